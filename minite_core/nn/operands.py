"""The operands a profile-driven GEMM reads: quantized through the kernel dispatch, cached per weight version, and
shared by the members of a fused group.

- `quantize`: one operand under a `Quant` spec (DESIGN.md's numerics; reference on CPU, Triton on the fast path),
  optionally with its GEMM-ready bf16 copy from the same kernel pass.
- Weights are quantized once per optimizer step, not per call (`weight_operand`): a cache entry is valid while
  `weight._version` and `data_ptr()` hold. Fused optimizers update in place without bumping the version, so
  learners `track_optimizer` (clears the caches after every step); edits through `.data` must
  `clear_weight_caches`. Unquantized weights are cast to the compute dtype once per version (`cast_weight`).
- A fused group (q/k/v, gate/up) shares one weight global scale (`fused_weight_amax`) and quantizes its one input
  once (`InputQuant`): the forward operand and the saved xᵀ are the same bits for every member, as in vLLM's
  QKVParallelLinear and Megatron-TE's fused linears, where they are one GEMM.
- Token shards (nn.shard): a dynamic per-tensor amax of a token-carrying operand is the global one (`shard_amax`).

Cached operands are made outside inference mode (`cache_context`): a cache filled by a sampler under
`torch.inference_mode` must still serve the learner's autograd.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from minite_core.kernels import dispatch
from minite_core.nn.shard import TokenShard, global_amax
from minite_core.profiles import Quant

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


def quantize(x: torch.Tensor, spec: Quant, *, amax=None, rounding=None, scale_mode=None, seed=None, rht=False,
             dq: bool = False, sr_origin=None):
    """Quantize through the kernel dispatch (reference on CPU, Triton on Hopper), the DESIGN.md numerics.
    dq=True returns the GEMM operand (bf16 e2m1(q)·sf + S_dec, emitted by the same kernel pass)."""
    overrides = {k: v for k, v in (("rounding", rounding), ("scale_mode", scale_mode), ("sr_origin", sr_origin))
                 if v is not None}
    if dq:
        return dispatch.quantize_dq(x, spec, amax=amax, seed=seed, rht=rht, check=False, **overrides)[1]
    return dispatch.quantize(x, spec, amax=amax, seed=seed, rht=rht, check=False, **overrides)


def cache_context():
    """Cached weight operands are made outside inference mode: a cache filled by a sampler running under
    `torch.inference_mode` must still serve the learner's autograd (inference tensors cannot be saved)."""
    return torch.inference_mode(False)


def weight_operand(weight: torch.Tensor, spec: Quant, cache: dict | None, key, fused, packed: bool = False) -> object:
    """Quantized weight (GEMM-ready operand), cached per module until the weight changes (module docstring).
    key = (name, "n" | "t"): along K, or along N (Wᵀ rows, dgrad). `fused` = (amax, versions) of a fused group
    sharing one global scale, or None. packed: the NVFP4Tensor itself (codes + scales, for the packed-weight and
    TE-reference GEMMs), not the backend's GEMM form."""
    amax, version = fused if fused is not None else (None, (weight._version, weight.data_ptr()))
    key = (*key, fused is not None) + (("packed",) if packed else ())  # fused / per-matrix, packed: other operands
    if cache is not None:
        hit = cache.get((key, spec))
        if hit is not None and hit[0] == version:
            return hit[1]
    with cache_context():
        w = weight.detach().float()
        w = w.t().contiguous() if key[1] == "t" else w
        op = quantize(w, spec, amax=amax)
        op = op if packed else dispatch.prepare_weight(op)
    if cache is not None:
        cache[(key, spec)] = (version, op)
    return op


def fused_weight_amax(group) -> tuple[torch.Tensor, tuple]:
    """One weight amax for a fused group of QuantLinears (vLLM's QKVParallelLinear / MergedColumnParallelLinear,
    Megatron-TE's linear_qkv / linear_fc1 quantize q|k|v and gate|up as one tensor): max over the members,
    recomputed only when a member's weight changed. Returns (amax fp32 [], member weight versions)."""
    versions = tuple((m.weight._version, m.weight.data_ptr()) for m in group)
    hit = group[0].__dict__.get("_fused_amax")
    if hit is None or hit[1] != versions:
        inf = float("inf")  # max |w| in one read, no |w| temporary (exact: a max)
        amax = torch.stack([torch.linalg.vector_norm(m.weight.detach(), ord=inf) for m in group]).amax().float()
        hit = (amax, versions)
        group[0].__dict__["_fused_amax"] = hit
    return hit


def clear_weight_caches(model: nn.Module) -> None:
    """Drop every cached quantized weight (and fused-group amax) of `model`."""
    for module in model.modules():
        if isinstance(getattr(module, "weight_cache", None), dict):
            module.weight_cache.clear()
        module.__dict__.pop("_fused_amax", None)


def track_optimizer(optimizer: torch.optim.Optimizer, model: nn.Module):
    """Clear `model`'s quantized-weight caches after every `optimizer.step()` (fused AdamW updates weights in place
    without bumping `weight._version`). Returns the hook handle."""
    return optimizer.register_step_post_hook(lambda opt, args, kwargs: clear_weight_caches(model))


def cast_weight(weight: torch.Tensor, dtype: torch.dtype, cache: dict | None) -> torch.Tensor:
    """weight in `dtype`, cast once per weight version (the fp32 master stays the parameter)."""
    if weight.dtype == dtype:
        return weight
    version = (weight._version, weight.data_ptr())
    key = ("cast", dtype, torch.is_inference_mode_enabled())  # an inference tensor cannot be saved for backward
    hit = cache.get(key) if cache is not None else None
    if hit is not None and hit[0] == version:
        return hit[1]
    with cache_context():
        w = weight.detach().to(dtype)
    if cache is not None:
        cache[key] = (version, w)
    return w


def pad_tokens(x: torch.Tensor) -> torch.Tensor:
    """Zero-pad the token dim to a multiple of 16 for the along-token (wgrad) quantization. Zero tokens change
    neither amax nor any dW entry."""
    m = x.shape[0]
    return F.pad(x, (0, 0, 0, (-m) % 16)) if m % 16 else x


def shard_amax(x: torch.Tensor, shard: TokenShard | None, spec: Quant | None = None, *, rht: bool = False,
               rht_dtype: str = "float32"):
    """The global amax of a token-sharded operand (nn.shard) under a dynamic per-tensor spec (spec=None: an
    along-token wgrad operand, always dynamic per tensor), else None (this tensor's own amax, computed by the
    quantizer: the single-process path)."""
    if shard is None or (spec is not None and (spec.scale_mode != "tensor" or spec.static)):
        return None
    return global_amax(x, shard, rht=rht, rht_dtype=rht_dtype)


class InputQuant:
    """The input quantizations a fused group shares (module docstring): a result is reused while the same input
    tensor (the base of the members' views, same data pointer, shape, strides and version) is alive; its entry
    is dropped when that tensor is freed, so nothing outlives the forward and a recycled address never hits."""

    def __init__(self):
        self.entries: dict = {}

    def __deepcopy__(self, memo):  # a model copy (peers.te_learner, rl.distributed) shares no live input
        return InputQuant()

    def get(self, x: torch.Tensor, tag, make):
        base = x if x._base is None else x._base
        version = -1 if x.is_inference() else x._version  # inference tensors (a sampler's forward) keep no counter
        sig = (x.data_ptr(), tuple(x.shape), x.stride(), version, x.dtype)
        hit = self.entries.get(tag)
        if hit is not None and hit[0]() is base and hit[1] == sig:
            return hit[2]
        value = make()
        entries = self.entries
        entries[tag] = (weakref.ref(base, lambda _, tag=tag: entries.pop(tag, None)), sig, value)
        return value


def input_quant(group) -> InputQuant | None:
    """The shared input quantizations of a fused group (kept on its first member), or None outside a group."""
    if not group:
        return None
    return group[0].__dict__.setdefault("_input_quant", InputQuant())

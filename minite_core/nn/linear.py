"""QuantLinear: one GEMM executed under an execution profile, forward and backward.

Forward (y = x Wᵀ, reduction dim K): W is quantized along K with the profile's weight spec, x along K with its
activation spec (dynamic, per-token, or static from `calibrate`), and the GEMM runs on the dequantized operands
with fp32 accumulation — exactly what an NVFP4 tensor core computes, up to accumulation order.

Backward, as TE's recipe lays it out (the reduction dim changes, so operands are re-quantized along it):
  dgrad  dx = dy W     dy quantized along N (grad spec, e.g. SR);  W re-quantized along N (Wᵀ rows).
                       With 16×16 weight tiles the transposed tiles have the same amax, so codes are reused.
  wgrad  dW = dyᵀ x    both quantized along the token dim M (RHT on both first when `wgrad_rht`, rounded to
                       `wgrad_rht_dtype`); dyᵀ with the grad spec, xᵀ with the activation spec's block/math,
                       RNE, one global scale per tensor (or per row of xᵀ: `wgrad_input_scale_mode`).
Only the column-wise (along-M) quantized xᵀ is saved for backward: ≈4.5 bits per element instead of 16.
M is zero-padded (`_pad_tokens`) to a multiple of 16 for the along-M quantization (zero rows add nothing to dW).

Operands that a profile leaves unquantized (`None`) run in `profile.dtype` as a plain F.linear, the weight cast
to that dtype once per weight version (cached, like the quantized weights; the cast copy is what the backward
uses for dgrad), so the bf16 profile *is* plain torch. Router and LM-head GEMMs are never quantized; they run
in the profile's router / LM-head dtype. Stochastic rounding draws the counter-based Philox stream of
`module.seed` (set per step by the learner): dgrad and wgrad operands from `seeds.dgrad_seed` / `seeds.wgrad_seed`.

A fused group (q/k/v, gate/up: `QuantLinear.fused_group`) reads one input: its members quantize that input once
(`_InputQuant`) — the forward operand and the saved xᵀ are the same bits for every member, as in vLLM's
QKVParallelLinear and Megatron-TE's fused linears, where they are one GEMM. On the H200's decode step that is 8 of
minite's 24 activation-quantizer launches (4 layers); in the learner, 2 of 3 along-token passes and saved xᵀ.

GEMMs go through `minite_core.kernels.dispatch` when a GPU backend is selected; the plain torch reference here
(dequantize → fp32 matmul) is what CPU runs and what the kernels are tested against.
"""
from __future__ import annotations

import dataclasses
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from minite_core.formats.nvfp4 import NVFP4Tensor, global_encode_scale
from minite_core.formats.rht import rht as rht_fn
from minite_core.kernels import dispatch, vllm_cpu
from minite_core.kernels.reference import gemm_te_reference
from minite_core.nn import nonfinite
from minite_core.nn.fp32_split import fp32_split_linear
from minite_core.nn.shard import TokenShard, current as current_shard, global_amax
from minite_core.profiles import PROFILES, Profile, Quant
from minite_core.seeds import dgrad_seed, wgrad_seed

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


def _q(x: torch.Tensor, spec: Quant, *, amax=None, rounding=None, scale_mode=None, seed=None, rht=False,
       dq: bool = False, sr_origin=None):
    """Quantize through the kernel dispatch (reference on CPU, Triton on Hopper), the DESIGN.md numerics.
    dq=True returns the GEMM operand (bf16 e2m1(q)·sf + S_dec, emitted by the same kernel pass)."""
    overrides = {k: v for k, v in (("rounding", rounding), ("scale_mode", scale_mode), ("sr_origin", sr_origin))
                 if v is not None}
    if dq:
        return dispatch.quantize_dq(x, spec, amax=amax, seed=seed, rht=rht, check=False, **overrides)[1]
    return dispatch.quantize(x, spec, amax=amax, seed=seed, rht=rht, check=False, **overrides)


def _weight_operand(weight: torch.Tensor, spec: Quant, cache: dict | None, key, fused, packed: bool = False) -> object:
    """Quantized weight (GEMM-ready operand), cached per module until the weight changes, so each weight is
    quantized once per optimizer step, not per call. A change is seen through `weight._version` (in-place ops)
    and `data_ptr()` (`.data =`, `.to()`); fused optimizers update without bumping the version, so learners
    `track_optimizer` (clears the caches after every step). Edits through `.data` must `clear_weight_caches`.
    `fused` = (amax, versions) of a fused group (q/k/v, gate/up) sharing one global scale, or None.
    packed: the NVFP4Tensor itself (codes + scales, for the packed-weight GEMM), not the backend's GEMM form."""
    amax, version = fused if fused is not None else (None, (weight._version, weight.data_ptr()))
    key = (*key, fused is not None) + (("packed",) if packed else ())  # fused / per-matrix, packed: other operands
    if cache is not None:
        hit = cache.get((key, spec))
        if hit is not None and hit[0] == version:
            return hit[1]
    with cache_context():
        w = weight.detach().float()
        w = w.t().contiguous() if key[1] == "t" else w
        op = _q(w, spec, amax=amax)
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


def gemm_nt(a, b, out_dtype=torch.float32, invariant: bool = False) -> torch.Tensor:
    """â @ b̂ᵀ [M, N] with fp32 accumulation, rounded once to `out_dtype` (kernels.dispatch: reference on CPU,
    exact bf16-tensor-core GEMM on Hopper; invariant: the fixed-tile one, profile knob batch_invariant)."""
    return dispatch.gemm(a, b, out_dtype=out_dtype, invariant=invariant)


def _pad_tokens(x: torch.Tensor) -> torch.Tensor:
    """Zero-pad the token dim to a multiple of 16 for the along-token (wgrad) quantization. Zero tokens change
    neither amax nor any dW entry."""
    m = x.shape[0]
    return F.pad(x, (0, 0, 0, (-m) % 16)) if m % 16 else x


def cache_context():
    """Cached weight operands are made outside inference mode: a cache filled by a sampler running under
    `torch.inference_mode` must still serve the learner's autograd (inference tensors cannot be saved)."""
    return torch.inference_mode(False)


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


class _CastLinear(torch.autograd.Function):
    """y = x @ w_castᵀ with the cached cast copy of the master weight; dW (in the cast dtype, as autograd's
    ToCopy backward would give it) is returned to the master."""

    @staticmethod
    def forward(ctx, x, weight, w_cast):
        ctx.save_for_backward(x, w_cast)
        ctx.w_dtype = weight.dtype
        return F.linear(x, w_cast)

    @staticmethod
    def backward(ctx, dy):
        x, w_cast = ctx.saved_tensors
        dx = dy @ w_cast if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            dw = (dy.reshape(-1, dy.shape[-1]).t() @ x.reshape(-1, x.shape[-1])).to(ctx.w_dtype)
        return dx, dw, None


def _plain_linear(x, weight, dtype, cache, invariant: bool = False):
    if dtype == torch.float32 and weight.dtype == torch.float32 and dispatch.fast_path(x):
        # fp32 GEMM on bf16 tensor cores (nn/fp32_split.py); invariant: profile knob batch_invariant
        return fp32_split_linear(x, weight, cache, invariant)
    if invariant and dtype == torch.float32:  # reference path: fp64 sums (CPU BLAS blocks by M), rounded once
        return (x.double() @ weight.double().t()).float()
    x = x.to(dtype)
    if weight.dtype == dtype or not weight.requires_grad or not torch.is_grad_enabled():
        return F.linear(x, cast_weight(weight, dtype, cache))
    return _CastLinear.apply(x, weight, cast_weight(weight, dtype, cache))


def _shard_amax(x: torch.Tensor, shard: TokenShard | None, spec: Quant | None = None, *, rht: bool = False,
                rht_dtype: str = "float32"):
    """The global amax of a token-sharded operand (nn.shard) under a dynamic per-tensor spec (spec=None: an
    along-token wgrad operand, always dynamic per tensor), else None (this tensor's own amax, computed by the
    quantizer: the single-process path)."""
    if shard is None or (spec is not None and (spec.scale_mode != "tensor" or spec.static)):
        return None
    return global_amax(x, shard, rht=rht, rht_dtype=rht_dtype)


def _te_amax(t: torch.Tensor, scale_mode: str = "tensor", *, rht: bool = False, rht_dtype: str = "float32"):
    """The amax TE's NVFP4QuantizerRef keeps beside a quantized operand (global_amax_row / _col) for the epilogue of
    its GEMM (profile knob w4a4_gemm="te-ref"): of the operand as quantized (RHT'd when it is), [] or per row [R, 1]."""
    a = (rht_fn(t.detach(), rht_dtype) if rht else t.detach()).float().abs()
    return a.amax(dim=1, keepdim=True) if scale_mode == "row" else a.amax()


def _e4m3_bound(spec: Quant) -> float:
    return 256.0 if spec.four_over_six != "off" else 448.0  # the E4M3 global bound 4over6 quantizes with (TE's)


class _InputQuant:
    """The input quantizations a fused group shares (module docstring): a result is reused while the same input
    tensor (the base of the members' views, same data pointer, shape, strides and version) is alive; its entry
    is dropped when that tensor is freed, so nothing outlives the forward and a recycled address never hits."""

    def __init__(self):
        self.entries: dict = {}

    def __deepcopy__(self, memo):  # a model copy (peers.te_learner, rl.distributed) shares no live input
        return _InputQuant()

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


def _input_quant(group) -> _InputQuant | None:
    """The shared input quantizations of a fused group (kept on its first member), or None outside a group."""
    if not group:
        return None
    return group[0].__dict__.setdefault("_input_quant", _InputQuant())


class _NVFP4Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, profile: Profile, input_amax, seed: int, cache, key, fused, wgrad: bool,
                shared: _InputQuant | None):
        # x: (M, K) compute dtype; weight: (N, K) master dtype; wgrad: a backward will want dW (grad mode was on
        # at the call and the weight requires grad — ctx.needs_input_grad ignores grad mode); shared: the fused
        # group's input quantizations (None: quantize here)
        shard = current_shard()  # a data-parallel rank's token slice (nn.shard), or None
        if shared is None or shard is not None:  # a shard's amaxes are all-reduced per call: not shared
            shared = _InputQuant()  # private: every lookup misses
        if shard is not None and profile.grad is not None and profile.wgrad_input_scale_mode != "tensor":
            raise NotImplementedError(f"profile {profile.name!r}: wgrad_input_scale_mode="
                                      f"{profile.wgrad_input_scale_mode!r} on a token shard (a per-channel amax "
                                      "over ranks) is not implemented; run it on one process")
        if shard is not None and profile.grad is not None and x.shape[0] % 16:
            raise ValueError(f"a token shard of {x.shape[0]} tokens: the wgrad's 16-token blocks would straddle "
                             "ranks; give each rank a multiple of 16 tokens (rows x padded length)")
        te_ref = profile.w4a4_gemm == "te-ref"  # TE's reference GEMM order (profiles.py); fprop, dgrad, wgrad
        if te_ref and shard is not None:
            raise NotImplementedError(f"profile {profile.name!r}: w4a4_gemm='te-ref' on a token shard (its amaxes "
                                      "would need an all-reduce); run it on one process")
        if te_ref:
            w_q = _weight_operand(weight, profile.weight, cache, (key, "n"), fused, packed=True)
            y = gemm_te_reference(_q(x.detach(), profile.activation), w_q, _te_amax(x, profile.activation.scale_mode),
                                  _te_amax(weight), (_e4m3_bound(profile.activation), _e4m3_bound(profile.weight)),
                                  x.dtype)
        elif profile.decode_gemm == "packed" and dispatch.fast_path(x):  # packed-weight GEMM (profiles.py)
            if shard is not None:
                raise NotImplementedError("decode_gemm='packed' on a data-parallel token shard; it is a sampler knob")
            amax = input_amax if profile.activation is not None and profile.activation.static else None
            y = dispatch.decode_gemm(x.detach(), _weight_operand(weight, profile.weight, cache, (key, "n"), fused,
                                                                 packed=True),
                                     act=profile.activation, amax=amax, out_dtype=x.dtype)
        elif profile.activation is None:  # W4A16 (Marlin): activations stay in the compute dtype
            w_q = _weight_operand(weight, profile.weight, cache, (key, "n"), fused)
            y = dispatch.gemm_w4a16(x.detach(), w_q)
        else:
            w_q = _weight_operand(weight, profile.weight, cache, (key, "n"), fused)
            amax = input_amax if profile.activation.static else _shard_amax(x, shard, profile.activation)
            if profile.w4a4_gemm == "vllm-cpu":  # vLLM's CPU emulation arithmetic (profile knob, kernels.vllm_cpu)
                y = vllm_cpu.gemm(_q(x.detach(), profile.activation, amax=amax), global_encode_scale(amax), w_q,
                                  x.dtype)
            else:
                x_op = shared.get(x, ("dq", profile.activation, id(amax)),
                                  lambda: _q(x.detach(), profile.activation, amax=amax, dq=True))
                nonfinite.record(weight, x_op.global_scale, "activation")
                y = gemm_nt(x_op, w_q, x.dtype, profile.batch_invariant)
        ctx.profile, ctx.seed, ctx.x_dtype, ctx.cache, ctx.key, ctx.fused = profile, seed, x.dtype, cache, key, fused
        ctx.shard = shard
        saved = ()
        if profile.grad is not None and wgrad:
            # keep only the column-wise quantized x^T (along tokens) for wgrad: packed, ~4.5 bits/element
            spec = dataclasses.replace(profile.activation or profile.grad, rounding="rne")
            rht = dict(rht=profile.wgrad_rht, rht_dtype=profile.wgrad_rht_dtype)

            def quantize_xt():
                x_p = _pad_tokens(x.detach())
                return dispatch.quantize_cols(x_p, spec, amax=_shard_amax(x_p.t(), shard, **rht),
                                              scale_mode=profile.wgrad_input_scale_mode, **rht)[0]  # xᵀ (K, M')

            x_t_q = shared.get(x, ("xt", spec, profile.wgrad_input_scale_mode, *rht.values()), quantize_xt)
            saved = (x_t_q.data, x_t_q.scale, x_t_q.global_scale)
            if te_ref:  # the amax of xᵀ for the wgrad epilogue
                saved += (_te_amax(_pad_tokens(x.detach()).t(), profile.wgrad_input_scale_mode, **rht),)
        ctx.save_for_backward(weight, *saved)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        weight, *x_t_parts = ctx.saved_tensors
        profile, seed, shard = ctx.profile, ctx.seed, ctx.shard
        if profile.grad is None:
            raise RuntimeError(f"profile {profile.name!r} has no backward (grad=None); it is a sampler profile")
        dy = dy.float()
        dx = dw = None
        te_ref = profile.w4a4_gemm == "te-ref"  # TE's reference GEMM (profiles.py): packed operands + amaxes
        if ctx.needs_input_grad[0]:
            dy_q = _q(dy, profile.grad, seed=dgrad_seed(seed), dq=not te_ref, amax=_shard_amax(dy, shard, profile.grad),
                      sr_origin=None if shard is None else (shard.offset, 0))  # (M, N) along N
            nonfinite.record(weight, dy_q.global_scale, "gradient (dgrad operand)")
            w_t_q = _weight_operand(weight, profile.weight, ctx.cache, (ctx.key, "t"), ctx.fused,
                                    packed=te_ref)  # (K, N) along N
            dx = (gemm_te_reference(dy_q, w_t_q, _te_amax(dy), _te_amax(weight),
                                    (_e4m3_bound(profile.grad), _e4m3_bound(profile.weight)), ctx.x_dtype)
                  if te_ref else gemm_nt(dy_q, w_t_q, ctx.x_dtype))
        if ctx.needs_input_grad[1]:
            dy_p = _pad_tokens(dy)
            origin = {} if shard is None else {"sr_origin": (0, shard.offset)}
            rht = dict(rht=profile.wgrad_rht, rht_dtype=profile.wgrad_rht_dtype)
            dy_t, dy_t_bf16 = dispatch.quantize_cols(
                dy_p, profile.grad, seed=wgrad_seed(seed), emit_dq=True, amax=_shard_amax(dy_p.t(), shard, **rht),
                **rht, **origin)  # dyᵀ (N, M')
            nonfinite.record(weight, dy_t.global_scale, "gradient (wgrad operand)")
            dy_t_q = dispatch.DqOperand(dy_t_bf16, dy_t.global_scale)
            x_t = NVFP4Tensor(*x_t_parts[:3])
            if te_ref:
                dw = gemm_te_reference(dy_t, x_t, _te_amax(dy_p.t(), **rht), x_t_parts[3],
                                       (_e4m3_bound(profile.grad), _e4m3_bound(profile.activation or profile.grad)),
                                       weight.dtype)
            else:
                x_t_op = dispatch.DqOperand(dispatch.dequantize_bf16(x_t), x_t.global_scale)
                dw = gemm_nt(dy_t_q, x_t_op, weight.dtype)
        return dx, dw, None, None, None, None, None, None, None, None


def linear(x: torch.Tensor, weight: torch.Tensor, profile: Profile, *, role: str = "linear",
           input_amax: torch.Tensor | None = None, seed: int = 0, cache: dict | None = None, key=None,
           fused=None, shared: _InputQuant | None = None) -> torch.Tensor:
    """y = x Wᵀ under `profile`. x: (..., K); weight: (N, K). Returns (..., N) in the compute dtype
    (router / LM head: in the profile's router / LM-head dtype). `cache` (a dict owned by the module) keeps the
    quantized weight between calls, `key` names the weight in it; `fused` = `fused_weight_amax(group)`;
    `shared` = the fused group's input quantizations (`_input_quant(group)`)."""
    if role in ("router", "lm_head"):
        dtype = torch_dtype(profile.router_dtype if role == "router" else profile.lm_head_dtype)
        return _plain_linear(x, weight, dtype, cache, profile.batch_invariant)
    dtype = torch_dtype(profile.dtype)
    if profile.weight is None:
        return _plain_linear(x, weight, dtype, cache)
    if profile.activation is not None and profile.activation.static and input_amax is None:
        raise RuntimeError(f"profile {profile.name!r} uses static activation scales: run "
                           "minite_core.model.calibrate(model, batches) first")
    lead = x.shape[:-1]
    wgrad = torch.is_grad_enabled() and weight.requires_grad  # no-grad calls (decode, eval) quantize no xᵀ
    y = _NVFP4Linear.apply(x.reshape(-1, x.shape[-1]).to(dtype), weight, profile, input_amax, seed, cache, key, fused,
                           wgrad, shared)
    return y.reshape(*lead, weight.shape[0])


class QuantLinear(nn.Module):
    """y = x Wᵀ under `self.profile`. role: "linear" | "router" | "lm_head" (the last two never quantized)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, role: str = "linear"):
        super().__init__()
        if bias:
            raise ValueError("QuantLinear has no bias: Qwen3 linears are bias-free")
        if role not in ("linear", "router", "lm_head"):
            raise ValueError(f"role must be linear/router/lm_head, got {role!r}")
        self.in_features, self.out_features, self.role = in_features, out_features, role
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = None
        self.profile: Profile = PROFILES["bf16"]
        self.seed = 0  # stochastic-rounding seed, set per step by the learner
        self.register_buffer("input_amax", None)  # static activation amax from calibrate()
        self.weight_cache: dict = {}  # quantized weight per (spec, orientation), valid while weight._version holds
        self.fused_group: tuple = ()  # QuantLinears sharing one weight global scale (set by the model: q/k/v, gate/up)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = None
        if self.fused_group and self.profile.weight is not None and self.profile.fused_weight_scale:
            fused = fused_weight_amax(self.fused_group)
        return linear(x, self.weight, self.profile, role=self.role, input_amax=self.input_amax, seed=self.seed,
                      cache=self.weight_cache, key="w", fused=fused, shared=_input_quant(self.fused_group))

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, role={self.role}, profile={self.profile.name}"

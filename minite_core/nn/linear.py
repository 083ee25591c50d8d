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
M is zero-padded (`operands.pad_tokens`) to a multiple of 16 for the along-M quantization (zero rows add nothing to dW).

Operands that a profile leaves unquantized (`None`) run in `profile.dtype` as a plain F.linear, the weight cast
to that dtype once per weight version (cached, like the quantized weights; the cast copy is what the backward
uses for dgrad), so the bf16 profile *is* plain torch. Router and LM-head GEMMs are never quantized; they run
in the profile's router / LM-head dtype. Stochastic rounding draws the counter-based Philox stream of
`module.seed` (set per step by the learner): dgrad and wgrad operands from `seeds.dgrad_seed` / `seeds.wgrad_seed`.

A fused group (q/k/v, gate/up: `QuantLinear.fused_group`) reads one input: its members quantize that input once
(`operands.InputQuant`) — the forward operand and the saved xᵀ are the same bits for every member, as in vLLM's
QKVParallelLinear and Megatron-TE's fused linears, where they are one GEMM. On the H200's decode step that is 8 of
minite's 24 activation-quantizer launches (4 layers); in the learner, 2 of 3 along-token passes and saved xᵀ.
At decode, under the packed-weight GEMM, the group is one GEMM too (`group_decode`: one launch for q|k|v).

What the GEMMs compute once the operands are quantized is the profile's arithmetic (nn.arithmetic: the
reference, W4A16, the packed-weight GEMM, vLLM's CPU kernel, TE's reference GEMM), chosen once per profile; this
file is the autograd around it, the same for every arithmetic. Operands, their quantization and caches:
nn.operands. Every kernel is reached through `minite_core.kernels.dispatch` (plain torch on the reference
backend, what CPU runs and what the kernels are tested against).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from minite_core.formats.nvfp4 import NVFP4Tensor
from minite_core.kernels import dispatch
from minite_core.nn import nonfinite
from minite_core.nn.arithmetic import GemmCall, linear_gemm
from minite_core.nn.fp32_split import fp32_split_linear
from minite_core.nn.operands import (InputQuant, cast_weight, fused_weight_amax, input_quant, pad_tokens, shard_amax,
                                     torch_dtype, weight_operand)
from minite_core.nn.shard import current as current_shard
from minite_core.profiles import PROFILES, Profile
from minite_core.seeds import wgrad_seed


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


class _NVFP4Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, profile: Profile, input_amax, seed: int, cache, key, fused, wgrad: bool,
                shared: InputQuant | None):
        # x: (M, K) compute dtype; weight: (N, K) master dtype; wgrad: a backward will want dW (grad mode was on
        # at the call and the weight requires grad — ctx.needs_input_grad ignores grad mode); shared: the fused
        # group's input quantizations (None: quantize here)
        gemm = linear_gemm(profile)  # what the profile's GEMMs compute (nn.arithmetic)
        shard = current_shard()  # a data-parallel rank's token slice (nn.shard), or None
        if shared is None or shard is not None:  # a shard's amaxes are all-reduced per call: not shared
            shared = InputQuant()  # private: every lookup misses
        if shard is not None:
            _check_shard(profile, gemm, x)
        call = GemmCall(weight, profile, cache, key, fused, shard, seed, x.dtype)
        y = gemm.fprop(call, x, input_amax, shared)
        ctx.call, ctx.gemm = call, gemm
        saved = ()
        if profile.grad is not None and wgrad:
            # keep only the column-wise quantized x^T (along tokens) for wgrad: packed, ~4.5 bits/element
            spec = dataclasses.replace(profile.activation or profile.grad, rounding="rne")
            rht = dict(rht=profile.wgrad_rht, rht_dtype=profile.wgrad_rht_dtype)

            def quantize_xt():
                x_p = pad_tokens(x.detach())
                return dispatch.quantize_cols(x_p, spec, amax=shard_amax(x_p.t(), shard, **rht),
                                              scale_mode=profile.wgrad_input_scale_mode, **rht)[0]  # xᵀ (K, M')

            x_t_q = shared.get(x, ("xt", spec, profile.wgrad_input_scale_mode, *rht.values()), quantize_xt)
            saved = (x_t_q.data, x_t_q.scale, x_t_q.global_scale, *gemm.wgrad_saved(call, x, rht))
        call.weight = None  # saved below (version-checked); backward puts it back
        ctx.save_for_backward(weight, *saved)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        weight, *x_t_parts = ctx.saved_tensors
        call, gemm = ctx.call, ctx.gemm
        profile, shard = call.profile, call.shard
        if not profile.can_learn:
            raise RuntimeError(f"profile {profile.name!r} has no backward (grad=None); it is a sampler profile")
        call.weight = weight
        dy = dy.float()
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = gemm.dgrad(call, dy)
        if ctx.needs_input_grad[1]:
            dy_p = pad_tokens(dy)
            origin = {} if shard is None else {"sr_origin": (0, shard.offset)}
            rht = dict(rht=profile.wgrad_rht, rht_dtype=profile.wgrad_rht_dtype)
            dy_t, dy_t_bf16 = dispatch.quantize_cols(
                dy_p, profile.grad, seed=wgrad_seed(call.seed), emit_dq=True, amax=shard_amax(dy_p.t(), shard, **rht),
                **rht, **origin)  # dyᵀ (N, M')
            nonfinite.record(weight, dy_t.global_scale, "gradient (wgrad operand)")
            dw = gemm.wgrad(call, dy_t, dy_t_bf16, dy_p, NVFP4Tensor(*x_t_parts[:3]), tuple(x_t_parts[3:]), rht)
        return dx, dw, None, None, None, None, None, None, None, None


def _check_shard(profile: Profile, gemm, x: torch.Tensor) -> None:
    """What a data-parallel token shard (nn.shard) cannot run, before any work."""
    if gemm.unshardable:
        raise NotImplementedError(f"profile {profile.name!r} on a data-parallel token shard: {gemm.unshardable}; "
                                  "run it on one process")
    if profile.grad is not None and x.shape[0] % 16:
        raise ValueError(f"a token shard of {x.shape[0]} tokens: the wgrad's 16-token blocks would straddle "
                         "ranks; give each rank a multiple of 16 tokens (rows x padded length)")


def linear(x: torch.Tensor, weight: torch.Tensor, profile: Profile, *, role: str = "linear",
           input_amax: torch.Tensor | None = None, seed: int = 0, cache: dict | None = None, key=None,
           fused=None, shared: InputQuant | None = None) -> torch.Tensor:
    """y = x Wᵀ under `profile`. x: (..., K); weight: (N, K). Returns (..., N) in the compute dtype
    (router / LM head: in the profile's router / LM-head dtype). `cache` (a dict owned by the module) keeps the
    quantized weight between calls, `key` names the weight in it; `fused` = `fused_weight_amax(group)`;
    `shared` = the fused group's input quantizations (`input_quant(group)`)."""
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


def group_decode(group: tuple, x: torch.Tensor) -> list[torch.Tensor] | None:
    """The modules of a fused group (q/k/v: each one's `fused_group` is `group`; a peer's module swapped in has
    none) on one input x (..., K) as ONE packed-weight decode GEMM over their stacked codes and scales (vLLM's
    QKVParallelLinear at decode): one launch instead of one a member, where every member runs its profile's packed
    GEMM (decode_gemm="packed") on the fast path, without gradients, with one global weight scale for the group
    (fused_weight_scale) and, for static activation scales, the same amax, and no module hooks. Returns each
    member's (..., N_i), or None (the caller runs the members). A column's products are the member GEMM's; the
    kernel splits K by the total N (kernels/decode_mma.split_k), so its fp32 sums may group differently: the
    packed profiles name that order (profiles.py `decode_gemm`)."""
    if not group or not all(getattr(m, "fused_group", None) == group for m in group):  # not (or no longer) one group
        return None
    first, p = group[0], group[0].profile
    if (not linear_gemm(p).packed or not p.fused_weight_scale or p.weight is None or not dispatch.fast_path(x)
            or current_shard() is not None or any(m.profile is not p or m._forward_hooks or m._forward_pre_hooks
                                                 for m in group)
            or (torch.is_grad_enabled() and (x.requires_grad or any(m.weight.requires_grad for m in group)))):
        return None
    amax = None
    if p.activation is not None and p.activation.static:
        amax = first.input_amax
        if amax is None or not _same_static_amax(group):
            return None
    fused = fused_weight_amax(group)
    hit = first.weight_cache.get(("group-packed", p.weight))
    if hit is None or hit[0] != fused[1]:
        ops = [weight_operand(m.weight, p.weight, m.weight_cache, ("w", "n"), fused, packed=True) for m in group]
        stacked = NVFP4Tensor(torch.cat([o.data for o in ops]), torch.cat([o.scale for o in ops]),
                              ops[0].global_scale)  # one amax for the group: one global scale
        hit = first.weight_cache[("group-packed", p.weight)] = (fused[1], stacked)
    lead = x.shape[:-1]
    y = linear_gemm(p).fprop_packed(p, x.reshape(-1, x.shape[-1]).to(torch_dtype(p.dtype)), hit[1], amax)
    return [part.reshape(*lead, part.shape[-1]) for part in y.split([m.out_features for m in group], dim=-1)]


def _same_static_amax(group: tuple) -> bool:
    """Whether the members' calibrated input amaxes are equal (they see one input; a loaded checkpoint may differ).
    Compared on the host once per set of versions, never while a CUDA graph is being captured (then: False)."""
    key = tuple((m.input_amax._version, m.input_amax.data_ptr()) if m.input_amax is not None else None
                for m in group)
    hit = group[0].__dict__.get("_same_input_amax")
    if hit is None or hit[0] != key:
        if any(k is None for k in key) or (group[0].input_amax.is_cuda and torch.cuda.is_current_stream_capturing()):
            return False
        hit = (key, all(torch.equal(m.input_amax, group[0].input_amax) for m in group[1:]))
        group[0].__dict__["_same_input_amax"] = hit
    return hit[1]


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
                      cache=self.weight_cache, key="w", fused=fused, shared=input_quant(self.fused_group))

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, role={self.role}, profile={self.profile.name}"

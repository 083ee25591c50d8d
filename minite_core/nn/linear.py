"""QuantLinear: one GEMM executed under an execution profile, forward and backward.

Forward (y = x Wᵀ, reduction dim K): W is quantized along K with the profile's weight spec, x along K with its
activation spec (dynamic, per-token, or static from `calibrate`), and the GEMM runs on the dequantized operands
with fp32 accumulation — exactly what an NVFP4 tensor core computes, up to accumulation order.

Backward, as TE's recipe lays it out (the reduction dim changes, so operands are re-quantized along it):
  dgrad  dx = dy W     dy quantized along N (grad spec, e.g. SR);  W re-quantized along N (Wᵀ rows).
                       With 16×16 weight tiles the transposed tiles have the same amax, so codes are reused.
  wgrad  dW = dyᵀ x    both quantized along the token dim M (RHT on both first when `wgrad_rht`); dyᵀ with the
                       grad spec, xᵀ with the activation spec's block/math, per-tensor scale, RNE.
Only the column-wise (along-M) quantized xᵀ is saved for backward: ≈4.5 bits per element instead of 16.
M is zero-padded to a multiple of 16 for the along-M quantization (zero rows add nothing to dW).

Operands that a profile leaves unquantized (`None`) run in `profile.dtype` through plain torch, so the bf16
profile *is* plain torch. Router and LM-head GEMMs are never quantized; they run in the profile's router /
LM-head dtype. Stochastic rounding draws from generators seeded by `module.seed` (set per step by the learner).

GEMMs go through `minite_core.kernels.dispatch` when a GPU backend is selected; the plain torch reference here
(dequantize → fp32 matmul) is what CPU runs and what the kernels are tested against.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minite_core.formats.nvfp4 import NVFP4Tensor, dequantize, quantize
from minite_core.formats.rht import rht
from minite_core.profiles import PROFILES, Profile, Quant

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


def _q(x: torch.Tensor, spec: Quant, *, amax=None, rounding=None, scale_mode=None, seed=None) -> NVFP4Tensor:
    rounding = rounding or spec.rounding
    gen = None
    if rounding == "sr":
        gen = torch.Generator(device=x.device).manual_seed(int(seed))
    return quantize(x, block=spec.block, scale_mode=scale_mode or spec.scale_mode, amax=amax, rounding=rounding,
                    math=spec.math, generator=gen, check=False)


def gemm_nt(a: NVFP4Tensor, b: NVFP4Tensor) -> torch.Tensor:
    """â @ b̂ᵀ in fp32 [M, N]: the reference; kernels.dispatch replaces it on GPU."""
    return dequantize(a) @ dequantize(b).t()


def _pad_rows16(x: torch.Tensor) -> torch.Tensor:
    pad = (-x.shape[0]) % 16
    return F.pad(x, (0, 0, 0, pad)) if pad else x


class _NVFP4Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, profile: Profile, input_amax, seed: int):
        # x: (M, K) compute dtype; weight: (N, K) master dtype
        w_q = _q(weight.detach(), profile.weight)
        if profile.activation is None:  # W4A16 (Marlin): activations stay in the compute dtype
            y = x.detach().float() @ dequantize(w_q).t()
        else:
            amax = input_amax if profile.activation.static else None
            y = gemm_nt(_q(x.detach(), profile.activation, amax=amax), w_q)
        ctx.profile, ctx.seed, ctx.x_dtype = profile, seed, x.dtype
        saved = ()
        if profile.grad is not None and weight.requires_grad:
            # keep only the column-wise quantized x^T (along tokens) for wgrad: packed, ~4.5 bits/element
            x_t = _pad_rows16(x.detach().float()).t().contiguous()  # (K, M16)
            x_t = rht(x_t) if profile.wgrad_rht else x_t
            x_t_q = _q(x_t, profile.activation or profile.grad, scale_mode="tensor", rounding="rne")
            saved = (x_t_q.data, x_t_q.scale, x_t_q.global_scale)
        ctx.save_for_backward(weight, *saved)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        weight, *x_t_parts = ctx.saved_tensors
        profile, seed = ctx.profile, ctx.seed
        if profile.grad is None:
            raise RuntimeError(f"profile {profile.name!r} has no backward (grad=None); it is a sampler profile")
        dy = dy.float()
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dy_q = _q(dy, profile.grad, seed=2 * seed)  # (M, N) along N
            w_t_q = _q(weight.detach().float().t().contiguous(), profile.weight)  # (K, N) along N
            dx = gemm_nt(dy_q, w_t_q).to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            dy_t = _pad_rows16(dy).t().contiguous()  # (N, M16)
            dy_t = rht(dy_t) if profile.wgrad_rht else dy_t
            dy_t_q = _q(dy_t, profile.grad, scale_mode="tensor", seed=2 * seed + 1)
            dw = gemm_nt(dy_t_q, NVFP4Tensor(*x_t_parts)).to(weight.dtype)
        return dx, dw, None, None, None


def linear(x: torch.Tensor, weight: torch.Tensor, profile: Profile, *, role: str = "linear",
           input_amax: torch.Tensor | None = None, seed: int = 0) -> torch.Tensor:
    """y = x Wᵀ under `profile`. x: (..., K); weight: (N, K). Returns (..., N) in the compute dtype
    (router / LM head: in the profile's router / LM-head dtype)."""
    if role in ("router", "lm_head"):
        dtype = torch_dtype(profile.router_dtype if role == "router" else profile.lm_head_dtype)
        return F.linear(x.to(dtype), weight.to(dtype))
    dtype = torch_dtype(profile.dtype)
    if profile.weight is None:
        return F.linear(x.to(dtype), weight.to(dtype))
    if profile.activation is not None and profile.activation.static and input_amax is None:
        raise RuntimeError(f"profile {profile.name!r} uses static activation scales: run "
                           "minite_core.nn.calibrate(model, batches) first")
    lead = x.shape[:-1]
    y = _NVFP4Linear.apply(x.reshape(-1, x.shape[-1]).to(dtype), weight, profile, input_amax, seed)
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.profile, role=self.role, input_amax=self.input_amax, seed=self.seed)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, role={self.role}, profile={self.profile.name}"

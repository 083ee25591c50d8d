"""Plain-torch references of every kernel in this package (no Triton): what the CPU runs, and what the Triton
kernels are tested against — codes and scales bitwise, GEMM outputs to fp32 accumulation order."""
from __future__ import annotations

import torch

from minite_core.formats import nvfp4 as ref


def quantize_reference(x, *, block=(1, 16), scale_mode="tensor", amax=None, rounding="rne", math="exact",
                       seed=None, rht=False, rht_dtype="float32", emit_dq=False, check=True, four_over_six="off", sr_origin=(0, 0),
                       **_tiles):
    """The plain torch reference behind the same signature (`formats`): RHT pre-pass (its output rounded to
    `rht_dtype`, formats.rht), then `nvfp4.quantize`
    (or `four_over_six.quantize_4over6` when four_over_six is "mae" / "mse")."""
    from minite_core.formats.rht import rht as rht_fn

    if four_over_six != "off":
        from minite_core.formats.four_over_six import quantize_4over6

        if rounding != "rne" or math != "exact" or rht:
            raise ValueError(f"4over6 needs rounding='rne', math='exact' and no RHT, got rounding={rounding!r} "
                             f"math={math!r} rht={rht} (TE 2.20 refuses the same combinations)")
        t = quantize_4over6(x, block=block, scale_mode=scale_mode, amax=amax, err_mode=four_over_six, check=check)
        return t, (ref.dequantize_unscaled(t).to(torch.bfloat16) if emit_dq else None)
    if rounding == "sr" and seed is None:
        raise ValueError("rounding='sr' needs an explicit integer seed (no hidden global RNG)")
    x_in = rht_fn(x, rht_dtype) if rht else x
    t = ref.quantize(x_in, block=block, scale_mode=scale_mode, amax=amax, rounding=rounding, math=math,
                     seed=seed if rounding == "sr" else None, check=check, sr_origin=sr_origin)
    return t, (ref.dequantize_unscaled(t).to(torch.bfloat16) if emit_dq else None)


def gemm_reference(a: ref.NVFP4Tensor, b: ref.NVFP4Tensor, out_dtype=torch.float32) -> torch.Tensor:
    """Plain torch: dequantize both fully in fp32 and multiply in fp32 (float64 when on CPU for a tight check)."""
    return (ref.dequantize(a) @ ref.dequantize(b).t()).to(out_dtype)


def grouped_gemm_reference(a: ref.NVFP4Tensor, b_experts: list[ref.NVFP4Tensor], offs, out_dtype=torch.float32):
    """Per-expert loop of fp32 dequantized products; rows of `a` in segments offs[e]:offs[e+1]."""
    x = ref.dequantize(a)
    bounds = torch.as_tensor(offs).tolist()
    outs = [x[s:t] @ ref.dequantize(b_experts[e]).t() for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:]))]
    return torch.cat(outs, 0).to(out_dtype)


def kgrouped_gemm_reference(a_experts: list[ref.NVFP4Tensor], b_experts: list[ref.NVFP4Tensor]) -> torch.Tensor:
    """Per-expert fp32 dequantized a_e @ b_eᵀ, stacked: [E, N, K]."""
    return torch.stack([ref.dequantize(a) @ ref.dequantize(b).t() for a, b in zip(a_experts, b_experts)])


def decode_gemm_reference(x: torch.Tensor, w: ref.NVFP4Tensor, *, x_scale=None, out_dtype=torch.float32):
    """Plain torch: fp32 x (times its S_dec when given) @ fully dequantized W^T."""
    xf = x.float() if x_scale is None else x.float() * x_scale.float()
    return (xf @ ref.dequantize(w).t()).to(out_dtype)

"""Native NVFP4 GEMM on sm_100+ (Blackwell): `torch._scaled_mm` on float4_e2m1fn_x2 with swizzled E4M3 scales.

Blackwell's block-scaled tensor cores take the packed E2M1 codes as they are (two a byte, even column in the
low nibble — the same packing as `formats.e2m1.pack_fp4`) and the E4M3 block scales in the 128x4 swizzled
layout (`formats.swizzle`). The fp32 global scales are not an argument of the block-scaled GEMM, so they are
applied to the fp32 output, as on Hopper: y = acc * (S_a * S_b).

Not runnable on the H200 (sm_90): cuBLAS answers CUBLAS_STATUS_NOT_SUPPORTED there (shared/GPU.md). The
operand preparation (views + swizzle) is tested on CPU; the GEMM test skips with `native_available()`'s reason.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minite_core.formats import nvfp4 as ref
from minite_core.formats.swizzle import swizzle_scales


def native_available(device=None) -> tuple[bool, str]:
    """(available, reason): needs CUDA, compute capability >= 10.0 and torch's float4_e2m1fn_x2 dtype."""
    if not torch.cuda.is_available():
        return False, "native NVFP4 GEMM needs a CUDA GPU (none visible)"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 10:
        return False, f"native NVFP4 GEMM needs sm_100+ (Blackwell); this GPU is sm_{major}{minor}"
    if not hasattr(torch, "float4_e2m1fn_x2"):
        return False, f"torch {torch.__version__} has no float4_e2m1fn_x2 dtype"
    return True, ""


@dataclass
class NativeOperand:
    """An NVFP4 operand as torch._scaled_mm takes it: fp4x2 view of the codes [R, K/2], swizzled scales
    (flat, padded to 128x4 tiles), and the fp32 S_dec ([] or [R, 1])."""

    data_fp4: torch.Tensor
    scale_swizzled: torch.Tensor
    global_scale: torch.Tensor
    shape: tuple[int, int]


def prepare(t: ref.NVFP4Tensor) -> NativeOperand:
    """Views and layout only: no value changes (weights: once per optimizer step)."""
    fp4 = getattr(torch, "float4_e2m1fn_x2", None)
    data = t.data.view(fp4) if fp4 is not None else t.data
    return NativeOperand(data, swizzle_scales(t.scale), t.global_scale, t.shape)


def gemm_native(a: ref.NVFP4Tensor | NativeOperand, b: ref.NVFP4Tensor | NativeOperand, out_dtype=torch.bfloat16):
    """y [M, N] = a_hat @ b_hat^T on Blackwell tensor cores; global scales on the fp32 output."""
    ok, reason = native_available()
    if not ok:
        raise RuntimeError(reason)
    a = a if isinstance(a, NativeOperand) else prepare(a)
    b = b if isinstance(b, NativeOperand) else prepare(b)
    acc = torch._scaled_mm(a.data_fp4, b.data_fp4.t(), scale_a=a.scale_swizzled, scale_b=b.scale_swizzled,
                           out_dtype=torch.float32)
    sa = a.global_scale.float()
    sb = b.global_scale.float()
    sb = sb.reshape(1, -1) if sb.ndim == 2 else sb  # per-row S_b [N, 1] -> columns of y
    return (acc * (sa * sb)).to(out_dtype)

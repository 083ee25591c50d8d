"""FP4 (E2M1) and FP8 (E4M3) element casts and nibble packing — the bit-level layer under `nvfp4.py`.

E2M1 codes are 0..15: bit 3 is the sign, bits 0-2 index the magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}.
Rounding to nearest goes ties-to-even *code* (DESIGN.md's table: 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2,
3.5→4, 5→4); magnitudes above 6 saturate. A value < 0 takes codes 8-15 even when it rounds to zero (−0.1 → 8),
while +0.0 and −0.0 both take code 0, matching TE's and cuBLAS's encoders.

Encoding is written as a sum of threshold comparisons instead of a bit-twiddling cast: seven compares say
exactly which midpoints round up (`>` for ties that go down to an even code, `>=` for ties that go up), which
is the specification itself, and the same formula is used by the Triton kernel.
"""
from __future__ import annotations

import torch

# magnitudes of codes 0..7
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E4M3_MAX = 448.0
FLT_MAX = torch.finfo(torch.float32).max


def e2m1_values(device=None) -> torch.Tensor:
    """All 16 code values (fp32), index = code."""
    mags = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def e2m1_encode(v_fp32: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even-code cast of already-scaled fp32 values to E2M1 codes (uint8, one per element)."""
    a = v_fp32.abs()
    mag = (
        (a > 0.25).to(torch.uint8)  # tie 0.25 -> code 0
        + (a >= 0.75)  # tie 0.75 -> code 2 (1.0)
        + (a > 1.25)  # tie 1.25 -> code 2 (1.0)
        + (a >= 1.75)  # tie 1.75 -> code 4 (2.0)
        + (a > 2.5)  # tie 2.5 -> code 4 (2.0)
        + (a >= 3.5)  # tie 3.5 -> code 6 (4.0)
        + (a > 5.0)  # tie 5 -> code 6 (4.0); > 6 saturates at code 7
    )
    return mag | ((v_fp32 < 0).to(torch.uint8) << 3)


def e2m1_encode_sr(v_fp32: torch.Tensor, generator: torch.Generator | None = None, *,
                   uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """Stochastic rounding: |v| between grid points lo < hi rounds up with probability (|v| - lo) / (hi - lo),
    i.e. when u < p_up for one uniform u in [0, 1) per element. `uniforms` (fp32, v's shape) gives the draws
    (the kernels' counter-based Philox stream, `formats.philox`); otherwise `torch.rand(v.shape,
    generator=generator)` in row-major order. Magnitudes >= 6 saturate to 6.
    """
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=v_fp32.device)
    a = v_fp32.abs().clamp(max=E2M1_MAX).contiguous()
    lo_idx = (torch.searchsorted(grid, a, right=True) - 1).clamp(0, 6)
    lo, hi = grid[lo_idx], grid[lo_idx + 1]
    p_up = (a - lo) / (hi - lo)
    if uniforms is None:
        u = torch.rand(v_fp32.shape, generator=generator, device=v_fp32.device, dtype=torch.float32)
    elif uniforms.shape != v_fp32.shape:
        raise ValueError(f"uniforms shape {tuple(uniforms.shape)} != values shape {tuple(v_fp32.shape)}")
    else:
        u = uniforms
    mag = (lo_idx + (u < p_up).to(lo_idx.dtype)).to(torch.uint8)
    mag = torch.where(a >= E2M1_MAX, torch.full_like(mag, 7), mag)
    return mag | ((v_fp32 < 0).to(torch.uint8) << 3)


_DECODE_LUT: dict[torch.device, torch.Tensor] = {}  # e2m1_values per device, built once


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Codes (uint8, one per element) -> fp32 values. The table is built once per device: a fresh one per call
    is a host-to-device copy, i.e. a host sync per GEMM on a GPU and illegal inside a CUDA-graph capture."""
    lut = _DECODE_LUT.get(codes.device)
    if lut is None:
        lut = _DECODE_LUT[codes.device] = e2m1_values(codes.device)
    return lut[codes.long()]


def to_e4m3(x_fp32: torch.Tensor) -> torch.Tensor:
    """RNE cast to float8_e4m3fn, saturating at 448 (torch turns > 448 into NaN, so clamp first)."""
    return x_fp32.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes -> [..., K/2] bytes, the even column in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4 needs an even last dimension, got shape {tuple(codes.shape)}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] codes."""
    lo, hi = packed & 0xF, packed >> 4
    return torch.stack([lo, hi], dim=-1).flatten(-2)

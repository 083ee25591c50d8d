"""NVFP4 quantize / dequantize — the bit-exact reference every engine and kernel in this project obeys.

NVFP4 = E2M1 elements × an E4M3 scale per 16 elements along the GEMM reduction dim K × an fp32 global scale.
Two quantizer arithmetics exist in the wild and they do *not* give the same codes:

  exact (TE; FlashInfer without fast-math)     fast (vLLM / FlashInfer default order of operations)
  S_enc = min(2688 / amax, FLT_MAX)            same S_enc (amax == 0 or S_enc == 0 -> 1), S_dec = 1 / S_enc
  sf  = e4m3(min(bamax * (S_enc * (1/6)), 448)) sf  = e4m3(min(S_enc * (bamax * (1/6)), 448))
  enc = min(1 / (sf * S_dec), FLT_MAX)          enc = 1 / (sf * (1 / S_enc)), 0 when sf == 0
  q   = e2m1(x * enc)                           q   = e2m1(x * enc)

Every product above is one fp32 operation in that order; this module spells each one out so the result is
defined to the bit on any device. Decoding is x̂ = e2m1(q) · sf · S_dec (the first product is exact).

Options: 1×16 blocks or 16×16 tiles (TE's 2D weights; the tile's scale is stored replicated on its 16 rows so
every consumer sees one layout [M, K/16]); a global scale per tensor or per row ("per-token", one S_dec per
row; with 16×16 tiles each row applies its own S_enc to the tile amax); dynamic (this tensor's amax) or static
(`amax` given, e.g. vLLM's calibrated input_global_scale — data above it saturates, never NaN); RNE or
stochastic rounding. The Random Hadamard transform is a separate pre-pass (`formats.rht`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minite_core.formats import philox
from minite_core.formats.e2m1 import (
    E2M1_MAX,
    E4M3_MAX,
    FLT_MAX,
    e2m1_decode,
    e2m1_encode,
    e2m1_encode_sr,
    pack_fp4,
    to_e4m3,
    unpack_fp4,
)

BLOCK = 16
GLOBAL_ENC_NUMERATOR = E4M3_MAX * E2M1_MAX  # 2688: maps amax to the top of the e4m3 × e2m1 range
_ONE_SIXTH = torch.tensor(1.0 / 6.0, dtype=torch.float32).item()  # fp32(1/6), as the CUDA code's constant


@dataclass
class NVFP4Tensor:
    """A quantized [M, K] matrix. data: uint8 [M, K/2]; scale: float8_e4m3fn [M, K/16];
    global_scale: fp32 S_dec, shape [] (per tensor) or [M, 1] (per row)."""

    data: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return self.data.shape[0], self.data.shape[1] * 2

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.data, self.scale, self.global_scale))


def _validate(x: torch.Tensor, block: tuple[int, int], check: bool) -> None:
    if x.ndim != 2:
        raise ValueError(f"NVFP4 quantize expects a 2D [M, K] tensor, got shape {tuple(x.shape)}")
    m, k = x.shape
    if k % BLOCK:
        raise ValueError(f"NVFP4 needs K (last dim) to be a multiple of 16, got shape {tuple(x.shape)}")
    if block == (BLOCK, BLOCK) and m % BLOCK:
        raise ValueError(f"16x16 (2D) blocks need M (rows) to be a multiple of 16, got shape {tuple(x.shape)}")
    if block not in ((1, BLOCK), (BLOCK, BLOCK)):
        raise ValueError(f"block must be (1, 16) or (16, 16), got {block}")
    if check and not torch.isfinite(x).all():
        raise ValueError(f"NVFP4 quantize got non-finite input (inf/NaN) in tensor of shape {tuple(x.shape)}")


def _div(num: float, den: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 num / den. (`num / tensor` in torch is reciprocal-then-multiply: two roundings.)"""
    return torch.full_like(den, num) / den


def global_encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """S_enc = min(2688 / amax, FLT_MAX); amax == 0 or S_enc == 0 -> 1. fp32, same shape as amax."""
    amax = amax.float()
    s_enc = torch.clamp(_div(GLOBAL_ENC_NUMERATOR, amax), max=FLT_MAX)
    return torch.where((amax == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)


def _amax(x_fp32: torch.Tensor, scale_mode: str, amax, check: bool = True) -> torch.Tensor:
    m = x_fp32.shape[0]
    if amax is None:  # dynamic
        return x_fp32.abs().amax() if scale_mode == "tensor" else x_fp32.abs().amax(dim=1, keepdim=True)
    amax = torch.as_tensor(amax, dtype=torch.float32, device=x_fp32.device)
    if check and (not torch.isfinite(amax).all() or (amax < 0).any()):  # value checks sync with the host
        raise ValueError(f"static amax must be finite and >= 0, got {amax}")
    if scale_mode == "tensor":
        if amax.numel() != 1:
            raise ValueError(f"scale_mode='tensor' takes a scalar amax, got shape {tuple(amax.shape)}")
        return amax.reshape(())
    if amax.numel() not in (1, m):
        raise ValueError(f"scale_mode='row' takes a scalar or [M] amax, got shape {tuple(amax.shape)} for M={m}")
    return amax.reshape(-1, 1).expand(m, 1).contiguous()


def _block_amax(x_fp32: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """[M, K/16] amax per 1×16 block, or per 16×16 tile replicated on its rows."""
    m, k = x_fp32.shape
    a = x_fp32.abs().reshape(m, k // BLOCK, BLOCK).amax(dim=2)  # (M, K/16)
    if block == (BLOCK, BLOCK):
        a = a.view(m // BLOCK, BLOCK, k // BLOCK).amax(dim=1, keepdim=True).expand(-1, BLOCK, -1).reshape(m, -1)
    return a


def quantize(
    x: torch.Tensor,
    *,
    block: tuple[int, int] = (1, BLOCK),
    scale_mode: str = "tensor",
    amax=None,
    rounding: str = "rne",
    math: str = "exact",
    generator: torch.Generator | None = None,
    seed: int | None = None,
    check: bool = True,
) -> NVFP4Tensor:
    """Quantize x [M, K] (fp32 or bf16) to NVFP4 with DESIGN.md's arithmetic; see the module docstring.
    rounding="sr" draws one uniform per element from `generator`, or — with `seed` — from the counter-based
    Philox stream `philox.uniform_grid(seed, r, c)` that the Triton kernels draw (bit-identical; the counter is
    built from (row, column), so a draw does not depend on the row length)."""
    block = tuple(block)
    _validate(x, block, check)
    if scale_mode not in ("tensor", "row"):
        raise ValueError(f"scale_mode must be 'tensor' or 'row', got {scale_mode!r}")
    if math not in ("exact", "fast"):
        raise ValueError(f"math must be 'exact' or 'fast', got {math!r}")
    if rounding not in ("rne", "sr"):
        raise ValueError(f"rounding must be 'rne' or 'sr', got {rounding!r}")
    m, k = x.shape
    x_fp32 = x.float()

    s_enc = global_encode_scale(_amax(x_fp32, scale_mode, amax, check))  # [] or (M, 1)
    s_dec = _div(1.0, s_enc)
    bamax = _block_amax(x_fp32, block)  # (M, K/16)
    if math == "exact":
        sf = to_e4m3(torch.clamp(bamax * (s_enc * _ONE_SIXTH), max=E4M3_MAX))
        enc = torch.clamp(_div(1.0, sf.float() * s_dec), max=FLT_MAX)
    else:
        sf = to_e4m3(torch.clamp(s_enc * (bamax * _ONE_SIXTH), max=E4M3_MAX))
        sf_fp32 = sf.float()
        enc = torch.where(sf_fp32 == 0, torch.zeros_like(sf_fp32), _div(1.0, sf_fp32 * _div(1.0, s_enc)))

    scaled = (x_fp32.reshape(m, k // BLOCK, BLOCK) * enc.unsqueeze(-1)).reshape(m, k)
    if rounding == "rne":
        codes = e2m1_encode(scaled)
    elif seed is not None:
        if generator is not None:
            raise ValueError("rounding='sr' takes a generator or a seed, not both")
        rows = torch.arange(m, dtype=torch.int64, device=x.device)[:, None]
        cols = torch.arange(k, dtype=torch.int64, device=x.device)[None, :]
        codes = e2m1_encode_sr(scaled, uniforms=philox.uniform_grid(seed, rows, cols))
    else:
        codes = e2m1_encode_sr(scaled, generator)
    return NVFP4Tensor(data=pack_fp4(codes), scale=sf, global_scale=s_dec.float())


def dequantize_unscaled(t: NVFP4Tensor) -> torch.Tensor:
    """e2m1(q) · sf, without the global scale: exact in bf16 (≤ 5 significant bits), fp32 [M, K]."""
    m, k = t.shape
    vals = e2m1_decode(unpack_fp4(t.data)).view(m, k // BLOCK, BLOCK)
    return (vals * t.scale.float().unsqueeze(-1)).view(m, k)


def dequantize(t: NVFP4Tensor) -> torch.Tensor:
    """x̂ = e2m1(q) · sf · S_dec, fp32 [M, K]."""
    return dequantize_unscaled(t) * t.global_scale

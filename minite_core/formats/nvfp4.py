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

Non-finite input (the hot path passes check=False and skips the check that would raise): an Inf or NaN is never
encoded as a finite value. A non-finite amax gives S_enc = S_dec = NaN (the tensor's, or the row's); a block whose
amax (or S_enc) is not finite gets the E4M3 NaN scale (0x7F), so it decodes to NaN whatever its codes (which are
then unspecified). S_dec = NaN is the flag nn/nonfinite.py reads once a step to stop it naming the layer.
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


_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # real floating inputs


def _validate_block(block) -> tuple[int, int]:
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) for b in block)
            or tuple(block) not in ((1, BLOCK), (BLOCK, BLOCK))):
        raise ValueError(f"block must be (1, 16) or (16, 16), got {block!r}")
    return tuple(block)


def _validate_options(scale_mode: str, math: str, rounding: str, generator, seed) -> None:
    if scale_mode not in ("tensor", "row"):
        raise ValueError(f"scale_mode must be 'tensor' or 'row', got {scale_mode!r}")
    if math not in ("exact", "fast"):
        raise ValueError(f"math must be 'exact' or 'fast', got {math!r}")
    if rounding not in ("rne", "sr"):
        raise ValueError(f"rounding must be 'rne' or 'sr', got {rounding!r}")
    if rounding == "sr" and generator is None and seed is None:
        raise ValueError("rounding='sr' needs a torch.Generator (generator=) or an integer seed (seed=): "
                         "stochastic rounding never draws from torch's global RNG")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")


def _validate(x: torch.Tensor, block: tuple[int, int], check: bool) -> None:
    """DESIGN.md's input contract: a real floating [M, K] tensor, K % 16 == 0 (M % 16 == 0 for 16x16 blocks),
    not empty; with `check`, finite and inside fp32's range (the scales are fp32; the hot path passes check=False
    and skips the two checks that need a device sync)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"NVFP4 quantize expects a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _INPUT_DTYPES:
        raise ValueError(f"NVFP4 quantize takes a real floating tensor ({', '.join(map(str, _INPUT_DTYPES))}), "
                         f"got {x.dtype} of shape {tuple(x.shape)}")
    if x.ndim != 2:
        raise ValueError(f"NVFP4 quantize expects a 2D [M, K] tensor, got shape {tuple(x.shape)}")
    m, k = x.shape
    if m == 0 or k == 0:
        raise ValueError(f"NVFP4 quantize got an empty tensor of shape {tuple(x.shape)} (nothing to quantize)")
    if k % BLOCK:
        raise ValueError(f"NVFP4 needs K (last dim) to be a multiple of 16, got shape {tuple(x.shape)}")
    if block == (BLOCK, BLOCK) and m % BLOCK:
        raise ValueError(f"16x16 (2D) blocks need M (rows) to be a multiple of 16, got shape {tuple(x.shape)}")
    if check:
        if not torch.isfinite(x).all():
            raise ValueError(f"NVFP4 quantize got non-finite input (inf/NaN) in tensor of shape {tuple(x.shape)}")
        if x.dtype == torch.float64 and bool((x.abs() > FLT_MAX).any()):
            raise ValueError(f"NVFP4 quantize got float64 values beyond fp32's range (max |x| = "
                             f"{float(x.abs().max()):.3g} > {FLT_MAX:.3g}) in tensor of shape {tuple(x.shape)}: "
                             "the global scale is fp32, scale the input first")


def _validate_nvfp4(t) -> None:
    """dequantize's input: an NVFP4Tensor whose parts have the layout `quantize` returns."""
    if not isinstance(t, NVFP4Tensor):
        raise ValueError(f"dequantize expects an NVFP4Tensor, got {type(t).__name__}")
    if t.data.dtype != torch.uint8 or t.data.ndim != 2 or t.data.shape[1] == 0:
        raise ValueError(f"NVFP4Tensor.data must be uint8 [M, K/2], got {t.data.dtype} {tuple(t.data.shape)}")
    m, k = t.shape
    if t.scale.dtype != torch.float8_e4m3fn or tuple(t.scale.shape) != (m, k // BLOCK) or k % BLOCK:
        raise ValueError(f"NVFP4Tensor.scale must be float8_e4m3fn [{m}, {k // BLOCK}] for data {tuple(t.data.shape)}, "
                         f"got {t.scale.dtype} {tuple(t.scale.shape)}")
    if t.global_scale.dtype != torch.float32 or tuple(t.global_scale.shape) not in ((), (m, 1)):
        raise ValueError(f"NVFP4Tensor.global_scale must be float32 [] or [{m}, 1], got "
                         f"{t.global_scale.dtype} {tuple(t.global_scale.shape)}")


def _div(num: float, den: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 num / den. (`num / tensor` in torch is reciprocal-then-multiply: two roundings.)"""
    return torch.full_like(den, num) / den


def global_encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """S_enc = min(2688 / amax, FLT_MAX); amax == 0 or S_enc == 0 -> 1; a non-finite amax -> NaN. fp32, amax's
    shape."""
    amax = amax.float()
    s_enc = torch.clamp(_div(GLOBAL_ENC_NUMERATOR, amax), max=FLT_MAX)
    s_enc = torch.where((amax == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)
    return torch.where(torch.isfinite(amax), s_enc, torch.full_like(s_enc, float("nan")))


def global_decode_scale(amax: torch.Tensor) -> torch.Tensor:
    """S_dec = 1 / S_enc(amax), correctly rounded (what `quantize` stores as global_scale). fp32, amax's shape."""
    return _div(1.0, global_encode_scale(amax))


def _amax(x_fp32: torch.Tensor, scale_mode: str, amax, check: bool = True) -> torch.Tensor:
    m = x_fp32.shape[0]
    if amax is None:  # dynamic
        return x_fp32.abs().amax() if scale_mode == "tensor" else x_fp32.abs().amax(dim=1, keepdim=True)
    if isinstance(amax, torch.Tensor) and (amax.is_complex() or not amax.is_floating_point()
                                           and amax.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"static amax must be a real number, got a {amax.dtype} tensor")
    try:
        amax = torch.as_tensor(amax, dtype=torch.float32, device=x_fp32.device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"static amax must be a real number or tensor, got {amax!r} ({e})") from None
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
    sr_origin: tuple[int, int] = (0, 0),
) -> NVFP4Tensor:
    """Quantize x [M, K] (fp32, bf16, fp16, or fp64 inside fp32's range) to NVFP4 with DESIGN.md's arithmetic;
    see the module docstring. Inputs outside that contract raise ValueError with the reason.
    rounding="sr" draws one uniform per element from `generator`, or — with `seed` — from the counter-based
    Philox stream `philox.uniform_grid(seed, r, c)` that the Triton kernels draw (bit-identical; the counter is
    built from (row, column), so a draw does not depend on the row length). `sr_origin` = (row, column) of x[0, 0]
    in a larger tensor that x is a shard of (a data-parallel rank's tokens): the draws are the larger tensor's."""
    block = _validate_block(block)
    _validate(x, block, check)
    _validate_options(scale_mode, math, rounding, generator, seed)
    m, k = x.shape
    x_fp32 = x.float()

    s_enc = global_encode_scale(_amax(x_fp32, scale_mode, amax, check))  # [] or (M, 1)
    s_dec = _div(1.0, s_enc)
    bamax = _block_amax(x_fp32, block)  # (M, K/16)
    finite = torch.isfinite(bamax) & torch.isfinite(s_enc)  # else the block's scale is NaN (module docstring)
    nan = torch.full_like(bamax, float("nan"))
    if math == "exact":
        sf = to_e4m3(torch.where(finite, torch.clamp(bamax * (s_enc * _ONE_SIXTH), max=E4M3_MAX), nan))
        enc = torch.clamp(_div(1.0, sf.float() * s_dec), max=FLT_MAX)
    else:
        sf = to_e4m3(torch.where(finite, torch.clamp(s_enc * (bamax * _ONE_SIXTH), max=E4M3_MAX), nan))
        sf_fp32 = sf.float()
        enc = torch.where(sf_fp32 == 0, torch.zeros_like(sf_fp32), _div(1.0, sf_fp32 * _div(1.0, s_enc)))

    scaled = (x_fp32.reshape(m, k // BLOCK, BLOCK) * enc.unsqueeze(-1)).reshape(m, k)
    if rounding == "rne":
        codes = e2m1_encode(scaled)
    elif seed is not None:
        if generator is not None:
            raise ValueError("rounding='sr' takes a generator or a seed, not both")
        rows = torch.arange(m, dtype=torch.int64, device=x.device)[:, None] + int(sr_origin[0])
        cols = torch.arange(k, dtype=torch.int64, device=x.device)[None, :] + int(sr_origin[1])
        codes = e2m1_encode_sr(scaled, uniforms=philox.uniform_grid(seed, rows, cols))
    else:
        codes = e2m1_encode_sr(scaled, generator)
    return NVFP4Tensor(data=pack_fp4(codes), scale=sf, global_scale=s_dec.float())


def dequantize_unscaled(t: NVFP4Tensor) -> torch.Tensor:
    """e2m1(q) · sf, without the global scale: exact in bf16 (≤ 5 significant bits), fp32 [M, K]."""
    _validate_nvfp4(t)
    m, k = t.shape
    vals = e2m1_decode(unpack_fp4(t.data)).view(m, k // BLOCK, BLOCK)
    return (vals * t.scale.float().unsqueeze(-1)).view(m, k)


def dequantize(t: NVFP4Tensor) -> torch.Tensor:
    """x̂ = e2m1(q) · sf · S_dec, fp32 [M, K]."""
    return dequantize_unscaled(t) * t.global_scale

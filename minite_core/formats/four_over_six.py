"""4over6 block-scale selection (Four Over Six, arXiv 2512.02010) as Transformer Engine 2.20 computes it.

What: plain NVFP4 scales every 16-block so that its amax maps to 6, the top of E2M1 — and the largest values of
a block then sit on the sparse end of the grid {4, 6}. 4over6 quantizes each block twice, once with the block amax
mapped to 6 ("map-to-6", the usual scale) and once mapped to 4 (a 1.5× larger E4M3 scale, "map-to-4", which uses
the denser {3, 4} part of the grid for the block's top), and keeps the candidate with the lower error. With the
global scale's E4M3 bound lowered from 448 to 256 (TE's default for 4over6 tensors) the 1.5× scale never clips.

The arithmetic is TE 2.20.2's reference, `transformer_engine/pytorch/custom_recipes/reference_nvfp4.py`,
`NVFP4QuantizerRef._quantize_blockwise_reference` + `_quantize_blockwise_4over6_reference` (non-fast-math error
path, the one `NVFP4BlockScaling(nvfp4_4over6=...)` uses), every fp32 operation in its order:
  S_enc  = min((6 · e4m3_max) / amax, FLT_MAX)     e4m3_max = 256 (TE default) or 448; S_enc == 0 -> 1
  S_dec  = 1 / S_enc
  base   = (bamax / 6) · S_enc                      a true division by 6, NOT the exact path's · fp32(1/6)
  sf6    = e4m3(min(base, 448))                     sf4 = e4m3(min(base · 1.5, 448))
  enc_c  = min(1 / (sf_c · S_dec), FLT_MAX);  q_c = e2m1(x · enc_c)     (c = 4, 6; RNE, saturating)
  err_c  = Σ_j |((e2m1(q_c,j) · sf_c) · amax) / (6 · e4m3_max) − x_j|   (MAE; MSE squares the difference),
           summed j = 0..15 left to right from 0; the dequantized value uses amax / (6 · e4m3_max), not S_dec
  1×16:  map-to-4 iff err_4 < err_6 (a tie keeps map-to-6);  16×16: the 16 row errors of a tile are summed in
         the CUDA warp's tree order ((r_i + r_{i+8}), then + 4 apart, + 2 apart, + 1 apart) before comparing.
Per-row ("row-scaled") global scales use each row's amax in S_enc and in the error, as TE's `row_scaled_nvfp4`;
TE supports row scaling with 1×16 blocks only, and so does this function.

Where it differs from TE's reference: amax == 0 gives S_enc = 1 here (DESIGN.md's rule; TE's gives FLT_MAX). The
codes and block scales are the same either way (every block amax is then 0), only the stored S_dec differs.
Not implemented: TE's fast-math error path (`nvfp4_4over6_err_use_fast_math`, error in the FP16 product domain),
which no built-in recipe selects. TE refuses 4over6 with RHT or stochastic rounding; so does `profiles.Quant`.
"""
from __future__ import annotations

import torch

from minite_core.formats.e2m1 import E2M1_MAX, E4M3_MAX, FLT_MAX, e2m1_decode, e2m1_encode, pack_fp4, to_e4m3
from minite_core.formats.nvfp4 import BLOCK, NVFP4Tensor, _amax, _block_amax, _div, _validate

E4M3_MAX_4OVER6 = 256.0  # TE 2.20 NVFP4BlockScaling.nvfp4_4over6_e4m3_use_256 = "all": every 4over6 tensor
ERR_MODES = ("mae", "mse")
MAP4_FACTOR = 1.5  # 6 / 4: the map-to-4 candidate's block scale


def global_encode_scale_4over6(amax: torch.Tensor, e4m3_max: float) -> torch.Tensor:
    """S_enc = min((6 · e4m3_max) / amax, FLT_MAX); amax == 0 or S_enc == 0 -> 1. fp32, shape of amax."""
    amax = amax.float()
    s_enc = torch.clamp(_div(E2M1_MAX * e4m3_max, amax), max=FLT_MAX)
    return torch.where((amax == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)


def _candidate(x_blocks: torch.Tensor, sf: torch.Tensor, s_dec: torch.Tensor):
    """Codes (M, K/16, 16) uint8 of x under block scale sf (M, K/16) e4m3: enc = min(1 / (sf · S_dec), FLT_MAX)."""
    enc = torch.clamp(_div(1.0, sf.float() * s_dec), max=FLT_MAX)  # (M, K/16)
    return e2m1_encode(x_blocks * enc.unsqueeze(-1))


def _block_error(x_blocks, codes, sf, amax, denom: float, err_mode: str) -> torch.Tensor:
    """err (M, K/16): Σ_j over the 16 elements, left to right, of |x̂_j − x_j| (or its square), where
    x̂ = ((e2m1(q) · sf) · amax) / denom in fp32, one rounding per operation (TE's loop over `idx`)."""
    vals = e2m1_decode(codes) * sf.float().unsqueeze(-1)  # exact: e2m1 × e4m3 has <= 5 significant bits
    vals = _div_by(vals * amax.unsqueeze(-1), denom)
    diff = vals - x_blocks
    terms = diff.abs() if err_mode == "mae" else diff * diff
    err = torch.zeros_like(terms[..., 0])
    for j in range(BLOCK):  # sequential fp32 sum: the order is part of the result
        err = err + terms[..., j]
    return err


def _div_by(num: torch.Tensor, den: float) -> torch.Tensor:
    """Correctly rounded fp32 num / den for a scalar den (torch on CUDA turns `t / python_scalar` into
    t * (1/den), two roundings; a tensor divisor keeps one)."""
    return num / torch.full_like(num, den)


def _tile_sum_tree(err: torch.Tensor) -> torch.Tensor:
    """(M, K/16) row errors -> (M, K/16): each 16-row tile's sum in the CUDA warp reduction's order, replicated."""
    m, nb = err.shape
    r = err.view(m // BLOCK, BLOCK, nb)
    r = r[:, 0:8] + r[:, 8:16]
    r = r[:, 0:4] + r[:, 4:8]
    r = r[:, 0:2] + r[:, 2:4]
    tile = r[:, 0] + r[:, 1]  # (M/16, K/16)
    return tile.repeat_interleave(BLOCK, dim=0)


def quantize_4over6(
    x: torch.Tensor,
    *,
    block: tuple[int, int] = (1, BLOCK),
    scale_mode: str = "tensor",
    amax=None,
    err_mode: str = "mae",
    e4m3_max: float = E4M3_MAX_4OVER6,
    check: bool = True,
) -> NVFP4Tensor:
    """x [M, K] (fp32 / bf16) -> NVFP4Tensor with per-block 4over6 scale selection (module docstring).
    `amax` given = static global amax (used in S_enc and in the error measure, as TE uses its global amax)."""
    block = tuple(block)
    _validate(x, block, check)
    if scale_mode not in ("tensor", "row"):
        raise ValueError(f"scale_mode must be 'tensor' or 'row', got {scale_mode!r}")
    if err_mode not in ERR_MODES:
        raise ValueError(f"4over6 err_mode must be one of {list(ERR_MODES)}, got {err_mode!r}")
    if e4m3_max not in (256.0, 448.0):
        raise ValueError(f"4over6 e4m3_max must be 256 or 448 (TE's two bounds), got {e4m3_max}")
    if scale_mode == "row" and block == (BLOCK, BLOCK):
        raise ValueError("4over6 with per-row global scales needs 1x16 blocks (TE's row_scaled_nvfp4 is 1x16 only)")
    m, k = x.shape
    x_fp32 = x.float()
    x_blocks = x_fp32.view(m, k // BLOCK, BLOCK)  # (M, K/16, 16)

    g_amax = _amax(x_fp32, scale_mode, amax)  # [] or (M, 1)
    s_enc = global_encode_scale_4over6(g_amax, e4m3_max)
    s_dec = _div(1.0, s_enc)
    base = _div_by(_block_amax(x_fp32, block), E2M1_MAX) * s_enc  # (M, K/16)
    sf6 = to_e4m3(torch.clamp(base, max=E4M3_MAX))
    sf4 = to_e4m3(torch.clamp(base * MAP4_FACTOR, max=E4M3_MAX))
    q6, q4 = _candidate(x_blocks, sf6, s_dec), _candidate(x_blocks, sf4, s_dec)

    amax_b = g_amax.expand(m, 1) if g_amax.ndim else g_amax.reshape(1, 1).expand(m, 1)  # (M, 1)
    denom = E2M1_MAX * e4m3_max
    err6 = _block_error(x_blocks, q6, sf6, amax_b, denom, err_mode)
    err4 = _block_error(x_blocks, q4, sf4, amax_b, denom, err_mode)
    if block == (BLOCK, BLOCK):
        err6, err4 = _tile_sum_tree(err6), _tile_sum_tree(err4)
    pick4 = err4 < err6  # (M, K/16); ties keep map-to-6
    codes = torch.where(pick4.unsqueeze(-1), q4, q6).view(m, k)
    sf = torch.where(pick4, sf4.float(), sf6.float()).to(torch.float8_e4m3fn)  # both are e4m3 values: exact
    return NVFP4Tensor(data=pack_fp4(codes), scale=sf, global_scale=s_dec.float())

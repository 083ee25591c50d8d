"""An independent 4over6 oracle for tests: numpy float32 scalar arithmetic written from TE 2.20.2's reference
(`custom_recipes/reference_nvfp4.py`, `_quantize_blockwise_4over6_reference`), sharing no code with
`minite_core.formats`; E4M3 and E2M1 rounding come from tests/nvfp4_oracle.py (table searches). Plus the
input families the 4over6 tests use (Gaussian, heavy-tailed, ties, edge)."""
from __future__ import annotations

import numpy as np
import torch

from tests.nvfp4_oracle import FLT_MAX, e2m1_code, e4m3_rne

F32 = np.float32
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _value(code: int) -> float:
    return (-1.0 if code & 8 else 1.0) * E2M1[code & 7]


def _oracle_block(xb, bamax, s_enc, s_dec, amax, denom, mode):
    """One 16-block's two candidates: [(codes, sf, per-element error terms)] for map-to-6 then map-to-4."""
    base = F32(F32(bamax / F32(6.0)) * s_enc)
    out = []
    for factor in (None, F32(1.5)):
        pre = base if factor is None else F32(base * factor)
        sf = F32(e4m3_rne(float(min(pre, F32(448.0)))))
        with np.errstate(divide="ignore", over="ignore"):
            enc = F32(min(F32(F32(1.0) / F32(sf * s_dec)), FLT_MAX))
        codes, terms = [], []
        for v in xb:
            with np.errstate(over="ignore"):
                c = e2m1_code(F32(v * enc))
            codes.append(c)
            val = F32(F32(F32(F32(_value(c)) * sf) * amax) / denom)
            d = F32(val - v)
            terms.append(abs(d) if mode == "mae" else F32(d * d))
        out.append((codes, sf, terms))
    return out


def _seq_sum(terms):
    s = F32(0.0)
    for t in terms:
        s = F32(s + t)
    return s


def oracle_4over6(x: np.ndarray, block=(1, 16), scale_mode="tensor", mode="mae", e4m3_max=256.0):
    """Returns (codes [M, K], scale [M, K/16] as float, s_dec [M]) — scalar numpy float32, TE's order."""
    x = x.astype(np.float32)
    m, k = x.shape
    amaxes = np.abs(x).max(axis=1) if scale_mode == "row" else np.full(m, np.abs(x).max(), dtype=np.float32)
    denom = F32(F32(6.0) * F32(e4m3_max))
    codes = np.zeros((m, k), dtype=np.uint8)
    scales = np.zeros((m, k // 16))
    s_decs = np.zeros(m, dtype=np.float32)
    cand = {}  # (row, block) -> two candidates
    for r in range(m):
        am = F32(amaxes[r])
        with np.errstate(divide="ignore", over="ignore"):
            s_enc = F32(min(F32(denom / am), FLT_MAX)) if am != 0 else F32(1.0)
        s_enc = F32(1.0) if s_enc == 0 else s_enc
        s_decs[r] = s_dec = F32(F32(1.0) / s_enc)
        for b in range(k // 16):
            rows = slice(r // 16 * 16, r // 16 * 16 + 16) if block == (16, 16) else slice(r, r + 1)
            bamax = F32(np.abs(x[rows, b * 16:(b + 1) * 16]).max())
            cand[r, b] = _oracle_block(x[r, b * 16:(b + 1) * 16], bamax, s_enc, s_dec, am, denom, mode)
    for r in range(m):
        for b in range(k // 16):
            if block == (16, 16):
                t0 = r // 16 * 16

                def tile_err(c):  # warp-tree order: +8 apart, +4, +2, +1
                    e = [_seq_sum(cand[t0 + i, b][c][2]) for i in range(16)]
                    for h in (8, 4, 2, 1):
                        e = [F32(e[i] + e[i + h]) for i in range(h)]
                    return e[0]

                e6, e4 = tile_err(0), tile_err(1)
            else:
                e6, e4 = _seq_sum(cand[r, b][0][2]), _seq_sum(cand[r, b][1][2])
            pick = cand[r, b][1] if e4 < e6 else cand[r, b][0]
            codes[r, b * 16:(b + 1) * 16] = pick[0]
            scales[r, b] = pick[1]
    return codes, scales, s_decs


def inputs():
    g = torch.Generator().manual_seed(0)
    gauss = torch.randn(32, 64, generator=g)
    chi2 = torch.randn(2, 32, 64, generator=g).pow(2).sum(0)
    heavy = torch.randn(32, 64, generator=g) / (chi2 / 2).sqrt()  # Student-t, 2 dof: heavy tails
    ties = torch.randint(-12, 13, (32, 64), generator=g).float() * 0.25  # grid midpoints; many equal errors
    edge = torch.randn(32, 64, generator=g) * 1e-3
    edge[:, :16] = 0.0  # all-zero blocks: equal (zero) errors, map-to-6 kept
    edge[0, 20] = 3e4  # one outlier: tiny and subnormal block scales, the 1.5x scale of some clamps at 448
    edge[5, 40:56] = 1e-30  # a block far below the global range: both scales round to 0
    return {"gauss": gauss, "student_t": heavy, "ties": ties, "edge": edge}

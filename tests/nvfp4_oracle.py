"""An independent NVFP4 oracle for tests: numpy float32 scalar arithmetic straight from DESIGN.md.

It shares no code with `minite_core.formats`: E4M3 rounding is done by searching the table of all 127 finite
e4m3fn values (ties to the even byte), E2M1 by searching its 8 magnitudes (ties to the even code), and every
fp32 operation is a numpy float32 operation in DESIGN.md's order.
"""
from __future__ import annotations

import numpy as np

F32 = np.float32
FLT_MAX = np.finfo(np.float32).max
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)


def _e4m3_table() -> np.ndarray:
    vals = []
    for b in range(0x7F):  # 0x7F is NaN in e4m3fn
        e, m = b >> 3, b & 7
        vals.append(m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(vals, dtype=np.float64)


E4M3 = _e4m3_table()


def e4m3_rne(v: float) -> float:
    """v >= 0, already clamped to <= 448."""
    i = int(np.searchsorted(E4M3, v))
    if i == 0:
        return float(E4M3[0])
    lo, hi = i - 1, min(i, len(E4M3) - 1)
    d_lo, d_hi = v - E4M3[lo], E4M3[hi] - v
    if d_lo < d_hi or (d_lo == d_hi and lo % 2 == 0):
        return float(E4M3[lo])
    return float(E4M3[hi])


def e2m1_code(v: np.float32) -> int:
    a = abs(float(v))
    best = min(range(8), key=lambda c: (abs(a - E2M1[c]), c % 2))  # nearest, ties -> even code
    if a >= 6:
        best = 7
    return best | (8 if v < 0 else 0)


def quantize_oracle(x: np.ndarray, block=(1, 16), scale_mode="tensor", math="exact", amax=None):
    """Returns (codes [M, K] uint8, scale [M, K/16] float (e4m3 values), s_dec [M] float32)."""
    x = x.astype(np.float32)
    m, k = x.shape
    one_sixth = F32(1.0 / 6.0)
    if amax is None:
        row_amax = np.abs(x).max(axis=1) if scale_mode == "row" else np.full(m, np.abs(x).max(), dtype=np.float32)
    else:
        row_amax = np.full(m, amax, dtype=np.float32)
    codes = np.zeros((m, k), dtype=np.uint8)
    scales = np.zeros((m, k // 16), dtype=np.float64)
    s_decs = np.zeros(m, dtype=np.float32)
    for r in range(m):
        am = F32(row_amax[r])
        with np.errstate(divide="ignore", over="ignore"):
            s_enc = F32(min(F32(2688.0) / am, FLT_MAX)) if am != 0 else F32(1.0)
        if s_enc == 0:
            s_enc = F32(1.0)
        s_dec = F32(F32(1.0) / s_enc)
        s_decs[r] = s_dec
        for b in range(k // 16):
            if block == (16, 16):
                r0 = r // 16 * 16
                bamax = F32(np.abs(x[r0 : r0 + 16, b * 16 : (b + 1) * 16]).max())
            else:
                bamax = F32(np.abs(x[r, b * 16 : (b + 1) * 16]).max())
            with np.errstate(over="ignore", divide="ignore"):
                if math == "exact":
                    sf = F32(e4m3_rne(float(min(F32(bamax * F32(s_enc * one_sixth)), F32(448)))))
                    enc = F32(min(F32(F32(1.0) / F32(sf * s_dec)), FLT_MAX))
                else:
                    sf = F32(e4m3_rne(float(min(F32(s_enc * F32(bamax * one_sixth)), F32(448)))))
                    enc = F32(0.0) if sf == 0 else F32(F32(1.0) / F32(sf * F32(F32(1.0) / s_enc)))
                scales[r, b] = sf
                for j in range(16):
                    c = b * 16 + j
                    codes[r, c] = e2m1_code(F32(x[r, c] * enc))
    return codes, scales, s_decs

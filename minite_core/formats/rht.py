"""Random Hadamard transform (RHT) on 16-element chunks — TE's NVFP4 recipe applies it to both wgrad operands.

Each 16-chunk v of the reduction dimension becomes `v @ (diag(s) @ H16) / 4` with H16 the Sylvester Hadamard
matrix and TE's fixed sign vector `s`. The matrix M = diag(s) H16 / 4 is orthogonal (H16 H16ᵀ = 16 I), so
applying it to both GEMM operands along K leaves the product unchanged while spreading outliers over the
chunk before quantization.

Bit-exactness: a matmul's fp32 summation order is up to the library. We define the transform as the fast
Walsh-Hadamard butterfly (4 stages of pairwise add/sub on sign-flipped values, then the exact ×1/4), whose
order is fixed; `rht_matrix()` gives the same map as a matrix for tests and kernels that prefer `tl.dot`.

Output dtype (`dtype`, the profile's `wgrad_rht_dtype`): "float32" keeps the butterfly's fp32 result; "bfloat16"
rounds it once to bf16 (RNE) before amax and quantization, as TE's reference does — reference_nvfp4.py
`_apply_rht` multiplies in the input's dtype (bf16 activations and gradients), bitwise equal to this rounding
on H200 (results/h200/te quantizer/rht_wgrad_bf16). Returned as fp32 either way.
"""
from __future__ import annotations

import torch

RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
RHT_CHUNK = 16


def hadamard16(device=None) -> torch.Tensor:
    """Sylvester H16 (entries ±1), fp32."""
    h = torch.ones(1, 1, dtype=torch.float32, device=device)
    while h.shape[0] < RHT_CHUNK:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def rht_matrix(device=None) -> torch.Tensor:
    """M = diag(s) @ H16 / 4, orthogonal; `rht(x) == x @ blockdiag(M)` up to fp32 summation order."""
    s = torch.tensor(RHT_SIGNS, dtype=torch.float32, device=device)
    return torch.diag(s) @ hadamard16(device) / 4


RHT_DTYPES = ("float32", "bfloat16")


def rht(x: torch.Tensor, dtype: str = "float32") -> torch.Tensor:
    """Transform the last dimension (the GEMM reduction dim) in 16-chunks, rounded to `dtype` (module docstring).
    Returns fp32 [..., K]."""
    if dtype not in RHT_DTYPES:
        raise ValueError(f"RHT dtype must be one of {RHT_DTYPES}, got {dtype!r}")
    k = x.shape[-1]
    if k % RHT_CHUNK:
        raise ValueError(f"RHT needs the reduction dim to be a multiple of 16, got shape {tuple(x.shape)}")
    s = torch.tensor(RHT_SIGNS, dtype=torch.float32, device=x.device)
    v = (x.float().reshape(*x.shape[:-1], k // RHT_CHUNK, RHT_CHUNK) * s).contiguous()
    h = 1
    while h < RHT_CHUNK:  # butterfly: pairs (i, i+h) within blocks of 2h -> (a+b, a-b)
        v = v.reshape(*v.shape[:-1], RHT_CHUNK // (2 * h), 2, h)
        a, b = v[..., 0, :], v[..., 1, :]
        v = torch.stack([a + b, a - b], dim=-2).reshape(*v.shape[:-3], RHT_CHUNK)
        h *= 2
    v = (v * 0.25).reshape(x.shape)
    return v.bfloat16().float() if dtype == "bfloat16" else v

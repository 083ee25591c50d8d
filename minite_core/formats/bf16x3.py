"""An fp32 value as the sum of three bf16 pieces: the reference of the fp32 GEMMs on bf16 tensor cores
(nn/fp32_split.py) and of the one-launch split (kernels/split3.py).

t = t1 + t2 + t3 with t1 = bf16(t), t2 = bf16(t - t1), t3 = bf16(t - t1 - t2). Every difference is exact in
fp32, and the three pieces carry all 24 significant bits. bf16 has fp32's exponent range, so this holds for
normal values; subnormal tails below 2^-126 aside.
"""
from __future__ import annotations

import torch


def split3(t: torch.Tensor) -> list[torch.Tensor]:
    """t (fp32) -> [t1, t2, t3] bf16 with t1 + t2 + t3 == t (exactly, for normal values). A bf16 input is [t]."""
    if t.dtype == torch.bfloat16:
        return [t]
    t = t.float()
    t1 = t.to(torch.bfloat16)
    r = t - t1.float()
    t2 = r.to(torch.bfloat16)
    return [t1, t2, (r - t2.float()).to(torch.bfloat16)]

"""fp32 -> its three bf16 pieces (`formats.bf16x3.split3`) in one launch, laid out for the split GEMMs.

Why: the torch spelling is 7 launches and ~12 passes over the tensor. Under `minite` the LM head's fp32 logit
gradient is split every step: at 4,096 tokens and a 151,936 vocabulary that is a 2.5 GB fp32 tensor. On the H200,
one 4-layer step of one node rank spent 14.4 ms in split3 and 5.7 ms adding split-GEMM terms, out of 125 ms
of kernels (results/h200/bench/NOTES.md, row 22). Here the tensor is read once and the
pieces are written once.

Arithmetic, the reference's: t1 = bf16(t), r = t - t1, t2 = bf16(r), t3 = bf16(r - t2). The casts round to
nearest even (the GPU's cvt.rn; the interpreter's too, kernels/interpret.py), and the subtractions are exact
in fp32. So the pieces are `split3`'s bit for bit (tests/test_fp32_split.py).

Layouts, smallest piece first: "cat" puts the pieces side by side along the columns, (R, 3C) = [t3 | t2 | t1].
That is the K-concatenated GEMM operand: Σ_j a @ t_jᵀ = [a | a | a] @ [t3 | t2 | t1]ᵀ, one GEMM. "stack" puts
them one after another, (3, R, C) = (t3, t2, t1). Smallest first because a GEMM adds its K blocks in order into
one accumulator, and the H200's tensor cores lose low bits on every add in proportion to the accumulator: with
t1 first, the small pieces' products were added to a full-size sum. On the H200 the forward of an fp32 head at
K = 1,024 was then 5.1e-6 off the fp64 product, against 1.0e-6 for one GEMM a term.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minite_core.kernels import interpret  # noqa: F401  (its interpreter fixes: bf16 RNE casts)

BLOCK = 1024


@triton.jit
def _split3_kernel(t_ptr, out_ptr, C, t_row_stride, part_stride, row_stride, BLOCK: tl.constexpr):
    # piece p (t1, t2, t3 = 0, 1, 2) of t[r, c] -> out[(2 - p) * part_stride + r * row_stride + c]
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < C
    t = tl.load(t_ptr + r * t_row_stride + c, mask=ok, other=0.0)
    t1 = t.to(tl.bfloat16)
    rest = t - t1.to(tl.float32)
    t2 = rest.to(tl.bfloat16)
    t3 = (rest - t2.to(tl.float32)).to(tl.bfloat16)
    out = out_ptr + r * row_stride + c
    tl.store(out, t3, mask=ok)
    tl.store(out + part_stride, t2, mask=ok)
    tl.store(out + 2 * part_stride, t1, mask=ok)


def split3(t: torch.Tensor, layout: str) -> torch.Tensor:
    """t (R, C) fp32 -> bf16 (R, 3C) [t3 | t2 | t1] for layout "cat", (3, R, C) (t3, t2, t1) for "stack"."""
    if t.dim() != 2 or t.dtype != torch.float32:
        raise ValueError(f"split3 takes a 2-D fp32 tensor, got {t.dtype} {tuple(t.shape)}")
    if t.stride(1) != 1:
        t = t.contiguous()
    rows, cols = t.shape
    if layout == "cat":
        out = torch.empty(rows, 3 * cols, dtype=torch.bfloat16, device=t.device)
        part_stride, row_stride = cols, 3 * cols
    elif layout == "stack":
        out = torch.empty(3, rows, cols, dtype=torch.bfloat16, device=t.device)
        part_stride, row_stride = rows * cols, cols
    else:
        raise ValueError(f"split3 layout must be 'cat' or 'stack', got {layout!r}")
    if t.numel():
        _split3_kernel[(rows, triton.cdiv(cols, BLOCK))](t, out, cols, t.stride(0), part_stride, row_stride,
                                                          BLOCK=BLOCK, num_warps=4)
    return out

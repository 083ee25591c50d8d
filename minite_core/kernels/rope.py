"""RoPE in one launch: `model.qwen3_moe.apply_rope` bitwise, forward only.

Why: the plain reference `x * cos + rotate_half(x) * sin` is ~10 elementwise kernels per call (chunk/neg/cat, two
multiplies, an add, casts), called for q and k in every layer; a decode step is hundreds of ~1.5 us kernels in a
CUDA graph, so launches are its cost. Here one program handles BLOCK_R rows (b, h, t) of x: both halves of a row,
so rotate_half is index arithmetic (first half -x2, second half x1), never a copy.

Arithmetic = torch's elementwise ops, in the compute dtype CD (`dtype`, or x's dtype when None): x, cos, sin cast
to CD (RNE; exact when widening), each product taken in fp32 and rounded to CD, the sum taken in fp32 from the two
rounded products and rounded to CD (torch's bf16/fp16 ops compute in fp32 and round each op's result; in fp32 the
roundings are no-ops), then CD -> x's dtype, "rtz" truncating fp32 -> bf16 as `cast`. The -x2 half is a
subtraction: the reference's negate-then-add bit for bit, signed zeros too. FMA contraction is off
(`enable_fp_fusion=False`; with it on, the sm_90 PTX of the fp32 kernel has 16 fma.rn.f32, off: none): torch runs
the multiplies and the add as separate kernels, so fp32 operands would differ in the last bit (bf16 x bf16
products are exact in fp32, where the two agree anyway). LLVM narrows the bf16 ops to mul/add.rn.bf16: the same
bits (an fp32 intermediate, 24 >= 2*8+2 bits, makes the double rounding innocuous).

Output: x's strides (`empty_like`; the reference's are x's too, or contiguous after `cast(..., "rtz")`), the same
values either way. Supported: x and CD in {fp32, bf16, fp16}, and with CD == x's dtype cos/sin in it too (else torch
promotes); anything else runs the reference (`supported`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minite_core.kernels import interpret  # noqa: F401  (its interpreter fixes: bf16 RNE casts, scalar loop bounds)

_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
PAIRS = 1024  # (row, d) pairs per program: 2048 elements of x, a handful of programs for a decode step's q


@triton.jit
def _load(ptr, ok, CD: tl.constexpr):
    # the operand cast to CD (RNE), held in fp32 (exact)
    return tl.load(ptr, mask=ok, other=0.0).to(CD).to(tl.float32)


@triton.jit
def _rot(a, c, b, s, CD: tl.constexpr, NEG: tl.constexpr):
    # (a*c)_CD ± (b*s)_CD rounded to CD, every op in fp32 (no FMA: the launch disables fp fusion). p - (b*s)_CD is
    # p + ((-b)*s)_CD bit for bit, signed zeros included; Triton's `-b` is 0 - b (+0 for b = +0), and the
    # interpreter's bf16 negation is wrong, so the minus goes here.
    p, q = (a * c).to(CD).to(tl.float32), (b * s).to(CD).to(tl.float32)
    return (p - q).to(CD) if NEG else (p + q).to(CD)


@triton.jit
def _rope_kernel(x_ptr, c_ptr, s_ptr, y_ptr, R, H, T, HALF,
                 sxb, sxh, sxt, sxd, scb, sch, sct, scd, ssb, ssh, sst, ssd, syb, syh, syt, syd,
                 CD: tl.constexpr, RTZ: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_HALF: tl.constexpr):
    # x, y: (B, H, T, Dh) strided; cos, sin expanded to (B, H, T, Dh) (stride 0 over heads); rows r = (b*H + h)*T + t
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    t, h, b = r % T, (r // T) % H, r // (T * H)
    d = tl.arange(0, BLOCK_HALF)
    ok = (r < R)[:, None] & (d < HALF)[None, :]
    x = x_ptr + (b * sxb + h * sxh + t * sxt)[:, None]
    c = c_ptr + (b * scb + h * sch + t * sct)[:, None]
    s = s_ptr + (b * ssb + h * ssh + t * sst)[:, None]
    y = y_ptr + (b * syb + h * syh + t * syt)[:, None]
    lo, hi = d[None, :], (d + HALF)[None, :]
    x1, x2 = _load(x + lo * sxd, ok, CD), _load(x + hi * sxd, ok, CD)
    y1 = _rot(x1, _load(c + lo * scd, ok, CD), x2, _load(s + lo * ssd, ok, CD), CD, True)  # first half: -x2
    y2 = _rot(x2, _load(c + hi * scd, ok, CD), x1, _load(s + hi * ssd, ok, CD), CD, False)  # second half: x1
    if RTZ:  # fp32 -> bf16 by dropping the low 16 bits (`cast(..., "rtz")`); exact cast afterwards
        y1 = (y1.to(tl.int32, bitcast=True) & -65536).to(tl.float32, bitcast=True)
        y2 = (y2.to(tl.int32, bitcast=True) & -65536).to(tl.float32, bitcast=True)
    tl.store(y + lo * syd, y1.to(y_ptr.dtype.element_ty), mask=ok)
    tl.store(y + hi * syd, y2.to(y_ptr.dtype.element_ty), mask=ok)


def supported(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype | None) -> bool:
    """Whether `rope_triton` equals the reference for these operands (else the caller runs the reference)."""
    cd = dtype or x.dtype
    same = cd != x.dtype or cos.dtype == sin.dtype == x.dtype  # apply_rope's dtype-None branch: no promotion
    return (x.ndim == 4 and x.shape[-1] % 2 == 0 and x.dtype in _TL and cd in _TL and same
            and cos.dtype in _TL and sin.dtype in _TL and cos.ndim == sin.ndim == 4)


def rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype | None = None,
                rounding: str = "rne") -> torch.Tensor:
    """x (B, H, T, Dh) rotated by cos/sin (broadcastable to x, e.g. (B, 1, T, Dh)) -> x's shape, dtype, strides."""
    B, H, T, Dh = x.shape
    cd = dtype or x.dtype
    cos, sin = cos.expand(B, H, T, Dh), sin.expand(B, H, T, Dh)  # views: stride 0 over heads
    y = torch.empty_like(x)
    R, half = B * H * T, Dh // 2
    block_half = triton.next_power_of_2(half)
    block_r = max(1, PAIRS // block_half)
    rtz = rounding == "rtz" and cd == torch.float32 and x.dtype == torch.bfloat16
    _rope_kernel[(triton.cdiv(R, block_r),)](
        x, cos, sin, y, R, H, T, half, *x.stride(), *cos.stride(), *sin.stride(), *y.stride(),
        CD=_TL[cd], RTZ=rtz, BLOCK_R=block_r, BLOCK_HALF=block_half, num_warps=4, enable_fp_fusion=False)
    return y

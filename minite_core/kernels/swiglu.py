"""SwiGLU, silu(gate) * up, in one launch forward and one backward: `model.qwen3_moe.silu_mul` on the fast path.

Why: in torch ops it is a silu and a multiply forward, and in backward two multiplies, silu's backward and (for
the experts' [gate | up] GEMM output, split with `chunk`) a cat of the two halves' gradients; under the NVFP4
learners' `recompute_elementwise` the forward runs twice. On the H200 at the learner bench's 6 layers that was
~12 ms of a minite step's kernels (results/h200/bench/NOTES.md, row 25). Here the forward reads gate
and up once and writes h; the backward reads gate, up and dh once and writes both gradients, into one [dgate | dup]
buffer when the input was one [gate | up] tensor. Only the input is saved (what the recompute knob saves).

Arithmetic, torch's bf16 ops (fp32 inside, one rounding an op): s = bf16(g / (1 + exp(-g))) (IEEE division; exp is
libdevice's expf, what torch's CUDA silu calls), h = bf16(s · u). Backward, autograd's formulas: ds = bf16(dh · u),
du = bf16(dh · s), dg = bf16(ds · σ · (1 + g · (1 - σ))) with σ = 1 / (1 + exp(-g)) (torch's silu_backward). The
forward's and du's bits are torch's on the GPU; dg within one bf16 rounding (where the compilers contract
`1 + g · (1 - σ)` into an FMA may differ). On CPU (the interpreter: numpy's exp, not torch's) all within one rounding.
Elementwise: the same bits for a row alone or in a batch, so learner and sampler run it alike.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from minite_core.kernels import interpret  # noqa: F401  (its interpreter fixes: bf16 RNE casts)

BLOCK = 1024  # columns a program handles: an expert's 768-wide half in one step, a dense 6,144 in six programs


@triton.jit
def _one_plus_exp_neg(g, GPU: tl.constexpr):
    # 1 + exp(-g): silu's and sigmoid's denominator
    return 1.0 + (libdevice.exp(-g) if GPU else tl.exp(-g))


@triton.jit
def _swiglu_forward_kernel(g_ptr, u_ptr, h_ptr, I, sg, su, sh, GPU: tl.constexpr, BLOCK: tl.constexpr):
    # row r: h[r, c] = bf16(bf16(silu(g[r, c])) * u[r, c]); g, u, h rows at strides sg, su, sh
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < I
    g = tl.load(g_ptr + r * sg + c, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + r * su + c, mask=ok, other=0.0).to(tl.float32)
    s = tl.math.div_rn(g, _one_plus_exp_neg(g, GPU)).to(tl.bfloat16).to(tl.float32)
    tl.store(h_ptr + r * sh + c, (s * u).to(tl.bfloat16), mask=ok)


@triton.jit
def _swiglu_backward_kernel(g_ptr, u_ptr, dh_ptr, dg_ptr, du_ptr, I, sg, su, sdh, sdg, sdu, GPU: tl.constexpr,
                            BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < I
    g = tl.load(g_ptr + r * sg + c, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + r * su + c, mask=ok, other=0.0).to(tl.float32)
    dh = tl.load(dh_ptr + r * sdh + c, mask=ok, other=0.0).to(tl.float32)
    den = _one_plus_exp_neg(g, GPU)
    sig = tl.math.div_rn(1.0, den)
    s = tl.math.div_rn(g, den).to(tl.bfloat16).to(tl.float32)
    ds = (dh * u).to(tl.bfloat16).to(tl.float32)
    tl.store(du_ptr + r * sdu + c, (dh * s).to(tl.bfloat16), mask=ok)
    tl.store(dg_ptr + r * sdg + c, (ds * sig * (1.0 + g * (1.0 - sig))).to(tl.bfloat16), mask=ok)


def supported(gate: torch.Tensor, up: torch.Tensor) -> bool:
    """bf16 halves of one shape, rows at any stride, columns contiguous."""
    return (gate.dtype == up.dtype == torch.bfloat16 and gate.shape == up.shape and gate.dim() >= 1
            and gate.stride(-1) == 1 and up.stride(-1) == 1)


def _rows(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """t (..., I) with contiguous columns -> a (rows, I) view when the leading dims flatten, and its row stride."""
    t2 = t.reshape(-1, t.shape[-1])  # a view when possible (the chunk halves of a contiguous (.., 2I) tensor are)
    return t2, t2.stride(0)


def _grid(rows: int, cols: int):
    return rows, triton.cdiv(cols, BLOCK)


def swiglu_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g2, sg = _rows(gate)
    u2, su = _rows(up)
    h = torch.empty(g2.shape, dtype=gate.dtype, device=gate.device)
    if h.numel():
        _swiglu_forward_kernel[_grid(*h.shape)](g2, u2, h, h.shape[1], sg, su, h.shape[1],
                                                GPU=not interpret.INTERPRET, BLOCK=BLOCK, num_warps=4)
    return h.view(gate.shape)


def swiglu_backward(gate, up, dh, dgate, dup):
    """Writes silu_mul's gradients into dgate, dup (row-strided views, e.g. the halves of one buffer)."""
    g2, sg = _rows(gate)
    u2, su = _rows(up)
    dh2, sdh = _rows(dh.contiguous())
    dg2, sdg = _rows(dgate)
    du2, sdu = _rows(dup)
    if g2.numel():
        _swiglu_backward_kernel[_grid(*g2.shape)](g2, u2, dh2, dg2, du2, g2.shape[1], sg, su, sdh, sdg, sdu,
                                                  GPU=not interpret.INTERPRET, BLOCK=BLOCK, num_warps=4)


class SiluMul(torch.autograd.Function):
    """silu(gate) * up for two tensors (the dense MLP's two GEMM outputs)."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return swiglu_forward(gate, up)

    @staticmethod
    def backward(ctx, dh):
        gate, up = ctx.saved_tensors
        dgate, dup = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (gate, up))  # contiguous
        swiglu_backward(gate, up, dh, dgate, dup)
        return dgate, dup


class SwiGLU(torch.autograd.Function):
    """silu(gate) * up of one [gate | up] tensor (..., 2I); its gradient written as one [dgate | dup] tensor."""

    @staticmethod
    def forward(ctx, gate_up):
        ctx.save_for_backward(gate_up)
        return swiglu_forward(*gate_up.chunk(2, dim=-1))

    @staticmethod
    def backward(ctx, dh):
        (gate_up,) = ctx.saved_tensors
        d = torch.empty(gate_up.shape, dtype=gate_up.dtype, device=gate_up.device)  # contiguous: halves are views
        swiglu_backward(*gate_up.chunk(2, dim=-1), dh, *d.chunk(2, dim=-1))
        return d

"""The grouped W4A4 GEMM with the activation quantizer fused into its prologue (kernels/quant_prologue.py) against the
unfused path — the separate quantize pass (`quantize_triton(..., emit_dq=True)`) then `grouped.grouped_gemm` — with
the same tile config: outputs and S_dec bit for bit (atol=0, rtol=0), RNE and SR, exact and fast, per-row /
per-expert / static global scales.

CPU: the kernels run under TRITON_INTERPRET=1 (tiny shapes: uneven segments, an empty expert, zero pad rows, a K
that is not a multiple of BLOCK_K, an N that is not one of BLOCK_N). GPU (`-m gpu`): the same checks compiled.
"""
from __future__ import annotations

import os

import pytest
import torch

from minite_core.kernels import dispatch
from minite_core.kernels import grouped as GG
from minite_core.kernels.grouped import grouped_gemm_quant
from minite_core.kernels.operands import DqOperand
from minite_core.kernels.quantize import quantize_triton, row_amax
from minite_core.profiles import Quant, get_profile

CUDA = torch.cuda.is_available()
# conftest sets TRITON_INTERPRET=1 without a GPU before anything imports triton
cpu_kernels = pytest.mark.skipif(not (os.environ.get("TRITON_INTERPRET") == "1" or CUDA),
                                 reason="needs a CUDA GPU or TRITON_INTERPRET=1 (set by conftest)")
DEV = "cuda" if CUDA else "cpu"
# rows of 4 experts: 10 + 6 pad, none, 20 + 12 pad, 5 + 11 pad (16-aligned segment starts, as nn.moe_layout)
OFFS = [0, 16, 16, 48, 64]
REAL = [(0, 10), (16, 36), (48, 53)]


def _layout_input(k, dtype, seed=0):
    """x (64, k): rows of varied amax, zero pad rows, the rounding ties and an all-zero block in expert 0's first
    row; the rows' expert and expert-local index."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, k, generator=g) * torch.rand(64, 1, generator=g).mul(10).exp2()
    real = torch.zeros(64, 1, dtype=torch.bool)
    for s, t in REAL:
        real[s:t] = True
    x = x * real
    x[0, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1, -0.0, 6.0, 7.0, 1e-30, -3.5, 0.5, 1, 2])
    x[1, 16:32] = 0.0
    offs = torch.tensor(OFFS)
    rows = torch.arange(64)
    expert = torch.searchsorted(offs[1:], rows, right=True)
    return x.to(dtype).to(DEV), offs.to(DEV), expert.to(DEV), (rows - offs[expert]).to(DEV)


def _weights(n, k, row_scales=False, seed=10):
    w = torch.randn(4 * n, k, generator=torch.Generator().manual_seed(seed)).to(DEV)
    t, dq = quantize_triton(w, scale_mode="row" if row_scales else "tensor", emit_dq=True)
    s = t.global_scale.view(4, n, 1) if row_scales else torch.tensor([0.5, 1.0, 3.0, 0.25], device=DEV)
    return DqOperand(dq.view(4, n, k), s)


def _unfused(x, amax, W, offs, math, rounding, seg_seed, config, schedule=None):
    mode = "tensor" if amax.ndim == 0 else "row"
    t, dq = quantize_triton(x, scale_mode=mode, amax=amax, math=math, rounding=rounding, seg_seed=seg_seed,
                            emit_dq=True, check=False)
    return GG.grouped_gemm(DqOperand(dq, t.global_scale), W, offs, torch.float32, config=config,
                           schedule=schedule), t.global_scale


def _equal(a, b):
    torch.testing.assert_close(a.cpu(), b.cpu(), atol=0, rtol=0, equal_nan=True)


SMALL = None if CUDA else GG.SMALL
CASES = [(math, rounding, scale, dtype)
         for math in ("exact", "fast") for rounding in ("rne", "sr") for scale, dtype in
         (("row", torch.bfloat16), ("expert", torch.float32), ("static", torch.bfloat16))]


@cpu_kernels
@pytest.mark.parametrize("math,rounding,scale,dtype", CASES)
def test_fused_equals_separate_quantize_then_grouped_gemm(math, rounding, scale, dtype):
    """The forward's and dgrad's operands of every grouped profile: per-token (minite), per-expert dynamic
    (te-nvfp4, gradients), static (vllm-nvfp4); K = 48 is 1.5 BLOCK_Ks (a masked tail), N = 40 not a BLOCK_N
    multiple."""
    x, offs, expert, local = _layout_input(48, dtype)
    W = _weights(40, 48, row_scales=scale == "static")
    if scale == "row":
        amax = row_amax(x)
    elif scale == "expert":
        seg = torch.zeros(4, device=DEV).scatter_reduce(0, expert, row_amax(x), "amax")
        amax = seg[expert]
    else:
        amax = torch.tensor(300.0, device=DEV)  # calibrated: some rows saturate at 6 * 448
    seeds = torch.tensor([5, 2**40 + 3, 7, 9], device=DEV)[expert]
    seg_seed = (seeds, local) if rounding == "sr" else None
    y_ref, s_ref = _unfused(x, amax, W, offs, math, rounding, seg_seed, SMALL)
    y, s = grouped_gemm_quant(x, amax, W, offs, torch.float32, math=math, rounding=rounding, seg_seed=seg_seed,
                              config=SMALL)
    assert y_ref.abs().amax() > 0
    _equal(y, y_ref)
    _equal(s, s_ref)
    if rounding == "sr":  # the draws matter: other seeds give other codes
        y2, _ = grouped_gemm_quant(x, amax, W, offs, torch.float32, math=math, rounding="sr",
                                   seg_seed=(seeds + 1, local), config=SMALL)
        assert not torch.equal(y2, y)


@cpu_kernels
def test_fused_invariant_dot_filler_and_non_finite_rows():
    """ROW_DOT (minite-onpolicy's dot), the `live` schedule (decode: the filler gets no tile, zero outputs, S_dec
    1), and a row holding Inf and one holding NaN: NaN where the unfused path has NaN, bit for bit elsewhere."""
    x, offs, _, _ = _layout_input(64, torch.bfloat16, seed=3)
    W = _weights(24, 64)
    amax = row_amax(x)
    cfg = dict(SMALL or GG.GROUPED_CONFIG, ROW_DOT=True)
    sched = GG.grouped_schedule(offs, cfg["BLOCK_M"], 64, torch.tensor([48], device=DEV), routed=35)
    y_ref, s_ref = _unfused(x, amax, W, offs, "exact", "rne", None, cfg, sched)
    y, s = grouped_gemm_quant(x, amax, W, offs, torch.float32, config=cfg, schedule=sched)
    _equal(y, y_ref)
    assert not y[48:].any() and torch.equal(s[48:].cpu(), torch.ones(16, 1))
    _equal(s[:48], s_ref[:48])
    x[3, 5], x[17, 40] = float("inf"), float("nan")
    amax = row_amax(x)
    y_ref, s_ref = _unfused(x, amax, W, offs, "exact", "rne", None, SMALL)
    y, s = grouped_gemm_quant(x, amax, W, offs, torch.float32, config=SMALL)
    _equal(y, y_ref)
    _equal(s, s_ref)
    assert y[3].isnan().all() and y[17].isnan().all() and s[3].isnan() and y[0].isfinite().all()


@cpu_kernels
def test_dispatch_entry_and_specs():
    assert dispatch.grouped_quant_spec(Quant()) and dispatch.grouped_quant_spec(Quant(rounding="sr", math="fast"))
    assert not dispatch.grouped_quant_spec(Quant(block=(16, 16)))
    assert not dispatch.grouped_quant_spec(Quant(four_over_six="mae")) and not dispatch.grouped_quant_spec(None)
    x, offs, _, _ = _layout_input(32, torch.float32)
    W = _weights(16, 32)
    with pytest.raises(RuntimeError, match="fast path"):
        dispatch.grouped_gemm_quant(x.cpu(), Quant(), row_amax(x).cpu(), W, offs.cpu(), backend="reference")
    with pytest.raises(ValueError, match="seg_seed"):
        grouped_gemm_quant(x, row_amax(x), W, offs, rounding="sr")

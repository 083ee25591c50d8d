"""The W4A4 GEMMs with the activation quantizer fused into their prologue (kernels/quant_prologue.py) against the
unfused path — the separate quantize pass (`quantize_triton(..., emit_dq=True)`) then the same Triton GEMM
(`grouped.grouped_gemm`, `gemm.gemm_triton`) with the same tile config: outputs and S_dec bit for bit (atol=0,
rtol=0), RNE and SR, exact and fast, per-row / per-expert / per-tensor / static global scales; the wgrad's dyᵀ
quantized along tokens in the K-grouped GEMM's prologue (`kgrouped_gemm_quant`) against the separate along-token
pass (`quantize_cols_triton(..., emit_dq=True)`) + `grouped.kgrouped_gemm`, with and without TE's RHT; then the MoE
layer and a whole learner step with the fused path on and off.

CPU: the kernels run under TRITON_INTERPRET=1 (tiny shapes: uneven segments, an empty expert, zero pad rows, a K
that is not a multiple of BLOCK_K, an N that is not one of BLOCK_N). GPU: the same tests compiled.
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


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("math,rounding,scale", [(m, r, s) for m in ("exact", "fast") for r in ("rne", "sr")
                                                 for s in ("row", "expert", "static")])
def test_gpu_fused_equals_separate_at_the_learner_tile(math, rounding, scale):
    """Compiled, at the learner's tile config (GROUPED_CONFIG) and a shape with uneven expert segments (one
    empty, one past a tile): the fused prologue against the separate pass + the same GEMM, bit for bit."""
    torch.manual_seed(0)
    counts = torch.tensor([300, 0, 17, 129, 1, 256, 64, 90])
    starts = torch.cat([torch.zeros(1, dtype=torch.long), ((counts + 15) // 16 * 16).cumsum(0)])
    rows = int(starts[-1])
    k, n = 512, 384
    expert = torch.searchsorted(starts[1:], torch.arange(rows), right=True)
    local = torch.arange(rows) - starts[expert]
    real = (local < counts[expert]).unsqueeze(1)
    x = (torch.randn(rows, k) * torch.rand(rows, 1).mul(8).exp2() * real).to(DEV, torch.bfloat16)
    offs, expert, local = starts.to(DEV), expert.to(DEV), local.to(DEV)
    w = torch.randn(8 * n, k, device=DEV)
    t, dq = quantize_triton(w, scale_mode="tensor", emit_dq=True)
    W = DqOperand(dq.view(8, n, k), torch.rand(8, device=DEV) + 0.5)
    if scale == "row":
        amax = row_amax(x)
    elif scale == "expert":
        amax = torch.zeros(8, device=DEV).scatter_reduce(0, expert, row_amax(x), "amax")[expert]
    else:
        amax = torch.tensor(40.0, device=DEV)
    seg_seed = ((torch.arange(8, device=DEV) * 7919 + 3)[expert], local) if rounding == "sr" else None
    y_ref, s_ref = _unfused(x, amax, W, offs, math, rounding, seg_seed, None)
    y, s = grouped_gemm_quant(x, amax, W, offs, torch.float32, math=math, rounding=rounding, seg_seed=seg_seed)
    _equal(y, y_ref)
    _equal(s, s_ref)


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
def test_dispatch_entries_and_specs():
    assert dispatch.fused_quant_spec(Quant()) and dispatch.fused_quant_spec(Quant(rounding="sr", math="fast"))
    assert not dispatch.fused_quant_spec(Quant(block=(16, 16)))
    assert not dispatch.fused_quant_spec(Quant(four_over_six="mae")) and not dispatch.fused_quant_spec(None)
    x, offs, _, _ = _layout_input(32, torch.float32)
    W = _weights(16, 32)
    with pytest.raises(RuntimeError, match="fast path"):
        dispatch.grouped_gemm_quant(x.cpu(), Quant(), row_amax(x).cpu(), W, offs.cpu(), backend="reference")
    with pytest.raises(ValueError, match="seg_seed"):
        grouped_gemm_quant(x, row_amax(x), W, offs, rounding="sr")
    # dense: what `gemm(invariant=True)` computes on the separate pass's operand (minite-onpolicy's linears)
    act = get_profile("minite").activation
    B = DqOperand(W.values_bf16[0], W.global_scale[0])
    with dispatch.using_backend("triton"):
        _, x_op = dispatch.quantize_dq(x, act, check=False)
        y, s = dispatch.gemm_quant(x, act, row_amax(x), B, torch.float32, invariant=True)
        _equal(y, dispatch.gemm(x_op, B, torch.float32, invariant=True))
        _equal(s, x_op.global_scale)


# ---- the wgrad (K-grouped) GEMM: dyᵀ quantized along tokens in its prologue --------------------------------------
def _wgrad_operands(n, k, dtype=torch.bfloat16, seed=0, pads=False):
    """dy (64, n) on OFFS's layout (zero pad rows unless `pads`; an all-zero 16-token block of one channel), the
    saved x operand as the kernel reads it (bf16 [k, 64], its S_dec per expert), per-token SR streams and the
    16-token blocks' experts."""
    dy, offs, expert, local = _layout_input(n, torch.float32, seed)
    if pads:  # pad rows holding values: the separate pass quantizes them too, with the same streams
        dy = dy + torch.randn(64, n, generator=torch.Generator().manual_seed(seed + 1)).to(DEV) * (dy == 0)
    dy[16:32, 3] = 0.0
    xt = torch.randn(k, 64, generator=torch.Generator().manual_seed(seed + 2)).to(DEV, torch.bfloat16)
    s_xt = torch.tensor([0.5, 1.0, 3.0, 0.25], device=DEV)
    seg_seed = (torch.tensor([5, 2**40 + 3, 7, 9], device=DEV)[expert], local)
    return dy.to(dtype), xt, s_xt, offs, seg_seed, expert[::16].contiguous()


def _wgrad_separate(dy, amax, xt, s_xt, offs, block_expert, math, rounding, seg_seed, rht, config):
    """What nn.experts runs without fused_quant: `quantize_cols_triton` emitting dyᵀ's bf16 copy (per-block amax
    = its expert's), then `kgrouped_gemm` with S_dec = decode_scale(amax)."""
    from minite_core.kernels.quantize import decode_scale
    from minite_core.kernels.quantize_cols import quantize_cols_triton

    _, dq = quantize_cols_triton(dy, col_amax=amax[block_expert], math=math, rounding=rounding,
                                 seg_seed=seg_seed if rounding == "sr" else None, rht=rht is not None,
                                 rht_dtype=rht or "float32", emit_dq=True, check=False)
    s_dec = decode_scale(amax)
    return GG.kgrouped_gemm(dq, s_dec, xt, s_xt, offs, config=config), s_dec


def _wgrad_amax(dy, block_expert, rht):
    from minite_core.kernels.quantize_cols import col_block_amax

    blocks = col_block_amax(dy, rht=rht is not None, rht_dtype=rht or "float32")
    return torch.zeros(4, device=DEV).scatter_reduce(0, block_expert, blocks, "amax")


SMALL_K = None if CUDA else GG.SMALL_K
WGRAD_CASES = [(math, rounding, rht) for math in ("exact", "fast") for rounding in ("rne", "sr")
               for rht in (None, "float32", "bfloat16")]


@cpu_kernels
@pytest.mark.parametrize("math,rounding,rht", WGRAD_CASES)
def test_fused_wgrad_equals_separate_quantize_cols_then_kgrouped_gemm(math, rounding, rht):
    """The wgrad's dyᵀ operand of both recipes — SR exact without RHT (minite), SR exact with RHT rounded to bf16
    (te-nvfp4) — and every other quantizer setting: `kgrouped_gemm_quant` against the separate along-token pass +
    `kgrouped_gemm`, bit for bit, per-expert scales, an empty expert, N = 40 and K = 48 not tile multiples; with a
    tile of two 16-token blocks too (the first expert's tile runs past its segment into the next)."""
    dy, xt, s_xt, offs, seg_seed, block_expert = _wgrad_operands(40, 48)
    amax = _wgrad_amax(dy, block_expert, rht)
    seg_seed = seg_seed if rounding == "sr" else None
    for cfg in (SMALL_K, None if CUDA else dict(GG.SMALL_K, BLOCK_T=32)):
        c_ref, s_ref = _wgrad_separate(dy, amax, xt, s_xt, offs, block_expert, math, rounding, seg_seed, rht, cfg)
        c, s = GG.kgrouped_gemm_quant(dy, amax, xt, s_xt, offs, math=math, rounding=rounding, seg_seed=seg_seed,
                                      rht=rht is not None, rht_dtype=rht or "float32", config=cfg)
        assert c_ref.abs().amax() > 0
        _equal(c, c_ref)
        _equal(s, s_ref)
    if rounding == "sr":  # the draws matter: other seeds give other values
        c2, _ = GG.kgrouped_gemm_quant(dy, amax, xt, s_xt, offs, math=math, rounding="sr",
                                       seg_seed=(seg_seed[0] + 1, seg_seed[1]), rht=rht is not None,
                                       rht_dtype=rht or "float32", config=SMALL_K)
        assert not torch.equal(c2, c)


@cpu_kernels
@pytest.mark.parametrize("rht", [None, "bfloat16"])
def test_fused_wgrad_pad_rows_fp32_and_non_finite(rht):
    """Pad rows holding values (the separate pass quantizes them with the same streams), an fp32 dy, and a token
    holding Inf and one holding NaN: NaN where the separate path has NaN (the expert's S_dec and its whole dW
    slice), bit for bit elsewhere."""
    dy, xt, s_xt, offs, seg_seed, block_expert = _wgrad_operands(24, 40, seed=4, pads=True)
    for x in (dy, dy.float()):
        amax = _wgrad_amax(x, block_expert, rht)
        c_ref, s_ref = _wgrad_separate(x, amax, xt, s_xt, offs, block_expert, "exact", "sr", seg_seed, rht, SMALL_K)
        c, s = GG.kgrouped_gemm_quant(x, amax, xt, s_xt, offs, rounding="sr", seg_seed=seg_seed,
                                      rht=rht is not None, rht_dtype=rht or "float32", config=SMALL_K)
        _equal(c, c_ref)
        _equal(s, s_ref)
    dy[20, 5], dy[50, 7] = float("inf"), float("nan")
    amax = _wgrad_amax(dy, block_expert, rht)
    c_ref, s_ref = _wgrad_separate(dy, amax, xt, s_xt, offs, block_expert, "exact", "rne", None, rht, SMALL_K)
    c, s = GG.kgrouped_gemm_quant(dy, amax, xt, s_xt, offs, rht=rht is not None, rht_dtype=rht or "float32",
                                  config=SMALL_K)
    _equal(c, c_ref)
    _equal(s, s_ref)
    assert s[2].isnan() and s[3].isnan() and c[2:].isnan().all() and c[0].isfinite().all()


@cpu_kernels
def test_fused_wgrad_dispatch_and_checks():
    dy, xt, s_xt, offs, seg_seed, block_expert = _wgrad_operands(16, 32)
    amax = _wgrad_amax(dy, block_expert, None)
    grad = get_profile("minite").grad
    with dispatch.using_backend("triton"):
        c, s = dispatch.kgrouped_gemm_quant(dy, grad, amax, xt, s_xt, offs, seg_seed=seg_seed)
    c_ref, s_ref = _wgrad_separate(dy, amax, xt, s_xt, offs, block_expert, "exact", "sr", seg_seed, None, None)
    _equal(c, c_ref)
    _equal(s, s_ref)
    with pytest.raises(RuntimeError, match="fast path"):
        dispatch.kgrouped_gemm_quant(dy.cpu(), grad, amax.cpu(), xt.cpu(), s_xt.cpu(), offs.cpu(),
                                     backend="reference")
    with pytest.raises(ValueError, match="seg_seed"):
        GG.kgrouped_gemm_quant(dy, amax, xt, s_xt, offs, rounding="sr")
    with pytest.raises(ValueError, match="one per expert"):
        GG.kgrouped_gemm_quant(dy, amax[:3], xt, s_xt, offs)
    with pytest.raises(ValueError, match="Tp % 16"):
        GG.kgrouped_gemm_quant(dy[:40], amax, xt, s_xt, offs)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("math,rounding,rht", [("exact", "sr", None), ("exact", "sr", "bfloat16"),
                                               ("exact", "rne", None), ("fast", "sr", "float32")])
def test_gpu_fused_wgrad_equals_separate_at_the_learner_tile(math, rounding, rht):
    """Compiled, at the learner's wgrad tile (KGROUPED_CONFIG) and a shape with uneven expert segments (one empty,
    several past a BLOCK_T tile, N and K not tile multiples): the fused dyᵀ prologue against the separate
    along-token pass + the same K-grouped GEMM, bit for bit — minite's and te-nvfp4's gradient specs first."""
    torch.manual_seed(0)
    counts = torch.tensor([300, 0, 17, 129, 1, 256, 64, 90])
    starts = torch.cat([torch.zeros(1, dtype=torch.long), ((counts + 15) // 16 * 16).cumsum(0)])
    rows = int(starts[-1])
    n, k = 384 + 16, 512 + 48
    expert = torch.searchsorted(starts[1:], torch.arange(rows), right=True)
    local = torch.arange(rows) - starts[expert]
    real = (local < counts[expert]).unsqueeze(1)
    dy = (torch.randn(rows, n) * torch.rand(rows, 1).mul(8).exp2() * real).to(DEV, torch.bfloat16)
    xt = (torch.randn(k, rows) * real.t()).to(DEV, torch.bfloat16)
    s_xt = torch.rand(8, device=DEV) + 0.5
    offs, expert, local = starts.to(DEV), expert.to(DEV), local.to(DEV)
    block_expert = expert[::16].contiguous()
    from minite_core.kernels.quantize_cols import col_block_amax

    blocks = col_block_amax(dy, rht=rht is not None, rht_dtype=rht or "float32")
    amax = torch.zeros(8, device=DEV).scatter_reduce(0, block_expert, blocks, "amax")
    seg_seed = ((torch.arange(8, device=DEV) * 7919 + 3)[expert], local) if rounding == "sr" else None
    c_ref, s_ref = _wgrad_separate(dy, amax, xt, s_xt, offs, block_expert, math, rounding, seg_seed, rht, None)
    c, s = GG.kgrouped_gemm_quant(dy, amax, xt, s_xt, offs, math=math, rounding=rounding, seg_seed=seg_seed,
                                  rht=rht is not None, rht_dtype=rht or "float32")
    _equal(c, c_ref)
    _equal(s, s_ref)


# ---- the dense GEMM ----------------------------------------------------------------------------------------------
DENSE = [("row", "rne", "exact"), ("tensor", "rne", "fast"), ("static", "rne", "exact"), ("tensor", "sr", "exact"),
         ("tensor", "sr", "fast")]


@cpu_kernels
@pytest.mark.parametrize("scale,rounding,math", DENSE)
def test_dense_fused_equals_separate_quantize_then_triton_gemm(scale, rounding, math):
    """`gemm_triton_quant` vs `quantize_triton` (dynamic amax computed by the quantizer itself) + `gemm_triton`: the
    fprop's per-token / per-tensor / static operands and dgrad's SR one at a shard's sr_origin row; M = 20 and N = 24
    not tile multiples, K = 48 a masked tail. Batch-invariant config (the GEMM `gemm(invariant=True)` runs) too."""
    from minite_core.kernels import gemm as G

    x, _, _, _ = _layout_input(48, torch.bfloat16, seed=5)
    x = x[:20].contiguous()
    b = _weights(6, 48, row_scales=True)
    B = DqOperand(b.values_bf16.reshape(24, 48), b.global_scale.reshape(24, 1))
    seed, row0 = (11, 32) if rounding == "sr" else (None, 0)
    amax = {"row": row_amax(x), "tensor": row_amax(x).amax(), "static": torch.tensor(40.0, device=DEV)}[scale]
    mode = "row" if scale == "row" else "tensor"
    t, dq = quantize_triton(x, scale_mode=mode, amax=None if scale != "static" else amax, math=math,
                            rounding=rounding, seed=seed, sr_origin=(row0, 0), emit_dq=True)
    for cfg in ((dict(GG.SMALL, GROUP_M=2) if not CUDA else None), G.INVARIANT_CONFIG):
        y_ref = G.gemm_triton(DqOperand(dq, t.global_scale), B, torch.float32, config=cfg)
        y, s = G.gemm_triton_quant(x, amax, B, torch.float32, math=math, rounding=rounding, seed=seed, sr_row0=row0,
                                   config=cfg)
        assert y_ref.abs().amax() > 0
        _equal(y, y_ref)
        _equal(s, t.global_scale)


# ---- the MoE layer and the learner: fused on vs off, bit for bit ------------------------------------------------
GROUPED_PROFILES = ["minite", "te-nvfp4", "vllm-nvfp4", "minite-onpolicy"]


def _layer_outputs(mod, x, layout, fused):
    mod.fused_quant = fused
    mod.weight_cache.clear()
    mod.weight.grad = None
    xi = x.detach().requires_grad_(mod.profile.can_learn)
    y = mod(xi, layout)
    if not mod.profile.can_learn:
        return (y.detach(),)
    (y.float() * torch.linspace(-1, 1, y.shape[1], device=y.device)).sum().backward()
    return y.detach(), xi.grad, mod.weight.grad


@cpu_kernels
@pytest.mark.parametrize("name", GROUPED_PROFILES)
def test_grouped_linear_fused_quant_is_bitwise_the_separate_pass(name, one_thread, monkeypatch):
    """GroupedLinear on the fast path with `fused_quant` on and off: y, dx and dW equal bit for bit (atol=0), over
    routings with empty experts, a single token, and every token on one expert; on, the forward, dgrad and wgrad
    GEMMs are the fused ones (wgrad's dyᵀ: SR, and for te-nvfp4 the RHT rounded to bf16)."""
    from minite_core.nn import GroupedLinear
    from minite_core.nn.moe_layout import moe_layout, permute

    calls = []
    fused_gemm, fused_wgrad = dispatch.grouped_gemm_quant, dispatch.kgrouped_gemm_quant
    monkeypatch.setattr(dispatch, "grouped_gemm_quant", lambda *a, **kw: calls.append(a[1]) or fused_gemm(*a, **kw))
    monkeypatch.setattr(dispatch, "kgrouped_gemm_quant",
                        lambda *a, **kw: calls.append(("wgrad", a[1])) or fused_wgrad(*a, **kw))

    with dispatch.using_backend("triton"):
        g = GroupedLinear(4, 32, 48)
        torch.nn.init.normal_(g.weight, std=0.1)
        g.to(DEV)
        g.profile, g.seed = get_profile(name), 77
        if g.profile.needs_calibration:
            g.input_amax = torch.tensor(2.5, device=DEV)
        for top in (torch.tensor([[2]]), torch.full((20, 1), 3), torch.tensor([[0, 3], [3, 1]] * 5)):
            layout = moe_layout(top.to(DEV), 4)
            x = torch.randn(top.shape[0], 32, generator=torch.Generator().manual_seed(top.numel()))
            x = permute(x.to(DEV, torch.bfloat16), layout)
            calls.clear()
            sut = _layer_outputs(g, x, layout, True)
            grad = g.profile.grad
            fused = [g.profile.activation] + ([grad, ("wgrad", grad)] if g.profile.can_learn else [])
            assert calls == fused
            ref = _layer_outputs(g, x, layout, False)
            assert calls == fused  # off: the separate pass only
            for what, a, b in zip(("y", "dx", "dw"), sut, ref):
                assert torch.equal(a, b), f"{name} {what} {tuple(top.shape)}"


@cpu_kernels
@pytest.mark.parametrize("name", ["minite", "te-nvfp4"])
def test_learner_step_bitwise_with_fused_quant(name, one_thread, monkeypatch):
    """A whole learner step of a tiny MoE model on the fast path: loss and every gradient bit for bit with the
    expert GEMMs' quantizers — forward, dgrad and wgrad — fused and separate."""
    import torch.nn.functional as F

    from minite_core.model import PRESETS, CausalLM, set_profile
    from minite_core.nn import GroupedLinear, QuantLinear

    cfg = PRESETS["tiny-moe"].replace(num_hidden_layers=2, mlp_only_layers=())
    model = CausalLM(cfg).init_weights(0).to(DEV)
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1)).to(DEV)
    outs, wgrads = [], []
    fused_wgrad = dispatch.kgrouped_gemm_quant
    monkeypatch.setattr(dispatch, "kgrouped_gemm_quant", lambda *a, **kw: wgrads.append(1) or fused_wgrad(*a, **kw))
    with dispatch.using_backend("triton"):
        set_profile(model, name)
        for fused in (True, False):
            for j, m in enumerate(m for m in model.modules() if isinstance(m, (QuantLinear, GroupedLinear))):
                m.seed = 1000 + j
                m.weight_cache.clear()
                if isinstance(m, GroupedLinear):
                    m.fused_quant = fused
            model.zero_grad(set_to_none=True)
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
            loss.backward()
            outs.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    assert len(wgrads) == 2 * cfg.num_hidden_layers  # gate_up and down of every MoE layer, fused run only
    (loss_sut, g_sut), (loss_ref, g_ref) = outs
    assert torch.equal(loss_sut, loss_ref)
    assert set(g_sut) == set(g_ref) and all(torch.equal(g_sut[n], g_ref[n]) for n in g_ref)

"""Kernels vs the plain torch reference (`minite_core.formats`).

CPU: the Triton kernels run under TRITON_INTERPRET=1 (set here before triton is first imported; when another
test module imported triton earlier without it, the interpreter tests skip with that reason). Tiny shapes —
the interpreter is slow on 2 cores. GPU (`-m gpu`): the same checks compiled for CUDA, larger shapes.
Codes and scales: atol=0. GEMM outputs: relative error against an fp32 reference, within TOL (fp32
accumulation order only — the products are exact in bf16).
"""
from __future__ import annotations

import itertools
import os
import sys

import pytest
import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")
tl = triton.language
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = torch.cuda.is_available()
cpu_kernels = pytest.mark.skipif(not (INTERPRETED or CUDA),
                                 reason="triton imported before this module without TRITON_INTERPRET=1 and no GPU")
gpu = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")]

from minite_core.formats import nvfp4 as ref  # noqa: E402
from minite_core.formats.e2m1 import e2m1_encode_sr  # noqa: E402
from minite_core.formats.swizzle import unswizzle_scales  # noqa: E402
from minite_core.formats.rht import rht as rht_ref  # noqa: E402
from minite_core.kernels import dispatch, native  # noqa: E402
from minite_core.kernels import gemm as G  # noqa: E402
from minite_core.kernels import grouped as GG  # noqa: E402
from minite_core.kernels import reference as R  # noqa: E402
from minite_core.kernels.decode import decode_gemm_triton  # noqa: E402
from minite_core.kernels.operands import DqOperand  # noqa: E402
from minite_core.kernels.quantize import _sr_magnitude, block_amax, quantize_triton, row_amax  # noqa: E402
from minite_core.kernels.reference import decode_gemm_reference, quantize_reference  # noqa: E402
from minite_core.profiles import Quant  # noqa: E402

TOL = {"gemm_rel": 1e-5}  # fp32 accumulation-order differences on K <= 4096 with exact products

DEV = "cuda" if CUDA else "cpu"
COMBOS = list(itertools.product([(1, 16), (16, 16)], ["tensor", "row"], ["exact", "fast"], [None, 3.0],
                                [False, True], [torch.float32, torch.bfloat16]))


def _same(t_sut, t_ref, dq_sut=None, dq_ref=None):
    assert torch.equal(t_sut.data.cpu(), t_ref.data.cpu()), "codes differ"
    assert torch.equal(t_sut.scale.view(torch.uint8).cpu(), t_ref.scale.view(torch.uint8).cpu()), "scales differ"
    assert torch.equal(t_sut.global_scale.cpu(), t_ref.global_scale.cpu()), "global scales differ"
    if dq_sut is not None:
        assert torch.equal(dq_sut.cpu(), dq_ref.cpu()), "bf16 dequantized copy differs"


def _input(m, k, dtype, seed=0, device=DEV):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g).mul(8).exp2()  # rows of varied amax
    x[0, :16] = 0.0  # an all-zero block
    if m > 1:
        x[1, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1, -0.0, 6.0, 7.0, 1e-30, -3.5, 0.5, 1, 2])
    if m > 2:
        x[2] = 0.0  # an all-zero row (amax 0 -> S_enc 1)
    return x.to(dtype).to(device)


@cpu_kernels
@pytest.mark.parametrize("block,mode,math,amax,rht,dtype", COMBOS)
def test_quantize_bitexact(block, mode, math, amax, rht, dtype):
    x = _input(32, 48, dtype)
    t_sut, dq_sut = quantize_triton(x, block=block, scale_mode=mode, math=math, amax=amax, rht=rht, emit_dq=True)
    t_ref, dq_ref = quantize_reference(x.cpu(), block=block, scale_mode=mode, math=math, amax=amax, rht=rht,
                                       emit_dq=True)
    _same(t_sut, t_ref, dq_sut, dq_ref)


@cpu_kernels
@pytest.mark.parametrize("m,k", [(1, 16), (3, 16), (5, 80), (17, 272)])
def test_quantize_odd_shapes(m, k):
    x = _input(m, k, torch.float32, seed=m)
    for mode in ("tensor", "row"):
        _same(quantize_triton(x, scale_mode=mode)[0], quantize_reference(x.cpu(), scale_mode=mode)[0])
    _same(quantize_triton(x, block_k=32)[0], quantize_reference(x.cpu())[0])  # several K tiles + masked tail


@cpu_kernels
@pytest.mark.parametrize("mode,rounding,rht", [("row", "rne", False), ("tensor", "sr", False), ("tensor", "rne", True),
                                               ("row", "rne", True)])
def test_quantize_prefetch_is_the_same_bits(mode, rounding, rht):
    """The loops that load a tile ahead (prefetch) give the default's bits: several K tiles and a masked tail."""
    x = _input(17, 272, torch.bfloat16, seed=3)
    kw = dict(scale_mode=mode, rounding=rounding, rht=rht, seed=5 if rounding == "sr" else None, emit_dq=True,
              block_k=32)
    t_sut, dq_sut = quantize_triton(x, prefetch=True, **kw)
    kw.pop("block_k")
    t_ref, dq_ref = quantize_reference(x.cpu(), **kw)
    _same(t_sut, t_ref, dq_sut, dq_ref)


@cpu_kernels
def test_quantize_edge_hand_cases():
    # static amax 2688 -> S_enc = 1, block amax 6 -> sf = 1: the values are their own scaled values
    x = torch.tensor([[0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1, -0.0, 6.0, 0.0, 0.5, 1.0, 2.0, 3.0, 4.0]])
    t, _ = quantize_triton(x.to(DEV), amax=2688.0)
    codes = torch.stack([t.data.cpu() & 15, t.data.cpu() >> 4], -1).flatten()
    assert codes.tolist() == [0, 2, 2, 4, 4, 6, 6, 8, 0, 7, 0, 1, 2, 4, 5, 6]
    # static amax below the data: saturates at 448 / code 7, never NaN
    y = torch.full((1, 16), 100.0)
    t, _ = quantize_triton(y.to(DEV), amax=1.0)
    assert t.scale.float().max().item() == 448.0 and (t.data.cpu() == 0x77).all()


@cpu_kernels
def test_quantize_rejects_like_reference():
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_triton(torch.zeros(4, 24, device=DEV))
    with pytest.raises(ValueError, match="16x16"):
        quantize_triton(torch.zeros(8, 32, device=DEV), block=(16, 16))
    with pytest.raises(ValueError, match="non-finite"):
        quantize_triton(torch.full((1, 16), float("nan"), device=DEV))
    with pytest.raises(ValueError, match="seed"):
        quantize_triton(torch.zeros(1, 16, device=DEV), rounding="sr")


@cpu_kernels
def test_stochastic_rounding_unbiased():
    # one block whose amax pins sf: values between grid points; E[dequant] must equal x
    m, k = 64, 64
    base = torch.tensor([0.3, 0.7, 1.1, 1.6, 2.2, 2.9, 3.3, 4.7, -0.3, -1.1, -2.2, -4.7, 0.1, 5.5, 0.0, 6.0])
    x = base.repeat(m, k // 16).to(DEV)
    acc = torch.zeros(m, k)
    n_seeds = 8
    for seed in range(n_seeds):
        t, _ = quantize_triton(x, rounding="sr", seed=seed, amax=2688.0)
        acc += ref.dequantize(ref.NVFP4Tensor(t.data.cpu(), t.scale.cpu(), t.global_scale.cpu()))
    mean = (acc / n_seeds).view(-1, 16).mean(0)  # 256 draws per value
    # binomial std of the mean <= 0.5 * gap / sqrt(256) = gap / 32 (gap <= 2): 4 sigma = 0.25
    assert torch.allclose(mean, base, atol=0.25), (mean, base)
    t0, _ = quantize_triton(x, rounding="sr", seed=0, amax=2688.0)
    t0b, _ = quantize_triton(x, rounding="sr", seed=0, amax=2688.0)
    t1, _ = quantize_triton(x, rounding="sr", seed=1, amax=2688.0)
    assert torch.equal(t0.data, t0b.data) and not torch.equal(t0.data, t1.data)  # seeded, reproducible


def _gemm_case(m, n, k, mode_a="row", mode_b="tensor", seed=0):
    a = _input(m, k, torch.float32, seed=seed)
    b = _input(n, k, torch.float32, seed=seed + 1)
    ta, da = quantize_triton(a, scale_mode=mode_a, emit_dq=True)
    tb, db = quantize_triton(b, scale_mode=mode_b, emit_dq=True)
    return ta, tb, DqOperand(da, ta.global_scale), DqOperand(db, tb.global_scale)


def _rel(y, yr):
    return ((y.double().cpu() - yr.double().cpu()).norm() / yr.double().cpu().norm()).item()


SMALL = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, num_warps=4, num_stages=1)


@cpu_kernels
@pytest.mark.parametrize("mode_a,mode_b", [("row", "tensor"), ("tensor", "tensor"), ("row", "row")])
def test_gemm_triton_matches_reference(mode_a, mode_b):
    ta, tb, A, B = _gemm_case(20, 24, 64, mode_a, mode_b)
    y = G.gemm_triton(A, B, torch.float32, config=None if CUDA else dict(SMALL, GROUP_M=2))
    assert _rel(y, R.gemm_reference(ta, tb)) < TOL["gemm_rel"]


def _experts(n, k, num, seed=10, mode="tensor"):
    ws = [quantize_triton(_input(n, k, torch.float32, seed=seed + e), scale_mode=mode, emit_dq=True) for e in range(num)]
    op = DqOperand(torch.stack([d for _, d in ws]), torch.stack([t.global_scale for t, _ in ws]))
    return [t for t, _ in ws], op


@cpu_kernels
def test_grouped_gemm_triton_matches_reference():
    ta, _, A, _ = _gemm_case(64, 8, 64)
    ws, W = _experts(24, 64, 4)
    offs = torch.tensor([0, 16, 16, 48, 64], device=DEV)  # an empty expert, a two-tile expert
    y = GG.grouped_gemm(A, W, offs, torch.float32, config=None if CUDA else GG.SMALL)
    assert _rel(y, R.grouped_gemm_reference(ta, ws, offs.cpu())) < TOL["gemm_rel"]


@cpu_kernels
def test_grouped_gemm_skips_the_filler_bitwise():
    """A schedule with `live` (MoELayout.live_rows) gives no tile to the last expert's filler rows and writes them
    as zeros: the same bits as the schedule over all of Tp, whose tiles compute those zeros."""
    ta, _, A, _ = _gemm_case(96, 8, 64)
    rows = torch.arange(96, device=DEV)[:, None]
    real = (rows < 10) | ((rows >= 16) & (rows < 36)) | ((rows >= 48) & (rows < 53))  # 10, 0, 20, 5 routed rows
    A = DqOperand(A.values_bf16 * real, A.global_scale)  # the layout's pad and filler rows are zeros
    _, W = _experts(24, 64, 4)
    offs = torch.tensor([0, 16, 16, 48, 96], device=DEV)
    live = torch.tensor([64], device=DEV)
    cfg = None if CUDA else GG.SMALL
    full = GG.grouped_gemm(A, W, offs, torch.float32, config=cfg)
    sched = GG.grouped_schedule(offs, (cfg or GG.GROUPED_CONFIG)["BLOCK_M"], 96, live, routed=35)
    assert sched.max_tiles < GG.grouped_schedule(offs, (cfg or GG.GROUPED_CONFIG)["BLOCK_M"], 96).max_tiles
    y = GG.grouped_gemm(A, W, offs, torch.float32, config=cfg, schedule=sched)
    assert torch.equal(y, full) and not y[64:].any()


@cpu_kernels
def test_grouped_schedule_kernel_equals_reference():
    """The one-launch tile schedule equals its torch reference entry by entry (tiles past num_tiles included), with
    and without `live`, over layouts of the MoE shapes: empty experts, one expert, E up to 256, tiles 16-128."""
    from minite_core.nn.moe_layout import moe_layout_reference, padded_rows

    g = torch.Generator().manual_seed(0)
    cases = [(1, 8, 64), (16, 8, 128), (3, 2, 8), (64, 2, 8), (7, 1, 1), (40, 4, 256), (512, 8, 128)]
    for n, k, e in cases:
        top = torch.randn(n, e, generator=g).topk(k, dim=1).indices
        lay = moe_layout_reference(top, e)
        offs, tp = lay.offs.to(DEV), padded_rows(n, k, e)
        live = ((lay.dest.amax() // 16 + 1) * 16).reshape(1).to(DEV)
        for bm in (16, 64, 128):
            for lv in (None, live):
                got = GG.grouped_schedule(offs, bm, tp, lv, n * k)
                want = GG.grouped_schedule_reference(offs, bm, tp, lv, n * k)
                assert got.max_tiles == want.max_tiles, (n, k, e, bm)
                for f in ("tile_expert", "tile_row", "num_tiles"):
                    a, b = getattr(got, f), getattr(want, f)
                    assert a.dtype == b.dtype and torch.equal(a, b), (n, k, e, bm, lv is not None, f)


@cpu_kernels
def test_kgrouped_gemm_matches_per_expert_reference():
    offs = torch.tensor([0, 32, 32, 48], device=DEV)  # expert 1 empty: its gradient is exactly zero
    a = _input(24, 48, torch.float32, seed=1)  # (N, Tp) along tokens
    b = _input(40, 48, torch.float32, seed=2)  # (K, Tp)
    segs = [(0, 32), (32, 32), (32, 48)]
    qa = [quantize_reference(a[:, s:t].cpu())[0] if t > s else None for s, t in segs]
    qb = [quantize_reference(b[:, s:t].cpu())[0] if t > s else None for s, t in segs]
    va = torch.cat([R.ref.dequantize_unscaled(q) for q in qa if q is not None], 1).to(torch.bfloat16)
    vb = torch.cat([R.ref.dequantize_unscaled(q) for q in qb if q is not None], 1).to(torch.bfloat16)
    sa = torch.stack([q.global_scale if q is not None else torch.tensor(1.0) for q in qa])
    sb = torch.stack([q.global_scale if q is not None else torch.tensor(1.0) for q in qb])
    c = GG.kgrouped_gemm(va.to(DEV), sa.to(DEV), vb.to(DEV), sb.to(DEV), offs, config=None if CUDA else GG.SMALL_K)
    assert torch.equal(c[1].cpu(), torch.zeros(24, 40))
    for e in (0, 2):
        assert _rel(c[e], R.ref.dequantize(qa[e]) @ R.ref.dequantize(qb[e]).t()) < TOL["gemm_rel"]


@cpu_kernels
def test_dequantize_and_amax_kernels_exact():
    x = _input(48, 80, torch.float32, seed=4)
    t, _ = quantize_triton(x)
    assert torch.equal(GG.dequantize_triton(t).float().cpu(), R.ref.dequantize_unscaled(t).cpu())
    xt = x.t()  # strided view: the along-token operands are read this way
    assert torch.equal(row_amax(xt, rht=True).cpu(), rht_ref(xt.contiguous().cpu()).abs().amax(1))
    assert torch.equal(block_amax(x, rht=True).cpu(), rht_ref(x.cpu()).abs().reshape(48, 5, 16).amax(dim=(0, 2)))


@cpu_kernels
def test_decode_scale_kernel_equals_reference():
    """S_dec = 1 / S_enc(amax) in one launch, bit for bit, edge values too: 0 (S_enc -> 1), subnormal amax (2688 /
    amax overflows, S_enc -> FLT_MAX), amax near FLT_MAX (S_enc subnormal), the tensor's [] shape and a vector's."""
    edge = torch.tensor([0.0, 1e-45, 1e-40, 1e-30, 1.4e-35, 0.5, 1.0, 3.0, 2688.0, 6.0 * 448, 1e30, 3.4e38])
    rand = torch.rand(3000, generator=torch.Generator().manual_seed(5)) * torch.logspace(-38, 38, 3000)
    for amax in (edge, rand, torch.tensor(7.25)):
        got = dispatch.decode_scale(amax.to(DEV), backend="triton").cpu()
        assert got.shape == amax.shape and torch.equal(got, ref.global_decode_scale(amax))


@cpu_kernels
@pytest.mark.parametrize("rht", [False, True])
def test_quantize_segments_equal_per_segment_reference(rht):
    """The MoE modes: per-row static amax (per-expert scales), per-16-column-block amax ("col-seg") and per-row /
    per-column SR streams give exactly the codes of quantizing each segment on its own with its own seed."""
    x = _input(48, 80, torch.float32, seed=6)
    seeds = torch.tensor([11, 2**40 + 22, 33], dtype=torch.int64)
    col_seg = [(0, 32), (32, 48), (48, 80)]  # column segments (tokens of 3 experts), 16-aligned
    col_e = torch.tensor([0] * 32 + [1] * 16 + [2] * 32)
    starts = torch.tensor([0, 32, 48])
    seg_amax = torch.stack([rht_ref(x[:, s:t]).abs().amax() if rht else x[:, s:t].abs().amax() for s, t in col_seg])
    for sr in (False, True):
        kw = dict(rounding="sr" if sr else "rne", rht=rht)
        t, _ = quantize_triton(x.to(DEV), col_amax=seg_amax[col_e[::16]].to(DEV),
                               seg_seed=(seeds[col_e].to(DEV), (torch.arange(80) - starts[col_e]).to(DEV)) if sr else None,
                               **kw)
        parts = [quantize_reference(x[:, s:t_].contiguous(), seed=int(seeds[e]) if sr else None, **kw)[0]
                 for e, (s, t_) in enumerate(col_seg)]
        assert torch.equal(t.data.cpu(), torch.cat([p.data for p in parts], 1))
        assert torch.equal(t.scale.view(torch.uint8).cpu(), torch.cat([p.scale.view(torch.uint8) for p in parts], 1))
    row_e = torch.tensor([0] * 16 + [1] * 32)
    amax = torch.stack([x[:16].abs().amax(), x[16:].abs().amax()])
    t, _ = quantize_triton(x.to(DEV), scale_mode="row", amax=amax[row_e].to(DEV), rounding="sr",
                           seg_seed=(seeds[row_e].to(DEV), (torch.arange(48) - torch.tensor([0, 16])[row_e]).to(DEV)))
    parts = [quantize_reference(x[s:e], rounding="sr", seed=int(seeds[i]))[0] for i, (s, e) in enumerate([(0, 16), (16, 48)])]
    _same(ref.NVFP4Tensor(t.data, t.scale, t.global_scale[:16, 0][0]), ref.NVFP4Tensor(
        torch.cat([p.data for p in parts]), torch.cat([p.scale for p in parts]), parts[0].global_scale))


@cpu_kernels
def test_sr_codes_equal_reference_philox_stream():
    x = _input(32, 64, torch.bfloat16, seed=8)
    for seed in (0, 7, 2**47 + 5):
        _same(quantize_triton(x, rounding="sr", seed=seed)[0], quantize_reference(x.cpu(), rounding="sr", seed=seed)[0])


@cpu_kernels
def test_sr_codes_at_the_grid_edges_equal_reference():
    """Stochastic rounding at every grid point, one ulp either side, the midpoints, subnormals and just below 6,
    with the scale 1 (static amax 2688, a 6 in every block): the codes of both Triton quantizers equal the
    reference's for several streams (the by-region `_sr_magnitude` against formats/e2m1.py's searchsorted)."""
    from minite_core.kernels.quantize_cols import quantize_cols_triton

    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    up, down = torch.nextafter(grid, torch.tensor(7.0)), torch.nextafter(grid, torch.tensor(-1.0)).clamp(min=0)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.999999, 1e-40, 1e-45, 0.1, 2.9999998, 3.9999998])
    vals = torch.cat([grid, up, down, mids])
    vals = torch.cat([vals, -vals])
    n = (len(vals) + 59) // 60 * 60  # whole rows of 4 blocks
    vals = torch.cat([vals, torch.rand(n - len(vals), generator=torch.Generator().manual_seed(1)) * 6])
    x = torch.cat([vals.view(-1, 15), torch.full((n // 15, 1), 6.0)], 1).reshape(-1, 64).repeat(8, 1)
    for seed in (0, 3, 2**40 + 1):
        want = quantize_reference(x, amax=2688.0, rounding="sr", seed=seed)[0]
        assert want.scale.float().eq(1.0).all()
        _same(quantize_triton(x.to(DEV), amax=2688.0, rounding="sr", seed=seed)[0], want)
        xt = x.t().contiguous().to(DEV)  # the along-token quantizer's xᵀ is x
        _same(quantize_cols_triton(xt, amax=torch.tensor(2688.0, device=DEV), rounding="sr", seed=seed)[0], want)


@triton.jit
def _sr_probe(a_ptr, u_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + i, mask=i < n, other=0.0)
    u = tl.load(u_ptr + i, mask=i < n, other=0.0)
    tl.store(out_ptr + i, _sr_magnitude(a, u), mask=i < n)


@cpu_kernels
def test_sr_magnitude_at_its_decision_boundaries():
    """The kernels' stochastic rounding decides as the reference at every draw that matters: for each magnitude
    (grid points, one ulp either side, midpoints, subnormals, just below 6), u = 0, u just below, at and just above
    the round-up probability, and u just below 1."""
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    a = torch.cat([grid, torch.nextafter(grid, torch.tensor(7.0)), torch.nextafter(grid[1:], torch.tensor(0.0)),
                   torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.999999, 1e-40, 1e-45, 0.1, 7.0])])
    vals = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    lo_idx = (torch.searchsorted(vals, a.clamp(max=6.0), right=True) - 1).clamp(0, 6)
    p_up = (a.clamp(max=6.0) - vals[lo_idx]) / (vals[lo_idx + 1] - vals[lo_idx])
    us = [torch.zeros_like(a), p_up, torch.nextafter(p_up, torch.tensor(-1.0)).clamp(min=0),
          torch.nextafter(p_up, torch.tensor(2.0)).clamp(max=0.99999994), torch.full_like(a, 0.99999994)]
    a, u = a.repeat(len(us)), torch.cat(us)
    out = torch.empty(len(a), dtype=torch.int32, device=DEV)
    _sr_probe[(1,)](a.to(DEV), u.to(DEV), out, len(a), BLOCK=triton.next_power_of_2(len(a)))
    want = e2m1_encode_sr(a, uniforms=u) & 7
    assert out.cpu().tolist() == want.int().tolist()


@cpu_kernels
def test_sr_origin_draws_the_full_tensors_stream():
    """A data-parallel shard quantized at its sr_origin with the global amax (nn.shard) has the full tensor's SR
    codes and scales, in both Triton quantizers, bit for bit with the reference: dy's rows along N (origin
    (row, 0)), a column slice (origin (0, col)), and the along-token xᵀ of a token shard (origin (0, token))."""
    from minite_core.kernels.quantize_cols import quantize_cols_triton

    x = _input(64, 64, torch.bfloat16, seed=9)
    amax = x.float().abs().amax().cpu()
    full = quantize_reference(x.cpu(), rounding="sr", seed=5, amax=amax)[0]
    for rows, cols, origin in ((slice(32, 64), slice(0, 64), (32, 0)), (slice(0, 64), slice(16, 64), (0, 16))):
        part = quantize_triton(x[rows, cols], rounding="sr", seed=5, amax=amax.to(DEV), sr_origin=origin)[0]
        assert torch.equal(part.data.cpu(), full.data[rows, cols.start // 2:])
        assert torch.equal(part.scale.view(torch.uint8).cpu(), full.scale[rows, cols.start // 16:].view(torch.uint8))
        _same(part, quantize_reference(x[rows, cols].cpu(), rounding="sr", seed=5, amax=amax, sr_origin=origin)[0])
    full_t = quantize_reference(x.t().contiguous().cpu(), rounding="sr", seed=5, amax=amax)[0]  # xᵀ (64, 64)
    part_t, _ = quantize_cols_triton(x[32:], rounding="sr", seed=5, amax=amax.to(DEV), sr_origin=(0, 32),
                                     block_t=32, block_c=16)  # the second rank's 32 tokens
    assert torch.equal(part_t.data.cpu(), full_t.data[:, 16:])
    assert torch.equal(part_t.scale.view(torch.uint8).cpu(), full_t.scale[:, 2:].view(torch.uint8))
    with pytest.raises(ValueError, match="multiple of 4"):
        quantize_triton(x, rounding="sr", seed=5, sr_origin=(0, 2))


@cpu_kernels
def test_quantize_cols_with_a_given_amax_makes_no_host_sync():
    """A token shard's all-reduced amax (nn.shard) reaches the along-token quantizer through dispatch on every
    wgrad operand: the Triton path must not read it back to check it (it did: 2 syncs a call, 4 a GEMM), while
    the kernel itself still validates when called directly. Same codes as the dynamic-amax call."""
    from minite_core.engines.host_sync import find_host_syncs
    from minite_core.kernels.quantize_cols import quantize_cols_triton

    x = _input(32, 64, torch.bfloat16, seed=4)
    amax = x.float().abs().amax()
    spec = Quant(rounding="sr")
    assert find_host_syncs(dispatch.quantize_cols, x, spec, amax=amax, seed=3, backend="triton") == []
    _same(dispatch.quantize_cols(x, spec, amax=amax, seed=3, backend="triton")[0],
          dispatch.quantize_cols(x, spec, seed=3, backend="triton")[0])
    direct = find_host_syncs(quantize_cols_triton, x, rounding="sr", seed=3, amax=amax)
    assert [s.op for s in direct] == ["__bool__"]  # direct calls keep the value check (deduplicated: one site)


@cpu_kernels
@pytest.mark.parametrize("m", [1, 3, 16])
def test_decode_gemm_matches_reference(m):
    _, tw, _, _ = _gemm_case(8, 48, 96)
    x = _input(m, 96, torch.bfloat16, seed=5)
    cfg = None if CUDA else dict(BLOCK_N=16, BLOCK_K=32)
    y = decode_gemm_triton(x, tw, out_dtype=torch.float32, config=cfg)  # W4A16
    assert _rel(y, decode_gemm_reference(x.cpu(), ref.NVFP4Tensor(tw.data.cpu(), tw.scale.cpu(), tw.global_scale.cpu()))) < TOL["gemm_rel"]
    tx, dx = quantize_triton(x, scale_mode="row", emit_dq=True)  # W4A4
    y = decode_gemm_triton(dx, tw, x_scale=tx.global_scale, out_dtype=torch.float32, config=cfg)
    assert _rel(y, R.gemm_reference(tx, tw)) < TOL["gemm_rel"]


def test_dispatch_reference_backend_on_cpu():
    x = _input(16, 32, torch.float32, device="cpu")
    w = _input(8, 32, torch.float32, seed=3, device="cpu")
    q = Quant(scale_mode="row")
    t = dispatch.quantize(x, q, backend="reference")
    _same(t, ref.quantize(x, scale_mode="row"))
    tw = dispatch.quantize(w, Quant(), backend="reference")
    y = dispatch.gemm(t, tw, torch.float32, backend="reference")
    assert torch.allclose(y, ref.dequantize(t) @ ref.dequantize(tw).t())
    offs = torch.tensor([0, 6, 16])
    both = DqOperand(torch.stack([dispatch.as_dq(tw).values_bf16] * 2), torch.stack([tw.global_scale] * 2))
    yg = dispatch.grouped_gemm(dispatch.as_dq(t), both, offs, torch.float32, backend="reference")
    assert torch.allclose(yg, y)
    yd = dispatch.decode_gemm(x[:4], tw, act=q, backend="reference", out_dtype=torch.float32)
    assert torch.allclose(yd, y[:4])


def test_dispatch_selection(monkeypatch):
    from minite_core.kernels import backend

    monkeypatch.setattr(backend, "_RUN_BACKEND", None)
    assert dispatch.select_backend() == ("reference" if not CUDA else dispatch.select_backend())
    dispatch.set_backend("reference")
    assert dispatch.select_backend() == dispatch.current_backend() == "reference"
    assert dispatch.select_backend("reference") == "reference"
    with pytest.raises(RuntimeError, match="not usable"):
        dispatch.select_backend("bogus")
    with pytest.raises(ValueError, match="bogus"):
        dispatch.set_backend("bogus")
    if not CUDA:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        with pytest.raises(RuntimeError, match="CUDA"):
            dispatch.select_backend("triton")


def test_native_operand_layout_cpu():
    x = _input(200, 96, torch.float32, device="cpu")  # rows not a multiple of 128, cols not of 4*16
    t = ref.quantize(x)
    op = native.prepare(t)
    assert op.scale_swizzled.numel() == 256 * 8
    assert torch.equal(unswizzle_scales(op.scale_swizzled, 200, 6).view(torch.uint8), t.scale.view(torch.uint8))
    assert op.data_fp4.view(torch.uint8).data_ptr() == t.data.data_ptr()  # a view, no copy


@pytest.mark.gpu
@pytest.mark.skipif(not native.native_available()[0], reason=native.native_available()[1])
def test_native_gemm_matches_reference():
    ta, tb, _, _ = _gemm_case(256, 128, 256)
    y = native.gemm_native(ta, tb, torch.float32)
    assert _rel(y, R.gemm_reference(ta, tb)) < TOL["gemm_rel"]


# ------------------------------------------------------------------------------------------ GPU-sized
@pytest.mark.parametrize("block,mode,math", list(itertools.product([(1, 16), (16, 16)], ["tensor", "row"],
                                                                  ["exact", "fast"])))
@pytest.mark.parametrize("rht", [False, True])
def test_gpu_quantize_bitexact_large(block, mode, math, rht):
    if not CUDA:
        pytest.skip("needs a CUDA GPU (none visible)")
    x = _input(512, 4096, torch.bfloat16, seed=7)
    t_ref, dq_ref = quantize_reference(x, block=block, scale_mode=mode, math=math, rht=rht, emit_dq=True)
    for prefetch in (False, True):
        t_sut, dq_sut = quantize_triton(x, block=block, scale_mode=mode, math=math, rht=rht, emit_dq=True,
                                        prefetch=prefetch)
        _same(t_sut, t_ref, dq_sut, dq_ref)


test_gpu_quantize_bitexact_large = pytest.mark.gpu(test_gpu_quantize_bitexact_large)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("impl", ["triton", "cublas"])
def test_gpu_gemm_and_grouped(impl):
    ta, tb, A, B = _gemm_case(1024, 768, 1024)
    f = G.gemm_triton if impl == "triton" else G.gemm_cublas
    assert _rel(f(A, B, torch.float32), R.gemm_reference(ta, tb)) < TOL["gemm_rel"]
    ws, W = _experts(256, 1024, 8, seed=20)
    offs = torch.tensor([0, 112, 112, 416, 432, 544, 752, 752, 1024], device="cuda")
    yr = R.grouped_gemm_reference(ta, ws, offs.cpu())
    assert _rel(GG.grouped_gemm(A, W, offs, torch.float32), yr) < TOL["gemm_rel"]
    xt = _input(256, 1024, torch.bfloat16, seed=9)
    va, vb = xt, _input(512, 1024, torch.bfloat16, seed=10)
    sa, sb = torch.rand(8, device="cuda"), torch.rand(8, device="cuda")
    c = GG.kgrouped_gemm(va, sa, vb, sb, offs)
    bounds = offs.tolist()
    for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:])):
        ref_e = (va[:, s:t].double() @ vb[:, s:t].double().t()) * (sa[e].double() * sb[e].double())
        assert torch.allclose(c[e].double(), ref_e, rtol=1e-5, atol=1e-5 * ref_e.abs().max().item() + 1e-30)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("m", [1, 8, 16])
def test_gpu_decode(m):
    _, tw, _, _ = _gemm_case(8, 4096, 4096)
    x = _input(m, 4096, torch.bfloat16, seed=5)
    y = decode_gemm_triton(x, tw, out_dtype=torch.float32)
    assert _rel(y, decode_gemm_reference(x, tw)) < TOL["gemm_rel"]
    y2 = dispatch.decode_gemm(x, tw, act=Quant(scale_mode="row"), out_dtype=torch.float32)
    tx = ref.quantize(x, scale_mode="row")
    assert _rel(y2, R.gemm_reference(tx, tw)) < TOL["gemm_rel"]


@cpu_kernels
@pytest.mark.parametrize("rht,sr,math", list(itertools.product([False, True], [False, True], ["exact", "fast"])))
def test_quantize_cols_equals_reference_on_transpose(rht, sr, math):
    """The along-token quantizer reads x [T, C] and gives exactly the row quantizer's codes of xᵀ."""
    from minite_core.kernels.quantize_cols import col_block_amax, quantize_cols_triton

    x = _input(96, 40, torch.bfloat16, seed=11)
    kw = dict(rht=rht, rounding="sr" if sr else "rne", math=math, seed=123456789012 if sr else None)
    t, d = quantize_cols_triton(x, emit_dq=True, block_t=32, block_c=16, **kw)
    r, rd = quantize_reference(x.t().contiguous().cpu(), emit_dq=True, **kw)
    _same(t, r, d, rd)
    xf = rht_ref(x.t().float().cpu()) if rht else x.t().float().cpu()
    assert torch.equal(col_block_amax(x, rht=rht, block_t=32, block_c=16).cpu(), xf.abs().reshape(40, 6, 16).amax(dim=(0, 2)))
    # per-segment scales and seeds (three experts' tokens)
    segs, tok_e = [(0, 32), (32, 48), (48, 96)], torch.tensor([0] * 32 + [1] * 16 + [2] * 48)
    seeds = torch.tensor([5, 2**41 + 7, 99], dtype=torch.int64)
    seg_amax = torch.stack([(rht_ref(x[s:e].t().float().cpu()) if rht else x[s:e].float().cpu()).abs().amax()
                            for s, e in segs])
    local = torch.arange(96) - torch.tensor([0, 32, 48])[tok_e]
    t, _ = quantize_cols_triton(x, col_amax=seg_amax[tok_e[::16]].to(DEV), rounding=kw["rounding"], rht=rht, math=math,
                                seg_seed=(seeds[tok_e].to(DEV), local.to(DEV)) if sr else None, block_t=32, block_c=16)
    parts = [quantize_reference(x[s:e].t().contiguous().cpu(), rht=rht, rounding=kw["rounding"], math=math,
                                seed=int(seeds[i]) if sr else None)[0] for i, (s, e) in enumerate(segs)]
    assert torch.equal(t.data.cpu(), torch.cat([p.data for p in parts], 1))
    assert torch.equal(t.scale.view(torch.uint8).cpu(), torch.cat([p.scale.view(torch.uint8) for p in parts], 1))


@cpu_kernels
@pytest.mark.parametrize("sr", [False, True])
def test_quantize_cols_rht_bf16_equals_reference(sr):
    """rht_dtype="bfloat16" (Profile.wgrad_rht_dtype, TE's RHT in the input dtype): the RHT'd tile is rounded to
    bf16 before amax and quantization, in the kernel as in the reference; and it is a different operand."""
    from minite_core.kernels.quantize_cols import col_block_amax, quantize_cols_triton

    x = _input(64, 32, torch.float32, seed=12)
    kw = dict(rht=True, rht_dtype="bfloat16", rounding="sr" if sr else "rne", seed=987654321 if sr else None)
    t, d = quantize_cols_triton(x, emit_dq=True, block_t=32, block_c=16, **kw)
    r, rd = quantize_reference(x.t().contiguous().cpu(), emit_dq=True, **kw)
    _same(t, r, d, rd)
    xf = rht_ref(x.t().float().cpu(), "bfloat16")
    amax = col_block_amax(x, rht=True, rht_dtype="bfloat16", block_t=32, block_c=16).cpu()
    assert torch.equal(amax, xf.abs().reshape(32, 4, 16).amax(dim=(0, 2)))
    r32, _ = quantize_reference(x.t().contiguous().cpu(), rht=True, rounding=kw["rounding"], seed=kw["seed"])
    assert not torch.equal(r32.data, r.data)


@cpu_kernels
@pytest.mark.parametrize("per_row,rht,math,segments",
                         [(True, False, "exact", False), (False, True, "exact", False), (True, False, "fast", True),
                          (False, True, "exact", True), (False, False, "exact", False)])
def test_quantize_rows_cols_is_both_quantizers(per_row, rht, math, segments):
    """One read of x for a forward linear's two operands (dispatch.quantize_rows_cols): x's row-wise codes, scales,
    S_dec and bf16 copy equal the reference row quantizer's, xᵀ's codes the reference's on the transpose — per-token or
    per-tensor row scales, TE's RHT on xᵀ only, per-expert (per-16-token-block) scales of xᵀ; C not a multiple of
    the tile (48 channels, block_c 32)."""
    from minite_core.kernels.quantize_cols import col_block_amax, quantize_rows_cols_triton

    x = _input(64, 48, torch.bfloat16, seed=13)
    ra = row_amax(x)
    rht_kw = dict(rht=rht, rht_dtype="bfloat16")
    row_arg = ra if per_row else ra.amax()
    cols_kw = {}
    if segments:  # two "experts": tokens [0, 16) and [16, 64), each xᵀ block with its expert's amax
        bam = col_block_amax(x, **rht_kw)
        seg = torch.stack([bam[:1].amax(), bam[1:].amax()])
        cols_kw["col_amax"] = seg[torch.tensor([0, 1, 1, 1], device=x.device)]
    elif rht:
        cols_kw["amax"] = col_block_amax(x, **rht_kw).amax()
    (t, dq), (t_t, _) = quantize_rows_cols_triton(x, row_arg, math=math, block_t=32, block_c=32, num_warps=4, **rht_kw,
                                             **cols_kw)
    r, rdq = quantize_reference(x.cpu(), scale_mode="row" if per_row else "tensor", math=math, emit_dq=True)
    _same(t, r, dq, rdq)
    if segments:
        xt = x.t().float().cpu()
        parts = [quantize_reference(xt[:, s:e].contiguous(), math=math, rht=rht, rht_dtype="bfloat16")[0]
                 for s, e in ((0, 16), (16, 64))]
        assert torch.equal(t_t.data.cpu(), torch.cat([p.data for p in parts], 1))
        assert torch.equal(t_t.scale.view(torch.uint8).cpu(), torch.cat([p.scale.view(torch.uint8) for p in parts], 1))
    else:
        _same(t_t, quantize_reference(x.t().contiguous().cpu(), math=math, rht=rht, rht_dtype="bfloat16")[0])
    # the dispatch entry point: the same bits on the Triton path, and the reference branch
    spec = Quant(scale_mode="row" if per_row else "tensor", math=math)
    for be in ("triton", "reference"):
        if be == "reference" and segments:
            continue  # per-block xᵀ scales are Triton only
        xb = x if be == "triton" else x.cpu()
        t2, op2, t_t2, _ = dispatch.quantize_rows_cols(xb, spec, row_arg.to(xb.device), backend=be, **rht_kw,
                                                    **{k: v.to(xb.device) for k, v in cols_kw.items()})
        _same(t2, r, op2.values_bf16, rdq)
        assert torch.equal(op2.global_scale.cpu(), r.global_scale)
        assert torch.equal(t_t2.data.cpu(), t_t.data.cpu())


@cpu_kernels
@pytest.mark.parametrize("rht,segments", [(False, False), (True, False), (False, True), (True, True)])
def test_quantize_rows_cols_stochastic_rounding(rht, segments):
    """A gradient's two operands from one read (nn backward: dgrad's dy along N, wgrad's dyᵀ along tokens with its
    bf16 copy), each with its own SR stream: one seed each, or per expert (per-row seeds, expert-local token index)
    — the same bits as the row quantizer and the along-token quantizer called apart."""
    from minite_core.kernels.quantize_cols import col_block_amax, quantize_cols_triton, quantize_rows_cols_triton

    x = _input(64, 48, torch.float32, seed=14)
    rht_kw = dict(rht=rht, rht_dtype="bfloat16")
    ra = row_amax(x)
    if segments:  # experts of 16 and 48 tokens, each with its own amax and SR streams
        expert = torch.tensor([0] * 16 + [1] * 48, device=x.device)
        local = torch.arange(64, device=x.device) - torch.tensor([0, 16], device=x.device)[expert]
        row_seeds = torch.tensor([11, 2**40 + 3], device=x.device)[expert]
        col_seeds = torch.tensor([7, 2**35 + 9], device=x.device)[expert]
        seg_r = torch.stack([ra[:16].amax(), ra[16:].amax()])
        bam = col_block_amax(x, **rht_kw)
        seg_c = torch.stack([bam[:1].amax(), bam[1:].amax()])[expert[::16]]
        row_arg, cols_kw = seg_r[expert], dict(col_amax=seg_c)
        sr_rows = dict(row_seeds=row_seeds, seg_seed=(col_seeds, local))
        ref_rows = dict(scale_mode="row", amax=seg_r[expert], seg_seed=(row_seeds, local))
        ref_cols = dict(col_amax=seg_c, seg_seed=(col_seeds, local))
    else:
        amax_t = col_block_amax(x, **rht_kw).amax()
        row_arg, cols_kw = ra.amax(), dict(amax=amax_t)
        sr_rows = dict(row_seed=2**33 + 5, seed=77)
        ref_rows = dict(seed=2**33 + 5)
        ref_cols = dict(amax=amax_t, seed=77)
    (t, dq), (t_t, dq_t) = quantize_rows_cols_triton(x, row_arg, rounding="sr", emit_dq=True, block_t=32, block_c=32,
                                                     num_warps=4, **rht_kw, **cols_kw, **sr_rows)
    r, rdq = quantize_triton(x, rounding="sr", emit_dq=True, check=False, **ref_rows)
    r_t, rdq_t = quantize_cols_triton(x, rounding="sr", emit_dq=True, check=False, **rht_kw, **ref_cols)
    _same(t, r, dq, rdq)
    _same(t_t, r_t, dq_t, rdq_t)
    if not segments:  # and the plain reference
        _same(t, quantize_reference(x.cpu(), rounding="sr", seed=2**33 + 5)[0])

"""The Triton quantizers (row, along-token, both from one read) against the plain torch reference
(`minite_core.formats`): codes, scales, S_dec and the bf16 copy with atol=0, for every block, scale mode, math,
static amax, RHT and stochastic-rounding stream the profiles use.

CPU: the kernels run under TRITON_INTERPRET=1 (tests/kernel_cases.py), tiny shapes. GPU (`-m gpu`): larger shapes.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from kernel_cases import CUDA, DEV, cpu_kernels, kernel_input, same_bits

triton = pytest.importorskip("triton")
tl = triton.language

from minite_core.formats import nvfp4 as ref  # noqa: E402
from minite_core.formats.e2m1 import e2m1_encode_sr  # noqa: E402
from minite_core.formats.rht import rht as rht_ref  # noqa: E402
from minite_core.kernels import dispatch  # noqa: E402
from minite_core.kernels.quantize import _sr_magnitude, quantize_triton, row_amax  # noqa: E402
from minite_core.kernels.reference import quantize_reference  # noqa: E402
from minite_core.profiles import Quant  # noqa: E402

COMBOS = list(itertools.product([(1, 16), (16, 16)], ["tensor", "row"], ["exact", "fast"], [None, 3.0],
                                [False, True], [torch.float32, torch.bfloat16]))


@cpu_kernels
@pytest.mark.parametrize("block,mode,math,amax,rht,dtype", COMBOS)
def test_quantize_bitexact(block, mode, math, amax, rht, dtype):
    x = kernel_input(32, 48, dtype)
    t_sut, dq_sut = quantize_triton(x, block=block, scale_mode=mode, math=math, amax=amax, rht=rht, emit_dq=True)
    t_ref, dq_ref = quantize_reference(x.cpu(), block=block, scale_mode=mode, math=math, amax=amax, rht=rht,
                                       emit_dq=True)
    same_bits(t_sut, t_ref, dq_sut, dq_ref)


@cpu_kernels
@pytest.mark.parametrize("m,k", [(1, 16), (3, 16), (5, 80), (17, 272)])
def test_quantize_odd_shapes(m, k):
    x = kernel_input(m, k, torch.float32, seed=m)
    for mode in ("tensor", "row"):
        same_bits(quantize_triton(x, scale_mode=mode)[0], quantize_reference(x.cpu(), scale_mode=mode)[0])
    same_bits(quantize_triton(x, block_k=32)[0], quantize_reference(x.cpu())[0])  # several K tiles + masked tail


@cpu_kernels
@pytest.mark.parametrize("mode,rounding,rht", [("row", "rne", False), ("tensor", "sr", False), ("tensor", "rne", True),
                                               ("row", "rne", True)])
def test_quantize_prefetch_is_the_same_bits(mode, rounding, rht):
    """The loops that load a tile ahead (prefetch) give the default's bits: several K tiles and a masked tail."""
    x = kernel_input(17, 272, torch.bfloat16, seed=3)
    kw = dict(scale_mode=mode, rounding=rounding, rht=rht, seed=5 if rounding == "sr" else None, emit_dq=True,
              block_k=32)
    t_sut, dq_sut = quantize_triton(x, prefetch=True, **kw)
    kw.pop("block_k")
    t_ref, dq_ref = quantize_reference(x.cpu(), **kw)
    same_bits(t_sut, t_ref, dq_sut, dq_ref)


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


@cpu_kernels
@pytest.mark.parametrize("rht", [False, True])
def test_quantize_segments_equal_per_segment_reference(rht):
    """The MoE modes: per-row static amax (per-expert scales), per-16-column-block amax ("col-seg") and per-row /
    per-column SR streams give exactly the codes of quantizing each segment on its own with its own seed."""
    x = kernel_input(48, 80, torch.float32, seed=6)
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
    same_bits(ref.NVFP4Tensor(t.data, t.scale, t.global_scale[:16, 0][0]), ref.NVFP4Tensor(
        torch.cat([p.data for p in parts]), torch.cat([p.scale for p in parts]), parts[0].global_scale))


@cpu_kernels
def test_sr_codes_equal_reference_philox_stream():
    x = kernel_input(32, 64, torch.bfloat16, seed=8)
    for seed in (0, 7, 2**47 + 5):
        same_bits(quantize_triton(x, rounding="sr", seed=seed)[0], quantize_reference(x.cpu(), rounding="sr", seed=seed)[0])


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
        same_bits(quantize_triton(x.to(DEV), amax=2688.0, rounding="sr", seed=seed)[0], want)
        xt = x.t().contiguous().to(DEV)  # the along-token quantizer's xᵀ is x
        same_bits(quantize_cols_triton(xt, amax=torch.tensor(2688.0, device=DEV), rounding="sr", seed=seed)[0], want)


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

    x = kernel_input(64, 64, torch.bfloat16, seed=9)
    amax = x.float().abs().amax().cpu()
    full = quantize_reference(x.cpu(), rounding="sr", seed=5, amax=amax)[0]
    for rows, cols, origin in ((slice(32, 64), slice(0, 64), (32, 0)), (slice(0, 64), slice(16, 64), (0, 16))):
        part = quantize_triton(x[rows, cols], rounding="sr", seed=5, amax=amax.to(DEV), sr_origin=origin)[0]
        assert torch.equal(part.data.cpu(), full.data[rows, cols.start // 2:])
        assert torch.equal(part.scale.view(torch.uint8).cpu(), full.scale[rows, cols.start // 16:].view(torch.uint8))
        same_bits(part, quantize_reference(x[rows, cols].cpu(), rounding="sr", seed=5, amax=amax, sr_origin=origin)[0])
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

    x = kernel_input(32, 64, torch.bfloat16, seed=4)
    amax = x.float().abs().amax()
    spec = Quant(rounding="sr")
    assert find_host_syncs(dispatch.quantize_cols, x, spec, amax=amax, seed=3, backend="triton") == []
    same_bits(dispatch.quantize_cols(x, spec, amax=amax, seed=3, backend="triton")[0],
          dispatch.quantize_cols(x, spec, seed=3, backend="triton")[0])
    direct = find_host_syncs(quantize_cols_triton, x, rounding="sr", seed=3, amax=amax)
    assert [s.op for s in direct] == ["__bool__"]  # direct calls keep the value check (deduplicated: one site)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("block,mode,math", list(itertools.product([(1, 16), (16, 16)], ["tensor", "row"],
                                                                  ["exact", "fast"])))
@pytest.mark.parametrize("rht", [False, True])
def test_gpu_quantize_bitexact_large(block, mode, math, rht):
    x = kernel_input(512, 4096, torch.bfloat16, seed=7)
    t_ref, dq_ref = quantize_reference(x, block=block, scale_mode=mode, math=math, rht=rht, emit_dq=True)
    for prefetch in (False, True):
        t_sut, dq_sut = quantize_triton(x, block=block, scale_mode=mode, math=math, rht=rht, emit_dq=True,
                                        prefetch=prefetch)
        same_bits(t_sut, t_ref, dq_sut, dq_ref)


@cpu_kernels
@pytest.mark.parametrize("rht,sr,math", list(itertools.product([False, True], [False, True], ["exact", "fast"])))
def test_quantize_cols_equals_reference_on_transpose(rht, sr, math):
    """The along-token quantizer reads x [T, C] and gives exactly the row quantizer's codes of xᵀ."""
    from minite_core.kernels.quantize_cols import col_block_amax, quantize_cols_triton

    x = kernel_input(96, 40, torch.bfloat16, seed=11)
    kw = dict(rht=rht, rounding="sr" if sr else "rne", math=math, seed=123456789012 if sr else None)
    t, d = quantize_cols_triton(x, emit_dq=True, block_t=32, block_c=16, **kw)
    r, rd = quantize_reference(x.t().contiguous().cpu(), emit_dq=True, **kw)
    same_bits(t, r, d, rd)
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

    x = kernel_input(64, 32, torch.float32, seed=12)
    kw = dict(rht=True, rht_dtype="bfloat16", rounding="sr" if sr else "rne", seed=987654321 if sr else None)
    t, d = quantize_cols_triton(x, emit_dq=True, block_t=32, block_c=16, **kw)
    r, rd = quantize_reference(x.t().contiguous().cpu(), emit_dq=True, **kw)
    same_bits(t, r, d, rd)
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

    x = kernel_input(64, 48, torch.bfloat16, seed=13)
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
    same_bits(t, r, dq, rdq)
    if segments:
        xt = x.t().float().cpu()
        parts = [quantize_reference(xt[:, s:e].contiguous(), math=math, rht=rht, rht_dtype="bfloat16")[0]
                 for s, e in ((0, 16), (16, 64))]
        assert torch.equal(t_t.data.cpu(), torch.cat([p.data for p in parts], 1))
        assert torch.equal(t_t.scale.view(torch.uint8).cpu(), torch.cat([p.scale.view(torch.uint8) for p in parts], 1))
    else:
        same_bits(t_t, quantize_reference(x.t().contiguous().cpu(), math=math, rht=rht, rht_dtype="bfloat16")[0])
    # the dispatch entry point: the same bits on the Triton path, and the reference branch
    spec = Quant(scale_mode="row" if per_row else "tensor", math=math)
    for be in ("triton", "reference"):
        if be == "reference" and segments:
            continue  # per-block xᵀ scales are Triton only
        xb = x if be == "triton" else x.cpu()
        t2, op2, t_t2, _ = dispatch.quantize_rows_cols(xb, spec, row_arg.to(xb.device), backend=be, **rht_kw,
                                                    **{k: v.to(xb.device) for k, v in cols_kw.items()})
        same_bits(t2, r, op2.values_bf16, rdq)
        assert torch.equal(op2.global_scale.cpu(), r.global_scale)
        assert torch.equal(t_t2.data.cpu(), t_t.data.cpu())


@cpu_kernels
@pytest.mark.parametrize("rht,segments", [(False, False), (True, False), (False, True), (True, True)])
def test_quantize_rows_cols_stochastic_rounding(rht, segments):
    """A gradient's two operands from one read (nn backward: dgrad's dy along N, wgrad's dyᵀ along tokens with its
    bf16 copy), each with its own SR stream: one seed each, or per expert (per-row seeds, expert-local token index)
    — the same bits as the row quantizer and the along-token quantizer called apart."""
    from minite_core.kernels.quantize_cols import col_block_amax, quantize_cols_triton, quantize_rows_cols_triton

    x = kernel_input(64, 48, torch.float32, seed=14)
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
    same_bits(t, r, dq, rdq)
    same_bits(t_t, r_t, dq_t, rdq_t)
    if not segments:  # and the plain reference
        same_bits(t, quantize_reference(x.cpu(), rounding="sr", seed=2**33 + 5)[0])

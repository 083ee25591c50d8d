"""The tensor-core packed decode GEMM (kernels/decode_mma.py + decode_mma.cu).

CPU: the mma layout read back the way the CUDA kernel reads it — the PTX m16n8k16 A-fragment definition (a0, a1: row
g, columns 2t, 2t+1; a2, a3: row g+8; a4..a7: the same rows, columns 2t+8, 2t+9), the kernel's column permutation
(MMA column 2t, 2t+1, 2t+8, 2t+9 of k-step j = chunk column 16t + 4j + 0..3) and its bit arithmetic (magnitude and
sign bits shifted onto a bf16, times the E4M3 scale · 2^119) — gives ŵ · 2^-7 exactly at every (row, column).
GPU: one-hot rows of x pick single weights (bitwise ŵ · S_w), few-bit activations make every sum exact (bitwise
the reference in any order), random bf16 activations agree to fp32 accumulation order; split-K is deterministic
and replays in a CUDA graph; the dispatch sends <= 16 rows here and more to the Triton kernel."""
from __future__ import annotations

import pytest
import torch

from minite_core.formats import nvfp4 as ref
from minite_core.kernels import decode_mma
from minite_core.kernels.reference import decode_gemm_reference, packed_gemm_reference

CUDA = torch.cuda.is_available()

def gpu(f):
    return pytest.mark.gpu(pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")(f))

REL_TOL = 1e-5  # fp32 accumulation order (tests/test_packed_decode.py)


def _weight(n, k, seed, device="cpu", scale_mode="tensor"):
    g = torch.Generator().manual_seed(seed)
    return ref.quantize(torch.randn(n, k, generator=g).to(device), scale_mode=scale_mode)


def _bf16_bits_to_float(h: torch.Tensor) -> torch.Tensor:
    return (h.to(torch.int32) << 16).view(torch.float32).double()


def _read_back(wq: torch.Tensor, ws: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """ŵ · 2^-7 [N, K] (float64) from the mma layout, lane by lane as decode_mma.cu computes its A registers."""
    out = torch.full((n, k), float("nan"), dtype=torch.float64)
    words = wq.view(n // 16, k // 64, 32, 4, 4).to(torch.int64)
    words = words[..., 0] | words[..., 1] << 8 | words[..., 2] << 16 | words[..., 3] << 24  # (nt, c, lane, j)
    sf = ws.view(n // 16, k // 64, 32, 2).to(torch.int32)
    e4m3 = torch.tensor(range(256), dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    scale = e4m3[sf.long()] * 2.0 ** 119  # (nt, c, lane, h): the bf16x2 multiplier of rows g (h=0), g+8 (h=1)
    shifts = ((6, 12), (2, 8), (-2, 4), (-6, 0))  # register r: magnitude shift, sign shift (decode_mma.cu dequant)
    nt, c, lane, j = torch.meshgrid(*(torch.arange(s) for s in words.shape), indexing="ij")
    g, t = lane // 4, lane % 4
    for r, (sm, ss) in enumerate(shifts):
        mag = (words << sm if sm >= 0 else words >> -sm) & 0x01C001C0
        reg = mag | ((words << ss) & 0x80008000)
        for half in (0, 1):  # a register's low / high bf16: columns +0 / +1 of its pair
            placed = _bf16_bits_to_float((reg >> (16 * half)) & 0xFFFF)
            # PTX fragment: r = 0: row g, cols 2t (+half); r = 1: row g+8; r = 2: row g, cols 2t+8; r = 3: row g+8
            row = nt * 16 + g + 8 * (r % 2)
            d = 8 * (r // 2) + half  # the MMA column inside the k-step is 2t + d (PTX), that is chunk column:
            col = c * 64 + 16 * t + 4 * j + {0: 0, 1: 1, 8: 2, 9: 3}[d]  # (the kernel's permutation of K)
            out[row.reshape(-1), col.reshape(-1)] = (placed * scale[..., r % 2, None]).reshape(-1)
    return out


@pytest.mark.parametrize("scale_mode", ["tensor", "row"])
def test_mma_layout_reads_back_as_the_dequantized_weight(scale_mode):
    n, k = 48, 192
    w = _weight(n, k, 0, scale_mode=scale_mode)
    wq, ws = decode_mma.mma_layout(w)
    assert wq.shape == (n // 16, k // 64, 32, 16) and ws.shape == (n // 16, k // 64, 32, 2)
    got = _read_back(wq, ws, n, k)
    want = ref.dequantize_unscaled(w).double() * 2.0 ** -7  # e2m1 · sf, before S_dec
    assert torch.equal(got, want)


def test_every_code_and_scale_reads_back():
    """All 16 codes against all 126 positive finite E4M3 scales (subnormals and 448 included)."""
    n, k = 16, 64 * 126
    codes = torch.arange(16, dtype=torch.uint8).repeat(n, k // 16)  # column j: code j % 16
    data = codes[:, 0::2] | (codes[:, 1::2] << 4)
    scale = torch.arange(1, 127, dtype=torch.uint8).repeat_interleave(4).repeat(n, 1).view(torch.float8_e4m3fn)
    w = ref.NVFP4Tensor(data, scale, torch.tensor(1.0))
    got = _read_back(*decode_mma.mma_layout(w), n, k)
    assert torch.equal(got, ref.dequantize_unscaled(w).double() * 2.0 ** -7)


def test_split_k_covers_k_and_keeps_slices_small():
    dev = torch.device("cpu")
    for n, k in ((4096, 4096), (1024, 4096), (151936, 4096), (4096, 12288), (16, 64), (2048, 768)):
        slices, per = decode_mma.split_k(n, k, dev, decode_mma.CONFIG)
        chunks = k // 64
        assert per <= decode_mma.CONFIG["max_slice"] and (slices - 1) * per < chunks <= slices * per, (n, k)


def test_the_dispatch_leaves_cpu_tensors_to_the_other_kernels():
    w = _weight(32, 128, 1)
    assert not decode_mma.supported(torch.zeros(4, 128), w)  # CPU tensor


# ------------------------------------------------------------------------------------------------------ GPU
def _exact_ref(x, w, x_scale=None):
    """x̂ @ ŵᵀ unscaled (bf16 operands, fp32 sums), then · (S_x ·) S_w: with exact sums the kernel's bits in any order."""
    return packed_gemm_reference(x, w, x_scale=x_scale, block_k=64)


def ref64(x, w, x_scale=None):
    """The same in float64: the yardstick for inexact sums."""
    xs = x.double() if x_scale is None else x.double() * x_scale.double()
    return (xs @ ref.dequantize_unscaled(w).double().t()) * w.global_scale.double().reshape(1, -1)


def _few_bits(x: torch.Tensor) -> torch.Tensor:
    """3 significant bits in [-4, 4]: every product and partial sum exact in fp32, so any order gives the same bits."""
    return (torch.round(x.float().clamp(-4, 4) * 2) / 2).to(torch.bfloat16)


@gpu
@pytest.mark.parametrize("scale_mode", ["tensor", "row"])
@pytest.mark.parametrize("m", [1, 5, 8, 9, 16])
def test_gpu_one_hot_rows_pick_single_weights(m, scale_mode):
    n, k = 256, 1024
    w = _weight(n, k, 2, "cuda", scale_mode)
    cols = torch.randperm(k)[:m].cuda()
    x = torch.zeros(m, k, device="cuda", dtype=torch.bfloat16)
    x[torch.arange(m, device="cuda"), cols] = 1.0
    y = decode_mma.packed_gemm_mma(x, w, out_dtype=torch.float32)
    assert torch.equal(y, decode_gemm_reference(x, w))


@gpu
@pytest.mark.parametrize("m", [1, 3, 8, 16])
@pytest.mark.parametrize("n,k", [(64, 128), (320, 640), (4096, 4096)])
def test_gpu_equals_the_reference(m, n, k):
    """W4A16 and W4A4 (x̂ given) bitwise with exact sums, else to fp32 order; the fused quantizer (exact, fast,
    per-row, per-tensor, static) gives the bits of the quantizer on its own followed by the kernel."""
    from minite_core.kernels import dispatch
    from minite_core.profiles import Quant

    for scale_mode in ("tensor", "row"):
        w = _weight(n, k, 3, "cuda", scale_mode)
        g = torch.Generator().manual_seed(4)
        x = torch.randn(m, k, generator=g).cuda().to(torch.bfloat16)
        if k <= 640:  # exact sums: bitwise, W4A16 and W4A4 (x̂ with its per-row S_dec)
            xf = _few_bits(x)
            assert torch.equal(decode_mma.packed_gemm_mma(xf, w, out_dtype=torch.float32),
                               _exact_ref(xf, w)), (scale_mode, "w4a16")
            s_x = torch.rand(m, 1, device="cuda") + 0.5
            assert torch.equal(decode_mma.packed_gemm_mma(xf, w, x_scale=s_x, out_dtype=torch.float32),
                               _exact_ref(xf, w, x_scale=s_x)), (scale_mode, "w4a4")
        for act, amax in ((Quant(scale_mode="row"), None), (Quant(), None), (Quant(math="fast", static=True),
                                                                            torch.tensor(2.5, device="cuda"))):
            _, dq = dispatch.quantize_dq(x, act, amax=amax, check=False)  # the quantizer on its own
            for cfg in ({"rows_quant_min": 99}, {"rows_quant_min": 1}):  # fused / `quantize_rows` then the kernel
                y_fused = decode_mma.packed_gemm_mma(x, w, act=act, amax=amax, out_dtype=torch.float32, config=cfg)
                y_sep = decode_mma.packed_gemm_mma(dq.values_bf16, w, x_scale=dq.global_scale,
                                                   out_dtype=torch.float32, config=cfg)
                assert torch.equal(y_fused, y_sep), (scale_mode, act, cfg)
            if act.scale_mode == "row" or amax is not None:
                xq, s_dec = decode_mma.quantize_rows(x, act, amax)
                assert torch.equal(xq.view(torch.int16), dq.values_bf16.view(torch.int16))
                assert torch.equal(s_dec, dq.global_scale.expand(m, 1))
        y = decode_mma.packed_gemm_mma(x, w, out_dtype=torch.float32)
        y_ref = ref64(x, w)
        assert ((y.double() - y_ref).norm() / y_ref.norm()).item() < REL_TOL, scale_mode
        y16 = decode_mma.packed_gemm_mma(x, w)  # bf16 out: the fp32 result rounded once
        assert torch.equal(y16, y.to(torch.bfloat16))


@gpu
def test_gpu_quantize_rows_passes_nan_and_zero_rows_as_the_quantizer_does():
    from minite_core.kernels import dispatch
    from minite_core.profiles import Quant

    x = torch.randn(12, 2048, device="cuda", dtype=torch.bfloat16)
    x[3] = 0.0
    x[5, 17] = float("nan")
    x[7, 100] = float("inf")
    act = Quant(scale_mode="row")
    _, dq = dispatch.quantize_dq(x, act, check=False)
    xq, s_dec = decode_mma.quantize_rows(x, act)
    assert torch.equal(xq.view(torch.int16), dq.values_bf16.view(torch.int16))
    assert torch.equal(s_dec.nan_to_num(-1.0), dq.global_scale.nan_to_num(-1.0))


@gpu
def test_gpu_split_k_is_deterministic_and_replays_in_a_graph():
    w = _weight(1024, 4096, 5, "cuda")
    x = torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16)
    slices, _ = decode_mma.split_k(1024, 4096, x.device, decode_mma.CONFIG)
    assert slices > 1  # the tickets and the ordered sum are exercised
    y0 = decode_mma.packed_gemm_mma(x, w)
    for config in ({"max_slice": 1}, {"blocks_per_sm": 1}, {"warps": 8, "unroll": 4}):
        y = decode_mma.packed_gemm_mma(x, w, config=config)  # other splits: other sums, same values to rounding
        assert ((y.float() - y0.float()).norm() / y0.float().norm()).item() < 1e-2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_g = decode_mma.packed_gemm_mma(x, w)
    for _ in range(3):
        graph.replay()
        assert torch.equal(y_g, y0)
    assert torch.equal(decode_mma.packed_gemm_mma(x, w), y0)


@gpu
def test_gpu_dispatch_takes_it_up_to_16_rows():
    from minite_core.kernels import dispatch
    from minite_core.profiles import Quant

    w = _weight(512, 1024, 6, "cuda", "row")
    for m in (1, 16, 17, 40):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        assert decode_mma.supported(x, w) == (m <= 16)
        for act in (None, Quant(scale_mode="row")):
            y = dispatch.decode_gemm(x, w, act=act, out_dtype=torch.float32)
            with decode_mma.off():
                y_triton = dispatch.decode_gemm(x, w, act=act, out_dtype=torch.float32)
            assert ((y - y_triton).norm() / y_triton.norm()).item() < REL_TOL, (m, act)


@gpu
def test_gpu_grouped_equals_the_per_expert_reference():
    from minite_core.kernels import dispatch
    from minite_core.kernels.operands import PackedExperts
    from minite_core.profiles import Quant

    E, N, K = 4, 96, 256
    ws = [_weight(N, K, 10 + e, "cuda") for e in range(E)]
    packed = PackedExperts(torch.stack([w.data for w in ws]), torch.stack([w.scale for w in ws]),
                           torch.stack([w.global_scale for w in ws]))
    offs = torch.tensor([0, 3, 3, 20, 21], device="cuda")  # expert 1 empty, expert 2 two tiles
    x = _few_bits(torch.randn(21, K, device="cuda"))
    assert decode_mma.grouped_supported(x, packed)
    schedule = dispatch.grouped_decode_schedule(offs, x.shape[0])
    y = decode_mma.grouped_packed_gemm_mma(x, packed, offs, schedule, out_dtype=torch.float32)
    bounds = offs.tolist()
    y_ref = torch.cat([_exact_ref(x[s:t], ws[e]) for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:])) if t > s])
    assert torch.equal(y, y_ref)
    s_x = torch.rand(21, 1, device="cuda") + 0.5
    y = decode_mma.grouped_packed_gemm_mma(x, packed, offs, schedule, x_scale=s_x, out_dtype=torch.float32)
    y_ref = torch.cat([_exact_ref(x[s:t], ws[e], x_scale=s_x[s:t])
                       for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:])) if t > s])
    assert torch.equal(y, y_ref)
    xr = torch.randn(21, K, device="cuda", dtype=torch.bfloat16)
    for act in (None, Quant(scale_mode="row")):  # the dispatch against the Triton kernel
        amax = None if act is None else xr.float().abs().amax(1)
        y = dispatch.grouped_decode_gemm(xr, packed, offs, act=act, amax=amax, out_dtype=torch.float32)
        with decode_mma.off():
            y_t = dispatch.grouped_decode_gemm(xr, packed, offs, act=act, amax=amax, out_dtype=torch.float32)
        assert ((y - y_t).norm() / y_t.norm()).item() < REL_TOL, act
    # W4A4: x̂ once (`quantize_rows`) or quantized by every block while staged: the same bits
    act, amax = Quant(scale_mode="row"), xr.float().abs().amax(1)
    sched = dispatch.grouped_decode_schedule(offs, xr.shape[0])
    y_once = decode_mma.grouped_packed_gemm_mma(xr, packed, offs, sched, act=act, amax=amax, out_dtype=torch.float32)
    y_fused = decode_mma.grouped_packed_gemm_mma(xr, packed, offs, sched, act=act, amax=amax, out_dtype=torch.float32,
                                                 config={"rows_quant_min": 1 << 30})
    assert torch.equal(y_once, y_fused)


@gpu
def test_gpu_grouped_decode_skips_the_filler():
    """One token's routing (top-8 of 32 experts): Tp = 496 rows of which 128 are routed rows with their padding
    and the rest the last expert's filler. With `MoELayout.live_rows` the packed kernels (mma and Triton) and the
    bf16 _grouped_mm path compute the routed rows only and write the filler as zeros: the per-expert reference's
    bits (few-bit operands: exact sums in any order)."""
    from minite_core.kernels import dispatch
    from minite_core.kernels.decode import grouped_packed_gemm_triton, grouped_packed_schedule
    from minite_core.kernels.operands import PackedExperts
    from minite_core.nn.experts import _GroupedMM, group_ends, segment_ends
    from minite_core.nn.moe_layout import moe_layout

    E, N, K = 32, 64, 128
    ws = [_weight(N, K, 40 + e, "cuda") for e in range(E)]
    packed = PackedExperts(torch.stack([w.data for w in ws]), torch.stack([w.scale for w in ws]),
                           torch.stack([w.global_scale for w in ws]))
    top = torch.randperm(E, generator=torch.Generator().manual_seed(3))[:8].view(1, 8).cuda()
    lay = moe_layout(top, E)
    live, routed = lay.live_rows(), lay.dest.numel()
    assert live.item() == 128 and lay.num_rows == 496
    x = _few_bits(torch.randn(lay.num_rows, K, device="cuda")) * (lay.src < 1)[:, None]  # pad and filler rows zero
    bounds = lay.offs.tolist()
    y_ref = torch.cat([_exact_ref(x[s:t], ws[e]) for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:])) if t > s])
    schedule = dispatch.grouped_decode_schedule(lay.offs, lay.num_rows, live, routed)
    assert schedule.max_tiles == 8 + 1  # ceil(8 / 16) + min(E, 8), not ceil(496 / 16) + E
    y = decode_mma.grouped_packed_gemm_mma(x, packed, lay.offs, schedule, out_dtype=torch.float32)
    assert torch.equal(y, y_ref)
    sched_t = grouped_packed_schedule(lay.offs, lay.num_rows, E, live, routed)
    assert torch.equal(grouped_packed_gemm_triton(x, packed, lay.offs, schedule=sched_t, out_dtype=torch.float32), y_ref)
    w_bf16 = _few_bits(torch.randn(E, N, K, device="cuda"))
    (live_ends, filler), ends = group_ends(lay), segment_ends(lay)
    assert live_ends[-1].item() == 128 and ends[-1].item() == lay.num_rows and filler.sum().item() == 496 - 128
    y_bf = _GroupedMM.apply(x, w_bf16, w_bf16, lay)
    y_all = torch._grouped_mm(x, w_bf16.transpose(-2, -1), offs=ends)
    assert torch.equal(y_bf, y_all) and not y_bf[128:].any()

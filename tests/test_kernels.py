"""The Triton GEMMs (W4A4 dense and grouped, the along-token grouped wgrad GEMM, decode), their tile schedule,
dequantize/amax/decode-scale kernels and the backend dispatch, against the plain torch reference
(`minite_core.formats`, `kernels/reference.py`).

CPU: the kernels run under TRITON_INTERPRET=1 (tests/kernel_cases.py), tiny shapes. GPU (`-m gpu`): larger shapes.
GEMM outputs: relative error against an fp32 reference within TOL (fp32 accumulation order only: the products of
bf16-exact dequantized values are exact). Codes and scales: atol=0.
"""
from __future__ import annotations

import pytest
import torch

from kernel_cases import CUDA, DEV, cpu_kernels, kernel_input, same_bits

pytest.importorskip("triton")

from minite_core.formats import nvfp4 as ref  # noqa: E402
from minite_core.formats.rht import rht as rht_ref  # noqa: E402
from minite_core.formats.swizzle import unswizzle_scales  # noqa: E402
from minite_core.kernels import dispatch, native  # noqa: E402
from minite_core.kernels import gemm as G  # noqa: E402
from minite_core.kernels import grouped as GG  # noqa: E402
from minite_core.kernels import reference as R  # noqa: E402
from minite_core.kernels.decode import decode_gemm_triton  # noqa: E402
from minite_core.kernels.operands import DqOperand  # noqa: E402
from minite_core.kernels.quantize import block_amax, quantize_triton, row_amax  # noqa: E402
from minite_core.kernels.reference import decode_gemm_reference, quantize_reference  # noqa: E402
from minite_core.profiles import Quant  # noqa: E402

TOL = {"gemm_rel": 1e-5}  # fp32 accumulation-order differences on K <= 4096 with exact products


def _gemm_case(m, n, k, mode_a="row", mode_b="tensor", seed=0):
    a = kernel_input(m, k, torch.float32, seed=seed)
    b = kernel_input(n, k, torch.float32, seed=seed + 1)
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
    ws = [quantize_triton(kernel_input(n, k, torch.float32, seed=seed + e), scale_mode=mode, emit_dq=True) for e in range(num)]
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
    a = kernel_input(24, 48, torch.float32, seed=1)  # (N, Tp) along tokens
    b = kernel_input(40, 48, torch.float32, seed=2)  # (K, Tp)
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
    x = kernel_input(48, 80, torch.float32, seed=4)
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
@pytest.mark.parametrize("m", [1, 3, 16])
def test_decode_gemm_matches_reference(m):
    _, tw, _, _ = _gemm_case(8, 48, 96)
    x = kernel_input(m, 96, torch.bfloat16, seed=5)
    cfg = None if CUDA else dict(BLOCK_N=16, BLOCK_K=32)
    y = decode_gemm_triton(x, tw, out_dtype=torch.float32, config=cfg)  # W4A16
    assert _rel(y, decode_gemm_reference(x.cpu(), ref.NVFP4Tensor(tw.data.cpu(), tw.scale.cpu(), tw.global_scale.cpu()))) < TOL["gemm_rel"]
    tx, dx = quantize_triton(x, scale_mode="row", emit_dq=True)  # W4A4
    y = decode_gemm_triton(dx, tw, x_scale=tx.global_scale, out_dtype=torch.float32, config=cfg)
    assert _rel(y, R.gemm_reference(tx, tw)) < TOL["gemm_rel"]


def test_dispatch_reference_backend_on_cpu():
    x = kernel_input(16, 32, torch.float32, device="cpu")
    w = kernel_input(8, 32, torch.float32, seed=3, device="cpu")
    q = Quant(scale_mode="row")
    t = dispatch.quantize(x, q, backend="reference")
    same_bits(t, ref.quantize(x, scale_mode="row"))
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
    x = kernel_input(200, 96, torch.float32, device="cpu")  # rows not a multiple of 128, cols not of 4*16
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
    xt = kernel_input(256, 1024, torch.bfloat16, seed=9)
    va, vb = xt, kernel_input(512, 1024, torch.bfloat16, seed=10)
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
    x = kernel_input(m, 4096, torch.bfloat16, seed=5)
    y = decode_gemm_triton(x, tw, out_dtype=torch.float32)
    assert _rel(y, decode_gemm_reference(x, tw)) < TOL["gemm_rel"]
    y2 = dispatch.decode_gemm(x, tw, act=Quant(scale_mode="row"), out_dtype=torch.float32)
    tx = ref.quantize(x, scale_mode="row")
    assert _rel(y2, R.gemm_reference(tx, tw)) < TOL["gemm_rel"]

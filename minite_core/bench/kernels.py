"""Kernel micro-benchmarks (`minite bench kernels`): every op against its baseline measured in the same run.

Timing: CUDA events around each call after warm-up, median and 20/80 percentiles over `--reps` calls; memory-
bound small ops (decode GEMM) are captured `--graph-inner` times in one CUDA graph cycling over enough weight
copies to exceed L2 (60 MB on an H200), so neither launch gaps nor cache hits flatter them; the baseline gets
the identical treatment. Rows: {"op","shape","time_ms","p20_ms","p80_ms","baseline","baseline_time_ms",
"speedup"} (+ "gbps"/"tflops" where meaningful); speedup = baseline_time / time (> 1 = faster than baseline).

Targets (brief): W4A4 linear forward (activation quantize + GEMM + scales, weights prepared) <= 1.10x bf16
linear time at M=16384, N=K=4096 and for the grouped expert GEMM; quantize >= 70% of D2D copy bandwidth;
decode GEMM >= 2.5x faster than cuBLAS bf16 for M in {1, 8, 16}, N=K in {4096, 8192}.
"""
from __future__ import annotations

import argparse
import csv
import functools
import json
import os

import torch
import torch.nn.functional as F

from minite_core.bench.kernel_timing import Recorder, _guard, time_fn
from minite_core.results import env_info


def quantized_bytes(m: int, k: int, dq: bool) -> int:
    """Bytes a quantizer of an (m, k) tensor must write: e2m1 codes, E4M3 block scales, the bf16 copy with dq."""
    return m * k // 2 + m * k // 16 + (m * k * 2 if dq else 0)


def bench_quantize(rec, m=16384, k=4096, reps=30, sweep=False):
    from minite_core.kernels.quantize import quantize_triton

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    buf = torch.empty_like(x)
    t_copy = time_fn(lambda: buf.copy_(x), reps)
    copy_gbps = 2 * x.numel() * 2 / t_copy[0] / 1e6
    shape = f"{m}x{k} bf16"
    rec.add("d2d-copy", shape, t_copy, gbps=copy_gbps)
    variants = {
        "quantize-1x16-tensor-static": dict(amax=4.0),
        "quantize-1x16-row-dynamic": dict(scale_mode="row"),
        "quantize-1x16-tensor-dynamic": dict(),
        "quantize-16x16-tensor-static": dict(block=(16, 16), amax=4.0),
        "quantize-1x16-tensor-static-fast": dict(amax=4.0, math="fast"),
        "quantize-1x16-tensor-static-sr": dict(amax=4.0, rounding="sr", seed=1),
        "quantize-1x16-tensor-dynamic-rht": dict(rht=True),
        "quantize-1x16-row-dynamic+dq": dict(scale_mode="row", emit_dq=True),
    }
    # the same kernels loading each K tile one iteration ahead (kernels/quantize.py PREFETCH_DEFAULT), beside them
    variants.update({f"{name}+prefetch": dict(variants[name], prefetch=True) for name in (
        "quantize-1x16-row-dynamic", "quantize-1x16-row-dynamic+dq", "quantize-1x16-tensor-static",
        "quantize-1x16-tensor-static-sr", "quantize-16x16-tensor-static")})
    for name, kw in variants.items():
        def run(kw=kw, name=name):
            f = lambda: quantize_triton(x, check=False, **kw)  # noqa: E731
            t = time_fn(f, reps)
            out_bytes = quantized_bytes(m, k, kw.get("emit_dq", False))
            in_bytes = m * k * 2 * (2 if (kw.get("amax") is None and kw.get("scale_mode") != "row") else 1)
            gbps = (m * k * 2 + out_bytes) / t[0] / 1e6  # compulsory bytes (input read once)
            rec.add(name, shape, t, "d2d-copy", t_copy, gbps=gbps, bw_frac=gbps / copy_gbps,
                    moved_gbps=(in_bytes + out_bytes) / t[0] / 1e6)
        _guard(rec, name, shape, run)
    bench_quantize_cols(rec, x, t_copy, copy_gbps, reps, sweep)
    bench_quantize_dual(rec, x, t_copy, copy_gbps, reps, sweep)
    if not sweep:
        return
    # tile sweep for the default (1x16 row dynamic): BLOCK_M, BLOCK_K, num_warps; the last three hold 8 elements a
    # thread (53 registers on sm_90 against the default's 80: 9-19 blocks an SM, NOTES row 36)
    for bm, bk, nw in [(16, 256, 4), (8, 256, 4), (16, 512, 8), (32, 256, 8), (16, 128, 4), (4, 512, 4),
                       (8, 128, 4), (4, 256, 4), (4, 128, 2)]:
        nm = f"quantize-tile-bm{bm}-bk{bk}-w{nw}"
        _guard(rec, nm, shape, lambda bm=bm, bk=bk, nw=nw, nm=nm: rec.add(
            nm, shape, time_fn(lambda: quantize_triton(x, scale_mode="row", check=False, block_m=bm, block_k=bk,
                                                         num_warps=nw), reps), "d2d-copy", t_copy))


COLS_SWEEP = [(32, 64, 4), (64, 64, 4), (64, 128, 4), (64, 128, 8), (128, 64, 4), (128, 128, 8), (64, 256, 8),
              (32, 128, 4)]  # (BLOCK_T, BLOCK_C, num_warps)


def bench_quantize_cols(rec, x, t_copy, copy_gbps, reps=30, sweep=False):
    """The along-token quantizer (kernels/quantize_cols.py: x [T, C] -> codes of xᵀ, the wgrad operands) and its
    block-amax pass, against the same D2D copy: minite's saved xᵀ (static scale after the amax pass), a gradient's
    dyᵀ (SR + the bf16 copy for the GEMM), TE's recipe (RHT, rounded to bf16), and the fp32 expert weights' Wᵀ."""
    from minite_core.kernels.quantize_cols import col_block_amax, quantize_cols_triton

    m, k = x.shape
    shape = f"{m}x{k} bf16"
    variants = {
        "quantize-cols-static": dict(amax=4.0),
        "quantize-cols-static-sr+dq": dict(amax=4.0, rounding="sr", seed=1, emit_dq=True),
        "quantize-cols-rht-bf16-static": dict(amax=4.0, rht=True, rht_dtype="bfloat16"),
        "quantize-cols-rht-bf16-static-sr+dq": dict(amax=4.0, rht=True, rht_dtype="bfloat16", rounding="sr", seed=1,
                                                    emit_dq=True),
    }
    x32 = x.float()  # the expert weights' Wᵀ (nn.expert_weights.weight_t_inplace): fp32 masters, RNE + the bf16 copy
    variants["quantize-cols-fp32-static+dq"] = dict(amax=4.0, emit_dq=True)
    for name, kw in variants.items():
        src = x32 if "fp32" in name else x

        def run(kw=kw, name=name, cfg=None, src=src):
            tile = {} if cfg is None else dict(block_t=cfg[0], block_c=cfg[1], num_warps=cfg[2])
            t = time_fn(lambda: quantize_cols_triton(src, check=False, **kw, **tile), reps)
            out_bytes = quantized_bytes(m, k, kw.get("emit_dq", False))
            gbps = (m * k * src.element_size() + out_bytes) / t[0] / 1e6  # compulsory bytes (input read once)
            label = name if cfg is None else f"{name}-bt{cfg[0]}-bc{cfg[1]}-w{cfg[2]}"
            rec.add(label, f"{m}x{k} {str(src.dtype)[6:]}", t, "d2d-copy", t_copy, gbps=gbps, bw_frac=gbps / copy_gbps)
        _guard(rec, name, shape, run)
        for cfg in COLS_SWEEP if sweep and name.endswith(("cols-static", "+dq")) else ():
            _guard(rec, name, shape, lambda cfg=cfg, run=run: run(cfg=cfg))
    for name, kw in (("col-block-amax", {}), ("col-block-amax-rht-bf16", dict(rht=True, rht_dtype="bfloat16"))):
        def amax(kw=kw, name=name, cfg=None):
            tile = {} if cfg is None else dict(block_t=cfg[0], block_c=cfg[1], num_warps=cfg[2])
            t = time_fn(lambda: col_block_amax(x, **kw, **tile), reps)
            gbps = m * k * 2 / t[0] / 1e6
            label = name if cfg is None else f"{name}-bt{cfg[0]}-bc{cfg[1]}-w{cfg[2]}"
            rec.add(label, shape, t, "d2d-copy", t_copy, gbps=gbps, bw_frac=gbps / copy_gbps)
        _guard(rec, name, shape, amax)
        for cfg in COLS_SWEEP if sweep else ():
            _guard(rec, name, shape, lambda cfg=cfg, amax=amax: amax(cfg=cfg))


DUAL_SWEEP = [(64, 128, 8), (32, 128, 4), (64, 64, 4), (32, 64, 4), (128, 64, 8), (64, 256, 8)]


def bench_quantize_dual(rec, x, t_copy, copy_gbps, reps=30, sweep=False):
    """A linear's two operands of one tensor from one read (`quantize_rows_cols_triton`), amax passes included: the
    forward's x (row codes + bf16 copy for the GEMM, xᵀ codes kept for wgrad) as minite (per-token rows) and TE's
    recipe (per-tensor rows, RHT'd xᵀ) run it, and a gradient dy (SR both ways, both bf16 copies) — against the D2D
    copy, with the separate quantizers it replaces timed beside it (`separate_ms`: row quantizer + xᵀ amax pass +
    along-token quantizer)."""
    from minite_core.kernels.quantize import quantize_triton, row_amax
    from minite_core.kernels.quantize_cols import col_block_amax, quantize_cols_triton, quantize_rows_cols_triton

    m, k = x.shape
    shape = f"{m}x{k} bf16"
    rht = dict(rht=True, rht_dtype="bfloat16")

    def minite(tile):
        ra = row_amax(x)
        return quantize_rows_cols_triton(x, ra, **tile)

    def minite_separate():
        quantize_triton(x, scale_mode="row", emit_dq=True, check=False)
        quantize_cols_triton(x, amax=col_block_amax(x).amax(), check=False)

    def te(tile):
        return quantize_rows_cols_triton(x, row_amax(x).amax(), amax=col_block_amax(x, **rht).amax(), **rht, **tile)

    def te_separate():
        quantize_triton(x, emit_dq=True, check=False)
        quantize_cols_triton(x, amax=col_block_amax(x, **rht).amax(), check=False, **rht)

    def grad(tile):  # a gradient (both recipes without the RHT): SR each way, both bf16 copies
        return quantize_rows_cols_triton(x, row_amax(x).amax(), rounding="sr", row_seed=1, seed=2, emit_dq=True,
                                         **tile)

    def grad_separate():
        quantize_triton(x, rounding="sr", seed=1, emit_dq=True, check=False)
        quantize_cols_triton(x, amax=col_block_amax(x).amax(), rounding="sr", seed=2, emit_dq=True, check=False)

    for name, dual, separate in (("quantize-dual-row+cols", minite, minite_separate),
                                 ("quantize-dual-tensor+cols-rht-bf16", te, te_separate),
                                 ("quantize-dual-grad-sr+dq", grad, grad_separate)):
        out_bytes = 2 * (m * k // 2 + m * k // 16) + m * k * 2 * (2 if name.endswith("+dq") else 1)
        t_sep = time_fn(separate, reps)
        for cfg in [None] + (DUAL_SWEEP if sweep else []):
            tile = {} if cfg is None else dict(block_t=cfg[0], block_c=cfg[1], num_warps=cfg[2])
            label = name if cfg is None else f"{name}-bt{cfg[0]}-bc{cfg[1]}-w{cfg[2]}"

            def run(dual=dual, tile=tile, label=label, t_sep=t_sep):
                t = time_fn(lambda: dual(tile), reps)
                gbps = (m * k * 2 + out_bytes) / t[0] / 1e6  # compulsory bytes (x read once)
                rec.add(label, shape, t, "d2d-copy", t_copy, gbps=gbps, bw_frac=gbps / copy_gbps,
                        separate_ms=t_sep[0], vs_separate=t_sep[0] / t[0])
            _guard(rec, label, shape, run)


def bench_linear(rec, m, n, k, reps=20, sweep=False):
    from minite_core.kernels import gemm as G
    from minite_core.kernels.operands import DqOperand
    from minite_core.kernels.quantize import quantize_triton
    from minite_core.kernels.reference import gemm_reference

    shape = f"M{m} N{n} K{k}"
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    t_bf16 = time_fn(lambda: F.linear(x, w), reps)
    flops = 2 * m * n * k
    rec.add("linear-bf16-cublas", shape, t_bf16, tflops=flops / t_bf16[0] / 1e9)

    def fp8():
        xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        sx = torch.ones(m, 1, device="cuda")
        sw = torch.ones(1, n, device="cuda")
        t = time_fn(lambda: torch._scaled_mm(xf, wf.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16), reps)
        rec.add("linear-fp8-rowwise-scaled_mm", shape, t, "linear-bf16-cublas", t_bf16, tflops=flops / t[0] / 1e9)
    _guard(rec, "linear-fp8-rowwise-scaled_mm", shape, fp8)

    tw, dw = quantize_triton(w, emit_dq=True)
    W = DqOperand(dw, tw.global_scale)  # prepared weights (once per optimizer step)
    ta, da = quantize_triton(x, scale_mode="row", emit_dq=True)
    A = DqOperand(da, ta.global_scale)
    yr = gemm_reference(ta, tw)  # correctness spot check on the GPU (fp32 dequantize + matmul)
    for nm, impl in (("cublas", G.gemm_cublas), ("triton", G.gemm_triton)):
        def run(nm=nm, impl=impl):
            y = impl(A, W, torch.float32)
            rel = ((y - yr).norm() / yr.norm()).item()
            t = time_fn(lambda: impl(A, W, torch.bfloat16), reps)
            rec.add(f"gemm-w4a4-{nm}(dq operands)", shape, t, "linear-bf16-cublas", t_bf16,
                    tflops=flops / t[0] / 1e9, rel_err=rel)

            def fwd():
                _, a_dq = quantize_triton(x, scale_mode="row", emit_dq=True, check=False)
                return impl(DqOperand(a_dq, _.global_scale), W, torch.bfloat16)
            t2 = time_fn(fwd, reps)
            rec.add(f"linear-w4a4-fwd-{nm}(quant+gemm)", shape, t2, "linear-bf16-cublas", t_bf16,
                    tflops=flops / t2[0] / 1e9)
        _guard(rec, f"gemm-w4a4-{nm}", shape, run)
    _guard(rec, "linear-w4a4-fwd-fused", shape, functools.partial(bench_linear_fused, rec, shape, x, W, flops, t_bf16,
                                                                  reps))
    if sweep:
        for cfg in [dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_stages=4, num_warps=8),
                    dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=4, num_warps=8),
                    dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, num_stages=3, num_warps=8),
                    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_stages=3, num_warps=8),
                    dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3, num_warps=4)]:
            nm = "gemm-triton-cfg-" + "-".join(f"{v}" for v in cfg.values())
            _guard(rec, nm, shape, lambda cfg=cfg, nm=nm: rec.add(
                nm, shape, time_fn(lambda: G.gemm_triton(A, W, torch.bfloat16, config=cfg), reps),
                "linear-bf16-cublas", t_bf16))


def bench_linear_fused(rec, shape, x, W, flops, t_bf16, reps):
    """The dense forward with the per-token quantizer fused into the Triton GEMM (`gemm_triton_quant`) vs the
    separate pass + `gemm_triton` (the same bits: compared here) and vs cuBLAS bf16; the amax pass included."""
    from minite_core.kernels import gemm as G
    from minite_core.kernels.operands import DqOperand
    from minite_core.kernels.quantize import quantize_triton, row_amax

    def separate():
        q, a_dq = quantize_triton(x, scale_mode="row", emit_dq=True, check=False)
        return G.gemm_triton(DqOperand(a_dq, q.global_scale), W, torch.bfloat16)

    def fused():
        return G.gemm_triton_quant(x, row_amax(x), W, torch.bfloat16)[0]

    same = torch.equal(separate(), fused())
    t_sep = time_fn(separate, reps)
    t = time_fn(fused, reps)
    rec.add("linear-w4a4-fwd-fused", shape, t, "linear-w4a4-fwd-triton(quant+gemm)", t_sep, tflops=flops / t[0] / 1e9,
            vs_cublas_bf16=t_bf16[0] / t[0], bitwise=same)


GROUPED_SWEEP = [dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4),
                 dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3),
                 dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4),
                 dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_warps=8, num_stages=3),
                 dict(BLOCK_M=64, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=4)]
KGROUPED_SWEEP = [dict(BLOCK_N=128, BLOCK_K=128, BLOCK_T=64, num_warps=8, num_stages=4),
                  dict(BLOCK_N=128, BLOCK_K=256, BLOCK_T=64, num_warps=8, num_stages=3),
                  dict(BLOCK_N=64, BLOCK_K=128, BLOCK_T=64, num_warps=4, num_stages=4),
                  dict(BLOCK_N=128, BLOCK_K=128, BLOCK_T=128, num_warps=8, num_stages=3)]


def bench_moe(rec, tokens, hidden=2048, inter=768, experts=128, topk=8, reps=10, sweep=False):
    """Expert GEMMs on the padded sorted layout (`nn.moe_layout`): forward/dgrad (M-grouped) and wgrad
    (K-grouped), NVFP4 (Triton, exact) vs torch._grouped_mm bf16 on the same layout."""
    from minite_core.kernels import grouped as GG
    from minite_core.kernels.operands import DqOperand
    from minite_core.kernels.quantize import quantize_triton
    from minite_core.nn.moe_layout import moe_layout

    gen = torch.Generator(device="cuda").manual_seed(0)
    top = torch.rand(tokens, experts, device="cuda", generator=gen).topk(topk, dim=-1).indices
    layout = moe_layout(top, experts)
    rows, offs, ends = layout.num_rows, layout.offs, layout.offs[1:].to(torch.int32)
    for name, n, k in (("gate_up", 2 * inter, hidden), ("down", hidden, inter)):
        shape = f"T{tokens}x{topk} E{experts} N{n} K{k}"
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        wt = w.transpose(-2, -1)
        t_bf16 = time_fn(lambda: torch._grouped_mm(x, wt, offs=ends), reps)
        flops = 2 * tokens * topk * n * k  # real routed rows only (pad rows are overhead)
        rec.add(f"moe-{name}-bf16-grouped_mm", shape, t_bf16, tflops=flops / t_bf16[0] / 1e9)
        qw, dqw = quantize_triton(w.reshape(experts * n, k), emit_dq=True)
        W = DqOperand(dqw.view(experts, n, k), qw.global_scale.expand(experts).contiguous())
        ta, da = quantize_triton(x, scale_mode="row", emit_dq=True)
        A = DqOperand(da, ta.global_scale)

        def run(cfg=None, label="triton"):
            sched = GG.grouped_schedule(offs, (cfg or GG.GROUPED_CONFIG)["BLOCK_M"], rows)
            GG.grouped_gemm(A, W, offs, torch.bfloat16, config=cfg, schedule=sched)
            t = time_fn(lambda: GG.grouped_gemm(A, W, offs, torch.bfloat16, config=cfg, schedule=sched), reps)
            rec.add(f"moe-{name}-w4a4-gemm-{label}", shape, t, f"moe-{name}-bf16-grouped_mm", t_bf16,
                    tflops=flops / t[0] / 1e9)
            if cfg is None:
                def fwd():
                    q, a_dq = quantize_triton(x, scale_mode="row", emit_dq=True, check=False)
                    return GG.grouped_gemm(DqOperand(a_dq, q.global_scale), W, offs, torch.bfloat16, schedule=sched)
                t2 = time_fn(fwd, reps)
                rec.add(f"moe-{name}-w4a4-fwd-triton(quant+gemm)", shape, t2, f"moe-{name}-bf16-grouped_mm",
                        t_bf16, tflops=flops / t2[0] / 1e9)
        _guard(rec, f"moe-{name}-w4a4-triton", shape, run)
        _guard(rec, f"moe-{name}-w4a4-fused", shape,
               functools.partial(bench_moe_fused, rec, name, shape, x, W, layout, flops, t_bf16, reps))
        for cfg in GROUPED_SWEEP if sweep else ():
            lbl = "cfg-" + "-".join(str(v) for v in cfg.values())
            _guard(rec, f"moe-{name}-w4a4-gemm-{lbl}", shape, lambda cfg=cfg, lbl=lbl: run(cfg, lbl))
        # wgrad: dW[e] = dy_eᵀ x_e over each expert's tokens
        dy = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        t_wb = time_fn(lambda: torch._grouped_mm(dy.t(), x, offs=ends), reps)
        rec.add(f"moe-{name}-wgrad-bf16-grouped_mm", shape, t_wb, tflops=flops / t_wb[0] / 1e9)
        sa = torch.rand(experts, device="cuda")

        def wgrad(cfg=None, label="triton"):
            a_t, b_t = dy.t().contiguous(), x.t().contiguous()  # (N, Tp), (K, Tp): along-token operands
            t = time_fn(lambda: GG.kgrouped_gemm(a_t, sa, b_t, sa, offs, config=cfg), reps)
            rec.add(f"moe-{name}-wgrad-w4a4-{label}", shape, t, f"moe-{name}-wgrad-bf16-grouped_mm", t_wb,
                    tflops=flops / t[0] / 1e9)
        _guard(rec, f"moe-{name}-wgrad-w4a4-triton", shape, wgrad)
        _guard(rec, f"moe-{name}-w4a4-wgrad-fused", shape,
               functools.partial(bench_moe_wgrad_fused, rec, name, shape, x, dy, layout, flops, t_wb, reps))
        for cfg in KGROUPED_SWEEP if sweep else ():
            lbl = "cfg-" + "-".join(str(v) for v in cfg.values())
            _guard(rec, f"moe-{name}-wgrad-{lbl}", shape, lambda cfg=cfg, lbl=lbl: wgrad(cfg, lbl))
        del x, w, wt, W, A, dy


def bench_moe_fused(rec, name, shape, x, W, layout, flops, t_bf16, reps):
    """The activation quantizer fused into the grouped GEMM (`grouped_gemm_quant`, kernels/quant_prologue.py) vs
    the separate pass (quantize emitting the bf16 copy, then `grouped_gemm`), as nn.experts runs each: the forward's
    per-token RNE operand (minite) and the dgrad's per-expert-amax SR operand (both recipes' gradients), each
    including its amax pass. Same bits either way (tests/test_fused_quant.py); rows give the ratio to the
    separate pass (speedup) and to torch._grouped_mm bf16 (vs_grouped_mm)."""
    from minite_core.kernels import grouped as GG
    from minite_core.kernels.operands import DqOperand
    from minite_core.kernels.quantize import quantize_triton, row_amax
    from minite_core.nn.experts import segment_amax

    offs, experts = layout.offs, layout.num_experts
    sched = GG.grouped_schedule(offs, GG._config(GG.GROUPED_CONFIG, GG.SMALL, None, x.device)["BLOCK_M"],
                                layout.num_rows)
    seg_seed = ((torch.arange(experts, device=x.device) * 7919 + 5)[layout.row_expert], layout.row_local)

    def expert_amax():
        return segment_amax(row_amax(x), layout.row_expert, experts)[layout.row_expert]

    def separate(sr):
        kw = {"amax": expert_amax(), "rounding": "sr", "seg_seed": seg_seed} if sr else {}
        q, a_dq = quantize_triton(x, scale_mode="row", emit_dq=True, check=False, **kw)
        return GG.grouped_gemm(DqOperand(a_dq, q.global_scale), W, offs, torch.bfloat16, schedule=sched)

    def fused(sr):
        kw = {"rounding": "sr", "seg_seed": seg_seed} if sr else {}
        return GG.grouped_gemm_quant(x, expert_amax() if sr else row_amax(x), W, offs, torch.bfloat16,
                                     schedule=sched, **kw)[0]

    for label, sr in (("fwd-rne-row", False), ("dgrad-sr-expert", True)):
        _fused_rows(rec, f"moe-{name}-w4a4-{label}", shape, functools.partial(separate, sr),
                    functools.partial(fused, sr), flops, f"moe-{name}-bf16-grouped_mm", t_bf16, reps)


def bench_moe_wgrad_fused(rec, name, shape, x, dy, layout, flops, t_wb, reps):
    """The wgrad's dyᵀ quantizer fused into the K-grouped GEMM (`kgrouped_gemm_quant`, kernels/quant_prologue.py
    `t_tile`: dy read in place, no bf16 dyᵀ copy) vs the separate along-token pass (`quantize_cols_triton` emitting
    the bf16 copy, then `kgrouped_gemm`), as nn.experts runs each, both with the per-expert amax pass: minite's
    gradient (SR, per-expert scales) and te-nvfp4's (the same after the RHT rounded to bf16). The saved x operand
    (bf16 [K, Tp]) is made once outside both timings. Same bits either way (tests/test_fused_quant.py); rows give
    the ratio to the separate pass (speedup) and to torch._grouped_mm bf16's wgrad (vs_grouped_mm)."""
    from minite_core.kernels import grouped as GG
    from minite_core.kernels.quantize import decode_scale
    from minite_core.kernels.quantize_cols import col_block_amax, quantize_cols_triton
    from minite_core.nn.experts import segment_amax

    offs, experts = layout.offs, layout.num_experts
    block_expert = layout.row_expert[::16].contiguous()
    seg_seed = ((torch.arange(experts, device=dy.device) * 7919 + 6)[layout.row_expert], layout.row_local)
    xt = x.t().contiguous()  # (K, Tp)
    s_x = torch.rand(experts, device=dy.device) + 0.5
    quant = {"rounding": "sr", "seg_seed": seg_seed, "rht_dtype": "bfloat16"}

    def expert_amax(rht):
        return segment_amax(col_block_amax(dy, rht=rht, rht_dtype="bfloat16"), block_expert, experts)

    def separate(rht):
        amax = expert_amax(rht)
        _, dq = quantize_cols_triton(dy, col_amax=amax[block_expert], rht=rht, emit_dq=True, check=False, **quant)
        return GG.kgrouped_gemm(dq, decode_scale(amax), xt, s_x, offs)

    def fused(rht):
        return GG.kgrouped_gemm_quant(dy, expert_amax(rht), xt, s_x, offs, rht=rht, **quant)[0]

    for label, rht in (("wgrad-sr-expert", False), ("wgrad-sr-rht-bf16", True)):
        _fused_rows(rec, f"moe-{name}-w4a4-{label}", shape, functools.partial(separate, rht),
                    functools.partial(fused, rht), flops, f"moe-{name}-wgrad-bf16-grouped_mm", t_wb, reps)


def _fused_rows(rec, op, shape, separate, fused, flops, bf16_op, t_bf16, reps):
    """Rows `{op}-separate` (vs the bf16 baseline `bf16_op`) and `{op}-fused` (vs the separate row, with
    vs_grouped_mm and `bitwise`: the compiled kernels' outputs equal, checked with the timing)."""
    same = torch.equal(separate(), fused())
    t_sep = time_fn(separate, reps)
    rec.add(f"{op}-separate", shape, t_sep, bf16_op, t_bf16, tflops=flops / t_sep[0] / 1e9)
    t_fused = time_fn(fused, reps)
    rec.add(f"{op}-fused", shape, t_fused, f"{op}-separate", t_sep, tflops=flops / t_fused[0] / 1e9,
            vs_grouped_mm=t_bf16[0] / t_fused[0], bitwise=same)


def _env(commit):
    import triton

    env = {**env_info(), "gpu": torch.cuda.get_device_name(), "triton": triton.__version__}
    return {**env, "commit": commit} if commit is not None else env


def main(argv=None):
    p = argparse.ArgumentParser(prog="minite bench kernels", description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True, help="output JSON (schema bench-kernels/v1)")
    p.add_argument("--csv", required=True, help="output long-format CSV")
    p.add_argument("--only", default="quantize,linear,moe,decode", help="comma list of sections")
    p.add_argument("--sweep", nargs="?", const="all", default=None, choices=("all", "mma"),
                   help="also sweep tile configs (mma: only the tensor-core decode kernel's)")
    p.add_argument("--quick", action="store_true", help="small shapes / fewer reps (smoke)")
    p.add_argument("--commit", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench kernels needs a CUDA GPU (none visible)")
    only = set(args.only.split(","))
    rec = Recorder()
    torch.manual_seed(0)
    if "quantize" in only:
        bench_quantize(rec, *((1024, 1024) if args.quick else (16384, 4096)), sweep=args.sweep == "all")
    if "linear" in only:
        bench_linear(rec, 16384, 4096, 4096, sweep=args.sweep == "all")
        if not args.quick:
            bench_linear(rec, 8192, 8192, 8192)
    if "moe" in only:
        for tokens in ((4096,) if args.quick else (4096, 16384)):
            bench_moe(rec, tokens, sweep=args.sweep == "all" and tokens == 16384)
    if "decode" in only:
        from minite_core.bench.decode_kernels import bench_decode

        bench_decode(rec, sweep=args.sweep)  # "mma": that kernel's sweep alone
    env = _env(args.commit)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"schema": "bench-kernels/v1", "env": env, "rows": rec.rows}, f, indent=1)
    keys = ["op", "shape", "metric", "value", *env]  # env: every field results.env_info records
    with open(args.csv, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=keys)
        wr.writeheader()
        for r in rec.rows:
            for metric, v in r.items():
                if metric in ("op", "shape") or v is None:
                    continue
                wr.writerow({"op": r["op"], "shape": r["shape"], "metric": metric, "value": v, **env})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`minite bench kernels --only decode`: the decode GEMMs at decode shapes (a few rows), each against the GEMM users
run on bf16 weights in the same run — cuBLAS `F.linear` for the dense layers, `torch._grouped_mm` for the MoE
experts — with bandwidth against the D2D copy of this run: the Triton packed kernel (kernels/decode.py) and the
tensor-core kernel (kernels/decode_mma.py); `--sweep` adds their tile sweeps (`--sweep mma`: that kernel's alone)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minite_core.bench.kernel_timing import _guard, time_graph


DECODE_SWEEP = [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)
                for bn, bk, nw, ns in ((64, 128, 4, 2), (64, 128, 4, 4), (64, 256, 4, 3), (128, 128, 8, 3),
                                       (128, 256, 8, 3), (64, 64, 4, 4))]


MMA_SWEEP = [dict(warps=w, unroll=u, blocks_per_sm=b) for w, u, b in
             ((4, 4, 4), (4, 16, 4), (8, 8, 2), (8, 8, 4), (4, 8, 2), (4, 8, 8), (2, 8, 8), (8, 4, 8))]


def bench_decode(rec, reps=20, sweep=False):
    """Packed-weight decode GEMMs (kernels/decode.py) against cuBLAS bf16 F.linear on the same shapes, each
    captured in one CUDA graph cycling over > 4x L2 of its own weight bytes; bandwidth = weight bytes read / time
    against the D2D copy bandwidth of this run. W4A16 (x bf16) and W4A4 with the fused per-token quantizer (the
    sampler's minite-packed path above 16 rows), the tensor-core kernel (`decode-*-mma`, kernels/decode_mma.py: the
    sampler's path up to 16 rows; its W4A4 rows include the quantizer's launch, fused and `quantize_rows` both
    timed), then the MoE experts' grouped packed GEMM at decode against torch._grouped_mm."""
    from minite_core.bench.timing import copy_bandwidth
    from minite_core.kernels.decode import decode_config, packed_gemm_triton
    from minite_core.kernels.quantize import quantize_triton
    from minite_core.formats import nvfp4 as ref
    from minite_core.kernels import decode_mma, dispatch
    from minite_core.kernels.reference import packed_gemm_reference
    from minite_core.profiles import Quant

    copy_gbps = copy_bandwidth("cuda")
    rec.add("d2d-copy", "1 GiB", (2 * (1 << 30) / copy_gbps / 1e6,) * 3, gbps=copy_gbps)
    row_act = Quant(scale_mode="row")
    for nk in (4096, 8192):
        l2x4 = 256 << 20
        ws = [torch.randn(nk, nk, device="cuda", dtype=torch.bfloat16) * 0.02
              for _ in range(max(4, l2x4 // (nk * nk * 2)))]
        qw = [quantize_triton(ws[i % len(ws)])[0] for i in range(max(4, l2x4 // int(nk * nk * 0.5625)))]
        bytes_bf16, bytes_w4 = nk * nk * 2, nk * nk * 0.5625
        for m in (1, 4, 8, 16):
            shape = f"M{m} N{nk} K{nk}"
            x = torch.randn(m, nk, device="cuda", dtype=torch.bfloat16)
            t_bf16 = time_graph([lambda w=w: F.linear(x, w) for w in ws], reps)
            g = bytes_bf16 / t_bf16[0] / 1e6
            rec.add("decode-bf16-cublas", shape, t_bf16, gbps=g, bw_frac=g / copy_gbps)

            def run(cfg=None, label=""):
                cfg_m = decode_config(1 if m <= 16 else -(-m // 64), nk, nk, x.device, cfg)
                for name, act in (("w4a16", None), ("w4a4", row_act)):
                    y = packed_gemm_triton(x, qw[0], act=act, out_dtype=torch.float32, config=cfg)
                    yr = packed_gemm_reference(x, qw[0], act=act, block_k=cfg_m["BLOCK_K"], split_k=cfg_m["SPLIT_K"])
                    rel = ((y - yr).norm() / yr.norm()).item()
                    t = time_graph([lambda q=q: packed_gemm_triton(x, q, act=act, config=cfg) for q in qw], reps)
                    gb = bytes_w4 / t[0] / 1e6
                    rec.add(f"decode-{name}-packed{label}", shape, t, "decode-bf16-cublas", t_bf16, gbps=gb,
                            bw_frac=gb / copy_gbps, rel_err=rel, split_k=cfg_m["SPLIT_K"],
                            placed=int(cfg_m["PLACED"]))
            _guard(rec, "decode-packed", shape, run)

            def run_mma(cfg=None, label=""):  # the tensor-core kernel (kernels/decode_mma.py), as the sampler calls it
                # w4a4: as the dispatch runs it (fused quantizer below CONFIG's rows_quant_min rows, else
                # `quantize_rows` then the kernel); -fused / -rows: each way at every M (the rule is chosen here)
                variants = (("w4a16", None, cfg), ("w4a4", row_act, cfg),
                            ("w4a4-fused", row_act, dict(cfg or {}, rows_quant_min=99)),
                            ("w4a4-rows", row_act, dict(cfg or {}, rows_quant_min=1)))
                for name, act, c in variants if cfg is None else variants[:2]:
                    f = lambda q, act=act, c=c, **kw: decode_mma.packed_gemm_mma(  # noqa: E731
                        x, q, act=act, config=c, **kw)
                    y = f(qw[0], out_dtype=torch.float32)
                    w64 = ref.dequantize_unscaled(qw[0]).double().t() * qw[0].global_scale.double().reshape(1, -1)
                    if act is None:
                        yr = x.double() @ w64
                    else:  # x̂ as the quantizer makes it, in fp64
                        _, dq = dispatch.quantize_dq(x, act, check=False)
                        yr = (dq.values_bf16.double() * dq.global_scale.double()) @ w64
                    rel = ((y.double() - yr).norm() / yr.norm()).item()
                    t = time_graph([lambda q=q: f(q) for q in qw], reps)
                    gb = bytes_w4 / t[0] / 1e6
                    rec.add(f"decode-{name}-mma{label}", shape, t, "decode-bf16-cublas", t_bf16, gbps=gb,
                            bw_frac=gb / copy_gbps, rel_err=rel,
                            split_k=decode_mma.split_k(nk, nk, x.device, dict(decode_mma.CONFIG, **(cfg or {})))[0])
            if m <= decode_mma.MAX_ROWS:
                _guard(rec, "decode-mma", shape, run_mma)
                for cfg in MMA_SWEEP if sweep in ("all", "mma") else ():
                    lbl = "-cfg-" + "-".join(f"{k[0]}{v}" for k, v in cfg.items())
                    _guard(rec, "decode-mma" + lbl, shape, lambda cfg=cfg, lbl=lbl: run_mma(cfg, lbl))
            if sweep == "all":
                for cfg in DECODE_SWEEP + [dict(PLACED=False)]:
                    for split in ((None, 1) if "PLACED" not in cfg else (None,)):
                        c = dict(cfg, **({} if split is None else {"SPLIT_K": split}))
                        lbl = "-cfg-" + "-".join(f"{k[0].lower()}{v}" for k, v in c.items())
                        _guard(rec, "decode" + lbl, shape, lambda c=c, lbl=lbl: run(c, lbl))
        del ws, qw
    bench_decode_moe(rec, reps)


def bench_decode_moe(rec, reps=20, hidden=2048, inter=768, experts=128, topk=8):
    """The MoE experts at decode (Qwen3-30B-A3B's expert shapes): batch tokens x top-k rows on the padded sorted
    layout, packed NVFP4 grouped GEMM (W4A16 and fused W4A4) vs torch._grouped_mm on bf16 expert weights; the
    bytes are those of the experts the batch touches."""
    from minite_core.kernels import decode_mma, dispatch
    from minite_core.kernels.decode import grouped_packed_gemm_triton, grouped_packed_schedule
    from minite_core.kernels.operands import PackedExperts
    from minite_core.kernels.quantize import quantize_triton
    from minite_core.nn.experts import _GroupedMM
    from minite_core.nn.moe_layout import moe_layout
    from minite_core.profiles import Quant

    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, n, k in (("gate_up", 2 * inter, hidden), ("down", hidden, inter)):
        copies = max(4, (256 << 20) // (experts * n * k * 2))
        ws = [torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        packed = []
        for w in ws:
            q = quantize_triton(w.reshape(experts * n, k))[0]
            packed.append(PackedExperts(q.data.view(experts, n, k // 2), q.scale.view(experts, n, k // 16),
                                        q.global_scale.expand(experts).contiguous()))
        for tokens in (1, 16):
            top = torch.rand(tokens, experts, device="cuda", generator=gen).topk(topk, dim=-1).indices
            layout = moe_layout(top, experts)
            touched = int(top.unique().numel())
            rows, offs, ends = layout.num_rows, layout.offs, layout.offs[1:].to(torch.int32)
            shape = f"T{tokens}x{topk} E{experts} N{n} K{k}"
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            # the bf16 experts as the model runs them: the filler rows past the routed ones (most of Tp at decode)
            # skipped and zero-filled (MoELayout.live_rows); the "-all-rows" row times _grouped_mm over all of Tp
            live, routed = layout.live_rows(), layout.dest.numel()
            t_bf16 = time_graph([lambda w=w: _GroupedMM.apply(x, w, w, layout) for w in ws], reps)
            rec.add(f"decode-moe-{name}-bf16-grouped_mm", shape, t_bf16, touched_experts=touched,
                    gbps=touched * n * k * 2 / t_bf16[0] / 1e6)
            t_all = time_graph([lambda w=w: torch._grouped_mm(x, w.transpose(-2, -1), offs=ends) for w in ws], reps)
            rec.add(f"decode-moe-{name}-bf16-grouped_mm-all-rows", shape, t_all, f"decode-moe-{name}-bf16-grouped_mm",
                    t_bf16, rows=rows)

            def run():
                sched = grouped_packed_schedule(offs, rows, experts, live, routed)
                for label, act in (("w4a16", None), ("w4a4", Quant(scale_mode="row"))):
                    t = time_graph([lambda p=p: grouped_packed_gemm_triton(x, p, offs, act=act, schedule=sched)
                                    for p in packed], reps)
                    rec.add(f"decode-moe-{name}-{label}-packed", shape, t, f"decode-moe-{name}-bf16-grouped_mm",
                            t_bf16, gbps=touched * n * k * 0.5625 / t[0] / 1e6)

            def run_mma():  # the tensor-core kernel as the sampler's MoE layer calls it (W4A4: quantizer + kernel)
                sched = dispatch.grouped_decode_schedule(offs, rows, live, routed)
                for label, act in (("w4a16", None), ("w4a4", Quant(scale_mode="row"))):
                    if not decode_mma.grouped_supported(x, packed[0]):
                        return
                    t = time_graph([lambda p=p: dispatch.grouped_decode_gemm(x, p, offs, act=act, schedule=sched)
                                    for p in packed], reps)
                    rec.add(f"decode-moe-{name}-{label}-mma", shape, t, f"decode-moe-{name}-bf16-grouped_mm",
                            t_bf16, gbps=touched * n * k * 0.5625 / t[0] / 1e6)
            _guard(rec, f"decode-moe-{name}", shape, run)
            _guard(rec, f"decode-moe-{name}-mma", shape, run_mma)
        del ws, packed

"""`minite kernels`: the DAG's first stage — compile every W4A4 kernel the experiment will use and check each on
the experiment's device against the plain-torch reference before any stage relies on it.

What is checked comes from the experiment config: the profiles named anywhere in it (throughput, RL runs,
diagnostics pairs, eval) give the quantizer variants (block, scale source, math, SR, RHT) and GEMM kinds (dense,
grouped MoE, wgrad, W4A16, fp32 LM head) that will run; the model shape gives the reduction widths. Each check
draws fresh random inputs (rows of very different amax) plus DESIGN.md's edge cases (an all-zero block, the
rounding ties 0.25 / 0.75 / 1.25 / 1.75 / 2.5 / 3.5 / 5, -0.1, -0.0, values beyond 6, an all-zero row):
codes and scales must be bitwise the reference's, GEMM outputs within `GEMM_TOL` (fp32 accumulation order —
the products are exact in bf16). Each row: kernel, shape, backend, compile seconds (the first call: Triton JIT),
max error, verdict. Written as results/<exp>/kernels/check.json (results contract, stage "kernels"); a failed
check stops the stage with one line naming the kernel, the shape and the error.

On CPU the Triton kernels run under TRITON_INTERPRET=1 at small shapes (the smoke DAG: well under a minute);
on the GPU the same checks run compiled, and `--bench` also runs the kernel micro-benchmarks
(`minite bench kernels`, baselines measured in the same run) into results/<exp>/bench/kernels.json.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time

import torch

from minite_core.profiles import Quant, experiment_profiles, get_profile
from minite_core.results import write_result

GEMM_TOL = 1e-5  # relative Frobenius error vs the fp32 reference (fp32 accumulation order, K <= 4096)
TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1, -0.0, 6.0, 7.0, 1e-30, -3.5, 0.5, 1.0, 2.0]


def _input(m: int, k: int, seed: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g).mul(8).exp2()
    x[0, :16] = 0.0
    x[1, :16] = torch.tensor(TIES)
    x[2] = 0.0
    return x.to(torch.bfloat16).to(device)


def _same(a, b) -> bool:
    return (torch.equal(a.data.cpu(), b.data.cpu())
            and torch.equal(a.scale.view(torch.uint8).cpu(), b.scale.view(torch.uint8).cpu()))


def _rel(y, y_ref) -> float:
    y, y_ref = y.double().cpu(), y_ref.double().cpu()
    return float((y - y_ref).norm() / y_ref.norm().clamp(min=1e-300))


class Checker:
    def __init__(self, device, backend: str):
        self.device, self.backend, self.rows = device, backend, []

    def run(self, kernel: str, shape: str, fn):
        """fn() -> (ok, max_err); the first call's wall time is the compile time (Triton JIT)."""
        t0 = time.perf_counter()
        try:
            ok, err = fn()
            error = None
        except Exception as exc:  # noqa: BLE001 - a kernel that fails to build or run is a failed check, recorded
            ok, err, error = False, None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.rows.append({"kernel": kernel, "shape": shape, "backend": self.backend, "device": str(self.device),
                          "compile_s": time.perf_counter() - t0, "max_err": err, "verdict": "ok" if ok else "FAIL",
                          **({"error": error} if error else {})})


def _quant_variants(profiles: list[str]) -> dict[str, tuple[Quant, bool]]:
    """name -> (Quant, rht) for every quantizer the profiles run (row-wise and along-token operands)."""
    out = {}
    for name in profiles:
        p = get_profile(name)
        for role in ("weight", "activation", "grad"):
            q = getattr(p, role)
            if q is not None:
                out[f"{role}:{q.block[0]}x{q.block[1]}-{q.scale_mode}-{q.math}-{q.rounding}-static{int(q.static)}"] = (q, False)
        if p.grad is not None:
            for q in (p.activation or p.grad, p.grad):
                out[f"wgrad:{q.math}-{q.rounding}-rht{int(p.wgrad_rht)}"] = (q, p.wgrad_rht)
    return out


def check_quantizers(ck: Checker, variants, m: int, k: int):
    from minite_core.kernels.quantize import quantize_triton
    from minite_core.kernels.quantize_cols import quantize_cols_triton
    from minite_core.kernels.reference import quantize_reference

    x = _input(m, k, 1, ck.device)
    for name, (q, rht) in variants.items():
        kw = dict(block=q.block, math=q.math, rounding=q.rounding, seed=7 if q.rounding == "sr" else None)
        if name.startswith("wgrad:"):
            def cols(kw=kw, rht=rht):
                t, _ = quantize_cols_triton(x, rht=rht, math=kw["math"], rounding=kw["rounding"], seed=kw["seed"])
                r, _ = quantize_reference(x.t().contiguous().cpu(), rht=rht, math=kw["math"], rounding=kw["rounding"],
                                          seed=kw["seed"])
                return _same(t, r), 0.0
            ck.run(f"quantize_cols[{name}]", f"{m}x{k}", cols)
            continue
        amax = 4.0 if q.static else None
        mode = q.scale_mode

        def rows(kw=kw, amax=amax, mode=mode):
            t, dq = quantize_triton(x, scale_mode=mode, amax=amax, emit_dq=True, **kw)
            r, rdq = quantize_reference(x.cpu(), scale_mode=mode, amax=amax, emit_dq=True, **kw)
            return _same(t, r) and torch.equal(dq.cpu(), rdq) and torch.equal(t.global_scale.cpu(), r.global_scale), 0.0
        ck.run(f"quantize[{name}]", f"{m}x{k}", rows)


def check_dual(ck: Checker, profiles: list[str], m: int, k: int):
    """The one-read forward quantization (dispatch.quantize_rows_cols) of every learner profile that uses it, against
    the reference's row quantizer on x and along-token quantizer on xᵀ: codes, scales, S_dec and bf16 copy bitwise."""
    from minite_core.kernels import dispatch
    from minite_core.kernels.quantize import row_amax
    from minite_core.kernels.quantize_cols import col_block_amax
    from minite_core.kernels.reference import quantize_reference

    x = _input(m - m % 16, k, 2, ck.device)
    for name in profiles:
        p = get_profile(name)
        act = p.activation
        if p.grad is None or not dispatch.rows_cols_spec(act) or act.rounding != "rne":
            continue
        rht = dict(rht=p.wgrad_rht, rht_dtype=p.wgrad_rht_dtype)

        def dual(act=act, rht=rht):
            ra = row_amax(x)
            amax = col_block_amax(x, **rht).amax() if rht["rht"] else None
            t, op, t_t, _ = dispatch.quantize_rows_cols(x, act, ra if act.scale_mode == "row" else ra.amax(), amax=amax,
                                                     **rht)
            r, rdq = quantize_reference(x.cpu(), scale_mode=act.scale_mode, math=act.math, emit_dq=True)
            r_t, _ = quantize_reference(x.t().contiguous().cpu(), math=act.math, **rht)
            return (_same(t, r) and torch.equal(op.values_bf16.cpu(), rdq)
                    and torch.equal(t.global_scale.cpu(), r.global_scale) and _same(t_t, r_t)), 0.0
        ck.run(f"quantize_rows_cols[{name}]", f"{x.shape[0]}x{k}", dual)


def check_gemms(ck: Checker, m: int, n: int, k: int, experts: int, top_k: int, fp32_head: bool):
    from minite_core.kernels import dispatch, grouped, reference
    from minite_core.kernels.operands import DqOperand
    from minite_core.kernels.quantize import quantize_triton

    dev = ck.device
    ta, da = quantize_triton(_input(m, k, 2, dev), scale_mode="row", emit_dq=True)
    tb, db = quantize_triton(_input(n, k, 3, dev), emit_dq=True)
    A, B = DqOperand(da, ta.global_scale), DqOperand(db, tb.global_scale)
    y_ref = reference.gemm_reference(_cpu(ta), _cpu(tb))
    ck.run("gemm", f"M{m} N{n} K{k}", lambda: _ok(_rel(dispatch.gemm(A, B, torch.float32), y_ref)))
    ck.run("dequantize", f"{n}x{k}", lambda: (torch.equal(grouped.dequantize_triton(tb).cpu(), db.cpu()), 0.0))
    ck.run("gemm_w4a16", f"M{m} N{n} K{k}", lambda: _ok(_rel(
        dispatch.gemm_w4a16(_input(m, k, 4, dev), B), _input(m, k, 4, "cpu").float() @ reference.ref.dequantize(_cpu(tb)).t())))
    if experts:
        from minite_core.nn.moe_layout import moe_layout

        g = torch.Generator().manual_seed(5)
        top = torch.rand(m, experts, generator=g).topk(top_k, dim=-1).indices.to(dev)
        layout = moe_layout(top, experts)
        tp = layout.num_rows
        tx, dx = quantize_triton(_input(tp, k, 6, dev), scale_mode="row", emit_dq=True)
        ws = [quantize_triton(_input(n, k, 10 + e, dev), emit_dq=True) for e in range(experts)]
        W = DqOperand(torch.stack([d for _, d in ws]), torch.stack([t.global_scale for t, _ in ws]))
        yg_ref = reference.grouped_gemm_reference(_cpu(tx), [_cpu(t) for t, _ in ws], layout.offs.cpu())
        ck.run("grouped_gemm", f"Tp{tp} E{experts} N{n} K{k}",
               lambda: _ok(_rel(dispatch.grouped_gemm(DqOperand(dx, tx.global_scale), W, layout.offs, torch.float32),
                                yg_ref)))
        x = _input(tp, k, 6, dev)  # the activation quantizer in the GEMM's prologue: the unfused path's bits
        ck.run("grouped_gemm_quant", f"Tp{tp} E{experts} N{n} K{k}", lambda: (torch.equal(
            dispatch.grouped_gemm_quant(x, Quant(scale_mode="row"), dispatch.row_amax(x), W, layout.offs,
                                        torch.float32)[0],
            dispatch.grouped_gemm(DqOperand(dx, tx.global_scale), W, layout.offs, torch.float32)), 0.0))
        a, b = _input(n, tp, 7, dev), _input(k, tp, 8, dev)
        s = torch.rand(experts, device=dev)
        bounds = layout.offs.tolist()
        kg_ref = torch.stack([(a[:, u:v].double().cpu() @ b[:, u:v].double().cpu().t()) * float(s[e]) ** 2
                              for e, (u, v) in enumerate(zip(bounds[:-1], bounds[1:]))])
        ck.run("kgrouped_gemm", f"Tp{tp} E{experts} N{n} K{k}",
               lambda: _ok(_rel(dispatch.kgrouped_gemm(a, s, b, s, layout.offs), kg_ref)))
        # wgrad's dyᵀ quantizer in the GEMM's prologue, every branch of it (SR per-expert streams, TE's RHT rounded
        # to bf16): the unfused path's bits (one variant: each costs the CPU smoke run ~5 s in the interpreter)
        ck.run("kgrouped_gemm_quant[sr-rht-bf16]", f"Tp{tp} E{experts} N{n} K{k}",
               lambda: (_wgrad_fused_equal(_input(tp, n, 12, dev), b, s, layout, True), 0.0))
        check_moe_quantizers(ck, layout, k)
    if fp32_head:
        from minite_core.formats.bf16x3 import split3
        from minite_core.nn.fp32_split import Fp32SplitLinear

        x, w = _input(m, k, 9, dev), torch.randn(n, k, device=dev) * 0.02
        ck.run("split3", f"{n}x{k}", lambda: (all(torch.equal(p.cpu(), q) for p, q in
                                                  zip(dispatch.split3(w, "stack").unbind(0), split3(w.cpu())[::-1])), 0.0))
        ck.run("fp32_split_linear", f"M{m} N{n} K{k}",
               lambda: _ok(_rel(Fp32SplitLinear.apply(x, w, None), x.double().cpu() @ w.double().cpu().t())))


def _wgrad_fused_equal(dy, xt, s_x, layout, rht: bool) -> bool:
    """`dispatch.kgrouped_gemm_quant` (dyᵀ quantized along tokens in the K-grouped GEMM's prologue: SR with
    per-expert streams, per-expert amax, TE's RHT rounded to bf16 with `rht`) equals the separate `quantize_cols`
    pass + `kgrouped_gemm`, bit for bit."""
    from minite_core.kernels import dispatch
    from minite_core.nn.experts import segment_amax

    grad, seeds = Quant(rounding="sr"), (1000 + 7919 * layout.row_expert, layout.row_local)
    block_expert = layout.row_expert[::16]
    blocks = dispatch.col_block_amax(dy, rht=rht, rht_dtype="bfloat16")
    amax = segment_amax(blocks, block_expert, layout.num_experts)
    _, dq = dispatch.quantize_cols(dy, grad, col_amax=amax[block_expert], seg_seed=seeds, rht=rht,
                                   rht_dtype="bfloat16", emit_dq=True)
    c_ref = dispatch.kgrouped_gemm(dq, dispatch.decode_scale(amax), xt, s_x, layout.offs)
    c, _ = dispatch.kgrouped_gemm_quant(dy, grad, amax, xt, s_x, layout.offs, seg_seed=seeds, rht=rht,
                                        rht_dtype="bfloat16")
    return torch.equal(c, c_ref)


def check_moe_quantizers(ck: Checker, layout, k: int):
    """The MoE's per-expert scales and SR streams (nn.experts): rows along K and xᵀ along tokens, against each
    expert's segment quantized alone with its own seed."""
    from minite_core.kernels.quantize import quantize_triton
    from minite_core.kernels.quantize_cols import quantize_cols_triton
    from minite_core.kernels.reference import quantize_reference

    x = _input(layout.num_rows, k, 11, ck.device)
    bounds = layout.offs.tolist()
    segs = [(u, v) for u, v in zip(bounds[:-1], bounds[1:])]
    seeds = (1000 + 7919 * torch.arange(layout.num_experts, device=ck.device)).to(torch.int64)
    local = layout.row_local
    amax = torch.stack([x[u:v].float().abs().amax() if v > u else torch.zeros((), device=ck.device) for u, v in segs])

    def rows():
        t, _ = quantize_triton(x, scale_mode="row", amax=amax[layout.row_expert], rounding="sr",
                               seg_seed=(seeds[layout.row_expert], local))
        return all(_same(_slice(t, u, v, 0), quantize_reference(x[u:v].cpu(), rounding="sr", seed=int(seeds[e]))[0])
                   for e, (u, v) in enumerate(segs) if v > u), 0.0

    def cols():
        t, _ = quantize_cols_triton(x, col_amax=amax[layout.row_expert[::16]], rounding="sr",
                                    seg_seed=(seeds[layout.row_expert], local))
        return all(_same(_slice(t, u, v, 1), quantize_reference(x[u:v].t().contiguous().cpu(), rounding="sr",
                                                                 seed=int(seeds[e]))[0])
                   for e, (u, v) in enumerate(segs) if v > u), 0.0
    ck.run("quantize[moe rows: per-expert scale + SR stream]", f"Tp{layout.num_rows}x{k}", rows)
    ck.run("quantize_cols[moe tokens: per-expert scale + SR stream]", f"Tp{layout.num_rows}x{k}", cols)


def _slice(t, u: int, v: int, axis: int):
    """Rows (axis 0) or token columns (axis 1) u:v of an NVFP4Tensor's codes and scales."""
    from minite_core.formats.nvfp4 import NVFP4Tensor

    if axis == 0:
        return NVFP4Tensor(t.data[u:v], t.scale[u:v], t.global_scale)
    return NVFP4Tensor(t.data[:, u // 2:v // 2], t.scale[:, u // 16:v // 16], t.global_scale)


def _cpu(t):
    from minite_core.formats.nvfp4 import NVFP4Tensor

    return NVFP4Tensor(t.data.cpu(), t.scale.cpu(), t.global_scale.cpu())


def _ok(err: float):
    return err <= GEMM_TOL, err


def shapes(config: dict, device) -> dict:
    """The checked shapes: the experiment model's widths on the GPU (small row counts), tiny ones on CPU."""
    p = config.get("pretrain", {})
    if device.type != "cuda":
        return dict(m=48, n=48, k=64, experts=4 if p.get("num_experts", 4) else 0, top_k=2)
    return dict(m=512, n=p.get("moe_intermediate_size", 256) * 2, k=p.get("hidden_size", 256),
                experts=p.get("num_experts", 8), top_k=p.get("num_experts_per_tok", 2))


def main(argv: list[str] | None = None) -> int:
    from minite_core.runs.cli import add_common_args, apply_common_args, run_command

    ap = argparse.ArgumentParser(prog="minite kernels", description=__doc__.splitlines()[0])
    ap.add_argument("--experiment-config", required=True, help="the experiment's whole config as JSON")
    ap.add_argument("--out", required=True, help="check.json (results contract, stage 'kernels')")
    ap.add_argument("--bench", default=None, help="GPU: also run `minite bench kernels` into this JSON")
    add_common_args(ap)
    args = apply_common_args(ap, ap.parse_args(argv))
    return run_command("minite kernels", lambda: _main(args))


def _skip(args, config: dict, device: torch.device, reason: str) -> int:
    """No kernel to check on this machine: an empty check.json that says why (the report prints the reason)."""
    write_result(args.out, stage="kernels", experiment=args.experiment,
                 config={"profiles": experiment_profiles(config), "device": str(device), "skipped": reason},
                 metrics={"checks": 0, "failed": 0, "seconds": 0.0}, rows=[])
    print(f"minite kernels: skipped on {device}: {reason} -> {args.out}", flush=True)
    return 0


def _main(args) -> int:
    from minite_core.kernels import dispatch

    config = json.loads(args.experiment_config)
    device = torch.device(args.device)
    if device.type != "cuda":
        if importlib.util.find_spec("triton") is None:
            return _skip(args, config, device, "triton is not installed: this CPU run uses the reference kernels "
                         "(nothing to check); `pip install triton==3.6.0` checks the Triton kernels under "
                         "TRITON_INTERPRET=1")
        os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import
    from minite_core.kernels import interpret  # noqa: F401  (the interpreter fixes, when interpreting)

    profiles = experiment_profiles(config)
    sh = shapes(config, device)
    with dispatch.using_backend("triton"):
        ck = Checker(device, dispatch.current_backend())
        t0 = time.perf_counter()
        check_quantizers(ck, _quant_variants(profiles), sh["m"], sh["k"])
        check_dual(ck, profiles, sh["m"], sh["k"])
        check_gemms(ck, sh["m"], sh["n"], sh["k"], sh["experts"], sh["top_k"],
                    fp32_head=any(get_profile(p).lm_head_dtype == "float32" for p in profiles))
    failed = [r for r in ck.rows if r["verdict"] != "ok"]
    write_result(args.out, stage="kernels", experiment=args.experiment,
                 config={"profiles": profiles, "shapes": sh, "gemm_tol": GEMM_TOL, "device": str(device)},
                 metrics={"checks": len(ck.rows), "failed": len(failed), "seconds": time.perf_counter() - t0},
                 rows=ck.rows)
    print(f"minite kernels: {len(ck.rows)} checks on {device} ({ck.backend}), {len(failed)} failed "
          f"-> {args.out}", flush=True)
    if failed:
        r = failed[0]
        why = r.get("error") or f"max error {r['max_err']} (tolerance {GEMM_TOL}; codes/scales: bitwise)"
        raise RuntimeError(f"kernel {r['kernel']} at {r['shape']} on {r['device']}: {why} (see {args.out})")
    if args.bench and device.type == "cuda":
        from minite_core.bench.kernels import main as bench_main

        bench_main(["--json", args.bench, "--csv", args.bench.replace(".json", ".csv")])
    return 0

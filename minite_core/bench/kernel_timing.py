"""Timing and recording of `minite bench kernels` rows (bench/kernels.py, bench/decode_kernels.py): CUDA-event
medians of single calls, CUDA-graph replays of many (launch gaps out), one row per op and shape with its baseline's
time and the ratio; a failing row is recorded, not fatal."""
from __future__ import annotations

import torch

from minite_core.bench.timing import bench


def time_fn(fn, reps=30, warmup=5):
    """Median, p20, p80 in ms of fn() with CUDA events (one pair per call): bench.timing.bench."""
    st = bench(fn, warmup=warmup, reps=reps, device="cuda")
    return st.median_ms, st.p20_ms, st.p80_ms


def time_graph(fns, reps=20, warmup=3):
    """Capture all fns (one call each) in a CUDA graph; return per-call median/p20/p80 of replays."""
    for f in fns:  # compile / warm
        f()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    med, p20, p80 = time_fn(g.replay, reps=reps, warmup=warmup)
    n = len(fns)
    return med / n, p20 / n, p80 / n


class Recorder:
    def __init__(self):
        self.rows = []

    def add(self, op, shape, t, base_name=None, base_t=None, **extra):
        row = {"op": op, "shape": shape, "time_ms": t[0], "p20_ms": t[1], "p80_ms": t[2], "baseline": base_name,
               "baseline_time_ms": None if base_t is None else base_t[0],
               "speedup": None if base_t is None else base_t[0] / t[0]}
        row.update(extra)
        self.rows.append(row)
        sp = "" if base_t is None else f"  x{row['speedup']:.3f} vs {base_name} {base_t[0]:.4f} ms"
        ex = "  " + " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items()) if extra else ""
        print(f"{op:38s} {shape:28s} {t[0]:9.4f} ms [{t[1]:.4f}, {t[2]:.4f}]{sp}{ex}", flush=True)

    def error(self, op, shape, exc):
        print(f"{op:38s} {shape:28s} FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        self.rows.append({"op": op, "shape": shape, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})


def _guard(rec, op, shape, fn):
    try:
        fn()
    except Exception as exc:  # a benchmark row failing must not lose the others; recorded in the JSON
        rec.error(op, shape, exc)

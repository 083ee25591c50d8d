"""Counts the torch ops and Triton launches of one learner step per minite_core call site, with its host time.

Run from the repository root on a CUDA machine (PYTHONPATH=$PWD):
    python workflow/scripts/probes/learner_launch_census.py CONFIG OUT.json   (CENSUS_GC=off: automatic GC off)
CONFIG as in moe_rows_ab.py. For each profile: 2 warm-up steps; one step under a TorchDispatchMode that counts the
aten ops that do work (views and allocations left out) by the innermost minite_core frame that issued them, with
Triton launches (JITFunction.run) counted the same way; then 3 steps timed twice: enqueue time (host returns,
before the device sync) and the step (to the sync), with the allocator's retries and Python's GC time in them.
A run's outputs: results/h200/extra/node-rank-host-time/census-*.json."""
import collections
import json
import sys
import time
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import minite_core
from minite_core.bench.learner_setup import build, learner_step, resolve_config, set_step_seed
from minite_core.model import set_profile

PKG = str(Path(minite_core.__file__).resolve().parent)
FREE = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "as_strided", "detach", "alias", "unsqueeze",
        "squeeze", "slice", "select", "empty", "empty_like", "empty_strided", "new_empty", "lift_fresh",
        "_reshape_alias", "split", "split_with_sizes", "unbind", "chunk", "set_", "view_as", "reshape",
        "_local_scalar_dense"}


def caller() -> str:
    for fr in reversed(traceback.extract_stack()):
        if fr.filename.startswith(PKG):
            return f"{Path(fr.filename).relative_to(PKG)}:{fr.lineno} {fr.name}"
    return "outside minite_core"


class Census(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.sites, self.ops = collections.Counter(), collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in FREE and not name.startswith("sym_") and not name.startswith("is_"):
            self.sites[caller()] += 1
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


GC = {"ms": 0.0, "collections": 0, "t0": 0.0}


def _gc_timer(phase, info):
    if phase == "start":
        GC["t0"] = time.perf_counter()
    else:
        GC["ms"] += 1e3 * (time.perf_counter() - GC["t0"])
        GC["collections"] += 1


def main():
    import gc
    import os
    gc.callbacks.append(_gc_timer)
    if os.environ.get("CENSUS_GC") == "off":
        gc.disable()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    cfg = resolve_config(sys.argv[1], dev)
    model, opt, x, y = build(cfg, dev)
    counting = False
    from triton.runtime.jit import JITFunction
    triton_sites = collections.Counter()
    run = JITFunction.run

    def counted(self, *a, **k):
        nonlocal counting
        if counting:
            triton_sites[f"{self.fn.__name__} @ {caller()}"] += 1
        return run(self, *a, **k)

    JITFunction.run = counted
    out = {"config": sys.argv[1], "gc": os.environ.get("CENSUS_GC", "on"),
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "profiles": {}}
    for name in cfg.profiles:
        set_profile(model, name)
        for s in range(2):
            set_step_seed(model, s)
            learner_step(model, opt, x, y)
        sync()
        counting = True
        triton_sites.clear()
        with Census() as c:
            learner_step(model, opt, x, y)
        counting = False
        sync()
        enq, step = [], []
        retries = torch.cuda.memory_stats().get("num_alloc_retries", 0) if dev.type == "cuda" else 0
        GC.update(ms=0.0, collections=0)
        for s in range(3):
            t0 = time.perf_counter()
            learner_step(model, opt, x, y)
            enq.append(time.perf_counter() - t0)
            sync()
            step.append(time.perf_counter() - t0)
        out["profiles"][name] = {
            "aten_ops": sum(c.sites.values()), "triton_launches": sum(triton_sites.values()),
            "enqueue_ms": [round(1e3 * t, 1) for t in enq], "step_ms": [round(1e3 * t, 1) for t in step],
            "alloc_retries_in_3_steps": (torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries
                                         if dev.type == "cuda" else 0),
            "gc_ms_in_3_steps": round(GC["ms"], 1), "gc_collections_in_3_steps": GC["collections"],
            "peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 1) if dev.type == "cuda" else None,
            "sites": dict(c.sites.most_common()), "ops": dict(c.ops.most_common()),
            "triton": dict(triton_sites.most_common())}
        p = out["profiles"][name]
        print(name, p["aten_ops"], "aten ops,", p["triton_launches"], "triton launches; enqueue", p["enqueue_ms"],
              "ms, step", p["step_ms"], "ms; alloc retries", p["alloc_retries_in_3_steps"], "; gc",
              p["gc_collections_in_3_steps"], "collections", p["gc_ms_in_3_steps"], "ms;", p["peak_gb"], "GB",
              flush=True)
    Path(sys.argv[2]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

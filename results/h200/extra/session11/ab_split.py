"""A/B in one process: the fp32 LM head / router as grouped split GEMMs (nn/fp32_split.py after this session)
against one GEMM a term, the form before it (99ba172: 3 GEMMs forward, 6 dgrad, 3 wgrad, an fp32 add after each
term but the first, and split3 as 7 torch launches). Learner steps alternate between the two. "before" is put
back by monkeypatching `nn.linear.fp32_split_linear`.
Usage: python ab_split.py '<bench learner config JSON>' OUT.json ROUNDS
       python ab_split.py head OUT.json: the head alone (forward + backward, CUDA events, alternating, 10 each) at
       the node rank's LM head, the 6-layer bench's, and a router's shape"""
import importlib
import json
import statistics
import sys
import time

import torch

from minite_core.bench.learner import _set_step_seed, build, learner_step, resolve_config
from minite_core.formats.bf16x3 import split3
from minite_core.model import set_profile
from minite_core.nn.fp32_split import mm_split

linear = importlib.import_module("minite_core.nn.linear")  # the module (minite_core.nn.linear is also a function)
NEW = linear.fp32_split_linear


class Before(torch.autograd.Function):  # 99ba172's Fp32SplitLinear, non-invariant path
    @staticmethod
    def forward(ctx, x, weight, cache):
        version = (weight._version, weight.data_ptr())
        hit = cache.get("split3-before")
        if hit is None or hit[0] != version:
            hit = cache["split3-before"] = (version, split3(weight.detach()))
        w_parts = hit[1]
        ctx.save_for_backward(x, *w_parts)
        ctx.x_dtype = x.dtype
        return mm_split(split3(x), w_parts)

    @staticmethod
    def backward(ctx, dy):
        x, *w_parts = ctx.saved_tensors
        dy_parts = split3(dy.float())
        dx = mm_split(dy_parts, [w.t() for w in w_parts]).to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
        dw = mm_split([d.t() for d in dy_parts], [p.t() for p in split3(x)]) if ctx.needs_input_grad[1] else None
        return dx, dw, None


def before(x, weight, cache, invariant=False):
    assert not invariant
    y = Before.apply(x.reshape(-1, x.shape[-1]), weight, cache)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def head(path):
    out = {}
    for m, k, n in ((4096, 2048, 151936), (16384, 2048, 32768), (4096, 2048, 128)):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, k, device="cuda", generator=g).bfloat16().requires_grad_(True)
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).requires_grad_(True)
        dy = torch.randn(m, n, device="cuda", generator=g)
        ms = {"before": [], "after": []}  # a fresh cache each call: the weight is split every time, as every step
        for r in range(11):
            for which in ("before", "after") if r % 2 else ("after", "before"):
                fn = before if which == "before" else NEW
                x.grad = w.grad = None
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn(x, w, {}).backward(dy)
                end.record()
                torch.cuda.synchronize()
                if r:
                    ms[which].append(round(start.elapsed_time(end), 3))
        med = {k_: statistics.median(v) for k_, v in ms.items()}
        out[f"M{m} K{k} N{n}"] = {**ms, "median": med}
        print(f"head M{m} K{k} N{n}: before {med['before']:.2f} ms, after {med['after']:.2f} ms "
              f"({med['before'] / med['after']:.2f}x)", flush=True)
        del x, w, dy
    json.dump(out, open(path, "w"), indent=1)


def main():
    if sys.argv[1] == "head":
        return head(sys.argv[2])
    cfg = resolve_config(sys.argv[1], torch.device("cuda"))
    rounds = int(sys.argv[3])
    model, opt, x, y = build(cfg, torch.device("cuda"))
    out = {"config": sys.argv[1], "rounds": rounds, "ms": {}}
    for name in cfg.profiles:
        set_profile(model, name)
        times = {"before": [], "after": []}
        for r in range(rounds + 1):
            for which in ("before", "after") if r % 2 else ("after", "before"):
                linear.fp32_split_linear = before if which == "before" else NEW
                _set_step_seed(model, r)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                learner_step(model, opt, x, y)
                torch.cuda.synchronize()
                if r:  # round 0 warms both up
                    times[which].append(1e3 * (time.perf_counter() - t0))
        out["ms"][name] = {k: [round(t, 1) for t in v] for k, v in times.items()}
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{name}: before {med['before']:.1f} ms, after {med['after']:.1f} ms "
              f"({med['before'] / med['after']:.3f}x)", flush=True)
    linear.fp32_split_linear = NEW
    out["peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 1)
    json.dump(out, open(sys.argv[2], "w"), indent=1)


if __name__ == "__main__":
    main()

"""Measures the fp32 LM head / router as grouped split GEMMs (nn/fp32_split.py) against one GEMM a term, A/B.

Run from the repository root on a CUDA machine (PYTHONPATH=$PWD):
    python workflow/scripts/probes/fp32_split_ab.py CONFIG OUT.json ROUNDS   learner steps, alternating
    python workflow/scripts/probes/fp32_split_ab.py head OUT.json             the head alone
CONFIG as in moe_rows_ab.py. "before" is the form at 99ba172 (3 GEMMs forward, 6 dgrad, 3 wgrad, an fp32 add after
each term but the first, split3 as 7 torch launches), put back by monkeypatching `nn.linear.fp32_split_linear`.
`head` times forward + backward alone (CUDA events, alternating, 10 each) at the node rank's LM head, the 6-layer
bench's and a router's shape. A run's outputs: results/h200/extra/fp32-head/ab_split-*.json."""
import importlib
import json
import statistics
import sys

import torch

from minite_core.formats.bf16x3 import split3
from minite_core.nn.fp32_split import mm_split
from moe_rows_ab import patcher, steps

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
    steps(sys.argv[1], sys.argv[2], int(sys.argv[3]), patcher(linear, fp32_split_linear=before))


if __name__ == "__main__":
    main()

"""Measures the MoE row kernels (kernels/moe_rows.py) against the torch ops they replace, A/B in one process.

Run from the repository root on a CUDA machine (PYTHONPATH=$PWD):
    python workflow/scripts/probes/moe_rows_ab.py CONFIG OUT.json ROUNDS   learner steps, before/after alternating
    python workflow/scripts/probes/moe_rows_ab.py ops OUT.json             the ops alone
CONFIG is a `minite bench learner --config` value: `h200`, or inline JSON such as
'{"base": "h200", "warmup": 0, "profiles": ["minite", "bf16"]}' (the 6-layer bench) or
'{"base": "h200", "layers": 48, "vocab_size": 151936, "batch": 1, "seq": 4096, "warmup": 0,
"model_overrides": {"num_experts": 16}}' (one rank of the 8-GPU node).
"before" is nn.moe_layout's `permute_reference` / `combine_reference`, put back by monkeypatching
`dispatch.moe_permute` / `dispatch.moe_combine`. `ops` times permute and combine alone (forward + backward, CUDA
events, alternating, 10 each) at one node rank's MoE shape and the 6-layer bench's, as bytes moved over time against
a copy's bandwidth measured in the same run. `steps` is shared with rmsnorm_ab.py and swiglu_ab.py.
A run's outputs: results/h200/extra/moe-rows-rmsnorm-swiglu/ab_rows-*.json."""
import json
import statistics
import sys
import time

import torch

from minite_core.bench.learner_setup import build, learner_step, resolve_config, set_step_seed
from minite_core.kernels import dispatch
from minite_core.model import set_profile
from minite_core.nn.moe_layout import combine, moe_layout_reference, permute



def patcher(module, **before):
    """-> use(which): sets `module`'s attributes to `before` (name -> stand-in) for "before", to the values they
    have now for "after" (every A/B probe of this folder swaps its code this way)."""
    after = {name: getattr(module, name) for name in before}

    def use(which):
        for name, fn in (before if which == "before" else after).items():
            setattr(module, name, fn)
    return use


use = patcher(dispatch,
              moe_permute=lambda x, layout, *, reference, backend=None: reference(x, layout),
              moe_combine=lambda y, w, layout, *, reference, backend=None: reference(y, w, layout))


def timed(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def ops(path):
    big = torch.empty(2 ** 30, dtype=torch.uint8, device="cuda")  # 1 GiB copy: the bandwidth ceiling, this run
    copy_ms = statistics.median([timed(lambda: big.clone()) for _ in range(10)])
    ceiling = 2 * big.numel() / copy_ms / 1e6  # GB/s, read + write
    out = {"copy_GBps": round(ceiling)}
    print(f"copy 1 GiB: {ceiling:.0f} GB/s (read + write)", flush=True)
    for n, k, e, d in ((4096, 8, 16, 2048), (16384, 8, 128, 2048)):
        g = torch.Generator(device="cuda").manual_seed(0)
        top_idx = torch.rand(n, e, device="cuda", generator=g).topk(k, dim=-1).indices
        layout = moe_layout_reference(top_idx, e)
        tp = layout.num_rows
        x = torch.randn(n, d, device="cuda", generator=g).bfloat16().requires_grad_(True)
        w = torch.rand(n, k, device="cuda", generator=g).softmax(-1).requires_grad_(True)
        gy = torch.randn(tp, d, device="cuda", generator=g).bfloat16()
        y = torch.randn(tp, d, device="cuda", generator=g).bfloat16().requires_grad_(True)
        go = torch.randn(n, d, device="cuda", generator=g)
        # the least each must move: rows read (gathered) and written, 2 bytes bf16, 4 fp32
        need = {"permute": (n * k * d * 2 + tp * d * 2) + (n * k * d * 2 + n * d * 2),
                "combine": (n * k * d * 2 + n * d * 4) + (n * k * d * 4 + 2 * tp * d * 2)}
        runs = {"permute": lambda: permute(x, layout).backward(gy), "combine": lambda: combine(y, w, layout).backward(go)}
        for name, fn in runs.items():
            ms = {"before": [], "after": []}
            for r in range(11):
                for which in ("before", "after") if r % 2 else ("after", "before"):
                    use(which)
                    x.grad = y.grad = w.grad = None
                    t = timed(fn)
                    if r:
                        ms[which].append(round(t, 4))
            med = {k_: statistics.median(v) for k_, v in ms.items()}
            gbps = {k_: need[name] / v / 1e6 for k_, v in med.items()}
            key = f"{name} N{n} k{k} E{e} D{d}"
            out[key] = {**ms, "median_ms": med, "GBps": {k_: round(v) for k_, v in gbps.items()},
                        "of_copy": {k_: round(v / ceiling, 3) for k_, v in gbps.items()}}
            print(f"{key} fwd+bwd: before {med['before']:.3f} ms, after {med['after']:.3f} ms "
                  f"({med['before'] / med['after']:.2f}x); after {gbps['after']:.0f} GB/s = "
                  f"{gbps['after'] / ceiling:.2f} of copy", flush=True)
    use("after")
    json.dump(out, open(path, "w"), indent=1)


def steps(spec, path, rounds, use):
    """Learner steps of the config `spec`, alternating use("before") / use("after"), one process; -> path."""
    cfg = resolve_config(spec, torch.device("cuda"))
    model, opt, x, y = build(cfg, torch.device("cuda"))
    out = {"config": spec, "rounds": rounds, "ms": {}}
    for name in cfg.profiles:
        set_profile(model, name)
        times = {"before": [], "after": []}
        for r in range(rounds + 1):
            for which in ("before", "after") if r % 2 else ("after", "before"):
                use(which)
                set_step_seed(model, r)
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
    use("after")
    out["peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 1)
    json.dump(out, open(path, "w"), indent=1)


def main():
    if sys.argv[1] == "ops":
        return ops(sys.argv[2])
    steps(sys.argv[1], sys.argv[2], int(sys.argv[3]), use)


if __name__ == "__main__":
    main()

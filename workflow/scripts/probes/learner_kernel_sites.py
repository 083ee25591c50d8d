"""Measures the device time of one learner step by the minite_core source line that issued each kernel.

Run from the repository root on a CUDA machine (PYTHONPATH=$PWD):
    python workflow/scripts/probes/learner_kernel_sites.py CONFIG OUT.json
CONFIG as in moe_rows_ab.py. For each profile: 2 warm-up steps, then one step under torch.profiler, with every aten
op and Triton launch wrapped in a `record_function` named by its innermost minite_core frame (a TorchDispatchMode
and a patched JITFunction.run, as learner_launch_census.py; the profiler's own Python tracer left the ops parentless
on torch 2.11). Device time is charged to the nearest such range ("autograd" for derivative formulas that
autograd's engine runs with no minite_core frame on the stack; ops the mode did not see are named by their
autograd node). On CPU (a dry run of the script) it charges CPU time.
A run's outputs: results/h200/extra/fp32-head/kernel-sites-*.json, results/h200/extra/moe-rows-rmsnorm-swiglu/kernel-sites-L6.json."""
import collections
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode

from learner_launch_census import caller as census_caller
from minite_core.bench.learner_setup import build, learner_step, resolve_config, set_step_seed
from minite_core.model import set_profile

TAG = "@site "


def caller() -> str:
    """The innermost minite_core frame on the stack; none: a derivative formula autograd's engine runs."""
    site = census_caller()
    return "autograd" if site == "outside minite_core" else site


class Sites(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        with record_function(f"{TAG}{caller()} | {func.overloadpacket.__name__}"):
            return func(*args, **(kwargs or {}))


def site(evt) -> str:
    """The nearest tag above evt; untagged (ops the mode did not see, e.g. some in backward): the nearest
    non-aten range (an autograd Function or `evaluate_function: XBackward0`) and the leaf op."""
    leaf, outer = evt.name, None
    while evt is not None:
        if evt.name.startswith(TAG):
            return evt.name[len(TAG):]
        if outer is None and not evt.name.startswith("aten::"):
            outer = evt.name
        evt = evt.cpu_parent
    return f"untagged {outer} | {leaf}"


def main():
    from triton.runtime.jit import JITFunction

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = resolve_config(sys.argv[1], dev)
    model, opt, x, y = build(cfg, dev)
    run, tagging = JITFunction.run, [False]

    def tagged(self, *a, **k):
        if not tagging[0]:
            return run(self, *a, **k)
        with record_function(f"{TAG}{caller()} | triton {self.fn.__name__}"):
            return run(self, *a, **k)

    JITFunction.run = tagged
    out = {"config": sys.argv[1], "profiles": {}}
    for name in cfg.profiles:
        set_profile(model, name)
        for s in range(2):
            set_step_seed(model, s)
            learner_step(model, opt, x, y)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            tagging[0] = True
            with Sites():
                learner_step(model, opt, x, y)
            tagging[0] = False
            if dev.type == "cuda":
                torch.cuda.synchronize()
        us, calls, kernels = collections.Counter(), collections.Counter(), collections.defaultdict(collections.Counter)
        for evt in prof.events():
            if evt.device_type != torch.autograd.DeviceType.CPU or evt.name.startswith(TAG):
                continue
            t = evt.self_device_time_total if dev.type == "cuda" else evt.self_cpu_time_total
            if t <= 0 or (dev.type == "cpu" and "::" not in evt.name):
                continue
            key = site(evt)
            us[key] += t
            calls[key] += 1
            for k in evt.kernels:
                kernels[key][k.name[:90]] += k.duration
        total = sum(us.values())
        rows = [{"site": k, "ms": round(v / 1e3, 3), "calls": calls[k],
                 "kernels": {n: round(d / 1e3, 3) for n, d in kernels[k].most_common(3)}} for k, v in us.most_common()]
        out["profiles"][name] = {"device_ms_charged": round(total / 1e3, 2), "rows": rows}
        print(f"== {name}: {total / 1e3:.1f} ms charged", flush=True)
        for r in rows[:45]:
            print(f"  {r['ms']:8.2f} ms {r['calls']:5d}x  {r['site']}  {list(r['kernels'])[:1]}")
    Path(sys.argv[2]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

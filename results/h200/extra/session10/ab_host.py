"""A/B in one process: this session's two host-side changes against the code before them, minite and te-nvfp4
learner steps alternating. "before" puts back (by monkeypatching) the torch spelling of S_dec (~10 launches a
call instead of `kernels.quantize.decode_scale`'s one) and the per-call backend check (`dispatch.select_backend`
asking the CUDA driver every call). Usage: python ab_host.py '<bench learner config JSON>' OUT.json ROUNDS"""
import json
import statistics
import sys
import time

import torch

from minite_core.bench.learner import _set_step_seed, build, learner_step, resolve_config
from minite_core.formats import nvfp4 as ref
from minite_core.kernels import dispatch
from minite_core.kernels import quantize_cols
from minite_core.model import set_profile

NEW = {"decode_scale": dispatch.decode_scale, "qc_decode_scale": quantize_cols.decode_scale,
       "select_backend": dispatch.select_backend}


def old_decode_scale(amax, *, backend=None):
    return torch.full_like(amax.float(), 1.0) / ref.global_encode_scale(amax.float())


def old_select_backend(backend=None):
    name = backend or dispatch._RUN_BACKEND
    if name is None:
        if not torch.cuda.is_available():
            return "reference"
        return "native" if torch.cuda.get_device_capability()[0] >= 10 else "triton"
    ok, reason = dispatch.backend_available(name)
    if not ok:
        raise RuntimeError(reason)
    return name


def use(which):
    old = which == "before"
    dispatch.decode_scale = old_decode_scale if old else NEW["decode_scale"]
    quantize_cols.decode_scale = (lambda a: old_decode_scale(a)) if old else NEW["qc_decode_scale"]
    dispatch.select_backend = old_select_backend if old else NEW["select_backend"]


def main():
    cfg = resolve_config(sys.argv[1], torch.device("cuda"))
    rounds = int(sys.argv[3])
    model, opt, x, y = build(cfg, torch.device("cuda"))
    out = {"config": sys.argv[1], "rounds": rounds, "ms": {}}
    for name in cfg.profiles:
        set_profile(model, name)
        times = {"before": [], "after": []}
        for r in range(rounds + 1):
            for which in ("before", "after") if r % 2 else ("after", "before"):
                use(which)
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
    use("after")
    json.dump(out, open(sys.argv[2], "w"), indent=1)


if __name__ == "__main__":
    main()

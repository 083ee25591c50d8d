"""Which aten ops, with their input shapes, spend a learner step's device time (H200 probe).

usage: PYTHONPATH=. python3 workflow/scripts/probe_learner_ops.py PROFILES [LAYERS]   (default 2 layers)
One profiled step per profile after two warm-up steps; prints the top 45 rows of torch.profiler's
key_averages(group_by_input_shape=True) by self device time (kernel rows appear beside their ops).
"""
import os
import sys

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # before CUDA starts, as the bench

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from minite_core.bench import learner_setup as L  # noqa: E402
from minite_core.model import use_profile  # noqa: E402


def main(argv: list[str]) -> None:
    dev = torch.device("cuda")
    layers = int(argv[1]) if len(argv) > 1 else 2
    model, opt, ids, labels = L.build(L.resolve_config("h200", dev, layers=layers, seq=4096, batch=4), dev)
    for name in argv[0].split(","):
        with use_profile(model, name):
            for r in range(2):  # warm-up: Triton compiles, allocator growth
                L.set_step_seed(model, r)
                L.learner_step(model, opt, ids, labels)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
                L.learner_step(model, opt, ids, labels)
                torch.cuda.synchronize()
            rows = sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: -e.self_device_time_total)[:45]
            print(f"== {name}: self device ms by (op, input shapes)", flush=True)
            for e in rows:
                print(f"{e.self_device_time_total / 1e3:8.2f} ms x{e.count:<4d} {e.key[:40]:40s} "
                      f"{str(e.input_shapes)[:150]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

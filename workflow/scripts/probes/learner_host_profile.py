"""Profiles where the host time of one learner step goes: cProfile of one step (after 2 warm-up steps) per profile.

Run from the repository root on a CUDA machine (PYTHONPATH=$PWD):
    python workflow/scripts/probes/learner_host_profile.py CONFIG OUT_PREFIX   -> OUT_PREFIX-<profile>.txt
CONFIG as in moe_rows_ab.py. A run's outputs: results/h200/extra/node-rank-host-time/host-L8-*.txt."""
import cProfile
import io
import pstats
import sys

import torch

from minite_core.bench.learner_setup import build, learner_step, resolve_config, set_step_seed
from minite_core.model import set_profile

cfg = resolve_config(sys.argv[1], torch.device("cuda"))
model, opt, x, y = build(cfg, torch.device("cuda"))
for name in cfg.profiles:
    set_profile(model, name)
    for s in range(2):
        set_step_seed(model, s)
        learner_step(model, opt, x, y)
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    learner_step(model, opt, x, y)
    torch.cuda.synchronize()
    pr.disable()
    buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf)
    st.sort_stats("tottime").print_stats(45)
    st.sort_stats("cumulative").print_stats(70)
    open(f"{sys.argv[2]}-{name}.txt", "w").write(buf.getvalue())
    print(name, buf.getvalue().splitlines()[0:3], flush=True)

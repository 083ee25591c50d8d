"""Where the host time of one learner step goes: cProfile of one step (after 2 warm-up steps) per profile.
Usage: python host_profile.py '<bench learner config JSON>' OUT_PREFIX  -> OUT_PREFIX-<profile>.txt"""
import cProfile
import io
import pstats
import sys

import torch

from minite_core.bench.learner import _set_step_seed, build, learner_step, resolve_config
from minite_core.model import set_profile

cfg = resolve_config(sys.argv[1], torch.device("cuda"))
model, opt, x, y = build(cfg, torch.device("cuda"))
for name in cfg.profiles:
    set_profile(model, name)
    for s in range(2):
        _set_step_seed(model, s)
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

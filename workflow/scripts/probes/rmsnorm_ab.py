"""Measures the learner's RMSNorm fast path (kernels/rmsnorm_grad.py) against autograd through torch's ops, A/B.

Run from the repository root on a CUDA machine (PYTHONPATH=$PWD):
    python workflow/scripts/probes/rmsnorm_ab.py CONFIG OUT.json ROUNDS   learner steps, alternating
    python workflow/scripts/probes/rmsnorm_ab.py ops OUT.json             one norm alone
CONFIG as in moe_rows_ab.py. "before" is `RMSNorm.autograd_reference` (with the recompute knob, the NVFP4 learners'
second forward in backward), put back by monkeypatching `dispatch.rms_norm_fused`. `ops` times one norm, forward +
backward (CUDA events, alternating, 10 each), at a layer norm's and a head norm's shape of the 6-layer bench, under
both recompute settings. A run's outputs: results/h200/extra/moe-rows-rmsnorm-swiglu/ab_norm-*.json."""
import json
import statistics
import sys

import torch

from moe_rows_ab import patcher, steps, timed
from minite_core.kernels import dispatch
from minite_core.model.qwen3_moe import RMSNorm

use = patcher(dispatch, rms_norm_fused=lambda x, w, eps, r, *, reference, backend=None: reference(x, w, r))


def ops(path):
    out = {}
    for shape in ((16384, 2048), (4, 4096, 32, 128)):
        norm = RMSNorm(shape[-1], 1e-6).cuda()
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(*shape, device="cuda", generator=g).bfloat16().requires_grad_(True)
        dy = torch.randn(*shape, device="cuda", generator=g).bfloat16()
        for recompute in (False, True):
            norm.recompute = recompute
            ms = {"before": [], "after": []}
            for r in range(11):
                for which in ("before", "after") if r % 2 else ("after", "before"):
                    use(which)
                    x.grad = norm.weight.grad = None
                    t = timed(lambda: norm(x).backward(dy))
                    if r:
                        ms[which].append(round(t, 4))
            med = {k: statistics.median(v) for k, v in ms.items()}
            key = f"{'x'.join(map(str, shape))} recompute={recompute}"
            out[key] = {**ms, "median_ms": med}
            print(f"norm {key} fwd+bwd: before {med['before']:.3f} ms, after {med['after']:.3f} ms "
                  f"({med['before'] / med['after']:.2f}x)", flush=True)
    use("after")
    json.dump(out, open(path, "w"), indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "ops":
        ops(sys.argv[2])
    else:
        steps(sys.argv[1], sys.argv[2], int(sys.argv[3]), use)

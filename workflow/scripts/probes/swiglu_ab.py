"""Measures SwiGLU's fast path (kernels/swiglu.py, one launch each way) against torch's ops, A/B in learner steps.

Run from the repository root on a CUDA machine (PYTHONPATH=$PWD):
    python workflow/scripts/probes/swiglu_ab.py CONFIG OUT.json ROUNDS   learner steps, alternating
CONFIG as in moe_rows_ab.py. "before" is `silu_mul_reference` / `swiglu_reference` (with the NVFP4 learners'
recompute knob), put back by monkeypatching `dispatch.silu_mul` / `dispatch.swiglu`.
A run's output: results/h200/extra/moe-rows-rmsnorm-swiglu/ab_swiglu-L6.json."""
import sys

from moe_rows_ab import patcher, steps
from minite_core.kernels import dispatch

use = patcher(dispatch,
              silu_mul=lambda gate, up, *, reference, backend=None: reference(gate, up),
              swiglu=lambda gate_up, *, reference, backend=None: reference(gate_up))


if __name__ == "__main__":
    steps(sys.argv[1], sys.argv[2], int(sys.argv[3]), use)

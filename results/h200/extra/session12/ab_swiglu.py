"""A/B in one process: SwiGLU on the fast path (kernels/swiglu.py, one launch each way) against torch's ops
(`silu_mul_reference` / `swiglu_reference`, with the NVFP4 learners' recompute knob). "before" is put back by
monkeypatching `dispatch.silu_mul` / `dispatch.swiglu` to call the reference.
Usage: python ab_swiglu.py '<bench learner config JSON>' OUT.json ROUNDS   learner steps, alternating (ab_rows.steps)"""
import sys

from ab_rows import steps
from minite_core.kernels import dispatch

NEW = dispatch.silu_mul, dispatch.swiglu


def use(which):
    if which == "after":
        dispatch.silu_mul, dispatch.swiglu = NEW
    else:
        dispatch.silu_mul = lambda gate, up, *, reference, backend=None: reference(gate, up)
        dispatch.swiglu = lambda gate_up, *, reference, backend=None: reference(gate_up)


if __name__ == "__main__":
    steps(sys.argv[1], sys.argv[2], int(sys.argv[3]), use)

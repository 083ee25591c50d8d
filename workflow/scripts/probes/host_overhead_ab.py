"""Measures a learner step's host overhead before and after two changes, A/B in one process.

Run from the repository root on a CUDA machine (PYTHONPATH=$PWD):
    python workflow/scripts/probes/host_overhead_ab.py CONFIG OUT.json ROUNDS
CONFIG as in moe_rows_ab.py (with "profiles": ["minite", "te-nvfp4"]). "before" puts back, by monkeypatching, the
torch spelling of S_dec (~10 launches a call instead of `decode_scale`'s one) and a backend selection that asks the
CUDA driver on every call. A run's output: results/h200/extra/node-rank-host-time/ab_host-L48.json."""
import sys

import torch

from minite_core.formats import nvfp4 as ref
from minite_core.kernels import backend as kernel_backend
from minite_core.kernels import dispatch, gemm_ops, quantize_ops
from minite_core.kernels import quantize_cols
from moe_rows_ab import steps

NEW = {"decode_scale": dispatch.decode_scale, "qc_decode_scale": quantize_cols.decode_scale,
       "select_backend": kernel_backend.select_backend}


def old_decode_scale(amax, *, backend=None):
    return torch.full_like(amax.float(), 1.0) / ref.global_encode_scale(amax.float())


def old_select_backend(backend=None):
    name = backend or kernel_backend._RUN_BACKEND
    if name is None:
        if not torch.cuda.is_available():
            return "reference"
        return "native" if torch.cuda.get_device_capability()[0] >= 10 else "triton"
    ok, reason = kernel_backend.backend_available(name)
    if not ok:
        raise RuntimeError(reason)
    return name


def use(which):
    old = which == "before"
    dispatch.decode_scale = old_decode_scale if old else NEW["decode_scale"]
    quantize_cols.decode_scale = (lambda a: old_decode_scale(a)) if old else NEW["qc_decode_scale"]
    for module in (kernel_backend, dispatch, gemm_ops, quantize_ops):  # every module that looks the name up
        module.select_backend = old_select_backend if old else NEW["select_backend"]


def main():
    steps(sys.argv[1], sys.argv[2], int(sys.argv[3]), use)


if __name__ == "__main__":
    main()

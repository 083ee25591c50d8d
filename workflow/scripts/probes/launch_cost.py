"""Measures the host cost of one launch: torch ops, our Triton launchers and a bare Triton launch.

Run from the repository root on a CUDA machine (PYTHONPATH=$PWD):
    python workflow/scripts/probes/launch_cost.py OUT.json
Tiny tensors, no sync inside the loop; medians of 5 x 500 calls, microseconds a call (bench/NOTES.md, row 21)."""
import json
import statistics
import sys
import time

import torch

from minite_core.kernels import quantize as Q
from minite_core.kernels import quantize_cols as QC
from minite_core.kernels.gemm import _scale_cast


def per_call_us(fn, n=500, reps=5):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return round(statistics.median(out), 1)


dev = torch.device("cuda")
x = torch.randn(64, 256, device=dev, dtype=torch.bfloat16)
a = torch.rand(16, device=dev) + 0.5
out = torch.empty_like(a)
acc = torch.randn(64, 64, device=dev)
one = torch.ones((), device=dev)
cases = {
    "torch.add": lambda: torch.add(a, a),
    "torch.empty": lambda: torch.empty(64, 128, device=dev),
    "tensor.float() of fp32 (no-op)": lambda: a.float(),
    "bare Triton launch (_decode_scale_kernel[grid](...))": lambda: Q._decode_scale_kernel[(1,)](a, out, 16, BLOCK=1024),
    "decode_scale (launcher)": lambda: Q.decode_scale(a),
    "row_amax (launcher)": lambda: Q.row_amax(x),
    "quantize_triton (launcher, row scales)": lambda: Q.quantize_triton(x, scale_mode="row"),
    "quantize_cols_triton (launcher)": lambda: QC.quantize_cols_triton(x),
    "col_block_amax (launcher)": lambda: QC.col_block_amax(x),
    "_scale_cast (launcher)": lambda: _scale_cast(acc, one, one, False, False, torch.bfloat16),
}
res = {name: per_call_us(fn) for name, fn in cases.items()}
for k, v in res.items():
    print(f"{v:8.1f} us  {k}")
import triton
res["env"] = {"torch": torch.__version__, "triton": triton.__version__, "gpu": torch.cuda.get_device_name()}
json.dump(res, open(sys.argv[1], "w"), indent=1)

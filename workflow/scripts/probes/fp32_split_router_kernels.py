"""Lists the CUDA kernels of one fp32-split GEMM forward + backward, both forms of fp32_split_ab.py.

Run from the repository root on a CUDA machine (PYTHONPATH=$PWD):
    python workflow/scripts/probes/fp32_split_router_kernels.py N    (N output columns; 128 = a router)
Prints the device time of every kernel under torch.profiler, "before" and "after", at M = 4096, K = 2048.
A run's output: results/h200/extra/fp32-head/prof-router-e0dd94a.log."""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import fp32_split_ab as A  # beside this file: the script's folder is on sys.path when run as a script

m, k, n = 4096, 2048, int(sys.argv[1])
x = torch.randn(m, k, device="cuda").bfloat16().requires_grad_(True)
w = (torch.randn(n, k, device="cuda") * 0.02).requires_grad_(True)
dy = torch.randn(m, n, device="cuda")
for name, fn in (("before", A.before), ("after", A.NEW)):
    for _ in range(3):
        fn(x, w, {}).backward(dy)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn(x, w, {}).backward(dy)
        torch.cuda.synchronize()
    print("==", name)
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            print(f"  {e.device_time:8.1f} us  {e.name[:110]}")

import sys, importlib, torch
sys.path.insert(0, "results/h200/extra/session11")
import ab_split as A
from torch.profiler import profile, ProfilerActivity
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

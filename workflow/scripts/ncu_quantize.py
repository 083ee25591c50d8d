"""One launch of the 1x16 per-token quantizer (+ bf16 copy) on 16384x4096 bf16, for `ncu` (H200 profiling)."""
import torch

from minite_core.kernels.quantize import quantize_triton

x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    quantize_triton(x, scale_mode="row", emit_dq=True, check=False)
torch.cuda.synchronize()

# Which SDPA kernel torch's default takes for a causal bf16 call, without and with `import transformer_engine`
# first: `. /tmp/te/env.sh; python3 sdpa_backend.py no; python3 sdpa_backend.py te` (the script as it ran)
import sys, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
te = sys.argv[1] == "te"
if te:
    import transformer_engine
torch.manual_seed(0)
q, k, v = (torch.randn(4, 8, 40, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
d = F.scaled_dot_product_attention(q, k, v, is_causal=True)
out = {"te": te, "cudnn": torch.backends.cudnn.version()}
for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
    try:
        with sdpa_kernel(b):
            out[b.name] = torch.equal(F.scaled_dot_product_attention(q, k, v, is_causal=True), d)
    except Exception as e:
        out[b.name] = type(e).__name__
a = torch.randn(300, 256, device="cuda", dtype=torch.bfloat16); w = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
out["mm_sum"] = float((a @ w.t()).float().sum())
import ctypes, re
maps = open("/proc/self/maps").read()
out["libs"] = sorted({m for m in re.findall(r"/\S*lib(?:cublas|cublasLt|cudnn)\S*\.so[.\d]*", maps)})[:8]
print(out)

"""`_quantize_kernel`'s tiles, timed against each other and the copy bandwidth in one process (bench/NOTES.md row 36).

On a CUDA GPU, from the repository root (PYTHONPATH=$PWD):
    python workflow/scripts/probes/quantize_tiles.py [OUT.json]
The 1x16 row-dynamic quantizer (the learner's forward operands) and its +dq variant on a 16,384 x 4,096 bf16 tensor,
at the default tile and at (BLOCK_M, BLOCK_K, num_warps) tiles holding 16 or 8 elements a thread. Rounds alternate
the tiles, so drift hits all alike; each row is the median of its rounds' medians. `bench kernels --only quantize
--sweep` times the same tiles among ~60 other rows, which does not fit one short call."""
import json
import statistics
import sys

import torch

from minite_core.bench.kernel_timing import time_fn
from minite_core.bench.kernels import quantized_bytes
from minite_core.kernels.quantize import quantize_triton

TILES = [None, (16, 256, 4), (8, 128, 4), (4, 256, 4), (4, 128, 2), (2, 256, 2)]  # None: the default
ROUNDS = 5
m, k = 16384, 4096
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
buf = torch.empty_like(x)
rows = {}
for _ in range(ROUNDS):
    rows.setdefault("d2d-copy", []).append(time_fn(lambda: buf.copy_(x), 30)[0])
    for tile in TILES:
        for dq in (False, True):
            kw = {} if tile is None else dict(block_m=tile[0], block_k=tile[1], num_warps=tile[2])
            name = f"row-dynamic{'+dq' if dq else ''} {'default' if tile is None else 'bm%d-bk%d-w%d' % tile}"
            f = lambda kw=kw, dq=dq: quantize_triton(x, scale_mode="row", emit_dq=dq, check=False, **kw)  # noqa: E731
            rows.setdefault(name, []).append(time_fn(f, 30)[0])
copy_ms = statistics.median(rows["d2d-copy"])
copy_gbps = 2 * x.numel() * 2 / copy_ms / 1e6
out = {"gpu": torch.cuda.get_device_name(), "shape": [m, k], "rounds": ROUNDS, "copy_gbps": copy_gbps, "rows": []}
print(f"{out['gpu']}: copy {copy_ms * 1e3:.1f} us, {copy_gbps:.0f} GB/s")
for name, ts in rows.items():
    if name == "d2d-copy":
        continue
    ms = statistics.median(ts)
    gbps = (m * k * 2 + quantized_bytes(m, k, "+dq" in name)) / ms / 1e6  # compulsory bytes (x read once)
    out["rows"].append({"name": name, "ms": ms, "gbps": gbps, "bw_frac": gbps / copy_gbps})
    print(f"{name:36s} {ms * 1e3:8.1f} us  {gbps:6.0f} GB/s  {gbps / copy_gbps:.2f} of copy")
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as fh:
        json.dump(out, fh, indent=1)

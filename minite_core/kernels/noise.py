"""The sampler's per-row uniforms in one launch: `tl.rand` keyed by each row's seed (engines.sampler.race_noise).

Why: the plain torch Philox (formats/philox.py) is ~160 elementwise kernels for one (B, V) draw — a fifth of a
small model's decode step inside a CUDA graph, where every launch costs ~1.5 us whatever its size. `tl.rand` is
the function philox.py defines (key = the 64-bit seed's two halves, counter = the 64-bit offset's two halves), so
one program per (row, vocab block) gives the same bits.

What: u[b, v] = philox.uniform(seeds[b], v + step * 2^32), with u == 0 read as `guard` — race_noise's uniforms;
the caller takes -log with torch's log, so the noise is bitwise the reference's on the same device.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minite_core.kernels import interpret  # noqa: F401  (its interpreter fixes)

BLOCK_V = 1024


@triton.jit
def _uniform_rows_kernel(seed_ptr, step_ptr, u_ptr, V, guard, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    seed = tl.load(seed_ptr + row)  # int64 Philox key of this row
    offset = cols.to(tl.int64) + (tl.load(step_ptr).to(tl.int64) << 32)  # counter (vocab index, step)
    u = tl.rand(seed, offset)
    tl.store(u_ptr + row.to(tl.int64) * V + cols, tl.where(u == 0.0, guard, u), mask=cols < V)


def uniform_rows(seeds: torch.Tensor, step: torch.Tensor, vocab: int, guard: float) -> torch.Tensor:
    """seeds (B,) int64, step 0-dim int64 on the same device -> u (B, vocab) fp32 (module docstring)."""
    u = torch.empty(seeds.shape[0], vocab, dtype=torch.float32, device=seeds.device)
    block = min(BLOCK_V, triton.next_power_of_2(vocab))
    _uniform_rows_kernel[(seeds.shape[0], triton.cdiv(vocab, block))](seeds.contiguous(), step, u, vocab, guard,
                                                                      BLOCK=block, num_warps=4)
    return u

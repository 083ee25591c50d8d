"""A timing probe, not a GEMM: the packed decode GEMM's memory traffic and tensor-core work without its
dequantization (`bench kernels`: decode-w4-stream-no-dequant). Its outputs are meaningless by design.

Why: the weight-bound decode target (issue 17) asks what limits kernels/decode.py's packed GEMM. Leaving one stage
out and timing the rest is the measurement (METHOD.md): if this kernel streamed the 0.5625 B/weight at copy
bandwidth, the dequantization would be the whole gap; if it does not, the tile schedule's streaming is a limit of
its own. H200, 2026-12-02 (results/h200/bench/kernels.json): 1.08-1.28x cuBLAS bf16 at M <= 16, N = K in
{4096, 8192} — 0.66-1.3 TB/s of packed bytes, a third of copy bandwidth: with N / 32 programs and no split-K too
few loads are in flight; the real kernel (dequantizing) is 0.59-0.80x cuBLAS.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _stream_w4_kernel(x_ptr, wq_ptr, ws_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    """TIMING ONLY, wrong values: the packed decode GEMM (kernels/decode.py, same tiles) with its dequantization
    left out — the same code and scale bytes loaded, each code byte used as one bf16 weight in two dots of BLOCK_K/2
    (the same tensor-core work), the scales summed in. What that kernel would take if dequantizing were free."""
    rm = tl.arange(0, BLOCK_M)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk2 = tl.arange(0, BLOCK_K // 2)
    rk16 = tl.arange(0, BLOCK_K // 16)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ssum = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x_lo = tl.load(x_ptr + rm[:, None] * K + (k0 + rk2)[None, :], mask=rm[:, None] < M, other=0.0)
        x_hi = tl.load(x_ptr + rm[:, None] * K + (k0 + BLOCK_K // 2 + rk2)[None, :], mask=rm[:, None] < M, other=0.0)
        wq = tl.load(wq_ptr + rn[:, None] * (K // 2) + (k0 // 2 + rk2)[None, :]).to(tl.bfloat16)
        ws = tl.load(ws_ptr + rn[:, None] * (K // 16) + (k0 // 16 + rk16)[None, :])
        acc = tl.dot(x_lo, tl.trans(wq), acc)
        acc = tl.dot(x_hi, tl.trans(wq), acc)
        ssum += tl.sum(ws.to(tl.float32), axis=1)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], (acc + ssum[None, :]).to(tl.bfloat16), mask=rm[:, None] < M)


def stream_w4(x: torch.Tensor, q, cfg: dict) -> torch.Tensor:
    """Launch `_stream_w4_kernel` on x [M, K] bf16 and a packed NVFP4Tensor q [N, K] with DECODE_CONFIG-style tiles."""
    m, k = x.shape
    n = q.data.shape[0]
    y = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    _stream_w4_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](x, q.data, q.scale.view(torch.uint8), y, m, n, k,
                                                          BLOCK_M=16, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                                                          num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y

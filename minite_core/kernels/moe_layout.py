"""The MoE layout (`nn.moe_layout.MoELayout`) of small routings in one Triton launch.

Why: at decode the torch layout is ~30 tiny ops (scatter_add, argsort, cumsums, gathers, scatters, searchsorted),
~30 kernels per MoE layer of the CUDA graph at ~1.5 us each, for a few hundred assignments. The work is
O(N·k·E + Tp·E) compares, so the dispatcher sends only small routings (`fits`: N·k <= MAX_ASSIGN,
E <= MAX_EXPERTS); the learner's shapes keep the torch code.

How (passes over the flat (N·k) assignments `e_i`, chunks of C against all BLOCK_E experts):
1. counts_e = sum_i [e_i == e]; offs = exclusive cumsum of round16(counts) (offs[E] = Tp, from shapes only).
   Every program computes it (N·k is small; a grid-wide barrier would cost more).
2. program 0: rank_i = #{j < i : e_j == e_i} (the stable argsort's order): a running per-expert count plus the
   exclusive cumsum of the chunk's one-hot along i; dest_i = offs[e_i] + rank_i; src[dest_i] = i // k. It also
   writes live = sum_e round16(count_e) (`MoELayout.live_rows`: the routed rows' end, where the decode GEMMs
   stop) and the int32 segment ends with the last one at live (torch._grouped_mm's offs, bf16 experts).
3. programs 1..: R padded rows r each: row_expert = #{1 <= e < E : offs_e <= r} (searchsorted(offs[1:E], r,
   right=True)), row_local = r - offs[row_expert]; a pad row (row_local >= counts[row_expert]) gets src = N.
   Real and pad rows are disjoint, so the scatter of pass 2 and the stores of pass 3 need no barrier. The rows
   from live on are the filler (a bool a row).
Pass 3 once ran in the one program of pass 2: 8 serial chunks of Tp = 976 rows at one token (top-8 of 64) took
~42 us a layer on an H100, a fifth of a decode step; as a grid, 4 us (`minite bench sampler --model
qwen3-moe-827m --op-profile`, results/h100/decode).
Integer-exact, static shapes, no host sync: capturable in a CUDA graph. Tested equal to the torch layout field by
field (tests/test_moe_layout_kernel.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minite_core.kernels import interpret  # noqa: F401  (patches Triton's interpreter: scalar loop bounds)

ALIGN = tl.constexpr(16)  # nn.moe_layout.ALIGN (kernels sit below nn: repeated here, the test checks they agree)
# bounds: a program does (2·N·k + R)·BLOCK_E compares, ~2.1M at the corner (4096, 256); well past it the torch ops,
# spread over the GPU, should win
MAX_ASSIGN = 4096
MAX_EXPERTS = 256
TILE = 8192  # elements of one [chunk, BLOCK_E] compare tile (64 int32 registers a thread at 4 warps)
ROWS = 64  # padded rows a pass-3 program (Tp = 976 at one token, 64 experts: 16 programs)


def fits(num_assign: int, num_experts: int) -> bool:
    """Whether `moe_layout_triton` takes this routing (shapes only)."""
    return 0 < num_assign <= MAX_ASSIGN and 0 < num_experts <= MAX_EXPERTS


@triton.jit
def _padded_offsets(idx_ptr, M, ex, BLOCK_E: tl.constexpr, C: tl.constexpr):
    """Pass 1: (counts, round16(counts), segment starts: their exclusive cumsum) per expert."""
    ci = tl.arange(0, C)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for i0 in range(0, M, C):
        e = tl.load(idx_ptr + i0 + ci, mask=i0 + ci < M, other=-1).to(tl.int32)
        counts += tl.sum((e[:, None] == ex[None, :]).to(tl.int32), axis=0)
    padded = (counts + ALIGN - 1) // ALIGN * ALIGN
    return counts, padded, tl.cumsum(padded, axis=0) - padded


@triton.jit
def _layout_kernel(idx_ptr, offs_ptr, dest_ptr, src_ptr, rexp_ptr, rloc_ptr, live_ptr, ends_ptr, filler_ptr,
                   M, N, K, E, TP,
                   BLOCK_E: tl.constexpr, C: tl.constexpr, R: tl.constexpr):
    ex = tl.arange(0, BLOCK_E)  # (BLOCK_E,) expert ids
    counts, padded, offs = _padded_offsets(idx_ptr, M, ex, BLOCK_E, C)  # every program: cheaper than a barrier
    live = tl.sum(padded, axis=0)  # the routed rows' end (MoELayout.live_rows)
    pid = tl.program_id(0)
    if pid == 0:  # offs, the live outputs, then pass 2: stable rank inside the expert -> dest, src of the real rows
        tl.store(offs_ptr + ex, offs.to(tl.int64), mask=ex < E)
        tl.store(offs_ptr + E, TP.to(tl.int64))
        tl.store(live_ptr, live.to(tl.int64))
        tl.store(ends_ptr + ex, tl.where(ex == E - 1, live, offs + padded), mask=ex < E)
        ci = tl.arange(0, C)
        seen = tl.zeros([BLOCK_E], dtype=tl.int32)  # assignments of each expert in earlier chunks
        for i0 in range(0, M, C):
            i = i0 + ci
            e = tl.load(idx_ptr + i, mask=i < M, other=-1).to(tl.int32)
            hot = (e[:, None] == ex[None, :]).to(tl.int32)  # (C, BLOCK_E)
            before = tl.cumsum(hot, axis=0) - hot + seen[None, :] + offs[None, :]
            dest = tl.sum(hot * before, axis=1)  # (C,)
            tl.store(dest_ptr + i, dest.to(tl.int64), mask=i < M)
            tl.store(src_ptr + dest, (i // K).to(tl.int64), mask=i < M)
            seen += tl.sum(hot, axis=0)
    else:  # pass 3 on rows [(pid - 1)·R, pid·R): expert and local index of every padded row; pad rows read token N
        r = (pid - 1) * R + tl.arange(0, R)
        le = offs[None, :] <= r[:, None]  # (R, BLOCK_E)
        rexp = tl.sum((le & (ex[None, :] >= 1) & (ex[None, :] < E)).to(tl.int32), axis=1)
        start = tl.max(tl.where(le & (ex[None, :] < E), offs[None, :], 0), axis=1)
        cnt = tl.sum(tl.where(ex[None, :] == rexp[:, None], counts[None, :], 0), axis=1)
        local = r - start
        tl.store(rexp_ptr + r, rexp.to(tl.int64), mask=r < TP)
        tl.store(rloc_ptr + r, local.to(tl.int64), mask=r < TP)
        tl.store(src_ptr + r, tl.full([R], 0, tl.int64) + N, mask=(r < TP) & (local >= cnt))
        tl.store(filler_ptr + r, (r >= live).to(tl.int8), mask=r < TP)


def moe_layout_triton(top_idx: torch.Tensor, num_experts: int, tp: int):
    """top_idx (N, k) expert ids, Tp -> the layout's fields (offs (E+1,), dest (N, k), src (Tp,), row_expert (Tp,),
    row_local (Tp,), all int64), equal to `nn.moe_layout.moe_layout_reference`'s, and its live outputs (live (1,)
    int64 = sum_e round16(count_e); the segment ends (E,) int32 with the last one at live; filler (Tp, 1) bool, the
    rows from live on): `MoELayout.live_rows`, `group_ends`' live ends and `MoELayout.filler`. One launch."""
    n, k = top_idx.shape
    m, e, dev = n * k, num_experts, top_idx.device
    if not fits(m, e):
        raise ValueError(f"moe_layout_triton: N*k={m}, E={e} outside its bound ({MAX_ASSIGN}, {MAX_EXPERTS})")
    block_e = max(16, triton.next_power_of_2(e))
    chunk = max(16, min(triton.next_power_of_2(m), TILE // block_e))
    rows = max(16, min(triton.next_power_of_2(tp), TILE // block_e, ROWS))
    offs = torch.empty(e + 1, dtype=torch.int64, device=dev)
    dest = torch.empty(n, k, dtype=torch.int64, device=dev)
    src, row_expert, row_local = (torch.empty(tp, dtype=torch.int64, device=dev) for _ in range(3))
    live = torch.empty(1, dtype=torch.int64, device=dev)
    ends = torch.empty(e, dtype=torch.int32, device=dev)
    filler = torch.empty(tp, 1, dtype=torch.bool, device=dev)
    _layout_kernel[(1 + triton.cdiv(tp, rows),)](
        top_idx.contiguous(), offs, dest, src, row_expert, row_local, live, ends, filler.view(torch.int8),
        m, n, k, e, tp, BLOCK_E=block_e, C=chunk, R=rows, num_warps=4)
    return (offs, dest, src, row_expert, row_local), (live, ends, filler)

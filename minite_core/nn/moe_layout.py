"""The MoE token layout: routed rows sorted by expert, each expert's segment padded to a multiple of 16 rows.

Shape legend: N = tokens, k = experts per token, E = experts, D = hidden, Tp = padded routed rows.

Why padded: the NVFP4 wgrad operands are quantized along tokens in 16-blocks *per expert* (the per-expert
reference pads each expert's tokens to a multiple of 16; TE and Megatron pad MoE tokens for FP8/FP4 alignment the
same way). With every segment starting at a multiple of 16, a 16-block never straddles two experts, so one kernel
over the whole buffer quantizes every expert exactly as the reference quantizes it alone. Pad rows are zeros: they
change no amax, no GEMM output row of a real token and no weight gradient. torch._grouped_mm (the bf16 path) also
wants 16-byte-aligned groups (torchtitan pads token groups to 8/16 rows for the same reason).

Shapes are static: Tp = round16(N·k + 15·E) depends only on N, k, E; the last expert's segment runs to Tp (it
absorbs the unused rows as more zero padding), so every row of the buffer belongs to an expert and no kernel ever
reads an unwritten row. At decode that filler is most of Tp: the GEMMs skip it (`MoELayout.live_rows`) and write
its outputs as the zeros they are. Everything is built on the device with no host sync (scatter_add counts, a stable argsort,
cumsum, searchsorted), so the layout works inside a CUDA graph; small routings on the fast path build it in one
Triton launch instead (kernels/moe_layout.py: ~30 kernels -> 1 per MoE layer of a decode step).

`permute` (x [N, D] -> x_pad [Tp, D]) has a deterministic backward: the k copies of a token's gradient are summed
in rank order in fp32 (an index_add would sum them in a nondeterministic order on the GPU). `combine` weights
each routed row by its router probability and sums a token's k rows in fp32, in rank order. On the fast path both
are one Triton launch each way (kernels/moe_rows.py), the torch ops here their references.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minite_core.kernels import dispatch

ALIGN = 16


@dataclass
class MoELayout:
    offs: torch.Tensor  # (E + 1,) int64: padded segment starts, offs[E] = Tp
    dest: torch.Tensor  # (N, k) int64: padded row of each (token, rank)
    src: torch.Tensor  # (Tp,) int64: source token of each padded row, N for pad rows
    row_expert: torch.Tensor  # (Tp,) int64: expert of each padded row
    row_local: torch.Tensor  # (Tp,) int64: row index inside its expert's segment
    num_experts: int
    # what the layout kernel (kernels/moe_layout.py) writes in its launch for `live_rows`, `filler` and the bf16
    # experts' group ends (nn.experts.group_ends): live (1,) int64, the ends (E,) int32 with the last at live, the
    # filler (Tp, 1) bool; None on the torch path, which derives them when asked
    live_outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    cache: dict = field(default_factory=dict)  # per-layout derived tensors (tile schedules), built on first use

    @property
    def num_rows(self) -> int:
        return self.src.shape[0]

    def live_rows(self) -> torch.Tensor | None:
        """(1,) int64 on the device: the rows that hold routed tokens, each expert's segment padded to 16 — sum_e
        round16(count_e), the end of the last real row rounded up to 16. The rows past it are the last expert's filler
        (zeros, whose GEMM outputs are zeros), so a forward GEMM may skip them and write zeros (a backward GEMM may
        not: its dy there need not be zero). None where the filler is under half of Tp (a learner's batch: skipping it
        would not pay for its zero-fill); at decode it is most of Tp (1 token, top-8 of 128 experts: 1,808 of 1,936
        rows). Shapes decide, not values."""
        n, k = self.dest.shape
        if 2 * n * k >= self.num_rows:
            return None
        if self.live_outputs is not None:
            return self.live_outputs[0]
        live = self.cache.get("live_rows")
        if live is None:
            live = self.cache["live_rows"] = ((self.dest.amax() // ALIGN + 1) * ALIGN).reshape(1)
        return live

    def filler(self) -> torch.Tensor | None:
        """(Tp, 1) bool on the device: the rows past `live_rows` (None where it is None)."""
        live = self.live_rows()
        if live is None:
            return None
        if self.live_outputs is not None:
            return self.live_outputs[2]
        mask = self.cache.get("filler")
        if mask is None:
            rows = torch.arange(self.num_rows, device=live.device)[:, None]
            mask = self.cache["filler"] = rows >= live
        return mask

    def bounds(self) -> list[int]:
        """Segment bounds on the host (reference path only: one sync)."""
        return self.offs.tolist()


def padded_rows(num_tokens: int, top_k: int, num_experts: int) -> int:
    """Tp: an upper bound of sum_e round16(count_e), from shapes only."""
    n = num_tokens * top_k + (ALIGN - 1) * num_experts
    return -(-n // ALIGN) * ALIGN


def expert_counts(flat_idx: torch.Tensor, num_experts: int) -> torch.Tensor:
    """(E,) int64 assignments per expert of the flat expert ids (a scatter_add: no host sync, unlike bincount)."""
    out = torch.zeros(num_experts, dtype=torch.int64, device=flat_idx.device)
    return out.scatter_add_(0, flat_idx, torch.ones_like(flat_idx))


def moe_layout(top_idx: torch.Tensor, num_experts: int) -> MoELayout:
    """top_idx (N, k) expert ids -> the padded sorted layout (device ops only). Small routings on the fast path
    (decode) take one Triton launch (kernels/moe_layout.py, equal field by field); the rest, `moe_layout_reference`."""
    N, k = top_idx.shape
    fields = dispatch.moe_layout(top_idx, num_experts, padded_rows(N, k, num_experts))
    if fields is None:
        return moe_layout_reference(top_idx, num_experts)
    fields, live_outputs = fields
    return MoELayout(*fields, num_experts=num_experts, live_outputs=live_outputs)


def moe_layout_reference(top_idx: torch.Tensor, num_experts: int) -> MoELayout:
    """The layout in torch ops (~30 kernels on a GPU): the reference, the CPU path and the learner's shapes."""
    N, k = top_idx.shape
    E, dev = num_experts, top_idx.device
    flat = top_idx.reshape(-1)  # (N*k,)
    counts = expert_counts(flat, E)
    padded = (counts + ALIGN - 1) // ALIGN * ALIGN
    tp = padded_rows(N, k, E)
    # (E + 1,): 0, cumulative padded counts, Tp — built from device tensors only (writing the Python int tp into a
    # CUDA tensor would be a host-to-device copy: a sync, which a CUDA graph capture refuses)
    offs = torch.cat([padded.new_zeros(1), torch.cumsum(padded, 0)[:-1], padded.new_full((1,), tp)])
    order = torch.argsort(flat, stable=True)  # (N*k,) assignment slots sorted by expert, rank order inside
    sorted_e = flat[order]
    rank = torch.arange(N * k, device=dev) - (torch.cumsum(counts, 0) - counts)[sorted_e]
    dest_sorted = offs[sorted_e] + rank  # (N*k,)
    dest = torch.empty_like(dest_sorted)
    dest[order] = dest_sorted
    src = torch.full((tp,), N, dtype=torch.int64, device=dev)
    src[dest_sorted] = order // k
    rows = torch.arange(tp, device=dev)
    row_expert = torch.searchsorted(offs[1:E].contiguous(), rows, right=True)
    return MoELayout(offs=offs, dest=dest.view(N, k), src=src, row_expert=row_expert,
                     row_local=rows - offs[row_expert], num_experts=E)


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, layout: MoELayout):
        # x (N, D) -> (Tp, D); pad rows read the appended zero row
        ctx.layout = layout
        return torch.cat([x, x.new_zeros(1, x.shape[1])]).index_select(0, layout.src)

    @staticmethod
    def backward(ctx, g):
        dest = ctx.layout.dest  # (N, k)
        return g[dest].float().sum(1).to(g.dtype), None  # rank order, fp32: deterministic


def permute(x: torch.Tensor, layout: MoELayout) -> torch.Tensor:
    """x (N, D) -> x_pad (Tp, D) in the padded sorted layout: one Triton launch each way on the fast path
    (kernels/moe_rows.py), bitwise `permute_reference`."""
    return dispatch.moe_permute(x, layout, reference=permute_reference)


def permute_reference(x: torch.Tensor, layout: MoELayout) -> torch.Tensor:
    """`permute` in torch ops: a gather from x with a zero row appended; backward sums a token's k rows in fp32."""
    return _Permute.apply(x, layout)


def combine(y_pad: torch.Tensor, top_w: torch.Tensor, layout: MoELayout, out_dtype=torch.float32) -> torch.Tensor:
    """y_pad (Tp, D), top_w (N, k) -> (N, D): sum_k top_w[t, k] * y_pad[dest[t, k]] in fp32, in rank order, then
    rounded to out_dtype. One Triton launch each way on the fast path (kernels/moe_rows.py: the forward bitwise
    `combine_reference`)."""
    return dispatch.moe_combine(y_pad, top_w, layout, reference=combine_reference, out_dtype=out_dtype)


def combine_reference(y_pad: torch.Tensor, top_w: torch.Tensor, layout: MoELayout) -> torch.Tensor:
    """`combine` in torch ops. The product is taken in the promoted dtype of (y_pad, top_w) — the router dtype
    decides — then summed in fp32 over k (in rank order on the CPU; torch's CUDA reduction may add in
    another order, kernels/moe_rows.py)."""
    return (y_pad[layout.dest] * top_w[..., None]).float().sum(dim=1)

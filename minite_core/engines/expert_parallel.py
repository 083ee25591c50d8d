"""Expert parallelism for the MoE layers: experts split across the data-parallel ranks, tokens dispatched to
their experts' rank and combined back with all-to-all (as torchtitan and Megatron do), with the single-process
numerics.

Layout: rank q of R owns experts [q·E/R, (q+1)·E/R) (each GroupedLinear keeps that weight slice; its
`expert_offset` keeps SR seeds and cache keys global). One MoE layer on rank r (N local tokens, k experts each):
  1. route locally; put the N·k assignments in the padded sorted layout (`moe_layout` + `permute`, exactly as
     one process does) and read the real rows out in expert order;
  2. all-to-all the per-expert counts (the split sizes: one deliberate host sync per layer, as in torchtitan's
     and Megatron's token dispatchers; counted with scatter_add, not bincount, and the receive layout sized from
     them, so it is the only one), then the rows: rank q receives, from every source rank in rank order,
     the rows of its experts;
  3. the owner lays the received rows out by local expert (a stable sort keeps source order inside an expert),
     runs the grouped SwiGLU and all-to-alls the outputs back;
  4. the source puts the outputs back in its padded layout and combines a token's k of them with its gate
     weights in fp32, in rank order: `nn.moe_layout.combine` itself, the same kernel as one process.
Why it is exact: source ranks hold contiguous global rows, so an expert's rows arrive in global token order — each
expert GEMM runs on the same rows as in one process, with its own per-expert amax and 16-token blocks and its
own SR stream (the shard's token offset does not apply: `token_shard(None)` around the experts), and no
cross-rank sum enters an expert's weight gradient (the owner sees all its tokens). Expert parameters are
therefore not FSDP-sharded (`shard_model` leaves them to their owner) and their gradients are not reduced.
Autograd runs through torch.distributed.nn.functional.all_to_all_single (its backward is the reverse all-to-all).
A group of one rank (world size 1) skips steps 1-4: every all-to-all there is the identity, so the layer runs the
single-process layout, experts and combine (no collective, no host sync, no extra row copies or index backwards).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_to_all_single

from minite_core.nn.experts import GroupedLinear
from minite_core.nn.moe_layout import combine, expert_counts, moe_layout, permute
from minite_core.nn.shard import token_shard


class ExpertParallel:
    """The dispatch/combine of one rank (set as SparseMoE.expert_parallel by `install`)."""

    def __init__(self, rank: int, world: int, group):
        self.rank, self.world, self.group = rank, world, group

    def __call__(self, moe, x: torch.Tensor, top_w: torch.Tensor, top_idx: torch.Tensor) -> torch.Tensor:
        N, k = top_idx.shape  # x (N, D), top_w / top_idx (N, k)
        E, R = moe.num_experts, self.world
        El = E // R
        if R == 1:  # a group of one: both all-to-alls are the identity and the split sizes need no host read, so
            # dispatch/combine reduce to the single-process layer, op for op
            with token_shard(None):
                return moe.local_experts(x, top_w, top_idx)
        layout = moe_layout(top_idx, E)
        flat = top_idx.reshape(-1)  # (N·k,)
        order = torch.argsort(flat, stable=True)  # assignments by expert, token order inside
        rows = layout.dest.reshape(-1)[order]  # their rows in the padded layout (unique: no grad accumulation)
        x_sorted = permute(x, layout)[rows]  # (N·k, D)
        counts = expert_counts(flat, E)  # (E,) this rank's assignments per expert
        recv_counts = torch.empty_like(counts)  # (R·El,): [source s, my local expert j]
        dist.all_to_all_single(recv_counts, counts, group=self.group)
        # host sync: the split sizes, sent and received in one read (deliberate, one per layer)
        send, recv = torch.stack([counts.view(R, El).sum(1), recv_counts.view(R, El).sum(1)]).tolist()
        x_recv = all_to_all_single(x.new_empty(sum(recv), x.shape[1]), x_sorted, recv, send, group=self.group)
        local_ids = torch.repeat_interleave(torch.arange(El, device=x.device).repeat(R), recv_counts,
                                            output_size=sum(recv))  # (M,); the size known: no second sync
        lay = moe_layout(local_ids[:, None], El)  # source order kept inside each expert = global token order
        with token_shard(None):  # the experts see every token of theirs: whole-tensor numerics
            y_pad = moe.experts(permute(x_recv, lay), lay)  # (Tp_local, D)
        y_recv = y_pad[lay.dest[:, 0]]  # (M, D)
        y_sorted = all_to_all_single(y_recv.new_empty(N * k, y_recv.shape[1]), y_recv, send, recv,
                                     group=self.group)
        # back to their rows of this rank's padded layout (pad rows zero), then the single-process combine
        y_back = y_sorted.new_zeros(layout.num_rows, y_sorted.shape[1]).index_copy(0, rows, y_sorted)  # (Tp, D)
        return combine(y_back, top_w, layout)


def install(model: torch.nn.Module, rank: int, world: int) -> ExpertParallel | None:
    """Keep this rank's experts (weights sliced in place, before `shard_model` and the optimizer) and route the
    MoE layers through all-to-all. None for a model without MoE layers."""
    from minite_core.model.qwen3_moe import SparseMoE

    layers = [m for m in model.modules() if isinstance(m, SparseMoE)]
    if not layers:
        return None
    E = layers[0].num_experts
    if E % world:
        raise ValueError(f"{E} experts do not split over {world} ranks; use a world size that divides them")
    El = E // world
    ep = ExpertParallel(rank, world, dist.new_group())
    for moe in layers:
        for gl in (m for m in moe.experts.modules() if isinstance(m, GroupedLinear)):
            gl.weight = torch.nn.Parameter(gl.weight.detach()[rank * El:(rank + 1) * El].clone())
            gl.num_experts, gl.expert_offset = El, rank * El
            gl.weight_cache.clear()
        moe.expert_parallel = ep
    return ep


def expert_params(model: torch.nn.Module) -> set:
    """The parameters that expert parallelism keeps whole on their owner (not FSDP-sharded, not reduced)."""
    from minite_core.model.qwen3_moe import SparseMoE

    return {m.weight for moe in model.modules() if isinstance(moe, SparseMoE) and moe.expert_parallel is not None
            for m in moe.experts.modules() if isinstance(m, GroupedLinear)}

"""Per-call MoE routing hook: record the top-k expert ids every MoE layer executes, or replay given ones (R3).

What: `SparseMoE.route()` computes its router's top-k and then, when `module.routing` is set, hands the (N, K) ids
to it; the hook may return other ids to execute (replay). `use_routing(model, routing)` is the one helper that
sets the hook on every MoE layer for the duration of a forward (and clears it after), so the model itself keeps
no state between calls and code that never asks for routing pays nothing.

- record: per MoE layer, the ids the router chose (`chosen`) and the ids executed (`executed`) of each call, in
  call order, as the (N, K) tensors route() saw (no copy, no host sync). The same as each other unless replaying.
- replay (rollout routing replay, R3, arXiv 2510.11370): `replay[layer]` (N, K) ids per token slot of the next
  call; a slot whose first id is -1 keeps its router's own choice (tokens the sampler never routed: the last
  response token, padding). Only the discrete SET is replayed: route() takes the gate weights from its own
  softmax at the replayed experts (renormalised when the model renormalises its top-k), so gradients still reach
  the router — what the paper's replayed gate softmax(s_train) over the inference mask is for Qwen3-MoE
  (norm_topk_prob), and what Megatron-LM's / NeMo's routing replay do. Without norm_topk_prob we keep the model's
  own gating rule (un-renormalised probabilities) rather than the paper's renormalised softmax: only the
  selection changes.

Routes of whole sequences, the form engines exchange: one (S, Lm, K) int32 tensor per row, S = the row's
prompt + response tokens in order, Lm = MoE layers (`moe_layers(model)`, ascending decoder index), -1 = not
routed by whoever recorded it. `stack_calls` turns the recorded calls of one batch into (B, S_calls, Lm, K);
`pad_routes` / `replay_tables` turn per-row routes into one call's `replay` argument.

Shape legend: N = tokens of one call (B * T, row-major), K = experts per token, B = rows, L = padded length.
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import torch

from minite_core.model.qwen3_moe import SparseMoE

NOT_ROUTED = -1


def moe_layers(model) -> tuple[int, ...]:
    """Decoder-layer indices of the model's MoE layers, ascending (empty for a dense model)."""
    return tuple(i for i, layer in enumerate(model.model.layers) if isinstance(layer.mlp, SparseMoE))


class Routing:
    """One or more forward calls' routing: record what every MoE layer executes, optionally replaying `replay`
    ({decoder layer: (N, K) long ids, -1 rows = keep the router's choice}) on the next call."""

    def __init__(self, *, record: bool = True, replay: dict[int, torch.Tensor] | None = None):
        self.record = record
        self.replay = dict(replay or {})
        self.chosen: dict[int, list[torch.Tensor]] = {}  # layer -> per call (N, K) the router's own top-k
        self.executed: dict[int, list[torch.Tensor]] = {}  # layer -> per call (N, K) the experts that ran

    def __call__(self, layer: int, top_idx: torch.Tensor) -> torch.Tensor | None:
        """top_idx (N, K) the router's top-k -> ids to execute instead, or None = execute top_idx."""
        out = None
        given = self.replay.get(layer)
        if given is not None:
            if given.shape != top_idx.shape:
                raise ValueError(f"routing replay for layer {layer}: given ids {tuple(given.shape)} do not match "
                                 f"this call's {tuple(top_idx.shape)} token slots")
            given = given.to(top_idx.device, torch.long)
            out = torch.where(given[:, :1] >= 0, given, top_idx)  # (N, K) -1 rows keep their own
        if self.record:
            self.chosen.setdefault(layer, []).append(top_idx)
            self.executed.setdefault(layer, []).append(top_idx if out is None else out)
        return out


@contextmanager
def use_routing(model, routing: Routing | None):
    """Set `routing` as the hook of every MoE layer of `model` (bound to its decoder index) for the `with` block;
    None = plain routing. The hook is always cleared on exit."""
    mods = [(i, layer.mlp) for i, layer in enumerate(model.model.layers) if isinstance(layer.mlp, SparseMoE)]
    for i, mod in mods:
        mod.routing = None if routing is None else partial(routing, i)
    try:
        yield routing
    finally:
        for _, mod in mods:
            mod.routing = None


def stack_calls(routing: Routing, layers: tuple[int, ...], rows: int, *, which: str = "executed") -> torch.Tensor:
    """The recorded calls of one batch of `rows` rows -> (B, S_calls, Lm, K) int32: call c's (B * T_c, K) ids
    reshaped (B, T_c, K) and concatenated along time in call order, layers stacked in `layers` order."""
    per_layer = getattr(routing, which)
    if not layers or any(i not in per_layer for i in layers):
        raise ValueError(f"no recorded routing for MoE layers {layers} (was the forward run inside use_routing?)")
    stacked = [torch.cat([c.reshape(rows, -1, c.shape[-1]) for c in per_layer[i]], dim=1) for i in layers]
    return torch.stack(stacked, dim=2).to(torch.int32)  # (B, S_calls, Lm, K)


def pad_routes(routes: list[torch.Tensor], length: int, *, device=None) -> torch.Tensor:
    """Per-row routes [(S_i, Lm, K)] -> (B, length, Lm, K) long, right-padded with -1 (the learner's layout)."""
    if not routes:
        raise ValueError("pad_routes needs at least one row")
    _, Lm, K = routes[0].shape
    out = torch.full((len(routes), length, Lm, K), NOT_ROUTED, dtype=torch.long, device=device)
    for b, r in enumerate(routes):
        if r.shape[1:] != (Lm, K) or r.shape[0] > length:
            raise ValueError(f"routes of row {b} have shape {tuple(r.shape)}; expected (<= {length}, {Lm}, {K})")
        out[b, :r.shape[0]] = r.to(device=out.device, dtype=torch.long)
    return out


def replay_tables(padded: torch.Tensor, layers: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """(B, L, Lm, K) padded routes -> one call's `replay` argument {layer: (B * L, K)}."""
    B, L, Lm, K = padded.shape
    if Lm != len(layers):
        raise ValueError(f"routes cover {Lm} MoE layers, the model has {len(layers)} ({layers})")
    return {layer: padded[:, :, j].reshape(B * L, K) for j, layer in enumerate(layers)}

"""First-divergence trace: where, op by op, two executions of the same tokens start to disagree.

What: run the reference execution (the learner: one full-sequence forward of the right-padded prompt + response
batch under profile A) and the system under test (profile B) on the same tokens, with forward hooks on every
decoder layer, attention block, attention kernel (SDPA output = o_proj's input, op `<attn>.sdpa`), MLP / MoE
block, router, GEMM (QuantLinear, GroupedLinear) and the LM head. Per op: relative error ‖a − b‖ / ‖a‖
(a = reference, over all compared tokens), max |a − b|, and the first op in execution order above `threshold`
(plus the first nonzero one).

SUT modes: "prefill" runs B's forward exactly like the learner's (isolates the profile: formats, scales,
arithmetic); "decode" replays the sampler's schedule on the given rollout — bucket-padded, left-padded prompt
prefill into the static KV cache, then one (B, 1) step per response position, rows that already stopped fed a
masked pad — the very batches `engines.Sampler` ran (isolates nothing: it is the real pair). With one profile
on both sides, decode mode measures the engine gap alone (cached decode vs full sequence, left vs right padding,
batch shape), which is the only gap left for minite↔minite: the op where it first appears is a finding to
report, not to hide.

Alignment: every call gets a token map (row, position in the sequence) per input slot, -1 for padding, so each
token-major output row is keyed by (row, position); expert-GEMM rows (tokens sorted by expert) by (row,
position, expert), from the same layer's router top-k in the same call. Only keys both sides computed are
compared; `coverage` = their share of the reference's keys (< 1 where routing flipped, or where the sampler never
fed a row's final token); routers also report `routing_flip`, the fraction of tokens whose top-k set differs.
Expert rows are keyed by the experts that EXECUTED (model/routing.py records them): with `routes` given and a
reference profile that replays routing (R3), the reference forward replays those sampler routes, as the learner
does, while `routing_flip` still compares the routers' own top-k.

Shape legend: B = rows, L = padded sequence, P = padded prompt, F = features of an op's output, K = top-k.
"""
from __future__ import annotations

import math
import re

import torch

from minite_core.engines.batching import pack_right
from minite_core.engines.mismatch import TRACE_THRESHOLD, rel_error  # noqa: F401  (re-exported)
from minite_core.engines.sampler import batch_bucket, batch_layout, cache_slots
from minite_core.model import KVCache, use_profile
from minite_core.model.qwen3_moe import Attention, DecoderLayer, DenseMLP, SparseMoE
from minite_core.model.routing import Routing, moe_layers, pad_routes, replay_tables, use_routing
from minite_core.nn import GroupedLinear, QuantLinear
from minite_core.profiles import Profile, get_profile
from minite_core.task.tokenizer import PAD_ID

MODES = ("prefill", "decode")
_LAYER = re.compile(r"layers\.(\d+)(?:\.|$)")


def op_kind(module) -> str | None:
    if isinstance(module, QuantLinear):
        return {"router": "router", "lm_head": "lm_head"}.get(module.role, "gemm")
    if isinstance(module, GroupedLinear):
        return "grouped_gemm"
    if isinstance(module, Attention):
        return "attention"
    if isinstance(module, (SparseMoE, DenseMLP)):
        return "mlp"
    if isinstance(module, DecoderLayer):
        return "layer"
    return None


class _Recorder:
    """Forward hooks keeping each traced op's output rows with their keys: per op a list of (keys (n, 2|3),
    values (n, F)) chunks, one per call. `token_map` (B, T) of flat ids row * KEY_STRIDE + pos (-1 = pad) must
    be set before each forward."""

    KEY_STRIDE = 1 << 20

    def __init__(self, model):
        self.top_k = model.config.num_experts_per_tok
        self.order: list[str] = []
        self.kinds: dict[str, str] = {}
        self.chunks: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.routing = Routing()  # what every MoE layer executed, per call (set as the model's hook by _record)
        self.route_keys: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # router -> (keys, sorted top-k)
        self.token_map: torch.Tensor | None = None
        self.handles = []
        for name, module in model.named_modules():
            kind = op_kind(module)
            if kind is None:
                continue
            self.kinds[name] = kind
            self.handles.append(module.register_forward_hook(self._hook(name, kind)))
            if kind == "attention":
                core = f"{name}.sdpa"
                self.kinds[core] = "attention_core"
                hook = self._hook(core, "attention_core")
                self.handles.append(module.o_proj.register_forward_pre_hook(
                    lambda mod, args, _h=hook: _h(mod, args, args[0])))

    def _hook(self, name, kind):
        def hook(module, args, output):
            if name not in self.chunks:
                self.order.append(name)
                self.chunks[name] = []
            flat = self.token_map.reshape(-1)  # (N,) = B*T slots in the model's row-major token order
            if kind == "grouped_gemm":  # rows of the padded sorted layout -> (token, expert) keys
                layout = args[1]
                live = layout.src < flat.numel()  # pad rows read no token
                tok = flat[layout.src[live]]
                keep = tok >= 0
                keys = torch.stack([tok[keep], layout.row_expert[live][keep]], -1)
                self.chunks[name].append((keys, output.detach().float()[live][keep]))
                return
            out = output.detach().float().reshape(flat.numel(), -1)  # (N, F)
            keep = flat >= 0
            self.chunks[name].append((flat[keep][:, None], out[keep]))
            if kind == "router":
                top = out.topk(self.top_k, dim=-1).indices  # (N, K) the router's own choice
                self.route_keys.setdefault(name, []).append((flat[keep], top[keep].sort(-1).values))
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()

    def table(self, name) -> dict[tuple, torch.Tensor]:
        out = {}
        for keys, values in self.chunks[name]:
            for k, v in zip(keys.tolist(), values):
                out[tuple(k)] = v
        return out

    def route_table(self, name) -> dict[int, tuple]:
        return {k: tuple(v) for keys, tops in self.route_keys[name] for k, v in zip(keys.tolist(), tops.tolist())}


def _flat_ids(rows: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return torch.where(valid, rows * _Recorder.KEY_STRIDE + pos, torch.full_like(pos, -1))


def _run_full(model, rec, prompt_ids, response_ids, device):
    ids, attn, _, _ = pack_right(prompt_ids, response_ids, device=device)  # (B, L) right-padded: the learner
    B, L = ids.shape
    rows = torch.arange(B, device=device)[:, None].expand(B, L)
    pos = torch.arange(L, device=device)[None].expand(B, L)
    rec.token_map = _flat_ids(rows, pos, attn.bool())
    model(ids, attention_mask=None if ids.is_cuda else attn)  # as the learner runs it (engines/learner.py)


def _run_decode(model, rec, prompt_ids, response_ids, device):
    # the Sampler's schedule (engines.sampler): bucket-padded, left-padded prefill into the static cache, then
    # step k feeds response token k of rows with k < R_i (the others a masked pad); dummy rows are never compared
    n, B = len(prompt_ids), batch_bucket(len(prompt_ids))
    ids, real = batch_layout(prompt_ids, B, device)  # (B, P)
    P = ids.shape[1]
    lens = [len(r) for r in response_ids] + [0] * (B - n)
    plen = torch.tensor([len(p) for p in prompt_ids] + [0] * (B - n), device=device)
    slot = torch.arange(P, device=device)[None]
    rows = torch.arange(B, device=device)[:, None]
    T = max(lens)
    cache = KVCache.for_model(model, B, cache_slots(P, T), device=device)
    rec.token_map = _flat_ids(rows.expand(B, P), slot - (P - plen)[:, None], real)
    model(ids, attention_mask=real, cache=cache)
    for k in range(T - 1):  # the sampler never feeds the last token it samples
        alive = torch.tensor([k < m for m in lens], device=device)
        tok = torch.tensor([r[k] if k < len(r) else PAD_ID for r in response_ids] + [PAD_ID] * (B - n),
                           device=device)[:, None]
        rec.token_map = _flat_ids(rows, (plen + k)[:, None], alive[:, None])
        model(tok, attention_mask=alive[:, None], cache=cache)


def _record(model, profile, prompt_ids, response_ids, mode, routes=None) -> _Recorder:
    rec = _Recorder(model)
    device = model.lm_head.weight.device
    layers = moe_layers(model)
    if mode == "prefill" and routes is not None and profile.routing_replay and layers:  # the learner's R3 forward
        L = max(len(p) + len(r) for p, r in zip(prompt_ids, response_ids))  # pack_right's padded length
        rec.routing = Routing(replay=replay_tables(pad_routes(routes, L, device=device), layers))
    try:
        with use_routing(model, rec.routing), use_profile(model, profile):
            (_run_full if mode == "prefill" else _run_decode)(model, rec, prompt_ids, response_ids, device)
    finally:
        rec.remove()
    return rec


@torch.inference_mode()
def trace_pair(model, ref_profile: Profile | str, sut_profile: Profile | str, prompt_ids: list[list[int]],
               response_ids: list[list[int]], *, sut_mode: str = "decode",
               threshold: float = TRACE_THRESHOLD, routes: list[torch.Tensor] | None = None) -> dict:
    """Reference = learner full-sequence forward under `ref_profile` (replaying `routes`, the sampler's per-row
    routes, when that profile replays routing); SUT = `sut_profile` run as `sut_mode`.
    -> {"ref", "sut", "sut_mode", "threshold", "rows", "ops": [{op, kind, layer, rel_err, max_abs, coverage
    (+ routing_flip)}], "first_divergence", "first_nonzero"} (the last two: an op row or None)."""
    if sut_mode not in MODES:
        raise ValueError(f"sut_mode must be one of {MODES}, got {sut_mode!r}")
    if not response_ids or max(map(len, response_ids)) == 0:
        raise ValueError("trace_pair needs at least one non-empty response")
    ref_profile, sut_profile = get_profile(ref_profile), get_profile(sut_profile)
    ref = _record(model, ref_profile, prompt_ids, response_ids, "prefill", routes=routes)
    sut = _record(model, sut_profile, prompt_ids, response_ids, sut_mode)
    ops = []
    for name in ref.order:
        a_tab, b_tab = ref.table(name), sut.table(name) if name in sut.chunks else {}
        common = sorted(set(a_tab) & set(b_tab))
        m = _LAYER.search(name)
        row = {"op": name, "kind": ref.kinds[name], "layer": int(m.group(1)) if m else None,
               "rel_err": math.nan, "max_abs": math.nan,
               "coverage": len(common) / len(a_tab) if a_tab else math.nan}
        if common:
            a = torch.stack([a_tab[k] for k in common]).double()
            b = torch.stack([b_tab[k] for k in common]).double()
            row["rel_err"] = rel_error(a, b)
            row["max_abs"] = float((a - b).abs().max())
        if row["kind"] == "router":
            ra, rb = ref.route_table(name), sut.route_table(name)
            both = set(ra) & set(rb)
            row["routing_flip"] = sum(ra[k] != rb[k] for k in both) / len(both) if both else math.nan
        ops.append(row)

    def diverged(r, level):
        return r["rel_err"] > level or (r.get("routing_flip") or 0.0) > 0  # nan compares False

    above = [r for r in ops if diverged(r, threshold)]
    nonzero = [r for r in ops if diverged(r, 0.0)]
    return {"ref": ref_profile.name, "sut": sut_profile.name, "sut_mode": sut_mode, "threshold": threshold,
            "rows": len(prompt_ids), "ops": ops,
            "first_divergence": above[0] if above else None, "first_nonzero": nonzero[0] if nonzero else None}




def decode_vs_prefill(model, profile: Profile | str, prompt_ids, response_ids, *,
                      threshold: float = TRACE_THRESHOLD) -> dict:
    """One profile, learner full-sequence vs sampler cached decode: the engine gap without any format gap."""
    return trace_pair(model, profile, profile, prompt_ids, response_ids, sut_mode="decode", threshold=threshold)

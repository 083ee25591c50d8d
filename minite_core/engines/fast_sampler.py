"""FastSampler: the sampler at full speed — static buffers, sampling on the device, a CUDA graph per batch bucket.

What: `engines.sampler.Sampler` (the reference) with its batch run the way gpt-fast and vLLM run decode; same
`generate(...) -> Rollout`, same computation: tests show tokens, log-probs, argmax ids and finished flags bitwise
equal to the reference on CPU (`graph=False`) for every sampler profile.

How:
- one static decode state per (bucket rows, cache slots, max_new_tokens, sampling options): the KV cache
  (model/kv_cache.py: fixed [B, Hkv, S, Dh] buffers, slot mask and position on the device), the row seeds, the
  next input tokens, the finished flags, a step counter on the device and the outputs [B, N] (tokens, processed
  log-probs, argmax ids, recorded mask; optionally the full processed log-prob rows [B, N, V]). Shapes never
  change between steps; a step allocates only its own temporaries.
- prefill: one eager forward of the left-padded, bucket-padded prompts (sampler.batch_layout: the reference's
  layout), then step 0 is sampled from its logits.
- decode step (`_step`): embedding -> layers -> LM head -> processed log-probs -> counter-based noise -> token
  -> stop detection -> writes at the device step column, with no host sync. Finished rows are tracked on the
  device; the host reads the all-finished flag only every `sync_every` steps and stops early then; the outputs
  come back in one copy at the end. A step after every row finished records nothing, so stopping late changes
  no result.
- on CUDA the step is captured in a CUDA graph once per state and replayed (`graph=True`, the default there):
  warm-up steps on a side stream first (the last one under `torch.cuda.set_sync_debug_mode("error")`, so a
  syncing op fails with its name), then `torch.cuda.graph` with one memory pool shared by all of this
  sampler's graphs — safe in any replay order because each replay's results go to the static buffers, which
  are allocated outside the pool. With `graph=False` the very same `_step` runs eagerly (CPU, tests, and the
  `fast-eager` engine on CUDA). A graph reads weights by address, so it is re-captured when anything it read
  changed (`_weight_refs`: parameter storages, calibrated scales, cached quantized weights): an optimizer step
  that clears nn's weight caches costs one re-capture; bf16 weights updated in place cost none.

Only when asked, as the reference: `keep_logprob_rows` keeps the processed log-prob rows [B, N, V] in a static
buffer; `record_routes` installs a routing hook (model/routing.py's protocol) that writes each forward's top-k
expert ids into a static [Lm, B, S, K] buffer at the cache slots of the fed tokens (`cache.slots`, on the
device), so a captured graph records them too; both come back as the reference's per-row tensors.

Shape legend: B = bucket rows, P = padded prompt length, S = cache slots, N = max_new_tokens, V = vocab.
"""
from __future__ import annotations

import contextlib
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from minite_core.engines.engine_choice import resolve_engine
from minite_core.engines.host_sync import HostSync, find_host_syncs
from minite_core.engines.sampler import (Sampler, batch_bucket, batch_layout, cache_slots, check_generate_args,
                                         row_routes, row_seeds, sample_step)
from minite_core.model import KVCache, use_profile
from minite_core.model.routing import NOT_ROUTED, moe_layers, use_routing
from minite_core.task.tokenizer import EOS_ID, PAD_ID

# CUDA: decode steps between host reads of the all-finished flag — at most 15 wasted steps after the last row
# stops; each read drains the launch queue once. CPU: every step (a host read costs nothing there).
SYNC_EVERY = 16
WARMUP_STEPS = 2  # eager steps before capture (Triton compile/autotune, cuBLAS workspaces, weight caches)
MAX_STATES = 8  # decode states (and their graphs) kept per sampler; the least recently used is dropped


class GraphCaptureError(RuntimeError):
    """The decode step could not be captured in a CUDA graph (the message says which op, and what to do)."""


def write_step(buf: torch.Tensor, step: torch.Tensor, values: torch.Tensor, dim: int = 1) -> None:
    """buf[:, step] = values (along `dim`) at the device step (0-dim int64): in place, capturable."""
    buf.index_copy_(dim, step.view(1), values.unsqueeze(dim))


class _SlotRoutes:
    """Routing hook (model/routing.py's `routing(layer, top_idx)` protocol): writes the (B*T, K) ids every MoE
    layer executes into st.routes at the forward's cache slots — device ops only, so a captured graph keeps
    recording; returns None (record, never replay)."""

    def __init__(self, st: "_Decode", layers: tuple[int, ...]):
        self.st, self.index = st, {layer: j for j, layer in enumerate(layers)}

    def __call__(self, layer: int, top_idx: torch.Tensor) -> None:
        buf, slots = self.st.routes[self.index[layer]], self.st.cache.slots  # (B, S, K), (T,)
        buf.index_copy_(1, slots, top_idx.view(buf.shape[0], slots.shape[0], -1).to(buf.dtype))


@dataclass(eq=False)
class _Decode:
    """Static buffers of one decode configuration (module docstring)."""

    cache: KVCache
    temperature: float
    top_p: float
    seeds: torch.Tensor  # (B,) int64 Philox keys
    stop: torch.Tensor  # (K,) int64 stop ids
    next_ids: torch.Tensor  # (B,) int64 input of the next decode step
    next_real: torch.Tensor  # (B,) bool: that input is a real token
    done: torch.Tensor  # (B,) bool: finished (stop token sampled; dummy rows from the start)
    step: torch.Tensor  # () int64: the output column of the next sample
    all_done: torch.Tensor  # () bool
    tokens: torch.Tensor  # (B, N) int64
    logprobs: torch.Tensor  # (B, N) fp32 processed log-prob of the token
    argmax: torch.Tensor  # (B, N) int64 argmax of the logits
    recorded: torch.Tensor  # (B, N) bool: the row was active at that step (a prefix of each row)
    full: torch.Tensor | None  # (B, N, V) fp32 processed log-prob rows, only when asked
    routes: torch.Tensor | None  # (Lm, B, S, K) int32 executed expert ids by cache slot, only when asked
    graph: object = None  # torch.cuda.CUDAGraph of `_step`, once captured
    weight_refs: list = field(default_factory=list)  # what the graph read of the weights (`_weight_refs`)


def _weight_refs(model) -> list[tuple]:
    """Everything of the weights a captured step reads by address, held by reference (so it stays alive while
    the graph may read it) with what must match for the graph to be current: every parameter and buffer with
    its storage pointer (+ its version where nn caches a converted copy of it: quantized operands, the bf16
    expert weights), every cached weight operand and fused-scale amax of nn."""
    refs = []
    for module in model.modules():
        cached = bool(getattr(module, "weight_cache", None))  # nn keeps a converted copy of this weight
        for t in itertools.chain(module.parameters(recurse=False), module.buffers(recurse=False)):
            refs.append((t, t.data_ptr(), t._version if cached and t is module.weight else None))
        refs += [(entry, None, None) for entry in getattr(module, "weight_cache", {}).values()]
        fused = module.__dict__.get("_fused_amax")
        if fused is not None:
            refs.append((fused[0], None, None))
    return refs


def _same_refs(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(x[0] is y[0] and x[1:] == y[1:] for x, y in zip(a, b))


@contextlib.contextmanager
def _sync_debug_error():
    """CUDA: every synchronizing op raises inside (torch.cuda.set_sync_debug_mode)."""
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


_SIDE_STREAMS: dict = {}


def _side_stream(device) -> torch.cuda.Stream:
    """One stream per device for every warm-up and capture. Per-stream lazy state (cuBLAS's workspace) is then
    made by the first eager warm-up, outside any graph pool: made during a capture (torch.cuda.graph's own
    stream, first used there), it outlived the graph and kept its pool in use, and PyTorch's allocator refused the
    next capture into that pool (`use_count > 0` assert on the H200, a re-capture after a weight update)."""
    device = torch.device(device)
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


def capture_step(fn, device, pool) -> torch.cuda.CUDAGraph:
    """PyTorch's torch.cuda.graph recipe for `fn` (a step that writes only into static buffers): WARMUP_STEPS
    eager calls on a side stream (the last under sync debug mode "error"), then the capture into `pool` on that
    same stream (`_side_stream`)."""
    side = _side_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for i in range(WARMUP_STEPS):
            with _sync_debug_error() if i == WARMUP_STEPS - 1 else contextlib.nullcontext():
                fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=side):
        fn()
    return graph


class FastSampler(Sampler):
    """`Sampler` whose batches run on static buffers with no per-token host sync; graph: CUDA-graph replay of
    the decode step (default: on CUDA); sync_every: steps between host reads of the all-finished flag."""

    def __init__(self, model, profile, *, device=None, graph: bool | None = None, sync_every: int | None = None):
        super().__init__(model, profile, device=device)
        cuda = self.device.type == "cuda"
        self.graph = cuda if graph is None else bool(graph)
        if self.graph and not cuda:
            raise ValueError(f"FastSampler(graph=True) needs a CUDA device, got {self.device}; use graph=False")
        self.sync_every = sync_every if sync_every is not None else SYNC_EVERY if cuda else 1
        if self.sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        self._states: OrderedDict[tuple, _Decode] = OrderedDict()
        self._pool = None  # CUDA-graph memory pool shared by this sampler's graphs

    # ---- one batch ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def _generate_batch(self, prompts, indices, max_new_tokens, temperature, top_p, stop_ids, seed, keep_rows,
                        record_routes):
        st = self._state_for(prompts, max_new_tokens, temperature, top_p, stop_ids, keep_rows, record_routes)
        with use_routing(self.model, _SlotRoutes(st, moe_layers(self.model)) if record_routes else None):
            self._prefill(st, prompts, indices, seed)
            for s in range(1, max_new_tokens):
                if s % self.sync_every == 0 and bool(st.all_done):  # host sync: every sync_every steps
                    break
                self._advance(st)
        return self._read(st, prompts)

    @torch.no_grad()
    def start(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
              stop_ids=(EOS_ID,), seed: int = 0) -> _Decode:
        """Prefill one batch of prompts (one bucket) and sample its step 0; `step` it max_new_tokens - 1 times
        (what `generate` does, without the early stop and the read-back: for benchmarks and checks)."""
        check_generate_args(prompts, max_new_tokens, temperature, top_p)
        self.model.eval()
        st = self._state_for(prompts, max_new_tokens, temperature, top_p, frozenset(stop_ids), False, False)
        with use_profile(self.model, self.profile):
            self._prefill(st, prompts, list(range(len(prompts))), seed)
        return st

    @torch.no_grad()
    def step(self, st: _Decode) -> None:
        """One decode step of a started batch (asynchronous on CUDA). A replayed graph holds the sampler's profile;
        an eager step runs under it (`use_profile`: free inside the caller's own block of it)."""
        if st.graph is not None:
            st.graph.replay()
            return
        with use_profile(self.model, self.profile):
            self._step(st)

    def _advance(self, st: _Decode) -> None:
        if st.graph is not None:
            st.graph.replay()
        else:
            self._step(st)

    def _state_for(self, prompts, max_new_tokens, temperature, top_p, stop_ids, keep_rows, record_routes):
        rows, P = batch_bucket(len(prompts)), max(map(len, prompts))
        record_routes = bool(record_routes and moe_layers(self.model))  # a dense model has nothing to route
        return self._state((rows, cache_slots(P, max_new_tokens), max_new_tokens, float(temperature), float(top_p),
                            tuple(sorted(stop_ids)), bool(keep_rows), record_routes, self.profile))

    def _prefill(self, st: _Decode, prompts, indices, seed) -> None:
        """Capture st's step first when graphs are on (and it is missing or stale), then reset, prefill, sample
        step 0. Runs inside the caller's routing hook, if any."""
        if self.graph and st.tokens.shape[1] > 1 and (st.graph is None
                                                      or not _same_refs(st.weight_refs, _weight_refs(self.model))):
            self._capture(st)
        rows = st.done.shape[0]
        ids, real = batch_layout(prompts, rows, self.device)  # (B, P)
        self._reset(st, row_seeds(seed, indices, rows, self.device), len(prompts))
        logits = self.model(ids, attention_mask=real, cache=st.cache)[:, -1]  # (B, V) prefill, eager
        self._sample_into(st, logits)

    def _step(self, st: _Decode) -> None:
        """One decode step, entirely on the device (what the CUDA graph holds)."""
        logits = self.model(st.next_ids[:, None], attention_mask=st.next_real[:, None], cache=st.cache)[:, -1]
        self._sample_into(st, logits)

    @staticmethod
    def _sample_into(st: _Decode, logits: torch.Tensor) -> None:
        # logits (B, V) fp32 -> the step's sample, written at column st.step; the reference's per-row loop, batched
        tok, tok_lp, top, logp = sample_step(logits, st.seeds, st.step, temperature=st.temperature, top_p=st.top_p)
        active = ~st.done  # (B,) rows still generating
        write_step(st.tokens, st.step, torch.where(active, tok, PAD_ID))
        write_step(st.logprobs, st.step, torch.where(active, tok_lp, 0.0))
        write_step(st.argmax, st.step, torch.where(active, top, -1))
        write_step(st.recorded, st.step, active)
        if st.full is not None:
            write_step(st.full, st.step, logp)
        st.done |= active & (tok[:, None] == st.stop[None, :]).any(dim=-1)
        st.next_ids.copy_(torch.where(active, tok, PAD_ID))  # rows finished before this step feed a masked pad
        st.next_real.copy_(active)
        st.step += 1
        st.all_done.copy_(st.done.all())

    def _read(self, st: _Decode, prompts):
        # host sync: the batch's results, one copy per buffer, once per batch
        n = len(prompts)
        lens = st.recorded[:n].sum(dim=1).tolist()
        tokens, logprobs, argmax = (t[:n].tolist() for t in (st.tokens, st.logprobs, st.argmax))
        resp = [row[:m] for row, m in zip(tokens, lens)]
        lps = [row[:m] for row, m in zip(logprobs, lens)]
        amx = [row[:m] for row, m in zip(argmax, lens)]
        kept = [st.full[b, :m].clone() for b, m in enumerate(lens)] if st.full is not None else None
        routes = None
        if st.routes is not None:
            # the reference feeds a row's sampled token back while the loop runs: all but the very last step
            fed = [min(m, max(lens) - 1) for m in lens]
            routes = row_routes(st.routes[:, :n].permute(1, 2, 0, 3), prompts, resp, fed)  # (B, S, Lm, K) by slot
        return resp, lps, st.done[:n].tolist(), amx, kept, routes

    # ---- static state ------------------------------------------------------------------------------------
    def _state(self, key: tuple) -> _Decode:
        if key in self._states:
            self._states.move_to_end(key)
            return self._states[key]
        if len(self._states) >= MAX_STATES:
            self._states.popitem(last=False)
        rows, slots, N, temperature, top_p, stop_ids, full, record_routes, _ = key
        dev, V = self.device, self.model.config.vocab_size
        Lm, K = len(moe_layers(self.model)), self.model.config.num_experts_per_tok

        def zeros(*shape, dtype):
            return torch.zeros(shape, dtype=dtype, device=dev)

        st = _Decode(cache=KVCache.for_model(self.model, rows, slots, device=dev), temperature=temperature,
                     top_p=top_p, seeds=zeros(rows, dtype=torch.long),
                     stop=torch.tensor(stop_ids, dtype=torch.long, device=dev).reshape(-1),
                     next_ids=zeros(rows, dtype=torch.long), next_real=zeros(rows, dtype=torch.bool),
                     done=zeros(rows, dtype=torch.bool), step=zeros(dtype=torch.long),
                     all_done=zeros(dtype=torch.bool), tokens=zeros(rows, N, dtype=torch.long),
                     logprobs=zeros(rows, N, dtype=torch.float32), argmax=zeros(rows, N, dtype=torch.long),
                     recorded=zeros(rows, N, dtype=torch.bool),
                     full=zeros(rows, N, V, dtype=torch.float32) if full else None,
                     routes=zeros(Lm, rows, slots, K, dtype=torch.int32) if record_routes else None)
        self._states[key] = st
        return st

    @staticmethod
    def _reset(st: _Decode, seeds: torch.Tensor, n: int) -> None:
        """In place (graphs keep reading the same buffers): rows >= n are dummy rows, finished from the start."""
        st.cache.reset()
        st.seeds.copy_(seeds)
        st.next_ids.fill_(PAD_ID)
        st.next_real.zero_()
        st.done.copy_(torch.arange(st.done.shape[0], device=st.done.device) >= n)
        st.step.zero_()
        st.all_done.zero_()
        st.tokens.fill_(PAD_ID)
        st.logprobs.zero_()
        st.argmax.fill_(-1)
        st.recorded.zero_()
        if st.full is not None:
            st.full.zero_()
        if st.routes is not None:
            st.routes.fill_(NOT_ROUTED)

    def _capture(self, st: _Decode) -> None:
        """Capture `_step` on st's buffers into st.graph (all rows active, so the step runs every branch)."""
        st.graph = None  # an old graph's pool memory is released first
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        self._reset(st, st.seeds.clone(), st.done.shape[0])
        try:
            graph = capture_step(lambda: self._step(st), self.device, self._pool)
        except RuntimeError as e:
            raise GraphCaptureError(
                f"FastSampler: the decode step of profile {self.profile.name!r} cannot be captured in a CUDA "
                f"graph: {e}. It must not sync with the host (FastSampler.step_host_syncs lists the Python-level "
                "syncs, also on CPU); meanwhile use the 'fast-eager' engine (graph=False)") from e
        st.graph, st.weight_refs = graph, _weight_refs(self.model)

    # ---- checks ------------------------------------------------------------------------------------------
    def step_host_syncs(self, prompts: list[list[int]], **start_kwargs) -> list[HostSync]:
        """The Python-level host syncs (engines.host_sync) of one eager decode step after a real prefill of
        `prompts` (`start`'s arguments; max_new_tokens defaults to 4): what stands between the step and a CUDA
        graph. Runs on any device."""
        graph, self.graph = self.graph, False
        try:
            st = self.start(prompts, **{"max_new_tokens": 4, **start_kwargs})
        finally:
            self.graph = graph
        with torch.no_grad(), use_profile(self.model, self.profile):  # the step as `generate` runs it
            return find_host_syncs(self._step, st)


def make_sampler(model, profile, *, engine: str | None = None, device=None) -> Sampler:
    """The rollout engine the stages use: "reference" (engines.sampler), "fast" (FastSampler, CUDA graph on
    CUDA), "fast-eager" (FastSampler without graph); None = `resolve_engine`'s default."""
    dev = torch.device(device) if device is not None else model.lm_head.weight.device
    name = resolve_engine(engine, dev)
    if name == "reference":
        return Sampler(model, profile, device=dev)
    return FastSampler(model, profile, device=dev, graph=name == "fast" and dev.type == "cuda")

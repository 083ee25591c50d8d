"""Sampler: the rollout engine — batched KV-cache generation under one execution profile (the reference).

What: `Sampler(model, profile).generate(prompts, ...)` returns a `Rollout` with the sampled response tokens, the
log-probability the sampler gave each of them, and the sampler's own argmax token at each step (for the
argmax-flip diagnostic); optionally each step's full processed log-prob row. The model object is the learner's
(weights as after a weight sync); the sampler runs it under its profile for the call (`use_profile`, restored
afterwards), so "same weights, different execution" is literally one module tree under two profiles.

This module is the REFERENCE: a plain loop, one host sync per row per step. `engines.fast_sampler` runs the same
computation with static buffers, no per-token host sync and a CUDA graph per batch bucket; tests show the two
give the same tokens, log-probs, argmax ids and finished flags bitwise on CPU. What both share lives here:
`batch_layout` (left padding, bucket padding, cache slots), `race_noise` and `sample_step`.

How it runs (the way vLLM / SGLang serve a batch, reduced to its numerics):
- prompts are left-padded to the batch's longest prompt and prefilled in one forward that fills a static KV
  cache; then one token per step, each step a (B, 1) forward against the cache. Every cached forward attends
  over all cache slots under the cache's slot mask (model/kv_cache.py), the layout a CUDA graph needs. The
  sampler therefore executes *cached decode*, the learner a *full-sequence* forward: with per-tensor dynamic
  activation scales the amax of a decode step is taken over B tokens (one per row), not over the whole
  sequence — part of the gap the diagnostics measure. Pad tokens (left padding, finished rows) are real
  embeddings and enter per-tensor amaxes; a per-token scale (`scale_mode="row"`) is immune to both.
- the batch is padded with dummy rows up to its bucket (`batch_bucket`: 1, 2, 4, then multiples of 8, as vLLM's
  CUDA-graph sizes): one fully masked pad prompt, finished from the start, dropped from the result. Both samplers
  pad, so their GEMMs see the same M — on CPU an fp32 GEMM's bits depend on M (torch 2.13 CPU, measured: rows
  of an M in {1, 2, 3, 5, 7} product differ from the same rows in a larger one). The cache has
  `cache_slots(P, max_new_tokens)` slots (rounded up to 64, so CUDA graphs are reused across prompt lengths).
- Log-probs are those of the PROCESSED distribution (vLLM's `processed_logprobs`): logits / temperature, then
  top-p filtering with renormalisation, log-softmax in fp32. temperature == 0 is greedy and, as vLLM skips the
  temperature for greedy rows, reports log-softmax(logits) at the argmax.
- Sampling is an exponential race (vLLM's `random_sample`: argmax(p / q), q ~ Exp(1)) with counter-based noise
  (`race_noise`): q = -log(u), u = Philox4x32-10 (formats.philox, bit-identical to Triton's `tl.rand`) keyed by
  the row's seed derive_seed(seed, prompt index) at counter (vocab index, step). Noise is a pure function of
  (seed, prompt index, step, token), computed for the whole batch at once on the device: a row's tokens do not
  depend on which other prompts share its batch, *as long as its logits do not* (per-tensor activation scales and
  pads make the logits themselves batch-dependent — a numerics effect, kept on purpose). A torch.Generator per row
  would give the same distribution but other bits on CPU and CUDA.
- A row stops at the first stop token (kept in the response) or after `max_new_tokens` (finished = False).

- Only when asked (memory): `record_routes` keeps the expert ids every MoE layer executed for every token the
  sampler fed (prefill and each decode step; model/routing.py), per row in sequence order, for the routing
  diagnostics and for a learner that replays them (R3); `keep_logprob_rows` keeps the whole processed log-prob
  row (V values) of every sampled step, for the full-vocabulary KL.
- `score` replays `generate`'s schedule on given tokens (teacher-forced decode).

Shape legend: B = batch rows (bucket-padded), P = padded prompt length, S = cache slots, V = vocab.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minite_core.engines.batching import pack_left
from minite_core.kernels import dispatch
from minite_core.model import KVCache, use_profile
from minite_core.model.routing import NOT_ROUTED, Routing, moe_layers, stack_calls, use_routing
from minite_core.profiles import Profile, get_profile
from minite_core.seeds import derive_seed
from minite_core.task.tokenizer import EOS_ID, PAD_ID

@dataclass
class Rollout:
    """Sampled responses. Per row i: response_ids[i], logprobs[i], argmax_ids[i] have the same length (the stop
    token, when hit, included); finished[i] = a stop token ended it."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    logprobs: list[list[float]]  # log p_processed(token) under the sampler
    finished: list[bool]
    argmax_ids: list[list[int]] = field(default_factory=list)  # the sampler's argmax token at each step
    # per row (P_i + R_i, Lm, K) int32: executed expert ids per prompt + response token and MoE layer, -1 where the
    # sampler never fed the token (its last sampled one); None unless record_routes (and for dense models)
    routes: list[torch.Tensor] | None = None
    # per row (R_i, V) fp32: the processed log-prob row each response token was drawn from; None unless kept
    logprob_rows: list[torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.response_ids)

    @property
    def num_tokens(self) -> int:
        return sum(map(len, self.response_ids))

    def padded(self, *, pad_id: int = PAD_ID, device=None) -> dict[str, torch.Tensor]:
        """Right-padded tensors: response_ids / argmax_ids (N, T) long, logprobs (N, T) fp32, mask (N, T) bool,
        finished (N,) bool. T = longest response (0 if all are empty)."""
        N, T = len(self), max(map(len, self.response_ids), default=0)
        out = {"response_ids": torch.full((N, T), pad_id, dtype=torch.long),
               "argmax_ids": torch.full((N, T), -1, dtype=torch.long),
               "logprobs": torch.zeros(N, T, dtype=torch.float32),
               "mask": torch.zeros(N, T, dtype=torch.bool),
               "finished": torch.tensor(self.finished, dtype=torch.bool)}
        for i, resp in enumerate(self.response_ids):
            n = len(resp)
            out["response_ids"][i, :n] = torch.tensor(resp, dtype=torch.long)
            out["logprobs"][i, :n] = torch.tensor(self.logprobs[i], dtype=torch.float32)
            out["mask"][i, :n] = True
            if self.argmax_ids:
                out["argmax_ids"][i, :n] = torch.tensor(self.argmax_ids[i], dtype=torch.long)
        return {k: v.to(device) for k, v in out.items()} if device is not None else out


def processed_logprobs(logits: torch.Tensor, *, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """logits (..., V) -> log-probs (..., V) fp32 of the distribution the sampler draws from: / temperature
    (skipped when 0 = greedy), top-p keeps the smallest head of mass >= top_p (vLLM's rule: drop the ascending
    tail whose cumulative mass <= 1 - top_p, always keep the top token), renormalised by log-softmax."""
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=False)  # (..., V) ascending
        tail_mass = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = tail_mass <= 1.0 - top_p
        drop[..., -1] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    return torch.log_softmax(logits, dim=-1)


# ---- shared by the reference and the fast sampler: batch layout, noise, one sampling step ------------------
CACHE_SLOT_MULTIPLE = 64  # cache slots rounded up to this, so one CUDA graph serves many prompt lengths
U_ZERO_GUARD = 2.0 ** -32  # u == 0 is read as half the smallest positive uniform (race_noise)


def batch_bucket(n: int) -> int:
    """Rows a batch of n prompts runs as: 1, 2, 4, then the next multiple of 8 (vLLM's CUDA-graph batch sizes:
    at most 7 dummy rows, few graphs)."""
    if n < 1:
        raise ValueError(f"a batch needs at least one prompt, got {n}")
    return n if n <= 2 else 4 if n <= 4 else -(-n // 8) * 8


def cache_slots(prompt_len: int, max_new_tokens: int) -> int:
    """KV-cache slots for a left-padded prompt of `prompt_len` and `max_new_tokens` (the last sampled token is
    never fed back, so prompt_len + max_new_tokens - 1 are used), rounded up to CACHE_SLOT_MULTIPLE."""
    return -(-(prompt_len + max_new_tokens) // CACHE_SLOT_MULTIPLE) * CACHE_SLOT_MULTIPLE


def batch_layout(prompts: list[list[int]], rows: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """`pack_left` of the prompts plus dummy rows up to `rows` (all pad, no real token) -> ids (rows, P) long,
    real (rows, P) bool."""
    ids, attn = pack_left(prompts, device=device)  # (n, P)
    extra = rows - ids.shape[0]
    ids = torch.cat([ids, torch.full((extra, ids.shape[1]), PAD_ID, dtype=ids.dtype, device=ids.device)])
    real = torch.cat([attn.bool(), torch.zeros(extra, ids.shape[1], dtype=torch.bool, device=ids.device)])
    return ids, real


def row_seeds(seed: int, indices: list[int], rows: int, device) -> torch.Tensor:
    """(rows,) int64: derive_seed(seed, prompt index) per prompt row, 0 for dummy rows."""
    seeds = [derive_seed(seed, i) for i in indices] + [0] * (rows - len(indices))
    return torch.tensor(seeds, dtype=torch.long, device=device)


def race_noise(seeds: torch.Tensor, step, vocab: int) -> torch.Tensor:
    """Exponential-race noise q ~ Exp(1), (B, V) fp32, for rows with Philox keys `seeds` (B,) int64 at decode
    `step` (int or 0-dim int64 tensor on the device): q = -log(u), u = philox.uniform(seed, step * 2^32 + v), i.e.
    Philox counter (c0, c1) = (vocab index v, step) — what a fused Triton kernel gets from tl.rand(seed, offset).
    Guard: u == 0 (probability 2^-31 per draw) would give q = +inf, a token that can never win; it is read as
    U_ZERO_GUARD = 2^-32, half the smallest positive uniform (q = 22.18, just past the grid's largest q, 21.49), so
    every q is finite and positive and argmax(p / q) always picks a token with p > 0."""
    return -torch.log(dispatch.uniform_rows(seeds, step, vocab, U_ZERO_GUARD))  # (B, V); one launch on a GPU


def sample_step(logits: torch.Tensor, seeds: torch.Tensor, step, *, temperature: float, top_p: float):
    """One sampling step for the whole batch, on the device: logits (B, V) fp32 -> (token (B,), its processed
    log-prob (B,), argmax of the logits (B,), processed log-probs (B, V)). temperature 0 = greedy (no noise)."""
    logp = processed_logprobs(logits, temperature=temperature, top_p=top_p)  # (B, V)
    top = logits.argmax(dim=-1)
    tok = top if temperature == 0 else (logp.exp() / race_noise(seeds, step, logits.shape[-1])).argmax(dim=-1)
    return tok, logp.gather(-1, tok[:, None])[:, 0], top, logp


def check_generate_args(prompts, max_new_tokens: int, temperature: float, top_p: float) -> None:
    """The ValueErrors both samplers raise for bad input."""
    if not prompts:
        raise ValueError("no prompts given (an empty batch)")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0 or not 0.0 < top_p <= 1.0:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (the first response token is predicted from it)")


def row_routes(calls: torch.Tensor, prompts, resp, fed: list[int]) -> list[torch.Tensor]:
    """A batch's routes by call (B, P + decode calls, Lm, K) — the left-padded prefill, then one slot per decode
    step — -> per row (P_i + R_i, Lm, K) in sequence order; fed[b] = decode steps that fed row b a real token
    (its first fed[b] response tokens, contiguous: a row that stopped is fed pads from then on)."""
    P = max(map(len, prompts))
    out = []
    for b, (p, r) in enumerate(zip(prompts, resp)):
        row = torch.full((len(p) + len(r), *calls.shape[2:]), NOT_ROUTED, dtype=calls.dtype, device=calls.device)
        row[:len(p)] = calls[b, P - len(p):P]
        row[len(p):len(p) + fed[b]] = calls[b, P:P + fed[b]]
        out.append(row)
    return out


class Sampler:
    """Rollout engine (reference): `generate` under `profile` on the (shared) model."""

    def __init__(self, model, profile: Profile | str, *, device: torch.device | str | None = None):
        self.model = model
        self.profile = get_profile(profile)
        self.device = torch.device(device) if device is not None else model.lm_head.weight.device

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop_ids=(EOS_ID,), seed: int, batch_size: int | None = None,
                 record_routes: bool = False, keep_logprob_rows: bool = False) -> Rollout:
        """Rows in chunks of `batch_size` (None = all at once); record_routes / keep_logprob_rows fill
        Rollout.routes / Rollout.logprob_rows."""
        check_generate_args(prompts, max_new_tokens, temperature, top_p)
        self.model.config.check_tokens(prompts, new_tokens=max_new_tokens, what="prompt")
        self.model.eval()
        with use_profile(self.model, self.profile):
            return self._generate(prompts, max_new_tokens, temperature, top_p, stop_ids, seed, batch_size,
                                  record_routes, keep_logprob_rows)

    def _generate(self, prompts, max_new_tokens, temperature, top_p, stop_ids, seed, batch_size, record_routes,
                  keep_logprob_rows) -> Rollout:
        batch_size = batch_size or len(prompts)
        record_routes = record_routes and bool(moe_layers(self.model))  # a dense model has nothing to route
        out = Rollout([list(p) for p in prompts], [], [], [], [], routes=[] if record_routes else None,
                      logprob_rows=[] if keep_logprob_rows else None)
        for start in range(0, len(prompts), batch_size):
            idx = list(range(start, min(start + batch_size, len(prompts))))
            resp, lps, fin, amx, rows, routes = self._generate_batch(
                [prompts[i] for i in idx], idx, max_new_tokens, temperature, top_p, frozenset(stop_ids), seed,
                keep_logprob_rows, record_routes)
            out.response_ids += resp
            out.logprobs += lps
            out.finished += fin
            out.argmax_ids += amx
            if keep_logprob_rows:
                out.logprob_rows += rows
            if record_routes:
                out.routes += routes
        return out

    @torch.no_grad()  # not inference_mode: nn caches weight copies made here, and the learner's autograd reuses them
    def _generate_batch(self, prompts, indices, max_new_tokens, temperature, top_p, stop_ids, seed, keep_rows,
                        record_routes):
        dev, B = self.device, len(prompts)
        rows = batch_bucket(B)  # + dummy rows, exactly as the fast sampler pads
        ids, real = batch_layout(prompts, rows, dev)  # (rows, P)
        cache = KVCache.for_model(self.model, rows, cache_slots(ids.shape[1], max_new_tokens), device=dev)
        routing = Routing() if record_routes else None
        seeds = row_seeds(seed, indices, rows, dev)
        resp, lps, amx, kept = ([[] for _ in range(B)] for _ in range(4))
        fed = [0] * B  # decode steps that fed each row a real token
        done = [False] * B + [True] * (rows - B)  # dummy rows are finished from the start
        with use_routing(self.model, routing):
            logits = self.model(ids, attention_mask=real, cache=cache)[:, -1]  # (rows, V) prefill
            for step in range(max_new_tokens):
                tok, tok_lp, top, logp = sample_step(logits, seeds, step, temperature=temperature, top_p=top_p)
                active = [not d for d in done]
                for b in range(B):
                    if active[b]:
                        t = int(tok[b])
                        resp[b].append(t)
                        lps[b].append(float(tok_lp[b]))
                        amx[b].append(int(top[b]))
                        if keep_rows:
                            kept[b].append(logp[b])
                        done[b] = t in stop_ids
                if all(done) or step == max_new_tokens - 1:
                    break
                fed = [f + a for f, a in zip(fed, active)]
                alive = torch.tensor(active, device=dev)  # rows finished before this step feed a masked pad
                step_ids = torch.where(alive, tok, torch.full_like(tok, PAD_ID))[:, None]  # (rows, 1)
                logits = self.model(step_ids, attention_mask=alive[:, None], cache=cache)[:, -1]
        kept = [torch.stack(r) if r else torch.zeros(0, logits.shape[-1], device=dev) for r in kept] \
            if keep_rows else None
        routes = (row_routes(stack_calls(routing, moe_layers(self.model), rows)[:B], prompts, resp, fed)
                  if record_routes else None)
        return resp, lps, done[:B], amx, kept, routes

    @torch.no_grad()
    def score(self, prompts: list[list[int]], responses: list[list[int]], *, temperature: float = 1.0,
              top_p: float = 1.0, max_new_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor,
                                                                            torch.Tensor]:
        """Teacher-forced decode: the log-probs this sampler gives *given* tokens (e.g. another engine's rollout),
        computed with exactly `generate`'s schedule — bucket-padded, left-padded prefill into the static KV cache
        (sized for `max_new_tokens`, default the longest response: pass the generate call's for its very cache),
        then one (B, 1) step per response position, rows that already stopped fed a masked pad.
        -> (logp (N, T) fp32, mask (N, T), argmax (N, T)), the Learner.logprobs layout (masked: finite junk)."""
        if len(prompts) != len(responses) or any(len(p) == 0 for p in prompts):
            raise ValueError("score needs one non-empty prompt per response")
        self.model.eval()
        with use_profile(self.model, self.profile):
            return self._score(prompts, responses, temperature, top_p, max_new_tokens)

    def _score(self, prompts, responses, temperature, top_p, max_new_tokens):
        dev, n, T = self.device, len(prompts), max(map(len, responses), default=0)
        rows = batch_bucket(n)
        ids, real = batch_layout(prompts, rows, dev)  # (rows, P)
        cache = KVCache.for_model(self.model, rows, cache_slots(ids.shape[1], max_new_tokens or max(T, 1)),
                                  device=dev)
        logits = self.model(ids, attention_mask=real, cache=cache)[:, -1]  # (rows, V) prefill
        tok = torch.full((rows, T), PAD_ID, dtype=torch.long, device=dev)
        lens = torch.zeros(rows, dtype=torch.long)
        for b, r in enumerate(responses):
            tok[b, :len(r)] = torch.tensor(r, dtype=torch.long, device=dev)
            lens[b] = len(r)
        mask = torch.arange(T, device=dev)[None] < lens.to(dev)[:, None]  # (rows, T); dummy rows: none
        logp, amx = torch.zeros(rows, T, device=dev), torch.zeros(rows, T, dtype=torch.long, device=dev)
        for k in range(T):
            lp = processed_logprobs(logits, temperature=temperature, top_p=top_p)  # (rows, V)
            logp[:, k], amx[:, k] = lp.gather(-1, tok[:, k:k + 1])[:, 0], logits.argmax(dim=-1)
            if k == T - 1:
                break
            alive = mask[:, k]  # the sampler feeds token k only to rows that sampled it (see generate)
            step_ids = torch.where(alive, tok[:, k], torch.full_like(tok[:, k], PAD_ID))[:, None]  # (rows, 1)
            logits = self.model(step_ids, attention_mask=alive[:, None], cache=cache)[:, -1]
        return logp[:n], mask[:n], amx[:n]

"""Sampler: the rollout engine — batched KV-cache generation under one execution profile (the reference).

What: `Sampler(model, profile).generate(prompts, ...)` returns a `Rollout` with the sampled response tokens, the
log-probability the sampler gave each of them, and the sampler's own argmax token at each step (for the
argmax-flip diagnostic); optionally each step's full processed log-prob row. The model object is the learner's
(weights as after a weight sync); the sampler puts its profile on it before running, so "same weights, different
execution" is literally one module tree under two profiles.

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
  pads make the logits themselves batch-dependent — a numerics effect, kept on purpose). (Until this change the
  noise came from one torch.Generator per row: same distribution, different bits, CPU != CUDA.)
- A row stops at the first stop token (kept in the response) or after `max_new_tokens` (finished = False).

Shape legend: B = batch rows (bucket-padded), P = padded prompt length, S = cache slots, V = vocab.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minite_core.formats import philox
from minite_core.model import KVCache, set_profile
from minite_core.profiles import Profile, get_profile
from minite_core.rl.tokenizer import EOS_ID, PAD_ID

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(*keys: int) -> int:
    """A 48-bit seed from integer keys (run seed, step, index, ...) by splitmix64 chaining: pure, platform-free,
    and well mixed, so neighbouring keys give unrelated streams (unlike seed + index). 48 bits leave headroom
    for consumers' arithmetic (nn.linear seeds its backward with 2*seed+1, experts add e * 1_000_003) inside
    torch.Generator's 64-bit range."""
    h = 0
    for key in keys:
        h = _splitmix64(h ^ (int(key) & _MASK64))
    return h & ((1 << 48) - 1)


@dataclass
class Rollout:
    """Sampled responses. Per row i: response_ids[i], logprobs[i], argmax_ids[i] have the same length (the stop
    token, when hit, included); finished[i] = a stop token ended it."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    logprobs: list[list[float]]  # log p_processed(token) under the sampler
    finished: list[bool]
    argmax_ids: list[list[int]] = field(default_factory=list)  # the sampler's argmax token at each step
    # generate(full_logprobs=True) only: per row a (len(response_ids[i]), V) fp32 CPU tensor, the processed
    # log-prob row of every step (full-vocabulary diagnostics); empty otherwise
    full_logprobs: list[torch.Tensor] = field(default_factory=list)

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
    """Left-padded prompt batch of `rows` >= len(prompts) rows -> ids (rows, P) long, real (rows, P) bool.
    Rows past the prompts are dummy rows: all pad, no real token."""
    P = max(map(len, prompts))
    ids = torch.full((rows, P), PAD_ID, dtype=torch.long)
    real = torch.zeros(rows, P, dtype=torch.bool)
    for b, p in enumerate(prompts):
        ids[b, P - len(p):] = torch.tensor(p, dtype=torch.long)
        real[b, P - len(p):] = True
    return ids.to(device), real.to(device)


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
    offset = torch.arange(vocab, dtype=torch.long, device=seeds.device) + step * (1 << 32)  # (V,)
    u = philox.uniform(seeds[:, None], offset[None, :])  # (B, V)
    return -torch.log(torch.where(u == 0, torch.full_like(u, U_ZERO_GUARD), u))


def sample_step(logits: torch.Tensor, seeds: torch.Tensor, step, *, temperature: float, top_p: float):
    """One sampling step for the whole batch, on the device: logits (B, V) fp32 -> (token (B,), its processed
    log-prob (B,), argmax of the logits (B,), processed log-probs (B, V)). temperature 0 = greedy (no noise)."""
    logp = processed_logprobs(logits, temperature=temperature, top_p=top_p)  # (B, V)
    top = logits.argmax(dim=-1)
    tok = top if temperature == 0 else (logp.exp() / race_noise(seeds, step, logits.shape[-1])).argmax(dim=-1)
    return tok, logp.gather(-1, tok[:, None])[:, 0], top, logp


def check_generate_args(prompts, max_new_tokens: int, temperature: float, top_p: float) -> None:
    """The ValueErrors both samplers raise for bad input."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0 or not 0.0 < top_p <= 1.0:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (the first response token is predicted from it)")


class Sampler:
    """Rollout engine (reference): `generate` under `profile` on the (shared) model."""

    def __init__(self, model, profile: Profile | str, *, device: torch.device | str | None = None):
        self.model = model
        self.profile = get_profile(profile)
        self.device = torch.device(device) if device is not None else model.lm_head.weight.device

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop_ids=(EOS_ID,), seed: int, batch_size: int | None = None,
                 full_logprobs: bool = False) -> Rollout:
        """Rows in chunks of `batch_size` (None = all at once); `full_logprobs` adds Rollout.full_logprobs."""
        check_generate_args(prompts, max_new_tokens, temperature, top_p)
        set_profile(self.model, self.profile)
        self.model.eval()
        batch_size = batch_size or max(len(prompts), 1)
        out = Rollout([list(p) for p in prompts], [], [], [], [])
        for start in range(0, len(prompts), batch_size):
            idx = list(range(start, min(start + batch_size, len(prompts))))
            resp, lps, fin, amx, full = self._generate_batch([prompts[i] for i in idx], idx, max_new_tokens,
                                                             temperature, top_p, frozenset(stop_ids), seed,
                                                             full_logprobs)
            out.response_ids += resp
            out.logprobs += lps
            out.finished += fin
            out.argmax_ids += amx
            out.full_logprobs += full
        return out

    @torch.no_grad()  # not inference_mode: nn caches weight copies made here, and the learner's autograd reuses them
    def _generate_batch(self, prompts, indices, max_new_tokens, temperature, top_p, stop_ids, seed, full_logprobs):
        dev, B = self.device, len(prompts)
        rows = batch_bucket(B)  # + dummy rows, exactly as the fast sampler pads
        ids, real = batch_layout(prompts, rows, dev)  # (rows, P)
        cache = KVCache.for_model(self.model, rows, cache_slots(ids.shape[1], max_new_tokens), device=dev)
        logits = self.model(ids, attention_mask=real, cache=cache)[:, -1]  # (rows, V) prefill
        seeds = row_seeds(seed, indices, rows, dev)
        resp, lps, amx, full = ([[] for _ in range(B)] for _ in range(4))
        done = [False] * B + [True] * (rows - B)  # dummy rows are finished from the start
        for step in range(max_new_tokens):
            tok, tok_lp, top, logp = sample_step(logits, seeds, step, temperature=temperature, top_p=top_p)
            active = [not d for d in done]
            for b in range(B):
                if active[b]:
                    t = int(tok[b])
                    resp[b].append(t)
                    lps[b].append(float(tok_lp[b]))
                    amx[b].append(int(top[b]))
                    if full_logprobs:
                        full[b].append(logp[b].cpu())
                    done[b] = t in stop_ids
            if all(done) or step == max_new_tokens - 1:
                break
            alive = torch.tensor(active, device=dev)  # rows finished before this step feed a masked pad
            step_ids = torch.where(alive, tok, torch.full_like(tok, PAD_ID))[:, None]  # (rows, 1)
            logits = self.model(step_ids, attention_mask=alive[:, None], cache=cache)[:, -1]
        full = [torch.stack(f) if f else torch.zeros(0, logits.shape[-1]) for f in full] if full_logprobs else []
        return resp, lps, done[:B], amx, full

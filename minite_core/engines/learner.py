"""Learner: the training engine's view of a policy — full-sequence log-probs of given responses.

What: `Learner(model, profile).logprobs(prompt_ids, response_ids)` returns logπ(response token | prefix) for every
response token, from one full-sequence forward over the right-padded prompt + response batch (as TE / Megatron /
FSDP learners compute the "old" and "new" log-probs of an RL step): logits / temperature, log-softmax in fp32.
These are the numbers the GRPO loss uses; `grad=True` keeps the graph for the update.

Why a separate engine object on the same model: the learner and the sampler share weights but not execution.
Each engine runs its forward under its own profile (`use_profile`, restored afterwards: model/profile_scope.py),
so a diagnostic or an RL step can interleave them on one module tree and neither leaves its profile behind. The
backward of `grad=True` log-probs runs later, outside the block, with the numerics its forward recorded.

Seeds: stochastic rounding in the backward draws from `module.seed`; `set_step(step)` gives every QuantLinear /
GroupedLinear (index j in `nn.walk.gemm_modules` order) the seed seeds.module_seed(run seed, step, j) — explicit, and
identical on resume. The forward is deterministic (RNE), so SR seeds never change log-probs.

`score` is the one forward loop, chunk by chunk (`batch_size` rows): besides the log-probs it can record the MoE
routing of the forward (`record_routes`), replay the sampler's routing (rollout routing replay, R3, when the
profile's `routing_replay` is on: `routes` = the sampler's per-row routes, model/routing.py), and compute the
full-vocabulary KL(π_sampler ‖ π_learner) per response token against the sampler's processed log-prob rows
(`sampler_rows`) — one chunk of (n, T, V) log-probs in memory at a time, never the whole batch's.

Shape legend: N = sequences, L = padded prompt + response length, T = longest response, V = vocab,
S_i = prompt + response length of row i, Lm = MoE layers, K = experts per token.
Padding: right padding (engines.batching); pad tokens are real embeddings and enter per-tensor activation amaxes (a packed-sequence
learner would not see them) — a per-token scale is immune.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minite_core.engines.batching import pack_right, response_targets
from minite_core.engines.sampler import processed_logprobs
from minite_core.model import use_profile
from minite_core.model.routing import Routing, moe_layers, pad_routes, replay_tables, stack_calls, use_routing
from minite_core.nn.walk import set_sr_seeds
from minite_core.profiles import Profile, get_profile


class Learner:
    """Training engine: full-sequence response log-probs under `profile` on the (shared) model."""

    def __init__(self, model, profile: Profile | str, *, seed: int = 0, batch_size: int | None = None):
        self.model = model
        self.profile = get_profile(profile)
        self.seed = int(seed)
        self.batch_size = batch_size  # rows per forward (None = all); per-tensor scales see one micro-batch
        self.device = model.lm_head.weight.device
        self.step = None
        self.pad_length = None  # padded length L (None = the batch's longest); engines.distributed sets the global L

    def set_step(self, step: int) -> None:
        """Per-step SR seeds: module j gets derive_seed(run seed, step, j)."""
        self.step = int(step)
        set_sr_seeds(self.model, self.seed, self.step)

    def _check(self, prompt_ids, response_ids) -> None:
        """Prompt + response rows against the model's vocabulary and positions (ModelConfig.check_tokens)."""
        self.model.config.check_tokens([list(p) + list(r) for p, r in zip(prompt_ids, response_ids)],
                                       what="prompt + response")

    def response_logits(self, prompt_ids, response_ids, *, grad: bool = False):
        """Raw logits (N, T, V) fp32 at the positions that predict each response token, and mask (N, T) bool."""
        self._check(prompt_ids, response_ids)
        ids, attn, pos, mask = pack_right(prompt_ids, response_ids, device=self.device, length=self.pad_length)
        N, T = mask.shape
        step = self.batch_size or max(N, 1)
        chunks = []
        with torch.set_grad_enabled(grad), use_profile(self.model, self.profile):
            for s in range(0, N, step):
                # right padding needs no key mask (real queries never see the pads after them): on CUDA the
                # mask is dropped so SDPA takes a fused causal kernel (cuDNN's on sm_90 with torch 2.11; what can
                # silently take it away: peers/te_cudnn.py); on CPU it stays (CPU results stay bitwise)
                key_mask = None if ids.is_cuda else attn[s:s + step]  # (not `mask`: that is the return value)
                logits = self.model(ids[s:s + step], attention_mask=key_mask)  # (n, L, V)
                idx = pos[s:s + step, :, None].expand(-1, -1, logits.shape[-1])  # (n, T, V)
                chunks.append(logits.gather(1, idx))
        V = self.model.config.vocab_size
        logits = torch.cat(chunks) if chunks else torch.zeros(0, T, V, device=self.device)
        return logits.float(), mask

    def logprobs(self, prompt_ids, response_ids, *, temperature: float = 1.0, top_p: float = 1.0,
                 with_entropy: bool = False, grad: bool = False, with_argmax: bool = False, routes=None):
        """-> (logp (N, T), entropy (N, T) | None, mask (N, T)); with_argmax adds argmax (N, T) as a 4th item.
        Masked positions hold finite junk. temperature == 0 is read as 1 (greedy rollouts report raw log-probs).
        `routes`: the sampler's per-row routes, replayed when the profile says so (see `score`)."""
        sc = self.score(prompt_ids, response_ids, temperature=temperature, top_p=top_p, with_entropy=with_entropy,
                        grad=grad, with_argmax=with_argmax, routes=routes)
        if with_argmax:
            return sc.logp, sc.entropy, sc.mask, sc.argmax
        return sc.logp, sc.entropy, sc.mask

    def score(self, prompt_ids, response_ids, *, temperature: float = 1.0, top_p: float = 1.0,
              with_entropy: bool = False, grad: bool = False, with_argmax: bool = False, routes=None,
              record_routes: bool = False, sampler_rows=None) -> "Scores":
        """Everything the learner measures on the sampler's tokens, one chunk of rows per forward.
        routes: per row (S_i, Lm, K) the sampler's executed expert ids (-1 = not routed), required when the
        profile replays routing on an MoE model, else unused. record_routes: return this forward's routing.
        sampler_rows: per row (R_i, V) the sampler's processed log-probs -> Scores.kl_full_vocab."""
        self._check(prompt_ids, response_ids)
        ids, attn, pos, mask = pack_right(prompt_ids, response_ids, device=self.device, length=self.pad_length)
        N, T = mask.shape
        layers = moe_layers(self.model)
        replay = self.profile.routing_replay and bool(layers)
        if replay and routes is None:
            raise ValueError(f"learner profile {self.profile.name!r} replays the sampler's routing: pass routes "
                             f"(Sampler.generate(record_routes=True) gives Rollout.routes)")
        record = record_routes and bool(layers)
        padded = None
        if replay:
            lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
            if len(routes) != N or any(x.shape[0] != n for x, n in zip(routes, lengths)):
                raise ValueError(f"routes must give one (prompt + response length, Lm, K) tensor per row; got "
                                 f"{[tuple(x.shape) for x in routes][:4]} for lengths {lengths[:4]}")
            padded = pad_routes(routes, ids.shape[1], device=self.device)  # (N, L, Lm, K)
        targets = response_targets(response_ids, mask.shape, device=self.device)  # (N, T)
        step = self.batch_size or max(N, 1)
        V = self.model.config.vocab_size
        out = Scores(logp=torch.zeros(N, T, device=self.device), mask=mask,
                     entropy=torch.zeros(N, T, device=self.device) if with_entropy else None,
                     argmax=torch.zeros(N, T, dtype=torch.long, device=self.device) if with_argmax else None,
                     kl_full_vocab=(torch.zeros(N, T, dtype=torch.float64, device=self.device)
                                    if sampler_rows is not None else None),
                     routes=[] if record else None, router_routes=[] if record and replay else None)
        logp_parts = []
        with use_profile(self.model, self.profile):
            for s in range(0, N, step):
                rows = slice(s, s + step)
                routing = Routing(record=record, replay=replay_tables(padded[rows], layers) if replay else None) \
                    if record or replay else None
                # right padding needs no key mask (real queries never see the pads after them): on CUDA the mask is
                # dropped so SDPA takes a fused causal kernel (as above); on CPU it stays (CPU results stay bitwise)
                key_mask = None if ids.is_cuda else attn[rows]
                with torch.set_grad_enabled(grad), use_routing(self.model, routing):
                    logits = self.model(ids[rows], attention_mask=key_mask)  # (n, L, V)
                    logits = logits.gather(1, pos[rows, :, None].expand(-1, -1, V)).float()  # (n, T, V)
                    # the sampler's processed distribution (temperature, top-p): aligned engines compare like with like
                    logp_all = processed_logprobs(logits, temperature=temperature, top_p=top_p)  # (n, T, V) fp32
                    logp_parts.append(logp_all.gather(-1, targets[rows, :, None])[..., 0])  # (n, T)
                    if with_entropy:
                        plogp = torch.where(torch.isfinite(logp_all), logp_all.exp() * logp_all, 0.0)  # 0·log 0 = 0
                        out.entropy[rows] = -plogp.sum(-1).detach()
                if with_argmax:
                    out.argmax[rows] = logits.argmax(dim=-1)
                if sampler_rows is not None:
                    for i in range(s, min(s + step, N)):  # row by row: one (R_i, V) sampler row set at a time
                        R = len(response_ids[i])
                        lp_l = logp_all[i - s, :R].detach()  # (R, V)
                        out.kl_full_vocab[i, :R] = full_vocab_kl(sampler_rows[i].to(lp_l.device), lp_l)
                if record:
                    self._keep_routes(out, routing, layers, prompt_ids[rows], response_ids[rows], replay)
        if logp_parts:
            out.logp = torch.cat(logp_parts)  # keeps the graph when grad
        return out

    @staticmethod
    def _keep_routes(out: "Scores", routing: Routing, layers, prompts, responses, replay: bool) -> None:
        """This chunk's recorded routing (one right-padded (n, L) call) -> per row (S_i, Lm, K)."""
        n = len(prompts)
        executed = stack_calls(routing, layers, n)  # (n, L, Lm, K)
        chosen = stack_calls(routing, layers, n, which="chosen") if replay else None
        for j, (p, r) in enumerate(zip(prompts, responses)):
            out.routes.append(executed[j, :len(p) + len(r)])
            if replay:
                out.router_routes.append(chosen[j, :len(p) + len(r)])


@dataclass
class Scores:
    """What `Learner.score` measured; masked positions (beyond a row's response) hold finite junk."""

    logp: torch.Tensor  # (N, T) log-prob of each response token under the processed distribution
    mask: torch.Tensor  # (N, T) bool
    entropy: torch.Tensor | None = None  # (N, T)
    argmax: torch.Tensor | None = None  # (N, T) the learner's argmax token (raw logits)
    kl_full_vocab: torch.Tensor | None = None  # (N, T) float64 KL(π_sampler ‖ π_learner) over the vocabulary
    routes: list[torch.Tensor] | None = None  # per row (S_i, Lm, K) int32 executed expert ids (record_routes)
    router_routes: list[torch.Tensor] | None = None  # the router's own top-k, when routing was replayed


def full_vocab_kl(logp_p: torch.Tensor, logp_q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) per row of (n, V) log-probs -> (n,) float64, as sum_v p_v (r_v − 1 − log r_v), r = q / p (the k3
    form per vocabulary entry; where p_v = 0 the term's limit q_v): every term is >= 0, and the sum is the KL for
    normalised p and q. Both rows are renormalised in float64 first: an fp32 log-softmax is normalised only to
    ~1e-7, an offset that would swamp the ~1e-9 KL of aligned engines. q_v = 0 where p_v > 0 gives inf."""
    lp = logp_p.double()
    lq = logp_q.double()
    lp = lp - torch.logsumexp(lp, dim=-1, keepdim=True)
    lq = lq - torch.logsumexp(lq, dim=-1, keepdim=True)
    p = lp.exp()
    d = lq - lp  # log r
    terms = torch.where(p > 0, p * (torch.expm1(d) - d), lq.exp())  # (n, V); p = 0 (top-p tail): limit q_v
    return terms.sum(-1)

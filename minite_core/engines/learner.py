"""Learner: the training engine's view of a policy — full-sequence log-probs of given responses.

What: `Learner(model, profile).logprobs(prompt_ids, response_ids)` returns logπ(response token | prefix) for every
response token, from one full-sequence forward over the right-padded prompt + response batch (as TE / Megatron /
FSDP learners compute the "old" and "new" log-probs of an RL step): logits / temperature, log-softmax in fp32.
These are the numbers the GRPO loss uses; `grad=True` keeps the graph for the update.

Why a separate engine object on the same model: the learner and the sampler share weights but not execution.
Each engine puts its profile on the model right before its forward (`set_profile`), so a diagnostic or an RL
step can interleave them on one module tree.

Seeds: stochastic rounding in the backward draws from `module.seed`; `set_step(step)` gives every QuantLinear /
GroupedLinear (index j in `nn.walk.gemm_modules` order) the seed seeds.module_seed(run seed, step, j) — explicit, and
identical on resume. The forward is deterministic (RNE), so SR seeds never change log-probs.

Shape legend: N = sequences, L = padded prompt + response length, T = longest response, V = vocab.
Padding: right padding (engines.batching); pad tokens are real embeddings and enter per-tensor activation amaxes
(a packed-sequence learner would not see them) — a per-token scale is immune.
"""
from __future__ import annotations

import torch

from minite_core.engines.batching import pack_right, response_targets
from minite_core.engines.sampler import processed_logprobs
from minite_core.model import set_profile
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

    def set_step(self, step: int) -> None:
        """Per-step SR seeds: module j gets derive_seed(run seed, step, j)."""
        self.step = int(step)
        set_sr_seeds(self.model, self.seed, self.step)

    def response_logits(self, prompt_ids, response_ids, *, grad: bool = False):
        """Raw logits (N, T, V) fp32 at the positions that predict each response token, and mask (N, T) bool."""
        set_profile(self.model, self.profile)
        ids, attn, pos, mask = pack_right(prompt_ids, response_ids, device=self.device)
        N, T = mask.shape
        step = self.batch_size or max(N, 1)
        chunks = []
        with torch.set_grad_enabled(grad):
            for s in range(0, N, step):
                # right padding needs no key mask (real queries never see the pads after them): on CUDA the
                # mask is dropped so SDPA takes its flash kernel; on CPU it stays (CPU results stay bitwise)
                key_mask = None if ids.is_cuda else attn[s:s + step]
                logits = self.model(ids[s:s + step], attention_mask=key_mask)  # (n, L, V)
                idx = pos[s:s + step, :, None].expand(-1, -1, logits.shape[-1])  # (n, T, V)
                chunks.append(logits.gather(1, idx))
        V = self.model.config.vocab_size
        logits = torch.cat(chunks) if chunks else torch.zeros(0, T, V, device=self.device)
        return logits.float(), mask

    def logprobs(self, prompt_ids, response_ids, *, temperature: float = 1.0, top_p: float = 1.0,
                 with_entropy: bool = False, grad: bool = False, with_argmax: bool = False):
        """-> (logp (N, T), entropy (N, T) | None, mask (N, T)); with_argmax adds argmax (N, T) as a 4th item.
        Masked positions hold finite junk. temperature == 0 is read as 1 (greedy rollouts report raw log-probs)."""
        logits, mask = self.response_logits(prompt_ids, response_ids, grad=grad)
        with torch.set_grad_enabled(grad):
            # the sampler's processed distribution (temperature, top-p), so aligned engines compare like with like
            logp_all = processed_logprobs(logits, temperature=temperature, top_p=top_p)  # (N, T, V) fp32
            targets = response_targets(response_ids, mask.shape, device=self.device)  # (N, T)
            logp = logp_all.gather(-1, targets[..., None])[..., 0]
            plogp = torch.where(torch.isfinite(logp_all), logp_all.exp() * logp_all, 0.0)  # 0·log 0 = 0 (top-p)
            entropy = -plogp.sum(-1) if with_entropy else None
        if with_argmax:
            return logp, entropy, mask, logits.argmax(dim=-1)
        return logp, entropy, mask

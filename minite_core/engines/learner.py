"""Learner: the training engine's view of a policy — full-sequence log-probs of given responses.

What: `Learner(model, profile).logprobs(prompt_ids, response_ids)` returns logπ(response token | prefix) for every
response token, from one full-sequence forward over the right-padded prompt + response batch (as TE / Megatron /
FSDP learners compute the "old" and "new" log-probs of an RL step): logits / temperature, log-softmax in fp32.
These are the numbers the GRPO loss uses; `grad=True` keeps the graph for the update.

Why a separate engine object on the same model: the learner and the sampler share weights but not execution.
Each engine puts its profile on the model right before its forward (`set_profile`), so a diagnostic or an RL
step can interleave them on one module tree.

Seeds: stochastic rounding in the backward draws from `module.seed`; `set_step(step)` gives every QuantLinear /
GroupedLinear (index j in `model.modules()` order) the seed derive_seed(run seed, step, j) — explicit, and
identical on resume. The forward is deterministic (RNE), so SR seeds never change log-probs.

Shape legend: N = sequences, L = padded prompt + response length, T = longest response, V = vocab.
Padding: right padding; pad tokens are real embeddings and enter per-tensor activation amaxes (a packed-sequence
learner would not see them) — a per-token scale is immune.
"""
from __future__ import annotations

import torch

from minite_core.engines.sampler import derive_seed, processed_logprobs
from minite_core.model import set_profile
from minite_core.nn import GroupedLinear, QuantLinear
from minite_core.profiles import Profile, get_profile
from minite_core.rl.tokenizer import PAD_ID


def gemm_modules(model) -> list[torch.nn.Module]:
    """Every profile-driven GEMM of the model in `modules()` order (the index used for SR seeds)."""
    return [m for m in model.modules() if isinstance(m, (QuantLinear, GroupedLinear))]


def pack_right(prompt_ids: list[list[int]], response_ids: list[list[int]], *, pad_id: int = PAD_ID, device=None):
    """Right-padded prompt + response batch -> (input_ids (N, L), attention_mask (N, L), pos (N, T), mask (N, T)):
    logits[i, pos[i, k]] predicts response token k of row i (valid where mask[i, k])."""
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token")
    N = len(prompt_ids)
    L = max((len(p) + len(r) for p, r in zip(prompt_ids, response_ids)), default=1)
    T = max(map(len, response_ids), default=0)
    ids = torch.full((N, L), pad_id, dtype=torch.long)
    attn = torch.zeros(N, L, dtype=torch.long)
    pos = torch.zeros(N, T, dtype=torch.long)
    mask = torch.zeros(N, T, dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        seq = list(p) + list(r)
        ids[i, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        attn[i, :len(seq)] = 1
        pos[i] = (len(p) - 1 + torch.arange(T)).clamp(max=L - 1)
        mask[i, :len(r)] = True
    return tuple(t.to(device) for t in (ids, attn, pos, mask)) if device is not None else (ids, attn, pos, mask)


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
        for j, module in enumerate(gemm_modules(self.model)):
            module.seed = derive_seed(self.seed, self.step, j)

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
                key_mask = None if ids.is_cuda else attn[s:s + step]  # (not `mask`: that is the return value)
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
            targets = _targets(response_ids, mask.shape, self.device)  # (N, T)
            logp = logp_all.gather(-1, targets[..., None])[..., 0]
            plogp = torch.where(torch.isfinite(logp_all), logp_all.exp() * logp_all, 0.0)  # 0·log 0 = 0 (top-p)
            entropy = -plogp.sum(-1) if with_entropy else None
        if with_argmax:
            return logp, entropy, mask, logits.argmax(dim=-1)
        return logp, entropy, mask


def _targets(response_ids, shape, device) -> torch.Tensor:
    out = torch.full(shape, PAD_ID, dtype=torch.long)
    for i, r in enumerate(response_ids):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out.to(device)

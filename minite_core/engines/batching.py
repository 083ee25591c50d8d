"""How the engines lay token sequences out in a batch — the one place for padding.

- `pack_right`: the learner's full-sequence batch (prompt + response, right-padded) and where each response
  token's logits are; pads sit after every real token, so causal attention never lets a real token see one.
- `pack_left`: the sampler's prefill batch (prompts left-padded to the longest, so every row's next token is at
  the last column), with the attention mask that hides the pads.
Pad tokens are real embeddings: under per-tensor dynamic activation scales they enter the amax (a numerics
effect the diagnostics measure); a per-token scale is immune. Static scales never see them (model.calibrate).

Shape legend: N = rows, L = padded prompt + response length, P = padded prompt length, T = longest response.
"""
from __future__ import annotations

import torch

from minite_core.task.tokenizer import PAD_ID


def _check_prompts(prompt_ids) -> None:
    if not prompt_ids:
        raise ValueError("no prompts given (an empty batch)")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token (the first response token is predicted from it)")


def pack_right(prompt_ids: list[list[int]], response_ids: list[list[int]], *, pad_id: int = PAD_ID, device=None,
               length: int | None = None):
    """Right-padded prompt + response batch -> (input_ids (N, L), attention_mask (N, L), pos (N, T), mask (N, T)):
    logits[i, pos[i, k]] predicts response token k of row i (valid where mask[i, k]). length: L (default the
    longest row; a data-parallel rank pads its rows to the global batch's L, so pads enter amaxes as there)."""
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
    _check_prompts(prompt_ids)
    N = len(prompt_ids)
    L = max(len(p) + len(r) for p, r in zip(prompt_ids, response_ids))
    if length is not None:
        if length < L:
            raise ValueError(f"pack_right length={length} is shorter than the longest prompt + response ({L})")
        L = length
    T = max(map(len, response_ids))
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


def pack_left(prompt_ids: list[list[int]], *, pad_id: int = PAD_ID, device=None):
    """Left-padded prompts -> (input_ids (N, P), attention_mask (N, P)); row i's last prompt token at column P-1."""
    _check_prompts(prompt_ids)
    N, P = len(prompt_ids), max(map(len, prompt_ids))
    ids = torch.full((N, P), pad_id, dtype=torch.long, device=device)
    attn = torch.zeros(N, P, dtype=torch.long, device=device)
    for b, p in enumerate(prompt_ids):
        ids[b, P - len(p):] = torch.tensor(p, dtype=torch.long, device=device)
        attn[b, P - len(p):] = 1
    return ids, attn


def response_targets(response_ids: list[list[int]], shape, *, pad_id: int = PAD_ID, device=None) -> torch.Tensor:
    """(N, T) long: response token k of row i at [i, k], pad elsewhere (the gather index of the learner)."""
    out = torch.full(shape, pad_id, dtype=torch.long)
    for i, r in enumerate(response_ids):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out.to(device)

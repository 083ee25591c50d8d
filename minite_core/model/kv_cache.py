"""KVCache: preallocated per-layer key/value buffers for batched decode with left padding.

Shape legend: B = batch, Hkv = key/value heads, S = cache slots (Tmax), Dh = head dim, T = new tokens.

The sampler prefills a left-padded batch of prompts (all rows share the same slot count), then appends one
token per step. Every row therefore uses the same slots, so one integer `length` describes the whole cache;
which slots hold real tokens is the caller's `attention_mask [B, length + T]` (1 = real), exactly as in
transformers' `generate`. Unlike transformers' DynamicCache nothing is concatenated per step: buffers are
allocated once at `max_len`, which keeps decode allocation-free and CUDA-graph friendly.

Protocol used by `CausalLM.forward`: each attention layer calls `update(layer, k, v)` (writes slots
[length, length + T) and returns the keys/values of slots [0, length + T)), and the model calls `advance(T)`
once after all layers.
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, batch_size: int, num_kv_heads: int, max_len: int, head_dim: int,
                 *, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu"):
        shape = (batch_size, num_kv_heads, max_len, head_dim)  # (B, Hkv, S, Dh)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.batch_size, self.max_len, self.dtype = batch_size, max_len, dtype
        self.length = 0  # slots filled, shared by all rows (left padding keeps rows aligned)

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> "KVCache":
        """A cache sized for `model` (a CausalLM); dtype defaults to the compute dtype of its profile."""
        cfg = model.config
        dtype = dtype if dtype is not None else getattr(torch, model.profile.dtype)
        device = device if device is not None else model.lm_head.weight.device
        return cls(cfg.num_hidden_layers, batch_size, cfg.num_key_value_heads, max_len, cfg.head_dim,
                   dtype=dtype, device=device)

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # k, v: (B, Hkv, T, Dh) -> returns (B, Hkv, length + T, Dh) views of the buffers
        T = k.shape[2]
        end = self.length + T
        if end > self.max_len:
            raise ValueError(f"KVCache overflow: length {self.length} + {T} new tokens > max_len {self.max_len}")
        if k.shape[0] != self.batch_size:
            raise ValueError(f"KVCache batch_size is {self.batch_size}, got keys for batch {k.shape[0]}")
        self.k[layer_idx][:, :, self.length:end] = k
        self.v[layer_idx][:, :, self.length:end] = v
        return self.k[layer_idx][:, :, :end], self.v[layer_idx][:, :, :end]

    def advance(self, num_tokens: int) -> None:
        self.length += num_tokens

    def reset(self) -> None:
        self.length = 0  # stale slots are never read: attention only sees [0, length + T)

"""KVCache: static per-layer key/value buffers for batched decode with left padding (gpt-fast / vLLM style).

Shape legend: B = batch, Hkv = key/value heads, S = cache slots (max_len), Dh = head dim, T = new tokens.

Every buffer is allocated once and only ever written in place, so shapes never change between decode steps and
a decode step can be captured in a CUDA graph:
- `k[layer]`, `v[layer]` (B, Hkv, S, Dh): slot s of every row holds the key/value of the s-th token fed;
- `valid` (B, S) bool: slot holds a real token (False for left padding, masked pads of finished rows, and slots
  not written yet) — the slot mask attention uses over ALL S slots;
- `pos` () int64, on the device: the next slot to write, shared by all rows (left padding keeps rows aligned);
- `n_real` (B,) int64, on the device: real tokens per row so far (the RoPE position of the row's next token).
`length` is the host mirror of `pos`, advanced by eager forwards; a CUDA-graph replay runs no Python, so the
graph's owner (engines.fast_sampler) counts its steps itself.

Protocol used by `CausalLM.forward` for T new tokens with real-token mask `real_new` (B, T):
`slots = begin(real_new)` (checks room, marks the slots in `valid`), each attention layer `update(layer, k, v)`
(writes slots [pos, pos + T) with index_copy_ at the device position, returns the whole buffers), then
`advance(real_new)`. Attention reads every slot, masked by `valid` and causality (CausalLM._cached_mask), in the
prefill and in every decode step alike: the reference and fast samplers run this one path. Stale slots from an
earlier use are never attended (masked to exactly zero weight) and `reset()` clears the mask and counters.
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, batch_size: int, num_kv_heads: int, max_len: int, head_dim: int,
                 *, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu"):
        shape = (batch_size, num_kv_heads, max_len, head_dim)  # (B, Hkv, S, Dh)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.valid = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)  # (B, S)
        self.pos = torch.zeros((), dtype=torch.long, device=device)  # next slot, on the device
        self.n_real = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,)
        self.batch_size, self.max_len, self.dtype = batch_size, max_len, dtype
        self.length = 0  # host mirror of pos (eager forwards only)
        self._slots: torch.Tensor | None = None  # (T,) slots of the forward in flight

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> "KVCache":
        """A cache sized for `model` (a CausalLM); dtype defaults to the compute dtype of its profile."""
        cfg = model.config
        dtype = dtype if dtype is not None else getattr(torch, model.profile.dtype)
        device = device if device is not None else model.lm_head.weight.device
        return cls(cfg.num_hidden_layers, batch_size, cfg.num_key_value_heads, max_len, cfg.head_dim,
                   dtype=dtype, device=device)

    def begin(self, real_new: torch.Tensor) -> torch.Tensor:
        """Start a forward of T new tokens; real_new (B, T) bool. Returns their slots (T,) int64 on the device."""
        B, T = real_new.shape
        if B != self.batch_size:
            raise ValueError(f"KVCache batch_size is {self.batch_size}, got a batch of {B}")
        if self.length + T > self.max_len:
            raise ValueError(f"KVCache overflow: length {self.length} + {T} new tokens > max_len {self.max_len}")
        self._slots = self.pos + torch.arange(T, device=self.pos.device)  # (T,)
        self.valid.index_copy_(1, self._slots, real_new)
        return self._slots

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # k, v: (B, Hkv, T, Dh) written at the slots of `begin` -> the whole (B, Hkv, S, Dh) buffers
        self.k[layer_idx].index_copy_(2, self._slots, k.to(self.dtype))
        self.v[layer_idx].index_copy_(2, self._slots, v.to(self.dtype))
        return self.k[layer_idx], self.v[layer_idx]

    def advance(self, real_new: torch.Tensor) -> None:
        """End the forward of `begin`: in-place device counters (capturable), host mirror."""
        self.pos += real_new.shape[1]
        self.n_real += real_new.sum(dim=1)
        self.length += real_new.shape[1]
        self._slots = None

    def reset(self) -> None:
        """Empty the cache in place (buffers, and so any CUDA graph reading them, stay valid)."""
        self.valid.zero_()
        self.pos.zero_()
        self.n_real.zero_()
        self.length = 0
        self._slots = None

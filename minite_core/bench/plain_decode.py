"""The bf16 decode a user writes in plain PyTorch (gpt-fast's recipe without torch.compile): the honest baseline
of `bench sampler`'s weight-bound rows, timed in the same run on the same weights.

What it is: one greedy decode step of a dense Qwen3 (`CausalLM` with bf16 parameters) on static buffers — the
embedding row, per layer RMSNorm, ONE fused q|k|v GEMM, per-head q/k RMSNorm, RoPE from a precomputed table,
the new key/value written into a static [B, Hkv, S, Dh] cache at the device position, SDPA over all S slots
under a slot mask (GQA), o_proj, RMSNorm, ONE fused gate|up GEMM, SiLU·up, down_proj; final norm, LM head,
argmax — captured once in a CUDA graph and replayed. No sampling, no log-prob processing, no stop detection:
a floor for what the project's sampler does per step (which keeps log-probs and samples), not the same work.
The fused q|k|v and gate|up weights are concatenated copies of the model's (same bytes per step).

Shape legend: B = batch, S = cache slots, D = hidden, H / Hkv = query / key-value heads, Dh = head dim.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minite_core.bench.timing import Stats, Timer


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: normalised in fp32, cast back, times the weight."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class PlainDecoder:
    """Static-buffer greedy decode of a dense bf16 `CausalLM` (module docstring)."""

    def __init__(self, model, batch: int, max_len: int):
        cfg = model.config
        if cfg.num_experts:
            raise ValueError("the plain decode baseline is for dense models (the weight-bound shape)")
        dev = model.lm_head.weight.device
        self.cfg, self.eps = cfg, cfg.rms_norm_eps
        self.H, self.Hkv, self.Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bf = torch.bfloat16
        self.embed = model.model.embed_tokens.weight.to(bf)
        self.layers = []
        for layer in model.model.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(dict(
                w_in=layer.input_layernorm.weight.to(bf), w_post=layer.post_attention_layernorm.weight.to(bf),
                wqkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).to(bf),
                q_norm=a.q_norm.weight.to(bf), k_norm=a.k_norm.weight.to(bf), wo=a.o_proj.weight.to(bf),
                w13=torch.cat([m.gate_proj.weight, m.up_proj.weight]).to(bf), w2=m.down_proj.weight.to(bf),
                k=torch.zeros(batch, self.Hkv, max_len, self.Dh, dtype=bf, device=dev),
                v=torch.zeros(batch, self.Hkv, max_len, self.Dh, dtype=bf, device=dev)))
        self.w_final = model.model.norm.weight.to(bf)
        self.lm_head = model.lm_head.weight.to(bf)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, self.Dh, 2, dtype=torch.float32, device=dev) / self.Dh))
        freqs = torch.arange(max_len, dtype=torch.float32, device=dev)[:, None] * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(bf), emb.sin().to(bf)  # (S, Dh)
        self.slots = torch.arange(max_len, device=dev)
        self.tokens = torch.zeros(batch, dtype=torch.int64, device=dev)
        self.pos = torch.zeros((), dtype=torch.int64, device=dev)
        self.graph = None
        self.logits = None

    def weight_bytes(self) -> int:
        """Bytes of GEMM weights one step reads (as bench.decode_bytes counts them: norms and the gathered
        embedding rows left out)."""
        per_layer = sum(layer[key].numel() * layer[key].element_size() for layer in self.layers
                        for key in ("wqkv", "wo", "w13", "w2"))
        return per_layer + self.lm_head.numel() * self.lm_head.element_size()

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    @torch.no_grad()
    def step(self) -> None:
        B = self.tokens.shape[0]
        H, Hkv, Dh = self.H, self.Hkv, self.Dh
        x = self.embed[self.tokens]  # (B, D)
        at = self.pos.view(1)  # index_select, not t[pos]: a 0-dim index would be read on the host (a sync)
        cos, sin = self.cos.index_select(0, at), self.sin.index_select(0, at)  # (1, Dh)
        mask = (self.slots <= self.pos).view(1, 1, 1, -1)
        for lw in self.layers:
            qkv = F.linear(_rms(x, lw["w_in"], self.eps), lw["wqkv"])
            q, k, v = qkv.split([H * Dh, Hkv * Dh, Hkv * Dh], dim=-1)
            q = self._rope(_rms(q.view(B, H, Dh), lw["q_norm"], self.eps), cos, sin)
            k = self._rope(_rms(k.view(B, Hkv, Dh), lw["k_norm"], self.eps), cos, sin)
            lw["k"].index_copy_(2, at, k.unsqueeze(2))
            lw["v"].index_copy_(2, at, v.view(B, Hkv, 1, Dh))
            o = F.scaled_dot_product_attention(q.unsqueeze(2), lw["k"], lw["v"], attn_mask=mask, enable_gqa=True)
            x = x + F.linear(o.reshape(B, H * Dh), lw["wo"])
            gate, up = F.linear(_rms(x, lw["w_post"], self.eps), lw["w13"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, lw["w2"])
        self.logits = F.linear(_rms(x, self.w_final, self.eps), self.lm_head)  # (B, V), kept for tests
        self.tokens.copy_(self.logits.argmax(dim=-1))
        self.pos.add_(1)

    def capture(self) -> None:
        """Warm up on a side stream, then capture one step in a CUDA graph."""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self.step()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step()

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.graph.replay() if self.graph is not None else self.step()


def time_plain(model, prompts: list[list[int]], new_tokens: int, reps: int, device) -> dict:
    """Decode-only tokens/s of the plain decode (median of `reps` runs of new_tokens - 1 steps, position reset
    to the prompt length before each run; the prompt's cache slots hold zeros: its values do not change a
    step's bytes or kernels)."""
    batch, plen = len(prompts), len(prompts[0])
    dec = PlainDecoder(model, batch, plen + new_tokens + 4)
    dec.tokens.copy_(torch.tensor([p[-1] for p in prompts], device=dec.tokens.device))
    graph = device.type == "cuda"
    if graph:
        dec.capture()
    steps, samples = new_tokens - 1, []
    for _ in range(reps):
        dec.pos.fill_(plen)
        with Timer(device) as t:
            dec.run(steps)
        samples.append(t.elapsed_ms)
    s = Stats.of(samples)
    tokens = batch * steps
    return {"engine": "plain-torch" + ("-graph" if graph else ""), "tokens_per_s": tokens / (s.median_ms / 1e3),
            "p20_tokens_per_s": tokens / (s.p80_ms / 1e3), "p80_tokens_per_s": tokens / (s.p20_ms / 1e3),
            "step_ms": s.median_ms / steps, "n_reps": s.n, "weight_bytes_per_step": dec.weight_bytes()}

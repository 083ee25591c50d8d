"""Qwen3-MoE / dense Qwen3 causal LM whose every GEMM is a profile-driven QuantLinear / GroupedLinear.

Shape legend: B = batch, T = new tokens, S = key slots (T, or the cache's max_len), D = hidden, H = query heads,
Hkv = key/value heads, Dh = head dim, E = experts, K = experts per token, I = expert width, N = B*T tokens,
V = vocab.

Same function as transformers' Qwen3MoeForCausalLM / Qwen3ForCausalLM (parity-tested to 1e-4 in fp32), same
module and parameter names where transformers has them (`model.layers.{i}.self_attn.q_proj`, `.mlp.gate`, ...),
so forward hooks and the first-divergence trace address both engines alike. Differences from transformers:
- Experts are two GroupedLinear, `mlp.experts.gate_up` [E, 2I, D] (gate rows first, like transformers 5's fused
  `gate_up_proj`) and `mlp.experts.down` [E, D, I], run on tokens sorted by expert with 16-aligned segments
  (`nn.moe_layout`, the grouped-GEMM layout the kernels take) instead of transformers' per-expert gather loop.
- The top-k expert outputs of a token are summed in fp32 in rank order (deterministic); transformers
  index_adds them in the hidden dtype in expert order. Identical in fp32 up to rounding.
- Precision comes from the profile (`use_profile`, model/profile_scope.py), not from the parameter dtype: parameters stay in whatever
  dtype they were loaded in (fp32 masters for training) and are cast per op. Embeddings, norms, RoPE and
  attention run in `profile.dtype`; the router GEMM in `profile.router_dtype` (softmax always fp32, as
  transformers); the LM head in `profile.lm_head_dtype`; logits are returned in fp32.
- `position_ids` default to the count of real tokens before each position (from `attention_mask`), so a
  left-padded row gets the positions it would have unpadded, in full-sequence and cached forwards alike
  (transformers' forward uses arange and leaves this to `generate`).
- Attention is torch SDPA with an explicit boolean mask (causal + padding); a padded query row that would see
  no key is allowed its own slot, so pad positions give finite (ignored) logits instead of NaN. With a KVCache
  (static buffers, model/kv_cache.py) every forward — prefill and decode — attends over all S slots of the
  cache under its slot mask: one cached-attention path for the reference and the fast (CUDA-graph) sampler.
  SDPA turns a boolean mask into an additive one (0 / -inf in q's dtype) on every call; the forward does it once
  (`attention_bias`) and every layer's SDPA takes that: the same tensor SDPA would build, one kernel a forward
  instead of three a layer (its two scalar tensors and the select).
- Under a profile with `recompute_elementwise` (the NVFP4 learners), in grad mode the RMSNorms and SwiGLU save
  only their inputs for backward and run their elementwise ops again there (`nn.recompute`): the same bits as
  autograd's plain graph, a fraction of its saved bytes. On the GPU fast path every learner profile's RMSNorm
  saves only its inputs anyway: torch's mean, one launch for the rest, one for the backward
  (kernels/rmsnorm_grad.py; the forward's bits, the gradients within one bf16 rounding).
- Where the expert GEMMs' knob `remake_output` is on (off by default; nn/experts.py), SwiGLU and the MoE combine keep
  their GEMM's input codes instead of its bf16 output, and backward makes the output again: the same bits, fewer
  saved bytes (`Experts.remade`, `SparseMoE.local_experts`).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from minite_core.kernels import dispatch
from minite_core.model.config import ModelConfig
from minite_core.model.kv_cache import KVCache
from minite_core.nn import GroupedLinear, QuantLinear
from minite_core.nn.linear import group_decode
from minite_core.nn.operands import cast_weight, torch_dtype
from minite_core.nn.moe_layout import MoELayout, combine, moe_layout, permute
from minite_core.nn.recompute import Remade, recompute
from minite_core.profiles import PROFILES, Profile


class RMSNorm(nn.Module):
    """x / rms(x) * w, normalised in fp32 and cast back before the weight multiply (as transformers)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.batch_invariant = False  # profile knob: the one-program-per-row kernel on the fast path
        self.recompute = False  # profile knob recompute_elementwise: save x, redo the ops in backward
        self.weight_cache: dict = {}  # the weight cast to the activation dtype, once per version (no-grad calls)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """residual given: normalise the fp32 sum x + residual before it is rounded (fused add-norm)."""
        if self.batch_invariant and dispatch.fast_path(x):
            return dispatch.rms_norm(x, self.weight, self.eps, residual, reference=self.reference)
        if torch.is_grad_enabled() and self.weight.requires_grad:
            # the fast path (every learner profile): torch's mean, the rest in one launch, the backward in one
            # (kernels/rmsnorm_grad.py: the forward's bits, x saved); else autograd through the reference
            return dispatch.rms_norm_fused(x, self.weight, self.eps, residual, reference=self.autograd_reference)
        # no gradient (decode, eval): the weight cast once per version (the same bits as .to()), and on the GPU
        # torch's mean between two launches (dispatch.rms_norm_nograd), or everything after the mean in one
        # (dispatch.rms_norm_tail) where the first does not take the inputs
        weight = cast_weight(self.weight, x.dtype, self.weight_cache)
        y = dispatch.rms_norm_nograd(x, weight, self.eps, residual)
        return y if y is not None else self.reference(x, weight, residual, tail=dispatch.rms_norm_tail)

    def autograd_reference(self, x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The reference under autograd; with the recompute knob it saves x (and residual), not the fp32 upcast
        and normalised copies, and runs the ops again in backward."""
        if not self.recompute:
            return self.reference(x, weight, residual)
        if residual is None:
            return recompute(lambda x_, w_: self.reference(x_, w_, None), x, weight)
        return recompute(self.reference, x, weight, residual)

    def reference(self, x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None,
                  tail=None) -> torch.Tensor:
        x_fp32 = x.float() if residual is None else x.float() + residual.float()
        ms = x_fp32.pow(2).mean(-1, keepdim=True)
        y = tail(x_fp32, ms, weight, self.eps, x.dtype) if tail is not None else None  # None: not taken here
        return y if y is not None else weight.to(x.dtype) * (x_fp32 * torch.rsqrt(ms + self.eps)).to(x.dtype)


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    # position_ids: (B, T) -> cos, sin: (B, 1, T, Dh), computed in fp32 then cast (as transformers)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                             device=position_ids.device) / head_dim))
    freqs = position_ids[..., None].float() * inv_freq  # (B, T, Dh/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, Dh)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def cast(x: torch.Tensor, dtype: torch.dtype, rounding: str = "rne") -> torch.Tensor:
    """x -> dtype; rounding "rtz" truncates fp32 -> bf16 (drops the low 16 bits, as vLLM's AVX2 CPU kernels),
    "rne" is torch's cast. Profile knob `kernel_rounding`."""
    if rounding == "rtz" and x.dtype == torch.float32 and dtype == torch.bfloat16:
        return (x.contiguous().view(torch.int32) & -65536).view(torch.float32).to(dtype)  # exact: low bits are 0
    return x.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype | None = None,
               rounding: str = "rne") -> torch.Tensor:
    """x (B, H, T, Dh) rotated. dtype None: in x's dtype, each product and the sum rounded (transformers);
    else in `dtype` with one rounding back to x's dtype (profile knobs rope_dtype, kernel_rounding; vLLM's
    CPU kernel: fp32, truncated). bf16 products are exact in fp32, so fp32 is bitwise with or without FMA.
    Fast path (no gradient): one Triton launch, bitwise this reference (kernels/rope.py)."""
    return dispatch.rope(x, cos, sin, dtype, rounding, reference=apply_rope_reference)


def apply_rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype | None = None,
                         rounding: str = "rne") -> torch.Tensor:
    """`apply_rope`'s plain torch arithmetic (the CPU path, autograd, and what the kernel is tested against)."""
    if dtype is None or dtype == x.dtype:
        return x * cos + _rotate_half(x) * sin
    xd = x.to(dtype)
    return cast(xd * cos.to(dtype) + _rotate_half(xd) * sin.to(dtype), x.dtype, rounding)


class Attention(nn.Module):
    """GQA with per-head RMSNorm on q and k before RoPE (Qwen3's QK-norm)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        D, H, Hkv, Dh = cfg.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        self.q_proj = QuantLinear(D, H * Dh)
        self.k_proj = QuantLinear(D, Hkv * Dh)
        self.v_proj = QuantLinear(D, Hkv * Dh)
        self.o_proj = QuantLinear(H * Dh, D)
        qkv = (self.q_proj, self.k_proj, self.v_proj)  # one weight global scale under fused_weight_scale
        for proj in qkv:
            proj.fused_group = qkv
        self.q_norm = RMSNorm(Dh, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(Dh, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache: KVCache | None):
        # x: (B, T, D); mask: (B, 1, T, S) bool (True = attend; its `attention_bias` where SDPA runs), or None
        # (= plain causal)
        B, T, _ = x.shape
        # decode under a packed-weight profile: q|k|v in one GEMM (nn.linear.group_decode); else one GEMM each
        qkv = group_decode((self.q_proj, self.k_proj, self.v_proj), x)
        q, k, v = qkv or (self.q_proj(x), self.k_proj(x), self.v_proj(x))
        q = self.q_norm(q.view(B, T, self.num_heads, self.head_dim)).transpose(1, 2)  # (B, H, T, Dh)
        k = self.k_norm(k.view(B, T, self.num_kv_heads, self.head_dim)).transpose(1, 2)  # (B, Hkv, T, Dh)
        v = v.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, Dh)
        p = self.o_proj.profile
        rope_dtype = torch_dtype(p.rope_dtype) if p.rope_dtype else None  # profile knob: rotation precision
        q, k = (apply_rope(t, cos, sin, rope_dtype, p.kernel_rounding) for t in (q, k))
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)  # (B, Hkv, S, Dh)
        att_dtype = torch_dtype(p.attention_dtype or p.dtype)  # profile knob: softmax(QK^T)V precision
        if p.batch_invariant:  # profile knob: one kernel for learner, prefill, decode (kernels/attention.py)
            o = dispatch.attention(q, k, v, mask, kernel=p.attention_kernel)  # fp32 inside, q's dtype out (RNE)
            return self.o_proj(o.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim))
        o = F.scaled_dot_product_attention(q.to(att_dtype), k.to(att_dtype), v.to(att_dtype),
                                           attn_mask=attention_bias(mask, att_dtype),
                                           is_causal=mask is None, enable_gqa=self.num_heads != self.num_kv_heads)
        o = cast(o, q.dtype, p.kernel_rounding)  # (B, H, T, Dh)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim))


def attention_bias(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean attention mask (True = attend) as SDPA converts it before any backend runs: 0 where True, -inf
    where False, in `dtype` (q's); an additive mask (or None) as it is."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(mask, 0.0, float("-inf")).to(dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """(..., 2I) gate|up GEMM output, gate first -> (..., I) silu(gate) * up."""
    return silu_mul(*gate_up.chunk(2, dim=-1))


class DenseMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) (Qwen3MLP / Qwen3MoeMLP); under `recompute_elementwise` silu(gate) * up
    is recomputed in backward (only the two GEMM outputs are saved for it). On the fast path one launch each way
    (kernels/swiglu.py), saving the same two."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = QuantLinear(hidden_size, intermediate_size)
        self.up_proj = QuantLinear(hidden_size, intermediate_size)
        self.down_proj = QuantLinear(intermediate_size, hidden_size)
        self.gate_proj.fused_group = self.up_proj.fused_group = (self.gate_proj, self.up_proj)  # fused gate|up

    def forward(self, x):
        gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(dispatch.silu_mul(gate, up, reference=self.silu_mul_reference))

    def silu_mul_reference(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """Torch's ops; with the recompute knob, only gate and up are saved (the fast path saves only them too)."""
        return recompute(silu_mul, gate, up) if self.down_proj.profile.recompute_elementwise else silu_mul(gate, up)


class Experts(nn.Module):
    """E SwiGLU experts as two grouped GEMMs over the padded sorted layout (`nn.moe_layout`); under
    `recompute_elementwise` silu(gate) * up is recomputed in backward (only the gate|up GEMM output is saved).
    Where the GEMMs' `remake_output` knob is on (nn/experts.py), SwiGLU keeps the gate|up GEMM's input codes instead
    of its output (per token where the activation scales are, given `token_rows`), and `remade` hands the down GEMM's
    recipe to the combine (`SparseMoE.local_experts`)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up = GroupedLinear(num_experts, hidden_size, 2 * intermediate_size)  # [E, 2I, D], gate first
        self.down = GroupedLinear(num_experts, intermediate_size, hidden_size)  # [E, D, I]

    def forward(self, x_pad: torch.Tensor, layout: MoELayout) -> torch.Tensor:
        # x_pad: (Tp, D) rows sorted by expert, 16-aligned segments -> (Tp, D)
        return self.remade(x_pad, layout).value

    def remade(self, x_pad: torch.Tensor, layout: MoELayout, token_rows: bool = False) -> Remade:
        """The forward's (Tp, D) output as a `Remade`: with the down GEMM's recipe where it keeps one. token_rows:
        x_pad is `permute(x_flat, layout)`, so the gate|up recipe may keep the N token rows' codes, not the Tp rows'
        (nn/experts.py `grouped_linear`)."""
        gate_up = _remade(self.gate_up, x_pad, layout, token_rows=token_rows)  # (Tp, 2I)
        if gate_up.make is None:
            h = dispatch.swiglu(gate_up.value, reference=self.swiglu_reference)  # (Tp, I)
        else:  # one region: gate_up made again from its codes, then SwiGLU's forward and backward
            h = recompute(_swiglu, gate_up)
        return _remade(self.down, h, layout)

    def swiglu_reference(self, gate_up: torch.Tensor) -> torch.Tensor:
        """Torch's ops; with the recompute knob, only gate_up is saved (the fast path saves only it too)."""
        return recompute(swiglu, gate_up) if self.down.profile.recompute_elementwise else swiglu(gate_up)


def _swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU through the dispatch (the fast path's kernel, else torch's ops): the same op with or without grad mode."""
    return dispatch.swiglu(gate_up, reference=swiglu)


def _remade(gemm: nn.Module, x: torch.Tensor, layout: MoELayout, token_rows: bool = False) -> Remade:
    """gemm(x, layout) as a `Remade`: a GroupedLinear with `remake_output` on hands its recipe in grad mode (its
    forward hooks then see the Remade); otherwise — the knob off, no gradient (hooks of the trace, calibration,
    export), a peer's module swapped in (peers.te_learner) — the plain call."""
    if isinstance(gemm, GroupedLinear) and gemm.remake_output and torch.is_grad_enabled():
        return gemm(x, layout, remade=True, token_rows=token_rows)
    return Remade(gemm(x, layout))


class SparseMoE(nn.Module):
    """Softmax top-k router (fp32 softmax, optional renormalisation) + grouped SwiGLU experts."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_experts, self.top_k = cfg.num_experts, cfg.num_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        self.gate = QuantLinear(cfg.hidden_size, cfg.num_experts, role="router")
        self.experts = Experts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        self.routing = None  # per-call hook (N, K) ids -> ids to execute | None; set only by model.routing
        # (moe, x (N, D), top_w, top_idx) -> (N, D) fp32 combined: experts on other ranks (engines.expert_parallel)
        self.expert_parallel = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: (N, D) -> weights (N, K) in the router dtype, expert ids (N, K)
        # x in the compute dtype: nn.linear casts it to the router dtype (the fp32 fast path takes a bf16 x as its
        # own first bf16 piece: 3 GEMMs, not 6 with two all-zero pieces of x.float())
        logits = self.gate(x)  # (N, E) in the router dtype
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        top_w, top_idx = torch.topk(probs, self.top_k, dim=-1)  # (N, K)
        if self.routing is not None:  # record / replay (model/routing.py)
            replayed = self.routing(top_idx)
            if replayed is not None:  # replayed expert set, this router's own gate weights over it
                top_idx = replayed
                top_w = probs.gather(-1, top_idx)
        if self.norm_topk_prob:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        return top_w.to(logits.dtype), top_idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        x_flat = x.reshape(-1, D)  # (N, D)
        top_w, top_idx = self.route(x_flat)
        ep = self.expert_parallel
        y = self.local_experts(x_flat, top_w, top_idx, x.dtype) if ep is None else ep(self, x_flat, top_w, top_idx)
        return y.to(x.dtype).view(B, T, D)

    def local_experts(self, x_flat: torch.Tensor, top_w: torch.Tensor, top_idx: torch.Tensor,
                      out_dtype=torch.float32) -> torch.Tensor:
        """x (N, D), top_w / top_idx (N, K) -> (N, D): every assignment through this process's experts, combined in
        fp32 and rounded to out_dtype (fp32 where other ranks' sums are added: engines.expert_parallel)."""
        layout = moe_layout(top_idx, self.num_experts)  # device-only: no host sync
        y_pad = self.experts.remade(permute(x_flat, layout), layout, token_rows=True)  # (Tp, D)
        # weight in the router dtype, the k rows of a token summed in fp32 in rank order
        if y_pad.make is None:
            return combine(y_pad.value, top_w, layout, out_dtype)
        # the down GEMM's remake_output: the combine keeps its input's codes, not y_pad (nn/experts.py); fp32 out
        # inside the region (the kernel a gradient takes, with or without grad mode), then rounded as combine rounds
        return recompute(functools.partial(combine, layout=layout), y_pad, top_w).to(out_dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = SparseMoE(cfg) if cfg.is_moe_layer(layer_idx) else DenseMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_fused(self, x, delta, cos, sin, mask, cache):
        """Profile knob fused_add_norm (vLLM's fused_add_rms_norm): each norm after a residual add normalises the
        fp32 sum, the stream keeps the rounded sum. x: stream without `delta`, the previous layer's MLP output
        (None for layer 0). Returns (stream without this layer's MLP output, MLP output)."""
        h = self.input_layernorm(x) if delta is None else self.input_layernorm(x, delta)
        x = x if delta is None else x + delta
        a = self.self_attn(h, cos, sin, mask, cache)
        h = self.post_attention_layernorm(x, a)
        return x + a, self.mlp(h)


class Decoder(nn.Module):
    """transformers' `model` submodule: embeddings, decoder layers, final norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # _weight skips nn.Embedding's N(0, 1) init (slow at 150k vocab); init_weights / load_pretrained fill it
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = QuantLinear(config.hidden_size, config.vocab_size, role="lm_head")
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight  # [V, D] is Linear's [out, in]
        self.profile: Profile = PROFILES["bf16"]  # QuantLinear's default; use_profile changes both together

    def forward(self, input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        """input_ids (B, T); attention_mask (B, T), 1 = real token: of the whole sequence without a cache, of the
        T new tokens with one (the cache's slot mask remembers the earlier ones); -> logits (B, T, V) fp32.
        With a cache the forward is host-sync free and shape-static in the cache (CUDA-graph capturable)."""
        B, T = input_ids.shape
        dtype = torch_dtype(self.profile.dtype)
        if attention_mask is not None and attention_mask.shape != (B, T):
            raise ValueError(f"attention_mask must be (B, T) = {(B, T)} (the new tokens' mask when a cache is "
                             f"given), got {tuple(attention_mask.shape)}")
        if cache is not None:
            if cache.dtype != dtype:
                raise ValueError(f"KVCache dtype {cache.dtype} != compute dtype {dtype} of profile "
                                 f"{self.profile.name!r}")
            real = (attention_mask.bool() if attention_mask is not None
                    else torch.ones(B, T, dtype=torch.bool, device=input_ids.device))  # (B, T)
            slots = cache.begin(real)  # (T,) on the device
            if position_ids is None:  # count of real tokens before each position, as without a cache
                position_ids = (cache.n_real[:, None] + real.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
            mask = self._cached_mask(cache.valid, slots)  # (B, 1, T, S) over every slot of the cache
        else:
            mask = None  # None = SDPA's is_causal fast path
            if attention_mask is not None:
                real = attention_mask.bool()  # (B, T)
                if position_ids is None:
                    position_ids = (real.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
                mask = self._mask(real, B, T, input_ids.device)
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
        if mask is not None and not self.profile.batch_invariant:  # SDPA's own conversion, once (module docstring)
            mask = attention_bias(mask, torch_dtype(self.profile.attention_dtype or self.profile.dtype))

        x = self.model.embed_tokens(input_ids).to(dtype)  # (B, T, D)
        cos, sin = rope_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta, dtype)
        if self.profile.fused_add_norm:
            delta = None
            for layer in self.model.layers:
                x, delta = layer.forward_fused(x, delta, cos, sin, mask, cache)
            x = self.model.norm(x, delta)
        else:
            for layer in self.model.layers:
                x = layer(x, cos, sin, mask, cache)
            x = self.model.norm(x)
        if cache is not None:
            cache.advance(real)
        return self.lm_head(x).float()  # (B, T, V); nn.linear casts x to the LM-head dtype (as the router's)

    @staticmethod
    def _mask(real: torch.Tensor, B: int, T: int, device) -> torch.Tensor:
        # real: (B, T) bool -> (B, 1, T, T) bool, True = may attend (causal + padding)
        pos = torch.arange(T, device=device)
        allowed = (pos[None, :] <= pos[:, None])[None] & real[:, None, :]  # (B, T, T)
        allowed = allowed | torch.eye(T, dtype=torch.bool, device=device)[None]  # padded queries see themselves
        return allowed[:, None]

    @staticmethod
    def _cached_mask(valid: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        # valid: (B, S) bool slot mask of the cache, slots: (T,) the new tokens' slots -> (B, 1, T, S) bool:
        # a query sees the valid slots up to its own; a padded query also sees itself (finite, never NaN)
        k_slot = torch.arange(valid.shape[1], device=valid.device)[None, :]  # (1, S)
        q_slot = slots[:, None]  # (T, 1)
        allowed = (k_slot <= q_slot)[None] & valid[:, None, :]  # (B, T, S)
        return (allowed | (k_slot == q_slot)[None])[:, None]

    # ---- utilities -------------------------------------------------------------------------------------------
    def num_parameters(self) -> int:
        """Unique parameters (tied embeddings counted once)."""
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def init_weights(self, seed: int, std: float = 0.02) -> "CausalLM":
        """From-scratch init as transformers' Qwen3 (N(0, std) GEMMs/embeddings/router, norms 1), drawn on CPU
        from one generator in sorted-name order, so the result is the same on any device and dtype."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in sorted(self.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.empty(p.shape, dtype=torch.float32).normal_(0.0, std, generator=gen))
        return self


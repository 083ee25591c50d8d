"""Bytes one decode step reads from device memory, per profile: the denominator of `bench sampler`'s bandwidth
column (bytes / step time against the copy bandwidth measured in the same run).

Counted: every GEMM weight as the profile's decode GEMM reads it — a quantized weight (the profile's layer, after
its boundary layers) 0.5 + 1/16 B/element packed (`decode_gemm: "packed"`: codes + e4m3 scales) or 2 B/element
(the cached exact bf16 copy); an unquantized one in `profile.dtype`; the router and LM head in their dtype, an
fp32 one as the bf16 pieces nn.fp32_split multiplies (three of an fp32 master, one of a bf16 parameter: its
fp32 value is that bf16); MoE experts for the expected number of distinct experts a step touches under uniform
routing, E·(1 − (1 − K/E)^B) (an estimate, so MoE rows say `bytes_estimated`); the KV cache, read whole (the
cached attention attends over every slot under a mask). Not counted: activations, the embedding rows, norms.
"""
from __future__ import annotations

from minite_core.model.qwen3_moe import CausalLM
from minite_core.nn import GroupedLinear, QuantLinear
from minite_core.profiles import get_profile

PACKED_BYTES = 0.5 + 1 / 16
_BYTES = {"bfloat16": 2, "float32": 4}


def _gemm_bytes(numel: int, layer_profile, role: str, param_bytes: int) -> float:
    if role in ("router", "lm_head"):
        dtype = layer_profile.router_dtype if role == "router" else layer_profile.lm_head_dtype
        return numel * (2 if dtype == "bfloat16" else (2 if param_bytes == 2 else 6))
    if layer_profile.weight is None:
        return numel * _BYTES[layer_profile.dtype]
    return numel * (PACKED_BYTES if layer_profile.decode_gemm == "packed" else 2)


def step_bytes(model: CausalLM, profile: str, batch: int, slots: int) -> dict:
    """{"weights": bytes of weights a decode step of `batch` rows reads, "kv": KV-cache bytes, "estimated": MoE
    expert counts are an estimate} under `profile`."""
    p = get_profile(profile)
    cfg = model.config
    layers = cfg.num_hidden_layers
    weights, estimated = 0.0, False
    for i, layer in enumerate(model.model.layers):
        lp = p.for_layer(i, layers)
        for mod in layer.modules():
            if isinstance(mod, QuantLinear):
                weights += _gemm_bytes(mod.weight.numel(), lp, mod.role, mod.weight.element_size())
            elif isinstance(mod, GroupedLinear):
                e = mod.weight.shape[0]
                k = cfg.num_experts_per_tok
                touched = e * (1 - (1 - k / e) ** batch)
                weights += _gemm_bytes(mod.weight[0].numel(), lp, "linear", mod.weight.element_size()) * touched
                estimated = True
    head = model.lm_head
    weights += _gemm_bytes(head.weight.numel(), p, "lm_head", head.weight.element_size())
    kv = 2 * layers * batch * cfg.num_key_value_heads * slots * cfg.head_dim * _BYTES[p.dtype]
    return {"weights": weights, "kv": kv, "estimated": estimated}

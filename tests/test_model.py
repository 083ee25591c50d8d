"""minite_core.model against transformers (the reference): fp32 parity both ways, KV-cache decode, config checks."""
from __future__ import annotations

import json

import pytest
import torch

from minite_core.model import PRESETS, CausalLM, KVCache, ModelConfig, load_pretrained, save_pretrained, set_profile
from minite_core.nn import GroupedLinear, QuantLinear
from minite_core.profiles import get_profile

transformers = pytest.importorskip("transformers")

FP32 = get_profile("bf16").replace(name="fp32", dtype="float32", router_dtype="float32", lm_head_dtype="float32")
PARITY_ATOL = 1e-4  # max |logit_sut - logit_ref| in fp32 (observed ~1e-6)
CACHE_ATOL = 1e-5  # cached decode vs full-sequence forward, same code, fp32

# Shared by both directions: a MoE model mixing dense (mlp_only_layers) and sparse layers, head_dim != D / H, GQA,
# renormalised top-k; and a dense Qwen3 with tied embeddings.
MOE = PRESETS["tiny-moe"].replace(norm_topk_prob=True)
DENSE = PRESETS["tiny-dense"]


def _hf_model(cfg: ModelConfig, seed: int):
    hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf())
    torch.manual_seed(seed)  # transformers' init draws from the global RNG
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32).eval()
    with torch.no_grad():  # transformers inits norms to 1; perturb so the norm weights are checked too
        gen = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def _left_padded(lengths, total, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (len(lengths), total), generator=gen)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, total - n:] = 1
    return ids, mask


def _hf_logits(model, ids, mask=None):
    kwargs = {}
    if mask is not None:  # transformers leaves left-padding positions to generate(); pass them explicitly
        kwargs = {"attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    with torch.no_grad():
        return model(input_ids=ids, **kwargs).logits.float()


def _max_err(sut, ref, mask=None):
    if mask is not None:
        sut, ref = sut[mask.bool()], ref[mask.bool()]
    return (sut - ref).abs().max().item()


@pytest.mark.parametrize("cfg", [MOE, DENSE], ids=["moe", "dense"])
def test_load_transformers_checkpoint_matches_transformers(cfg, tmp_path):
    model_ref = _hf_model(cfg, seed=1)
    model_ref.save_pretrained(tmp_path)
    model_sut = set_profile(load_pretrained(tmp_path), FP32).eval()
    assert model_sut.config == cfg

    ids, mask = _left_padded([9, 6, 2], 9, cfg.vocab_size, seed=2)
    with torch.no_grad():
        assert _max_err(model_sut(ids), _hf_logits(model_ref, ids)) < PARITY_ATOL
        logits_sut = model_sut(ids, attention_mask=mask)
    assert torch.isfinite(logits_sut).all()  # pad rows too
    assert _max_err(logits_sut, _hf_logits(model_ref, ids, mask), mask) < PARITY_ATOL


@pytest.mark.parametrize("cfg", [MOE, DENSE], ids=["moe", "dense"])
def test_saved_checkpoint_loads_in_transformers(cfg, tmp_path):
    model_sut = set_profile(CausalLM(cfg).init_weights(seed=3), FP32).eval()
    save_pretrained(model_sut, tmp_path)
    model_ref, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(model_ref).__name__ == ("Qwen3MoeForCausalLM" if cfg.is_moe else "Qwen3ForCausalLM")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ids = torch.randint(0, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert _max_err(model_sut(ids), _hf_logits(model_ref.eval(), ids)) < PARITY_ATOL
    # and back: our own checkpoint round-trips exactly
    model_rt = load_pretrained(tmp_path)
    for (name, p), (name_rt, p_rt) in zip(model_sut.state_dict().items(), model_rt.state_dict().items()):
        assert name == name_rt and torch.equal(p, p_rt), name


def test_load_sharded_checkpoint(tmp_path):
    model_ref = _hf_model(MOE, seed=9)
    model_ref.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    model_sut = set_profile(load_pretrained(tmp_path), FP32).eval()
    ids = torch.randint(0, MOE.vocab_size, (1, 6), generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        assert _max_err(model_sut(ids), _hf_logits(model_ref, ids)) < PARITY_ATOL


def test_load_fused_expert_names(tmp_path):
    """transformers 5's in-memory (fused) names, written as-is, load to the same model."""
    from safetensors.torch import save_file

    model_ref = _hf_model(MOE, seed=5)
    save_file({k: v.contiguous() for k, v in model_ref.state_dict().items()}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(MOE.to_hf()))
    model_sut = set_profile(load_pretrained(tmp_path), FP32).eval()
    ids = torch.randint(0, MOE.vocab_size, (1, 6), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert _max_err(model_sut(ids), _hf_logits(model_ref, ids)) < PARITY_ATOL


def test_calibrated_input_amax_round_trips(tmp_path):
    model = CausalLM(MOE).init_weights(seed=12)
    model.model.layers[0].self_attn.q_proj.input_amax = torch.tensor(3.5)
    model.model.layers[0].mlp.experts.down.input_amax = torch.arange(1.0, 1.0 + MOE.num_experts)
    model_rt = load_pretrained(save_pretrained(model, tmp_path, dtype=torch.bfloat16))
    assert model_rt.model.embed_tokens.weight.dtype == torch.float32  # load dtype, whatever was stored
    assert torch.equal(model_rt.model.layers[0].self_attn.q_proj.input_amax, torch.tensor(3.5))
    assert torch.equal(model_rt.model.layers[0].mlp.experts.down.input_amax, torch.arange(1.0, 1.0 + MOE.num_experts))
    assert model_rt.model.layers[1].self_attn.q_proj.input_amax is None


@pytest.mark.parametrize("cfg", [MOE, DENSE], ids=["moe", "dense"])
def test_kv_cache_decode_matches_full_forward(cfg):
    model = set_profile(CausalLM(cfg).init_weights(seed=7), FP32).eval()
    prompt_lens, prompt_slots, new_tokens = [5, 3, 1], 5, 4
    ids, mask = _left_padded([n + new_tokens for n in prompt_lens], prompt_slots + new_tokens, cfg.vocab_size, 8)
    with torch.no_grad():
        logits_ref = model(ids, attention_mask=mask)  # (B, T, V) full sequence
        cache = KVCache.for_model(model, batch_size=3, max_len=16)
        steps = [model(ids[:, :prompt_slots], attention_mask=mask[:, :prompt_slots], cache=cache)]  # prefill
        for t in range(prompt_slots, prompt_slots + new_tokens):  # teacher-forced decode, one token a step
            steps.append(model(ids[:, t:t + 1], attention_mask=mask[:, t:t + 1], cache=cache))
    logits_sut = torch.cat(steps, dim=1)
    assert cache.length == prompt_slots + new_tokens
    assert _max_err(logits_sut, logits_ref, mask) < CACHE_ATOL


@pytest.mark.parametrize("fields, key", [
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"mlp_only_layers": (7,)}, "mlp_only_layers"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"head_dim": 15}, "head_dim"),
    ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
])
def test_invalid_config_names_the_key(fields, key):
    with pytest.raises(ValueError, match=key):
        MOE.replace(**fields)


@pytest.mark.parametrize("override, key", [
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "rope_type"),
    ({"model_type": "llama"}, "model_type"),
])
def test_unsupported_hf_config_names_the_key(override, key):
    with pytest.raises(ValueError, match=key):
        ModelConfig.from_hf({**MOE.to_hf(), **override})


def test_hf_config_round_trip_and_legacy_keys():
    assert ModelConfig.from_hf(MOE.to_hf()) == MOE
    assert ModelConfig.from_hf(DENSE.to_hf()) == DENSE
    legacy = {k: v for k, v in MOE.to_hf().items() if k not in ("rope_parameters", "num_experts")}
    legacy.update(rope_theta=5e5, rope_scaling=None, num_local_experts=MOE.num_experts)  # Qwen3-30B-A3B style
    assert ModelConfig.from_hf(legacy) == MOE.replace(rope_theta=5e5)


def test_is_moe_layer_follows_transformers():
    cfg = MOE.replace(num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=(3,))
    hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf())
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeDecoderLayer, Qwen3MoeSparseMoeBlock

    ref = [isinstance(Qwen3MoeDecoderLayer(hf_cfg, i).mlp, Qwen3MoeSparseMoeBlock) for i in range(6)]
    assert [cfg.is_moe_layer(i) for i in range(6)] == ref == [False, True, False, False, False, True]


def test_set_profile_boundary_layers_and_init_determinism():
    profile = get_profile("minite").replace(boundary_layers=(1, 0))
    model = set_profile(CausalLM(MOE), profile)
    for i, layer in enumerate(model.model.layers):
        gemms = [m for m in layer.modules() if isinstance(m, (QuantLinear, GroupedLinear))]
        assert gemms and all(m.profile == profile.for_layer(i, MOE.num_hidden_layers) for m in gemms)
    assert model.model.layers[0].self_attn.q_proj.profile.weight is None  # boundary layer: high precision
    assert model.model.layers[2].mlp.experts.gate_up.profile.weight is not None
    assert model.lm_head.profile == profile and model.profile == profile
    sd_a, sd_b = CausalLM(MOE).init_weights(11).state_dict(), CausalLM(MOE).init_weights(11).state_dict()
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    assert CausalLM(DENSE).num_parameters() == sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**DENSE.to_hf())).parameters())


def _attention_bias_cases(device):
    from minite_core.model.qwen3_moe import CausalLM as M

    g = torch.Generator().manual_seed(3)
    valid = torch.rand(3, 12, generator=g) > 0.3  # a cache's slot mask with holes (left padding)
    yield "decode", M._cached_mask(valid.to(device), torch.tensor([9], device=device)), 1, 12
    yield "prefill", M._mask((torch.rand(3, 7, generator=g) > 0.2).to(device), 3, 7, device), 7, 7


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_bias_is_sdpas_own_conversion(dtype, device="cpu"):
    """The forward hands every layer's SDPA the additive mask once (`attention_bias`) instead of the boolean one
    SDPA converts on every call: the same outputs, bit for bit (GQA, decode and prefill masks)."""
    from minite_core.model.qwen3_moe import attention_bias

    g = torch.Generator().manual_seed(4)
    for name, mask, t, s in _attention_bias_cases(device):
        q, k, v = (torch.randn(3, h, n, 16, generator=g).to(device, dtype) for h, n in ((4, t), (2, s), (2, s)))
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        bias = attention_bias(mask, dtype)
        got = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
        assert bias.dtype == dtype and torch.equal(attention_bias(bias, dtype), bias), name
        assert torch.equal(got, want), f"{name} {dtype}: {(got != want).sum().item()} values differ"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_attention_bias_is_sdpas_own_conversion(dtype):
    test_attention_bias_is_sdpas_own_conversion(dtype, device="cuda")

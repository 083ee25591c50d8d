"""model.nvfp4_io: compressed-tensors NVFP4 checkpoints, bit-exact against our quantizer and back (codes and
scales compared with atol=0, rtol=0)."""
from __future__ import annotations

import json

import pytest
import torch

from minite_core.profiles import get_profile

from minite_core.model.nvfp4_io import (
    FORMAT,
    amax_for_encode_scale,
    export_nvfp4,
    fusion_groups,
    load_nvfp4,
    pinned_weights,
    quantize_checkpoint_weights,
    shared_weight_amax,
)
from minite_core.formats.nvfp4 import dequantize, global_encode_scale, quantize
from minite_core.model import PRESETS, CausalLM, save_pretrained, set_profile
from minite_core.model.io import read_safetensors
from minite_core.model.calibrate import calibrate
from minite_core.peers.export import main

MOE = PRESETS["tiny-moe"]
DENSE = PRESETS["tiny-dense"]


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _model(cfg, seed=0):
    model = CausalLM(cfg).init_weights(seed, std=0.2)
    with torch.no_grad():  # make q/k/v and gate/up amaxes differ a lot, so sharing visibly changes codes
        for layer in model.model.layers:
            layer.self_attn.k_proj.weight.mul_(0.25)
    calibrate(model, [torch.randint(4, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(seed))])
    return model


@pytest.fixture(scope="module", params=["dense", "moe"])
def exported(request, tmp_path_factory):
    cfg = DENSE if request.param == "dense" else MOE
    model = _model(cfg)
    path = export_nvfp4(model, tmp_path_factory.mktemp(request.param) / "ckpt")
    return request.param, model, path


def test_layout_and_codes_match_quantizer(exported):
    kind, model, path = exported
    raw = read_safetensors(path)
    amax = shared_weight_amax(model)
    attn = "model.layers.0.self_attn"
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        p = f"{attn}.{proj}"
        w = model.get_submodule(p).weight
        ref = quantize(w, amax=amax[p], math="fast")  # vllm-nvfp4 weight spec with the shared amax
        assert raw[f"{p}.weight_packed"].dtype == torch.uint8 and raw[f"{p}.weight_packed"].shape == (w.shape[0], w.shape[1] // 2)
        assert raw[f"{p}.weight_scale"].dtype == torch.float8_e4m3fn
        assert raw[f"{p}.weight_global_scale"].shape == (1,) and raw[f"{p}.input_global_scale"].shape == (1,)
        torch.testing.assert_close(raw[f"{p}.weight_packed"], ref.data, atol=0, rtol=0)
        torch.testing.assert_close(_u8(raw[f"{p}.weight_scale"]), _u8(ref.scale), atol=0, rtol=0)
        torch.testing.assert_close(raw[f"{p}.weight_global_scale"][0], global_encode_scale(amax[p]), atol=0, rtol=0)
        torch.testing.assert_close(raw[f"{p}.input_global_scale"][0],
                                   global_encode_scale(model.get_submodule(p).input_amax), atol=0, rtol=0)
    if kind == "moe":
        gu = model.get_submodule("model.layers.0.mlp.experts.gate_up").weight  # [E, 2I, D]
        I = MOE.moe_intermediate_size
        for e in range(MOE.num_experts):
            ref = quantize(gu[e], amax=gu[e].abs().amax(), math="fast")
            p = f"model.layers.0.mlp.experts.{e}"
            torch.testing.assert_close(raw[f"{p}.gate_proj.weight_packed"], ref.data[:I], atol=0, rtol=0)
            torch.testing.assert_close(raw[f"{p}.up_proj.weight_packed"], ref.data[I:], atol=0, rtol=0)
            torch.testing.assert_close(_u8(raw[f"{p}.up_proj.weight_scale"]), _u8(ref.scale[I:]), atol=0, rtol=0)
            assert torch.equal(raw[f"{p}.gate_proj.weight_global_scale"], raw[f"{p}.up_proj.weight_global_scale"])
            assert f"{p}.down_proj.weight_packed" in raw
        assert "model.layers.0.mlp.gate.weight" in raw and raw["model.layers.0.mlp.gate.weight"].dtype == torch.bfloat16
    assert not any(k.endswith(".input_amax") for k in raw)
    assert ("lm_head.weight" in raw) == (not model.config.tie_word_embeddings)


def test_shared_global_scale_semantics():
    model = _model(DENSE)
    groups = fusion_groups(model)
    assert ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
            "model.layers.0.self_attn.v_proj"] in groups
    assert ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"] in groups
    assert ["model.layers.0.self_attn.o_proj"] in groups
    amax = shared_weight_amax(model)
    attn = model.model.layers[0].self_attn
    expected = max(float(m.weight.detach().abs().amax()) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
    assert float(amax["model.layers.0.self_attn.k_proj"]) == expected
    # k's own amax is 4x smaller: the shared scale changes its codes vs per-matrix quantization
    w = quantize_checkpoint_weights(model)["model.layers.0.self_attn.k_proj"]
    own = quantize(attn.k_proj.weight, math="fast")
    assert not torch.equal(w.nvfp4.data, own.data)
    assert torch.equal(w.encode_scale, global_encode_scale(torch.tensor(expected)))


def test_config_json(exported):
    kind, model, path = exported
    hf = json.loads((path / "config.json").read_text())
    qc = hf["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == FORMAT
    assert "lm_head" in qc["ignore"] and (("re:.*mlp.gate$" in qc["ignore"]) == (kind == "moe"))
    g = qc["config_groups"]["group_0"]
    assert g["targets"] == ["Linear"]
    for key, dynamic in (("weights", False), ("input_activations", "local")):
        args = g[key]
        assert (args["num_bits"], args["type"], args["strategy"], args["group_size"], args["dynamic"]) == \
            (4, "float", "tensor_group", 16, dynamic)
        assert args["scale_dtype"] == "float8_e4m3fn"
    assert hf["model_type"] == ("qwen3_moe" if kind == "moe" else "qwen3")


def test_round_trip_bit_exact(exported, tmp_path):
    kind, model, path = exported
    imported, weights = load_nvfp4(path)
    # weights: the dequantized codes; scales: re-derive the file's input_global_scale bit for bit
    raw = read_safetensors(path)
    for name, w in weights.items():
        sut = imported.get_submodule(name)
        if isinstance(w, list):  # GroupedLinear: per expert [N, K]
            for e, w_e in enumerate(w):
                torch.testing.assert_close(sut.weight[e], dequantize(w_e.nvfp4), atol=0, rtol=0)
        else:
            torch.testing.assert_close(sut.weight, dequantize(w.nvfp4), atol=0, rtol=0)
        prefix = name if not isinstance(w, list) else name.rpartition(".")[0] + (
            ".0.gate_proj" if name.endswith("gate_up") else ".0.down_proj")
        torch.testing.assert_close(global_encode_scale(sut.input_amax).reshape(1), raw[f"{prefix}.input_global_scale"],
                                   atol=0, rtol=0)
    # non-quantized tensors come back as stored (bf16)
    torch.testing.assert_close(imported.model.embed_tokens.weight, model.model.embed_tokens.weight.bfloat16().float(),
                               atol=0, rtol=0)
    # re-export of the imported checkpoint reproduces the file exactly
    again = read_safetensors(export_nvfp4(imported, tmp_path / "again", weights=weights))
    assert set(again) == set(raw)
    for k in raw:
        torch.testing.assert_close(_u8(again[k]), _u8(raw[k]), atol=0, rtol=0, msg=k)


def test_requantizing_dequantized_weights_is_not_identity(exported):
    """Why load_nvfp4 returns the codes: quantize(dequantize(q)) != q for NVFP4."""
    _, _, path = exported
    _, weights = load_nvfp4(path)
    w = weights["model.layers.0.self_attn.k_proj"]
    again = quantize(dequantize(w.nvfp4), math="fast")
    assert not (torch.equal(again.data, w.nvfp4.data) and torch.equal(_u8(again.scale), _u8(w.nvfp4.scale)))


@pytest.mark.parametrize("s_enc", [1.0, 2688.0, 3.0e-3, 1.2345678e5, 7.0e8])
def test_amax_for_encode_scale_inverts(s_enc):
    s = torch.tensor(s_enc, dtype=torch.float32)
    torch.testing.assert_close(global_encode_scale(amax_for_encode_scale(s)), s, atol=0, rtol=0)


def test_pinned_weights_run_checkpoint_codes():
    model = _model(DENSE)
    set_profile(model, "vllm-nvfp4")  # fused_weight_scale: q/k/v and gate/up share one global scale, as exported
    weights = quantize_checkpoint_weights(model)
    ids = torch.randint(4, DENSE.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    plain = model(ids)
    with pinned_weights(model, weights):
        torch.testing.assert_close(model(ids), plain, atol=0, rtol=0)  # the nn runs the checkpoint's codes
    set_profile(model, get_profile("vllm-nvfp4").replace(fused_weight_scale=False))
    unfused = model(ids)
    assert not torch.equal(unfused, plain)  # per-matrix scales are a different function
    with pinned_weights(model, weights):
        torch.testing.assert_close(model(ids), plain, atol=0, rtol=0)
    torch.testing.assert_close(model(ids), unfused, atol=0, rtol=0)  # hooks removed


def test_export_needs_calibration(tmp_path):
    model = CausalLM(DENSE).init_weights(0, std=0.2)
    with pytest.raises(ValueError, match="calibrate"):
        export_nvfp4(model, tmp_path / "x")


def test_boundary_layers_stay_high_precision(tmp_path):
    from minite_core.profiles import get_profile

    model = _model(MOE)
    profile = get_profile("vllm-nvfp4").replace(name="vllm-nvfp4-b1", boundary_layers=(1, 0))
    raw = read_safetensors(export_nvfp4(model, tmp_path / "b", profile=profile))
    hf = json.loads((tmp_path / "b" / "config.json").read_text())
    assert "model.layers.0.self_attn.q_proj.weight" in raw and "model.layers.0.mlp.experts.3.up_proj.weight" in raw
    assert "model.layers.0.self_attn.q_proj" in hf["quantization_config"]["ignore"]
    assert "model.layers.1.self_attn.q_proj.weight_packed" in raw
    imported, _ = load_nvfp4(tmp_path / "b")
    torch.testing.assert_close(imported.model.layers[0].self_attn.q_proj.weight,
                               model.model.layers[0].self_attn.q_proj.weight.bfloat16().float(), atol=0, rtol=0)


def test_cli(tmp_path):
    model = _model(DENSE)
    save_pretrained(model, tmp_path / "m")  # carries the calibrated input_amax
    assert main(["--model", str(tmp_path / "m"), "--out", str(tmp_path / "q")]) == 0
    assert (tmp_path / "q" / "model.safetensors").exists()

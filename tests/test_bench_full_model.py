"""`minite bench full-model` at a tiny shape on CPU: the same code the H200 runs at Qwen3-30B-A3B's full shape
(workflow/scripts/h200_full_model.sh). Its memory plan at the full shape, the plan check, the rows and diagnostics
it writes, and an out-of-memory phase as one line with the phases before it kept."""
import math

import pytest
import torch

from minite_core.bench import full_model
from minite_core.bench.full_model import FullModelConfig, check_plan, plan_memory
from minite_core.model import PRESETS, CausalLM
from minite_core.results import read_result

TINY = ["--model", "tiny-moe", "--layers", "2", "--batch", "4", "--prompt-len", "4", "--new-tokens", "4",
        "--reps", "1", "--diag-prompts", "2", "--diag-new-tokens", "3", "--threads", "1"]


def test_plan_at_qwen3_30b_a3b_shape():
    cfg = FullModelConfig()
    mcfg = cfg.model_config()
    assert (mcfg.num_hidden_layers, mcfg.num_experts, mcfg.num_experts_per_tok, mcfg.hidden_size,
            mcfg.moe_intermediate_size, mcfg.vocab_size) == (48, 128, 8, 2048, 768, 151936)
    plan = plan_memory(cfg)
    assert 30.4e9 < plan["parameters"] < 30.6e9 and plan["bytes"]["weights"] == 2 * plan["parameters"]
    L, E, D, I, V = 48, 128, 2048, 768, 151936
    experts = L * E * 3 * D * I
    attention = L * (4096 * D + 2 * 512 * D + D * 4096)
    assert plan["operand_cache"]["bf16"] == 0
    assert plan["operand_cache"]["vllm-nvfp4"] == 2 * (experts + attention)  # dequantized bf16 operands
    assert plan["operand_cache"]["minite"] == 2 * (experts + attention) + 6 * (V * D + L * E * D)  # + fp32 splits
    assert plan["total"] < 139e9  # one H200 (141 GB, ~139.8 usable), one NVFP4 profile's cache at a time


def test_plan_over_free_memory_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(100e9), int(141e9)))
    with pytest.raises(ValueError, match=r"^full-model: the memory plan needs 1\d\d\.\d+ GB \(weights 61\.\d+, "
                                         r"operand_cache_max 6\d\.\d+.*has 100\.0 GB free of 141\.0"):
        check_plan(plan_memory(FullModelConfig()), torch.device("cuda"))


def test_tiny_shape_runs_and_writes_the_result(tmp_path, monkeypatch):
    out = tmp_path / "full.json"
    built = []
    build = full_model.build
    monkeypatch.setattr(full_model, "build", lambda cfg, device: built.append(1) or build(cfg, device))
    assert full_model.main([*TINY, "--out", str(out)]) == 0
    res = read_result(out, stage="full_model")
    assert [r["profile"] for r in res["rows"]] == ["bf16", "vllm-nvfp4", "minite"] and built == [1]
    for row in res["rows"]:
        assert row["tokens_per_s"] > 0 and row["engine"] == "fast-eager" and row["n_reps"] == 1
    assert set(res["diagnostics"]) == {"bf16:bf16", "minite:minite"}
    for pair, m in res["diagnostics"].items():
        assert m["mismatch/tokens"] == 2 * 3 and math.isfinite(m["mismatch/k3"]) and m["routing/applies"]
        assert res["metrics"][f"{pair}/mismatch/k3"] == m["mismatch/k3"]
    assert res["config"]["model_config"]["num_hidden_layers"] == 2
    assert res["memory"]["plan_total_gb"] > 0 and res["env"]["commit"]


def test_weights_are_drawn_on_the_device_from_meta():
    cfg = FullModelConfig(model="tiny-moe", layers=2)
    model = full_model.build(cfg, torch.device("cpu"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    ref = CausalLM(PRESETS["tiny-moe"].replace(num_hidden_layers=2, mlp_only_layers=(1,)))
    assert sum(p.numel() for p in model.parameters()) == ref.num_parameters()
    w = model.model.layers[0].self_attn.q_proj.weight.float()
    assert 0.015 < w.std().item() < 0.025 and model.model.norm.weight.eq(1).all()


def test_out_of_memory_names_the_phase_and_keeps_what_ran(tmp_path, monkeypatch):
    decode = full_model._decode_row

    def second_fails(model, name, cfg, device):
        if name == "vllm-nvfp4":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return decode(model, name, cfg, device)

    monkeypatch.setattr(full_model, "_decode_row", second_fails)
    out = tmp_path / "full.json"
    with pytest.raises(RuntimeError, match=r"^full-model: out of memory in decode vllm-nvfp4 .*lower --batch"):
        full_model.main([*TINY, "--out", str(out)])
    assert [r["profile"] for r in read_result(out, stage="full_model")["rows"]] == ["bf16"]

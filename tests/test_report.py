"""The report's diagnostics table (report/build.py) shows full-vocabulary KL, max |Δ|, routing agreement (n/a on
a dense model, never 0) and the mismatch budget next to the measured k3, from the results file alone."""
from __future__ import annotations

from minite_core.report.build import section_mismatch
from minite_core.results import write_result


def _pair(k3, kl, routing):
    return {"mismatch/k3": k3, "mismatch/kl_full_vocab": kl, "mismatch/max_abs_delta": 2.5, "mismatch/tokens": 10,
            **routing}


def test_mismatch_section_shows_kl_routing_and_budget(tmp_path):
    moe = {"routing/applies": True, "routing/topk_disagree": 0.125, "routing/first_divergent_layer": 3,
           "routing/replayed": False}
    r3 = {"routing/applies": True, "routing/topk_disagree": 0.0, "routing/first_divergent_layer": None,
          "routing/replayed": True, "routing/router_topk_disagree": 0.25}
    dense = {"routing/applies": False, "routing/topk_disagree": None, "routing/first_divergent_layer": None}
    metrics = {"te-nvfp4:vllm-nvfp4": _pair(0.5, 0.75, moe), "te-nvfp4-r3:vllm-nvfp4": _pair(0.25, 0.375, r3),
               "bf16:bf16": _pair(1e-5, 2e-5, dense)}
    budget = [{"pair": "bf16:bf16", "k3_budget": 1e-3, "k3": 1e-5, "pass": True, "first_divergence": None},
              {"pair": "te-nvfp4:vllm-nvfp4", "k3_budget": 1e-3, "k3": 0.5, "pass": False,
               "first_divergence": {"op": "model.layers.0.self_attn.q_proj", "rel_err": 0.2, "sut_mode": "decode"}}]
    write_result(tmp_path / "diagnostics" / "mismatch.json", stage="diagnostics", experiment="t",
                 config={"num_prompts": 2}, metrics=metrics, by_position={}, trace=None, attribution=None,
                 budget=budget)
    text = section_mismatch(tmp_path)
    header = next(line for line in text.splitlines() if line.startswith("| pair"))
    assert "kl_full_vocab" in header and "max_abs_delta" in header and "routing top-k disagree" in header
    naive = next(line for line in text.splitlines() if line.startswith("| naive Blackwell stack (TE"))
    assert "| 0.750 |" in naive and "| 0.125 | 3 |" in naive
    assert "| 0.000 (replayed; router alone 0.250) | none |" in text
    dense_row = next(line for line in text.splitlines() if line.startswith("| BF16"))
    assert dense_row.count("n/a (dense)") == 2
    assert "| **FAIL** | model.layers.0.self_attn.q_proj |" in text and "| pass | – |" in text


def test_mismatch_section_without_budget(tmp_path):
    write_result(tmp_path / "diagnostics" / "mismatch.json", stage="diagnostics", experiment="t", config={},
                 metrics={"bf16:bf16": {"mismatch/k3": 0.0}}, by_position={})
    text = section_mismatch(tmp_path)
    assert "No mismatch budget set" in text
    assert text.count("| – | – |") >= 1  # a result without routing metrics: dashes, not zeros


def test_external_pairs_in_the_mismatch_table(tmp_path):
    """diagnostics.external's result (minite diagnose --rollouts) adds rows beside the own pairs, says where they
    come from and why their full-vocabulary KL is missing, and shows the frameworks' metrics of every pair."""
    write_result(tmp_path / "diagnostics" / "mismatch.json", stage="diagnostics", experiment="t", config={},
                 metrics={"bf16:bf16": {**_pair(1e-5, 2e-5, {"routing/applies": False}),
                                        "train/gen_kl_error": 1e-5}},
                 by_position={}, trace=None, attribution=None, budget=None)
    ext = {"mismatch/k3": 0.0123, "mismatch/tokens": 77, "train/gen_kl_error": 0.0124, "rollout_corr/kl": 0.5}
    write_result(tmp_path / "diagnostics" / "external.json", stage="external", experiment="t", config={},
                 metrics={"dump": ext}, by_position={}, by_step={}, omitted=[],
                 sources={"dump": {"layout": "nemo-rl", "files": ["x/train_data_step8.jsonl"], "num_files": 3,
                                   "rows": 32, "steps": [8, 24], "kl_full_vocab_omitted": "no logits logged"}},
                 gate=[{"pair": "dump", "metric": "train/gen_kl_error", "value": 0.0124, "limit": 0.03,
                        "rule": "ceiling", "pass": True}])
    text = section_mismatch(tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| external: dump (nemo-rl log)"))
    assert "| 0.012 |" in row and "| not logged |" in row and row.rstrip().endswith("| 77 | not logged | not logged |")
    assert "| nemo-rl | x/train_data_step8.jsonl … (3 files) | 32 | 8–24 | no logits logged |" in text
    fw = next(line for line in text.splitlines() if line.startswith("| BF16") and "1.000e-05 |" in line
              and line.count("|") == 10)
    assert fw
    assert "| train/gen_kl_error | 0.012 | 0.030 | ceiling | pass |" in text


def test_full_model_section_from_its_file_alone(tmp_path):
    """`minite bench full-model`'s file (not a DAG stage) gets its section: decode per profile against BF16 of the
    same run, peak memory, the diagnostics; without the file the report has no such section."""
    from minite_core.report.build import build, section_full_model

    assert section_full_model(tmp_path) == "" and "full-shape" not in build(tmp_path)
    rows = [{"profile": "bf16", "tokens_per_s": 2000.0, "peak_gb": 64.2},
            {"profile": "minite", "tokens_per_s": 1900.0, "peak_gb": 124.8}]
    config = {"model": "qwen3-30b-a3b", "batch": 64, "new_tokens": 128,
              "model_config": {"num_hidden_layers": 48, "num_experts": 128, "vocab_size": 151936}}
    write_result(tmp_path / "full_model" / "qwen3-30b-a3b.json", stage="full_model", experiment="t", config=config,
                 metrics={}, rows=rows, memory={"plan_total_gb": 131.9},
                 diagnostics={"minite:minite": {"mismatch/k3": 3.1e-3, "mismatch/kl_full_vocab": 3.0e-3,
                                                "routing/topk_disagree": 0.36, "mismatch/tokens": 1024}})
    text = section_full_model(tmp_path)
    assert "48 layers, 128 experts, vocabulary 151,936" in text and "memory plan 131.9 GB" in text
    assert "| minite | 1,900 | 0.95 | 124.8 |" in text
    assert "| miniTE ↔ miniTE (aligned) | 3.100e-03 | 3.000e-03 | 0.360 | 1024 |" in text
    assert text in build(tmp_path)

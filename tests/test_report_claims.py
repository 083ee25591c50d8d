"""The claims table (report/claims.py) on made-up results folders: every verdict path of each claim, "not run"
for each missing input, links that resolve to the report's headings; the header's env grouping; the TE section."""
from __future__ import annotations

import json
import re

import pytest

from minite_core.report import claims
from minite_core.report.build import build, section_header
from minite_core.report.te import section_te
from minite_core.results import write_result


def _mismatch(root, **k3s):
    """diagnostics/mismatch.json with bf16:bf16 (k3 1e-5) and the given pairs: name=(k3, se[, max_abs_delta])."""
    metrics = {"bf16:bf16": {"mismatch/k3": 1e-5, "mismatch/k3_se": 1e-6}}
    for pair, v in k3s.items():
        metrics[pair] = {"mismatch/k3": v[0], "mismatch/k3_se": v[1], "mismatch/max_abs_delta": v[-1]}
    write_result(root / "diagnostics" / "mismatch.json", stage="diagnostics", experiment="t", config={},
                 metrics=metrics, by_position={})
    return json.loads((root / "diagnostics" / "mismatch.json").read_text())


def _row(text: str, claim: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| ({claim}) |"))


def test_claim_a_every_verdict():
    naive, marlin = "te-nvfp4:vllm-nvfp4", "te-nvfp4:vllm-marlin-w4a16"
    assert claims.claim_a(None)[1] == "not run"
    assert claims.claim_a({"metrics": {"bf16:bf16": {"mismatch/k3": 0.0}}})[1] == "not run"  # no cross pair
    mm = {"metrics": {"bf16:bf16": {"mismatch/k3": 1e-5}, naive: {"mismatch/k3": 0.02, "mismatch/k3_se": 0.004},
                      marlin: {"mismatch/k3": 0.012, "mismatch/k3_se": 0.003}}}
    text, verdict = claims.claim_a(mm)
    assert verdict == "supported" and "2 of 2 pairs" in text and "`te-nvfp4:vllm-nvfp4` 0.020" in text
    mm["metrics"][marlin]["mismatch/k3_se"] = 0.006  # 0.012 − 2·0.006 = 0 < the 1e-3 threshold
    assert claims.claim_a(mm)[1] == "partly"
    mm["metrics"][naive]["mismatch/k3"] = 5e-4  # below the healthy threshold: the same policy as far as k3 sees
    assert claims.claim_a(mm)[1] == "not supported"


def test_claim_b_every_verdict(tmp_path):
    assert claims.claim_b(None)[1] == "not run"
    text, verdict = claims.claim_b(_mismatch(tmp_path, **{"minite:minite": (5e-6, 1e-6, 0.3)}))
    assert verdict == "partly" and "= 0.500" in text and "`minite-onpolicy:minite-onpolicy`) was not run" in text
    onpolicy = {"minite:minite": (5e-6, 1e-6, 0.3), "minite-onpolicy:minite-onpolicy": (0.0, 0.0, 0.0)}
    text, verdict = claims.claim_b(_mismatch(tmp_path, **onpolicy))
    assert verdict == "supported" and "(bitwise)" in text
    onpolicy["minite-onpolicy:minite-onpolicy"] = (0.0, 0.0, 1e-6)  # k3 rounds to 0 but one log-prob differs
    assert claims.claim_b(_mismatch(tmp_path, **onpolicy))[1] == "partly"
    assert claims.claim_b(_mismatch(tmp_path, **{"minite:minite": (1e-3, 1e-4, 0.3)}))[1] == "not supported"


def _rl(root, finals: dict):
    for (learner, sampler), final in finals.items():
        d = root / "rl" / f"{learner}__{sampler}__none"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({
            "schema": "rl/v1", "run": d.name, "config": {"learner": learner, "sampler": sampler, "seed": 0},
            "metrics": {"heldout_n": 512, "heldout_acc_initial": 0.4, "heldout_acc_final": final,
                        "heldout_gain": final - 0.4, "heldout_gain_se": 0.02}}))


def test_claim_c_from_rl_runs(tmp_path):
    assert claims.claim_c(tmp_path)[1] == "not run"
    _rl(tmp_path, {("bf16", "bf16"): 0.6, ("minite", "minite"): 0.6, ("te-nvfp4", "vllm-nvfp4"): 0.1})
    text, verdict = claims.claim_c(tmp_path)
    assert verdict.startswith("supported: ") and "minite ↔ minite 60.0% ± 2.2" in text
    assert "collapsed (final below initial by > 2 SE): te-nvfp4 ↔ vllm-nvfp4" in text


def _learner(root, x_bf16, x_te, applicable=True):
    path = root / "throughput" / "learner.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": "throughput/v1", "env": {"gpu": "GPU-X"},
                                "targets": {"applicable": applicable}, "rows": [
        {"profile": "minite", "speedup_vs_bf16": x_bf16, "speedup_vs_te_nvfp4": x_te}]}))


def test_claim_d_every_verdict(tmp_path):
    assert claims.claim_d(tmp_path)[1] == "not run"
    _learner(tmp_path, 1.4, 1.5)
    text, verdict = claims.claim_d(tmp_path)
    assert verdict == "supported" and "1.400× BF16, 1.500× TE-NVFP4" in text and "sampler not run" in text
    assert "Hopper (sm_90) has none" in text  # the throughput section's own sentence, unwrapped
    _learner(tmp_path, 0.5, 1.2)
    assert claims.claim_d(tmp_path)[1] == "partly"
    _learner(tmp_path, 0.5, 0.9)
    assert claims.claim_d(tmp_path)[1] == "not supported"
    _learner(tmp_path, 1.4, 1.5, applicable=False)  # a CPU run: no verdict on Hopper throughput
    assert claims.claim_d(tmp_path)[1].startswith("not run (not a GPU measurement")


def _peers(exp, nvfp4_ok: bool):
    write_result(exp.parent / "vllm-cpu" / "vllm_peer" / "ratios.json", stage="vllm_peer", experiment="vllm-cpu",
                 config={}, metrics={"dense_floor_k3": 4e-4, "nvfp4_over_floor": 0.0 if nvfp4_ok else 9.0,
                                     "nvfp4_gpu_profile_over_floor": 350.0, "moe_over_floor": 80.0,
                                     "moe_vllm_bf16_cpu_over_floor": 0.7, "targets": {"nvfp4_over_floor": 3.0},
                                     "nvfp4_ok": nvfp4_ok})


def _te(exp, k3: float, model: str = ""):
    write_result(exp / "te" / model / "agreement.json", stage="te", experiment=exp.name,
                 config={"transformer_engine": "9.9", "checkpoint": model or "random", "modes": {
                     "bf16": {"recipe": "none", "emulated_by": "bf16"},
                     "nvfp4": {"recipe": "nvfp4-ref", "emulated_by": "te-nvfp4-rne"}}},
                 metrics={"e2e/nvfp4/ours-vs-te/k3": k3, "e2e/nvfp4/ours-vs-te/max_abs_delta": 0.5,
                          "e2e/nvfp4/te-vs-te-bf16/k3": 1.5, "e2e/bf16/ours-vs-te/k3": 0.0,
                          "quantizer/1x16/gauss/codes_equal": 1.0, "quantizer/1x16/gauss/scales_equal": 0.99955,
                          "gemm/nvfp4/8x16x8/fprop/quant_rel": 0.1, "gemm/nvfp4/8x16x8/fprop/ours/rel": 1e-5,
                          "gemm/nvfp4/8x16x8/fprop/ours/eq_bf16": 0.99959},
                 grouped_probe={"grouped/bf16/all": "ok", "grouped/fp8/all": "RuntimeError: pad"}, errors={})


def test_claim_e_every_verdict(tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    assert claims.claim_e(exp) == ("real vLLM: not run; real TE: not run", "not run")
    _peers(exp, nvfp4_ok=True)
    text, verdict = claims.claim_e(exp)
    assert verdict == "supported" and "real TE: not run" in text and "0.000× the dense floor" in text
    _te(exp, k3=0.07)
    text, verdict = claims.claim_e(exp)
    assert verdict == "partly" and "TE `nvfp4`) = 0.070" in text and "real TE 9.9" in text
    _peers(exp, nvfp4_ok=False)
    assert claims.claim_e(exp)[1] == "not supported"
    _te(exp, k3=1e-4)
    assert claims.claim_e(exp)[1] == "partly"
    _peers(exp, nvfp4_ok=True)
    assert claims.claim_e(exp)[1] == "supported"
    _te(exp, k3=0.04, model="checkpoint")  # a trained model's agreement is the one claim (e) reads
    text, verdict = claims.claim_e(exp)
    assert verdict == "partly" and "model: checkpoint" in text and "= 0.040" in text


def test_empty_results_build_and_every_claim_is_not_run(tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    text = build(exp)
    section = text.split("## Claims against the paper, point by point")[1].split("\n## ")[0]
    assert all("| **not run** |" in _row(section, c) for c in "abcde")
    headings = {claims.anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}
    links = re.findall(r"\]\((#[^)]+)\)", section)
    assert len(links) == 8 and set(links) <= headings, set(links) - headings
    assert "## Transformer Engine on the H200 (real TE vs our te-nvfp4 emulation)\n\n_not run_" in text


def test_anchor_follows_github():
    assert claims.anchor("Learner ↔ sampler mismatch by engine pair") == "#learner--sampler-mismatch-by-engine-pair"
    assert claims.anchor("Sampler throughput: decode tokens/s × batch") == "#sampler-throughput-decode-tokenss--batch"


def test_te_section_from_agreement(tmp_path):
    _te(tmp_path, k3=0.07)
    text = section_te(tmp_path)
    assert "Real Transformer Engine 9.9" in text and "`nvfp4` nvfp4-ref" in text
    assert "| 1x16/gauss | 1.000000 | 0.999550 |" in text
    assert "| nvfp4/8x16x8 | te-nvfp4-rne | fprop | 0.100 | 1.000e-05 | 0.9996 | – | – |" in text  # not 1.000
    assert "| nvfp4 | te-nvfp4-rne | 0.070 | 0.500 | – | 1.500 |" in text
    assert "1 of 2 cases ok; failed: `grouped/fp8/all` (RuntimeError)" in text
    assert "End to end on a trained model" not in text and "4over6 block scales" not in text
    _te(tmp_path, k3=0.03, model="checkpoint")
    write_result(tmp_path / "te" / "diag-4over6" / "mismatch.json", stage="diagnostics", experiment="t", config={},
                 metrics={"minite-4over6:minite-4over6": {"mismatch/k3": 6.5e-5, "mismatch/k3_se": 3e-5}})
    (tmp_path / "te" / "learner.json").write_text(json.dumps({  # bench learner's payload (no metrics key)
        "schema": "throughput/v1", "config": {"layers": 2}, "env": {"commit": "c0ffee"},
        "rows": [{"profile": "te:bf16", "tokens_per_s": 10.0, "speedup_vs_bf16": 0.2}],
        "skipped": [{"profile": "te:fp8-block", "reason": "no TE here"}]}))
    text = section_te(tmp_path)
    assert "**End to end on a trained model** (checkpoint, " in text and "| nvfp4 | te-nvfp4-rne | 0.030 |" in text
    assert "| minite-4over6:minite-4over6 | 6.500e-05 | 3.000e-05 | – | – | – |" in text
    assert "| te:bf16 | 10.000 | 0.200 | – | – |" in text and "`te:fp8-block` skipped: no TE here" in text
    (tmp_path / "te" / "agreement.json").write_text(json.dumps({"schema": "eval/v1"}))
    with pytest.raises(ValueError, match="is not te/v1"):
        section_te(tmp_path)


def test_te_section_renders_the_first_divergence_trace(tmp_path):
    """te_compare's own trace keys (trace_compare on toy forwards): the first op that differs at all and the first
    above the threshold, per mode; an identical mode shows none."""
    import torch

    from minite_core.peers.te_compare import trace_compare

    ours = {"l0.q": [torch.ones(2, 3)], "l0.mlp.gate": [torch.tensor([[1.0, 2, 3, 4]])], "l1.o": [torch.ones(2, 3)]}
    te = {"l0.q": [torch.ones(2, 3)], "l0.mlp.gate": [torch.tensor([[1.0, 2, 3, 4.00001]])],
          "l1.o": [torch.full((2, 3), 1.1)]}
    _te(tmp_path, k3=0.0)
    res = json.loads((tmp_path / "te" / "agreement.json").read_text())
    res["metrics"] |= trace_compare(ours, te, "e2e/nvfp4/trace", top_k=2) | trace_compare(ours, ours, "e2e/bf16/trace")
    (tmp_path / "te" / "agreement.json").write_text(json.dumps(res))
    text = section_te(tmp_path)
    assert "| bf16 | 1.000e-03 | none | none |" in text
    assert ("| nvfp4 | 1.000e-03 | `l0.mlp.gate` (op 1): rel 1.83e-06, eq bf16 1.0000, routing flip 0.0000 | "
            "`l1.o` (op 2): rel 9.09e-02, eq bf16 0.0000 |") in text


def test_te_learner_pairs_in_the_report(tmp_path):
    """A real-TE learner pair (`te:<mode>:<sampler>`, diagnostics/cli.py): a readable label in the mismatch table,
    and te/diag-te/ as a table in the TE section with its skipped steps."""
    from minite_core.report.build import pair_label, section_mismatch

    assert pair_label("te:nvfp4:vllm-nvfp4") == "real TE nvfp4 ↔ vllm-nvfp4"
    assert pair_label("te-nvfp4:vllm-nvfp4") == "naive Blackwell stack (TE-NVFP4 ↔ vLLM-NVFP4)"
    assert pair_label("x:y") == "x:y"
    _mismatch(tmp_path, **{"te:nvfp4:vllm-nvfp4": (0.02, 0.004, 3.0)})
    assert "| real TE nvfp4 ↔ vllm-nvfp4 | 0.020 |" in section_mismatch(tmp_path)
    _te(tmp_path, k3=0.07)
    assert "Real TE as the learner" not in section_te(tmp_path)
    write_result(tmp_path / "te" / "diag-te" / "mismatch.json", stage="diagnostics", experiment="t",
                 config={"te": "transformer_engine 9.9"},
                 metrics={"te:nvfp4:vllm-nvfp4": {"mismatch/k3": 0.02, "mismatch/k3_se": 4e-3}},
                 skipped=[{"pair": "te:nvfp4:vllm-nvfp4", "step": "trace", "reason": "no profiles"}])
    text = section_te(tmp_path)
    assert "**Real TE as the learner of a pair**" in text and "transformer_engine 9.9" in text
    assert "| te:nvfp4:vllm-nvfp4 | 0.020 | 4.000e-03 | – | – | – |" in text
    assert "- `te:nvfp4:vllm-nvfp4` trace skipped: no profiles" in text


def _env_file(root, stage, commit, gpu="GPU-X"):
    write_result(root / stage / "x.json", stage=stage, experiment="t", config={}, metrics={})
    payload = json.loads((root / stage / "x.json").read_text())
    payload["env"] = {"gpu": gpu, "torch": "2.0", "commit": commit, "kernels": stage}  # kernels differs per file
    (root / stage / "x.json").write_text(json.dumps(payload))


def test_header_groups_envs_and_names_stages(tmp_path):
    for stage in ("bench", "diagnostics", "rl"):
        _env_file(tmp_path, stage, "aaaaaaa")
    text = section_header(tmp_path)
    assert "- ran on: GPU-X; torch 2.0; commit `aaaaaaa`: bench, diagnostics, rl\n" in text
    assert text.count("- ran on:") == 1 and "results from" not in text
    _env_file(tmp_path, "te", "bbbbbbb")
    text = section_header(tmp_path)
    assert "- results from 2 commits: `aaaaaaa`, `bbbbbbb`\n" in text
    assert "- ran on: GPU-X; torch 2.0; commit `bbbbbbb`: te\n" in text and text.count("- ran on:") == 2
    _env_file(tmp_path / "extra", "probe", "ccccccc")  # probes: apart, not counted as the results' commits
    text = section_header(tmp_path)
    assert "- results from 2 commits: `aaaaaaa`, `bbbbbbb`\n" in text and "ccccccc" not in text
    assert "- `extra/`: probes beside the results above, at 1 commit of their own" in text

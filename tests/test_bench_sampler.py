"""`minite bench sampler` on CPU: the tiny shapes run the same code as the H200 bench; JSON, table, report."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from minite_core.bench import sampler as bench
from minite_core.report.build import section_sampler_throughput
from minite_core.report.tables import sampler_table


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, one_thread):
    out = tmp_path_factory.mktemp("bench") / "throughput" / "sampler.json"
    assert bench.main(["--config", "tiny", "--new-tokens", "4", "--reps", "1", "--device", "cpu", "--experiment",
                       "t", "--out", str(out), "--config-json", '{"profiles": ["bf16", "minite"]}']) == 0
    return json.loads(out.read_text()), out


def test_tiny_bench_rows(tiny_run):
    res, _ = tiny_run
    assert res["schema"] == "throughput/v1" and res["experiment"] == "t"
    rows = [r for r in res["rows"] if r["profile"] != bench.PLAIN]
    keys = {(r["shape"], r["batch"], r["profile"]) for r in rows}
    assert keys == {(s, b, p) for s in ("rl", "weight-bound") for b in (1, 4) for p in ("bf16", "minite")}
    for r in rows:
        assert r["engine"] == "fast-eager" and r["tokens_per_s"] > 0 and r["generate_tokens_per_s"] > 0
        assert r["p20_tokens_per_s"] <= r["tokens_per_s"] <= r["p80_tokens_per_s"]
        bf16 = next(x for x in rows if (x["shape"], x["batch"], x["profile"]) == (r["shape"], r["batch"], "bf16"))
        assert r["speedup_vs_bf16"] == pytest.approx(r["tokens_per_s"] / bf16["tokens_per_s"])
        step = r["weight_bytes_per_step"] + r["kv_bytes_per_step"]
        assert r["bytes_per_token"] == pytest.approx(step / r["batch"]) and r["bw_frac"] is None  # CPU: no ceiling
        assert r["gbps"] == pytest.approx(step / r["step_ms"] / 1e6)
        assert r["bytes_estimated"] == (r["shape"] == "rl")  # MoE experts touched: an estimate
    plain = [r for r in res["rows"] if r["profile"] == bench.PLAIN]
    assert {(r["shape"], r["batch"]) for r in plain} == {("weight-bound", 1), ("weight-bound", 4)}
    for r in plain:
        bf16 = next(x for x in rows if (x["shape"], x["batch"], x["profile"]) == ("weight-bound", r["batch"], "bf16"))
        assert r["engine"] == "plain-torch" and r["tokens_per_s"] > 0
        assert bf16["speedup_vs_plain"] == pytest.approx(bf16["tokens_per_s"] / r["tokens_per_s"])
        assert r["weight_bytes_per_step"] == bf16["weight_bytes_per_step"]  # the same weights, the same bytes
    assert [(r["profile"], r["engine"], r["batch"]) for r in res["reference"]] == [("bf16", "reference", 4),
                                                                                ("minite", "reference", 4)]
    assert all(r["tokens_per_s"] > 0 and r["fast_speedup_vs_reference"] > 0 for r in res["reference"])
    assert res["targets"]["applicable"] is False and res["ceilings"] == {"copy_gbps": None}
    assert res["config"]["model_configs"]["weight-bound"]["num_experts"] == 0


def test_table_and_report_section_read_the_json(tiny_run):
    res, out = tiny_run
    table = sampler_table(res)
    assert "| rl | 4 | minite | fast-eager |" in table and "Before: the reference sampler" in table
    section = section_sampler_throughput(out.parent.parent)
    assert section.startswith("## Sampler throughput") and table in section
    assert "_not run_" in section_sampler_throughput(out.parent.parent / "missing")


def test_budget_spent_rows_are_recorded_as_skipped(one_thread):
    cfg = dataclasses.replace(bench.CONFIGS["tiny"], profiles=("bf16",), shapes=("weight-bound",), new_tokens=2,
                              reps=1, budget_s=1e-9)
    res = bench.run(cfg, torch.device("cpu"), log=lambda s: None)
    assert res["rows"] and all(r["skipped"] == "budget" and r["tokens_per_s"] is None for r in res["rows"])
    assert "budget" in sampler_table(res)


def test_targets_on_measured_rows():
    rows = [{"profile": p, "shape": s, "batch": b, "tokens_per_s": v, **x} for p, s, b, v, x in [
        ("bf16", "rl", 64, 120_000.0, {}), ("minite", "rl", 64, 100_000.0, {}), ("vllm-nvfp4", "rl", 64, 110_000.0, {}),
        ("bf16", "weight-bound", 1, 1000.0, {"bw_frac": 0.72}), ("plain-torch", "weight-bound", 1, 1100.0, {}),
        ("minite-packed", "weight-bound", 1, 2500.0, {}), ("minite", "weight-bound", 1, 900.0, {})]]
    checks = {c["target"]: c["met"] for c in bench.check_targets(rows, cuda=True)["checks"]}
    assert checks["rl batch 64: bf16 >= 100,000 tok/s"] is True
    assert checks["rl batch 64: minite >= 0.9x bf16"] is False  # 0.83
    assert checks["rl batch 64: vllm-nvfp4 >= 0.9x bf16"] is True
    assert checks["weight-bound batch 1: minite-packed >= 2.0x bf16"] is True
    assert checks["weight-bound batch 1: bf16 >= 1.0x plain PyTorch"] is False  # 0.91
    assert checks["weight-bound batch 1: bf16 >= 70% of copy bandwidth"] is True
    assert not any("weight-bound batch 1: minite >=" in t for t in checks)  # cached-bf16 weights: no byte target


def test_model_shape_targets():
    """The RL base model ("model" shape, an MoE): NVFP4 >= 0.9x bf16 at batch 64, packed >= 1.5x at batch <= 16."""
    rows = [{"profile": p, "shape": "model", "batch": b, "tokens_per_s": v} for p, b, v in [
        ("bf16", 1, 1000.0), ("minite-packed", 1, 1600.0), ("minite", 1, 700.0), ("bf16", 16, 10_000.0),
        ("minite-packed", 16, 12_000.0), ("bf16", 64, 30_000.0), ("minite", 64, 28_000.0),
        ("minite-packed", 64, 26_000.0), ("bf16", 256, 90_000.0), ("minite-packed", 256, 50_000.0)]]
    checks = {c["target"]: c["met"] for c in bench.check_targets(rows, cuda=True)["checks"]}
    assert checks["model batch 1: minite-packed >= 1.5x bf16"] is True
    assert checks["model batch 16: minite-packed >= 1.5x bf16"] is False  # 1.2
    assert checks["model batch 64: minite >= 0.9x bf16"] is True  # 0.93
    assert checks["model batch 64: minite-packed >= 0.9x bf16"] is False  # 0.87
    assert not any(t.startswith(("model batch 64: minite-packed >= 1.5x", "model batch 256")) for t in checks)
    assert not any(t.startswith("model batch 1: minite >=") for t in checks)  # cached bf16 weights: no byte target


def test_decode_bytes_count_the_profile_weights():
    """bench.decode_bytes on a dense model: bf16 reads 2 B a weight, a packed profile 0.5625 B a quantized one and
    its LM head in bf16 (an fp32 head over bf16 parameters is one bf16 piece), the KV cache whole."""
    from minite_core.bench.decode_bytes import step_bytes

    mcfg, _ = bench.shape_config("weight-bound", tiny=True)
    model = bench.random_model(mcfg, torch.bfloat16, torch.device("cpu"), 0)[0]
    head = model.lm_head.weight.numel()
    body = sum(p.numel() for n, p in model.named_parameters() if n.endswith("proj.weight"))
    bf16 = step_bytes(model, "bf16", 2, 48)
    assert bf16["weights"] == 2 * (body + head) and not bf16["estimated"]
    assert bf16["kv"] == 2 * mcfg.num_hidden_layers * 2 * mcfg.num_key_value_heads * 48 * mcfg.head_dim * 2
    assert step_bytes(model, "minite-packed", 2, 48)["weights"] == pytest.approx(0.5625 * body + 2 * head)
    assert step_bytes(model, "minite", 2, 48)["weights"] == 2 * (body + head)  # the cached bf16 copies


def test_plain_decode_computes_the_model():
    """The plain-PyTorch baseline is the same function as the model: its logits, token by token from an empty
    cache, match the model's full-sequence bf16 forward."""
    from minite_core.bench.plain_decode import PlainDecoder
    from minite_core.model import set_profile

    mcfg, _ = bench.shape_config("weight-bound", tiny=True)
    model = bench.random_model(mcfg, torch.bfloat16, torch.device("cpu"), 1)[0]
    set_profile(model, "bf16")
    ids = torch.randint(0, mcfg.vocab_size, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(ids).float()  # (B, T, V)
    dec = PlainDecoder(model, 2, 8)
    for t in range(ids.shape[1]):
        dec.tokens.copy_(ids[:, t])
        dec.step()
        err = (dec.logits.float() - ref[:, t]).abs().max() / ref[:, t].abs().max()
        assert err < 2e-2, (t, err)  # bf16 rounding of two implementations of one function
    assert int(dec.pos) == ids.shape[1]


def test_bad_arguments_name_the_input(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--config", "nope", "--out", "x.json", "--device", "cpu"])
    assert "--config 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--shapes", "moe", "--out", "x.json", "--device", "cpu"])
    assert "unknown bench shape 'moe'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--out", "x.json", "--device", "cpu", "--config-json", '{"warmup": 3}'])
    assert "unknown key 'warmup'" in capsys.readouterr().err


def test_packed_rows_against_cached_in_the_same_run(one_thread):
    """A `-packed` profile's rows carry decode_gemm and tokens/s over its cached-bf16 row (same shape, batch)."""
    cfg = dataclasses.replace(bench.CONFIGS["tiny"], profiles=("bf16", "minite", "minite-packed"),
                              shapes=("weight-bound",), weight_bound_batches=(2,), new_tokens=2, reps=1)
    res = bench.run(cfg, torch.device("cpu"), log=lambda s: None)
    rows = {r["profile"]: r for r in res["rows"]}
    assert rows["minite"]["decode_gemm"] == "cached-bf16" and rows["minite-packed"]["decode_gemm"] == "packed"
    assert rows["minite-packed"]["speedup_vs_cached"] == pytest.approx(
        rows["minite-packed"]["tokens_per_s"] / rows["minite"]["tokens_per_s"])
    assert "speedup_vs_cached" not in rows["minite"]
    assert "| minite-packed |" in sampler_table(res)


def test_op_profile_keys_batch_1_and_16(one_thread):
    """`--op-profile` on a weight-bound / model shape profiles a decode step at batch 1 and 16 (the targets' batches)."""
    cfg = dataclasses.replace(bench.CONFIGS["tiny"], profiles=("bf16",), shapes=("weight-bound",),
                              reps=1, weight_bound_batches=(1,), op_profile=True)
    res = bench.run(cfg, torch.device("cpu"), log=lambda s: None)
    assert set(res["op_profile"]) == {"weight-bound/bf16", "weight-bound/bf16/b16"}
    assert res["op_profile"]["weight-bound/bf16/b16"]["batch"] == 16

"""`minite diagnose --rollouts`: logged rollouts of other RL frameworks in their own dump layouts (fixtures written
here exactly as each framework's code writes them: diagnostics/layouts.py cites the files), the schema's own
layout (JSONL and parquet, with logits for the full-vocabulary KL), the report and gate, and one-line errors on bad
input naming file, row and column."""
import json
import math

import pytest
import torch

from minite_core.cli import main as cli
from minite_core.diagnostics.external import measure
from minite_core.diagnostics.layouts import load, write_nemo_rl_step
from minite_core.engines.framework_metrics import framework_metrics
from minite_core.engines.learner import full_vocab_kl
from minite_core.engines.mismatch import mismatch_metrics
from minite_core.results import read_result

G = torch.Generator().manual_seed(0)


def _pairs(lengths):
    """Per response: (learner, sampler) log-probs, the learner a little off the sampler."""
    out = []
    for n in lengths:
        s = -torch.rand(n, generator=G, dtype=torch.float64) * 2 - 0.01
        out.append(((s + 0.05 * torch.randn(n, generator=G, dtype=torch.float64)).clamp(max=0).tolist(), s.tolist()))
    return out


def _direct(pairs):
    """The metrics straight from the per-response arrays (what every importer must reproduce)."""
    T = max(len(a) for a, _ in pairs)
    lp, sp, m = (torch.zeros(len(pairs), T, dtype=torch.float64) for _ in range(3))
    for i, (a, b) in enumerate(pairs):
        lp[i, :len(a)], sp[i, :len(b)], m[i, :len(a)] = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64), 1
    return {**mismatch_metrics(lp, sp, m.bool()), **framework_metrics(lp, sp, m.bool())}


def _same(rollouts, pairs):
    got, want = measure(rollouts)["metrics"], _direct(pairs)
    for k in ("mismatch/k3", "mismatch/k1", "mismatch/chi2", "train/gen_kl_error", "train/js_divergence_error",
              "rollout_corr/kl", "rollout_corr/chi2_seq", "mismatch/tokens"):
        assert got[k] == pytest.approx(want[k], rel=1e-12), k


# ---- fixtures in the frameworks' layouts -------------------------------------------------------------------------
def nemo_rl_dump(directory, step, pairs, prompt_len=3):
    """nemo_rl/algorithms/grpo.py's log_data through Logger.log_batched_dict_as_jsonl: one line per sample, each
    value a batch of one, arrays over the padded prompt + response with entry t the log-prob of token t."""
    S = prompt_len + max(len(a) for a, _ in pairs) + 2  # right padding beyond the longest
    lines = []
    for i, (learner, sampler) in enumerate(pairs):
        R = len(learner)
        pad = [0.0] * (S - prompt_len - R)
        on_seq = lambda xs: [0.0] * prompt_len + list(xs) + pad  # noqa: E731
        lines.append(json.dumps({
            "content": [["What is 2+3?", "answer: 5"]], "rewards": [1.0], "input_lengths": [prompt_len + R],
            "token_ids": [list(range(prompt_len + R)) + [0] * len(pad)],
            "token_loss_mask": [[0] * prompt_len + [1] * R + [0] * len(pad)], "sample_loss_mask": [1],
            "advantages": [on_seq([0.5] * R)], "generation_logprobs": [on_seq(sampler)],
            "prev_logprobs": [on_seq(learner)], "idx": i}))
    path = directory / f"train_data_step{step}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def slime_dump(path, rollout_id, pairs):
    """slime/observability/train_data_utils.py `_build_dump_payload`, saved with torch.save."""
    samples = [{"data_parallel_rank": 0, "rollout_position": i, "sample_index": 100 + i,
                "tokens": torch.arange(5 + len(a)), "response_lengths": len(a), "loss_masks": [1] * len(a),
                "rollout_log_probs": torch.tensor(b, dtype=torch.float32),  # slime's fp32 tensors
                "log_probs": torch.tensor(a, dtype=torch.float32), "rewards": 1.0, "truncated": 0}
               for i, (a, b) in enumerate(pairs)]
    torch.save({"format_version": 2, "rollout_id": rollout_id, "rank": 0, "samples": samples,
                "dp_shards": [{"rank": 0, "data_parallel_rank": 0, "num_microbatches": [1]}],
                "raw_reward": [1.0] * len(samples)}, path)
    return path


def verl_dump(directory, step, pairs):
    """verl/trainer/ppo/ray_trainer.py `_write_generations`: <step>.jsonl, base fields + per-sample extras (here
    the batch's rollout_log_probs / old_log_probs / response_mask, padded to the response length)."""
    T = max(len(a) for a, _ in pairs)
    with (directory / f"{step}.jsonl").open("w") as f:
        for a, b in pairs:
            pad = [0.0] * (T - len(a))
            f.write(json.dumps({"input": "q", "output": "a", "gts": "5", "score": 1.0, "step": step,
                                "rollout_log_probs": b + pad, "old_log_probs": a + pad,
                                "response_mask": [1] * len(a) + [0] * len(pad)}) + "\n")
    return directory / f"{step}.jsonl"


def test_nemo_rl_layout(tmp_path):
    first, second = _pairs([4, 7, 5]), _pairs([6, 3])
    nemo_rl_dump(tmp_path, 2, first)
    nemo_rl_dump(tmp_path, 10, second)  # natural order: step 2 before step 10
    ro = load([tmp_path], name="n")
    assert ro.layout == "nemo-rl" and [r.step for r in ro.rows] == [2, 2, 2, 10, 10]
    assert ro.rows[1].learner == first[1][0] and ro.rows[1].sampler == first[1][1]  # response tokens from position 0
    _same(ro, first + second)
    m = measure(ro)
    assert [s["step"] for s in m["by_step"]] == [2, 10]
    assert m["by_step"][1]["mismatch/k3"] == pytest.approx(_direct(second)["mismatch/k3"], rel=1e-12)
    assert "no logits" in m["source"]["kl_full_vocab_omitted"]


def test_nemo_rl_writer_reads_back(tmp_path):
    """The RL stage's dump (write_nemo_rl_step) is the layout the importer reads."""
    pairs = _pairs([3, 5])
    T = 5
    lp, sp, mask = (torch.zeros(2, T, dtype=torch.float64) for _ in range(3))
    for i, (a, b) in enumerate(pairs):
        lp[i, :len(a)], sp[i, :len(b)], mask[i, :len(a)] = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64), 1
    write_nemo_rl_step(tmp_path, 4, prompt_ids=[[1, 5, 6], [1, 7]], response_ids=[[8, 9, 2], [8, 9, 9, 9, 2]],
                       logp_sampler=sp, logp_learner=lp, mask=mask.bool(), rewards=[1.0, 0.0],
                       advantages=[0.7, -0.7], contents=[["q1", "a1"], ["q2", "a2"]])
    rec = json.loads((tmp_path / "train_data_step4.jsonl").read_text().splitlines()[0])
    assert rec["token_loss_mask"] == [[0, 0, 0, 1, 1, 1, 0]] and rec["sample_loss_mask"] == [1]
    ro = load([tmp_path], name="w")
    assert ro.layout == "nemo-rl" and [r.step for r in ro.rows] == [4, 4]
    _same(ro, pairs)


def _fp32(pairs):
    return [tuple(torch.tensor(x, dtype=torch.float32).double().tolist() for x in p) for p in pairs]


def test_slime_layout(tmp_path):
    pairs = _pairs([5, 2, 6])
    ro = load([slime_dump(tmp_path / "7.pt", 7, pairs)], name="s")
    assert ro.layout == "slime" and {r.step for r in ro.rows} == {7} and ro.rows[0].prompt_id == "100"
    _same(ro, _fp32(pairs))


def test_verl_layout(tmp_path):
    pairs = _pairs([3, 6])
    ro = load([verl_dump(tmp_path, 5, pairs)], name="v")
    assert ro.layout == "verl" and {r.step for r in ro.rows} == {5}
    _same(ro, pairs)


def test_schema_parquet_and_full_vocab_kl(tmp_path):
    """The schema's own layout from parquet; both engines' logits give the full-vocabulary KL per token."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows, kls = [], []
    for i, n in enumerate((3, 4)):
        s_logits, l_logits = torch.randn(n, 6, generator=G, dtype=torch.float64), torch.randn(n, 6, generator=G,
                                                                                               dtype=torch.float64)
        tok = torch.randint(0, 6, (n,), generator=G)
        lp = l_logits.log_softmax(-1).gather(1, tok[:, None])[:, 0]
        sp = s_logits.log_softmax(-1).gather(1, tok[:, None])[:, 0]
        kls += full_vocab_kl(s_logits, l_logits).tolist()
        rows.append({"step": 3, "prompt_id": f"p{i}", "learner_logprobs": lp.tolist(), "sampler_logprobs": sp.tolist(),
                     "sampler_logits": s_logits.tolist(), "learner_logits": l_logits.tolist()})
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "r.parquet")
    m = measure(load([tmp_path / "r.parquet"], name="p"))
    assert m["source"]["kl_full_vocab_omitted"] is None
    assert m["metrics"]["mismatch/kl_full_vocab"] == pytest.approx(sum(kls) / len(kls), rel=1e-12)


def test_cli_report_gate_and_history(tmp_path, capsys):
    """Two pairs of two frameworks in one report; a ceiling gates; a later run within 5% of the history passes,
    one far above it fails with one line per (pair, metric)."""
    (tmp_path / "nemo").mkdir()
    nemo_rl_dump(tmp_path / "nemo", 1, _pairs([5, 6, 4]))
    slime_dump(tmp_path / "0.pt", 0, _pairs([4, 4]))
    first = tmp_path / "a" / "external.json"
    args = ["diagnose", "--rollouts", str(tmp_path / "nemo"), "--name", "nemo", "--rollouts", str(tmp_path / "0.pt"),
            "--name", "slime"]
    assert cli(args + ["--out", str(first), "--figures", str(tmp_path / "a" / "fig"),
                       "--ceiling", "gen_kl_error=0.03"]) == 0
    res = read_result(first, stage="external")
    assert set(res["metrics"]) == {"nemo", "slime"} and all(r["pass"] for r in res["gate"])
    assert (tmp_path / "a" / "fig" / "by_step.png").exists() and (tmp_path / "a" / "fig" / "k3_by_pair.png").exists()
    report = (tmp_path / "a" / "external.md").read_text()
    assert "| nemo | nemo-rl |" in report and "| slime | slime |" in report and "fig/by_step.png" in report
    assert cli(args + ["--out", str(tmp_path / "b.json"), "--ceiling", "slime:k3=1e-9"]) == 1
    err = capsys.readouterr().err
    assert "mismatch gate failed for slime: mismatch/k3 = " in err and "(ceiling)" in err and "nemo: mismatch" not in err
    # the history gate: the same logs again are within 5% of themselves; a 10x worse slime log is not
    assert cli(args + ["--out", str(tmp_path / "c.json"), "--history", str(first)]) == 0
    worse = [(a, [x - 0.5 for x in b]) for a, b in _pairs([4, 4])]
    slime_dump(tmp_path / "0.pt", 0, worse)
    assert cli(args + ["--out", str(tmp_path / "d.json"), "--history", str(first), str(tmp_path / "c.json"),
                       "--history-metric", "gen_kl_error"]) == 1
    lines = [x for x in capsys.readouterr().err.splitlines() if "error:" in x]
    assert len(lines) == 1 and "slime: train/gen_kl_error" in lines[0] and "max of the last 2 runs +5%" in lines[0]


# ---- bad input: one line naming file, row and column -------------------------------------------------------------
def _schema_line(**kw):
    rec = {"step": 1, "learner_logprobs": [-0.5, -1.0, -0.2], "sampler_logprobs": [-0.4, -1.1, -0.2]}
    rec.update(kw)
    return json.dumps(rec)


@pytest.mark.parametrize("bad, row, column, words", [
    ('{"foo": [1], "bar": 2}', 2, None, "match no known layout"),
    (_schema_line(sampler_logprobs=[-0.4, -1.1]), 2, "sampler_logprobs", "has 2 values, 'learner_logprobs' has 3"),
    (_schema_line(mask=[1, 1]), 2, "mask", "has 2 values"),
    (_schema_line(sampler_logprobs=[-0.4, float("nan"), -0.2]), 2, "sampler_logprobs", "nan at token 1"),
    (_schema_line(learner_logprobs=[-0.5, 3.0, -0.2]), 2, "learner_logprobs", "no log-prob"),
    (_schema_line(learner_logprobs=[[-0.5], [-1.0], [-0.2]]), 2, "learner_logprobs", "flat list"),
    (_schema_line(step="three"), 2, "step", "integer training step"),
    ("{not json", 2, None, "not a JSON line"),
])
def test_bad_schema_rows(tmp_path, capsys, bad, row, column, words):
    path = tmp_path / "r.jsonl"
    path.write_text(_schema_line() + "\n" + bad + "\n")
    if row == 2 and bad.startswith('{"foo"'):  # a first row no layout matches
        path.write_text(bad + "\n")
        row = 1
    assert cli(["diagnose", "--rollouts", str(path), "--out", str(tmp_path / "o.json")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("minite diagnose: error: ")
    assert f"{path}: row {row}" in err[0] and words in err[0]
    if column:
        assert f"column {column!r}" in err[0]
    assert not (tmp_path / "o.json").exists()  # nothing written from a bad log


def test_bad_framework_rows(tmp_path, capsys):
    """A NeMo-RL line whose mask is one token short (misaligned), a slime sample missing its learner log-probs."""
    nemo_rl_dump(tmp_path, 3, _pairs([4, 4]))
    path = tmp_path / "train_data_step3.jsonl"
    lines = path.read_text().splitlines()
    rec = json.loads(lines[1])
    rec["token_loss_mask"] = [rec["token_loss_mask"][0][1:]]
    path.write_text(lines[0] + "\n" + json.dumps(rec) + "\n")
    assert cli(["diagnose", "--rollouts", str(tmp_path), "--out", str(tmp_path / "o.json")]) == 1
    err = capsys.readouterr().err.strip()
    assert f"{path}: row 2: column 'generation_logprobs': has" in err and "must align" in err
    pt = slime_dump(tmp_path / "9.pt", 9, _pairs([3, 3]))
    payload = torch.load(pt, weights_only=True)
    del payload["samples"][1]["log_probs"]
    torch.save(payload, pt)
    assert cli(["diagnose", "--rollouts", str(pt), "--out", str(tmp_path / "o.json")]) == 1
    err = capsys.readouterr().err.strip()
    assert f"{pt}: row 2: column 'log_probs': missing; the slime layout needs" in err
    assert math.isfinite(len(err)) and "\n" not in err

"""GRPO loop (rl/train.py) on a tiny pretrained model: every metric is logged each step, the run's outputs follow
the results contract, and a killed + resumed run reproduces the straight run's rows exactly (timing aside).

The naive Blackwell pair te-nvfp4 (learner: 2D weights, SR + RHT backward) / vllm-nvfp4 (sampler: static,
calibrated activation scales, fast quantizer) with TIS exercises every moving part at once.

The tiny model barely solves the task, so its rewards would all be 0 (zero advantages: no update, a vacuous resume
test). The reward is therefore patched to "the response contains the digit 7": random across samples, so groups
carry signal and the weights really move. The loop's mechanics do not depend on what the reward means.
"""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from minite_core.engines.mismatch import KEYS as MISMATCH_KEYS
from minite_core.engines import Learner, Sampler
from minite_core.model import load_pretrained
from minite_core.results import read_result
from minite_core.task import data as data_mod
from minite_core.rl import train as train_mod
from minite_core.runs.state import read_state_file, write_state_file
from minite_core.runs.steplog import StepLog
from minite_core.rl.pretrain import PretrainConfig, pretrain
from minite_core.rl.train import TIMING_PREFIX, RLConfig, run_name, train
from minite_core.task.tasks import ArithmeticTask

DATA = {"levels": ["add2"], "n_train_per_level": 64, "n_heldout_per_level": 4}
TINY = PretrainConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, batch_size=8,
                      lr=1e-2, warmup_steps=2, max_steps=8, eval_every=8, target_accuracy=(0.99, 1.0))
RL = RLConfig(steps=4, prompts_per_step=2, group_size=4, mini_batches=2, lr=1e-3, max_new_tokens=20,
              eval_every=2, eval_n=4, eval_batch_size=3, checkpoint_every=2, calibration_examples=8)
PAIR = dict(learner_profile="te-nvfp4", sampler_profile="vllm-nvfp4", correction="tis")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl")
    data_mod.main(["--out", str(root / "data"), "--config-json", json.dumps(DATA)])
    pretrain(TINY, data_dir=root / "data", out=root / "pre", state_dir=root / "pre_state", seed=0, progress=False)
    return root


@pytest.fixture(autouse=True)
def digit_reward(monkeypatch):
    monkeypatch.setattr(ArithmeticTask, "reward", lambda self, text, row, credit=0.0: float("7" in text))


def _run(base, out, **kw):
    return train(pretrained=base / "pre" / "model", data_dir=base / "data", out=out, cfg=kw.pop("cfg", RL),
                 seed=5, progress=False, **PAIR, **kw)


def _rows(path, drop_timing=True):
    return [{k: v for k, v in r.items() if not (drop_timing and k.startswith(TIMING_PREFIX))}
            for r in StepLog(path).rows()]


def test_loop_logs_every_metric(base, tmp_path):
    out = tmp_path / run_name("te-nvfp4", "vllm-nvfp4", "tis")
    summary = _run(base, out)
    rows = _rows(out / "metrics.csv", drop_timing=False)
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    expected = ({f"mismatch/{k}" for k in MISMATCH_KEYS}
                | {"reward/mean", "reward/acc", "response/len_mean", "actor/entropy", "actor/grad_norm",
                   "actor/pg_loss", "actor/clipfrac", "actor/tis_weight_mean", "timing/sample_tokens_per_s",
                   "timing/learn_tokens_per_s", "eval/acc"})
    assert expected <= set(rows[0]), expected - set(rows[0])
    for r in rows:
        for k, v in r.items():
            if k.startswith("eval/") and int(r["step"]) % 2:
                assert v == ""  # evaluation steps only
            elif k not in ("mismatch/pearson_p",):  # pearson is nan when a probability column is constant
                assert v != "" and math.isfinite(float(v)), (r["step"], k, v)
    assert any(float(r["actor/grad_norm"]) > 0 for r in rows)  # the patched reward gives real updates
    assert float(rows[0]["mismatch/k3"]) > 0  # different numerics on the two sides
    res = read_result(out / "summary.json", stage="rl")
    assert res["run"] == "te-nvfp4__vllm-nvfp4__tis" and res["metrics"]["steps"] == 4
    assert "mismatch/k3_mean" in summary and summary["heldout_acc_initial"] >= 0
    assert "eval/se" in rows[0] and "eval/acc/add2" in rows[0]


def test_summary_heldout_fields(base, tmp_path, monkeypatch):
    """summary.json's held-out numbers are those of the first and last evaluation, on eval_n problems: the
    accuracies match the step log's, the SEs are binomial, the gain is paired over the same problems."""
    seen = []
    evaluate = train_mod.evaluate

    def spy(model, profile, tok, examples, **kw):  # every evaluation scores the same problems, in batches
        seen.append(([e["prompt"] for e in examples], kw["batch_size"]))
        return evaluate(model, profile, tok, examples, **kw)

    monkeypatch.setattr(train_mod, "evaluate", spy)
    out = tmp_path / "r"
    m = _run(base, out)
    assert len(seen) == 3 and all(s == seen[0] for s in seen) and seen[0][1] == 3 and len(seen[0][0]) == 4
    rows = _rows(out / "metrics.csv")
    assert m["heldout_n"] == 4 and m["heldout_decoding"] == "greedy"
    assert m["heldout_acc_final"] == float(rows[-1]["eval/acc"])
    for when in ("initial", "final"):
        acc = m[f"heldout_acc_{when}"]
        assert acc * 4 == round(acc * 4) and m[f"heldout_se_{when}"] == pytest.approx(math.sqrt(acc * (1 - acc) / 4))
    assert m["heldout_gain"] == pytest.approx(m["heldout_acc_final"] - m["heldout_acc_initial"])
    assert math.isfinite(m["heldout_gain_se"]) and m["heldout_gain_se"] >= 0
    assert m["heldout_acc_final/add2"] == m["heldout_acc_final"]
    with pytest.raises(ValueError, match="eval_n"):  # more problems than the held-out split holds
        _run(base, tmp_path / "big", cfg=dataclasses.replace(RL, eval_n=5))
    model = load_pretrained(out / "final")  # transformers layout, calibrated static scales included
    assert model.model.layers[0].self_attn.q_proj.input_amax is not None


def test_resume_is_exact(base, tmp_path):
    _run(base, tmp_path / "straight")
    part = _run(base, tmp_path / "resumed", stop_after=2)  # "killed" after step 2 (checkpoint at step 2)
    assert part == {"stopped_at": 2}
    assert not (tmp_path / "resumed" / "metrics.csv").exists()
    _run(base, tmp_path / "resumed")
    straight, resumed = _rows(tmp_path / "straight" / "metrics.csv"), _rows(tmp_path / "resumed" / "metrics.csv")
    assert len(straight) == 4 and straight == resumed
    a, b = load_pretrained(tmp_path / "straight" / "final"), load_pretrained(tmp_path / "resumed" / "final")
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), name


def test_a_finished_run_is_never_overwritten_by_another_config(base, tmp_path):
    """`minite rl --out <a finished run>` with another learner: an error naming the keys, the run untouched;
    --restart keeps it under previous/<time>/; the same config resumes (here: finds the run finished)."""
    cfg = dataclasses.replace(RL, steps=1)
    out = tmp_path / "r"
    _run(base, out, cfg=cfg)
    summary = (out / "summary.json").read_bytes()
    with pytest.raises(ValueError, match=r"another config \(learner: \"te-nvfp4\" -> \"bf16\"; sampler: "
                                         r"\"vllm-nvfp4\" -> \"bf16\"\).*another --out, or pass --restart"):
        train(pretrained=base / "pre" / "model", data_dir=base / "data", out=out, cfg=cfg, seed=5, progress=False,
              learner_profile="bf16", sampler_profile="bf16", correction="tis")
    assert (out / "summary.json").read_bytes() == summary
    assert _run(base, out, cfg=cfg)["steps"] == 1  # the same config: resumed at its last step
    train(pretrained=base / "pre" / "model", data_dir=base / "data", out=out, cfg=cfg, seed=5, progress=False,
          learner_profile="bf16", sampler_profile="bf16", correction="tis", restart=True)
    (kept,) = (out / "previous").iterdir()
    assert (kept / "summary.json").read_bytes() == summary and (kept / "final" / "model.safetensors").exists()
    assert read_result(out / "summary.json")["config"]["learner"] == "bf16"


def test_resume_drops_rows_after_the_checkpoint(base, tmp_path):
    """A kill after step 3 with the checkpoint at step 2: row 3 is in the live CSV; resuming replays it once."""
    cfg = dataclasses.replace(RL, steps=3, checkpoint_every=2)
    _run(base, tmp_path / "r", cfg=cfg)
    state = tmp_path / "r" / "state"
    log = StepLog(state / "metrics.csv")
    rows = log.rows()
    # simulate: the checkpoint is from step 2 but the log already has step 3
    _run(base, tmp_path / "ref", cfg=dataclasses.replace(cfg, steps=2))
    (state / "state.pt").write_bytes((tmp_path / "ref" / "state" / "state.pt").read_bytes())
    # the step-2 state was saved under steps=2: same config otherwise; copy it into a steps=3 run's state
    ckpt = read_state_file(state / "state.pt")
    ckpt["config"]["steps"] = 3
    write_state_file(state / "state.pt", ckpt)
    _run(base, tmp_path / "r", cfg=cfg)
    again = log.rows()
    assert [r["step"] for r in again] == ["1", "2", "3"]
    drop = lambda rs: [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIX)} for r in rs]  # noqa: E731
    assert drop(again) == drop(rows)


def test_routing_replay_loop_replays_the_sampler_routes(base, tmp_path, monkeypatch):
    """An R3 learner (te-nvfp4-r3): every learner forward of a step (old log-probs and each update) gets the
    sampler's recorded routes of its rows and executes exactly those expert sets."""
    rollouts, scored = [], []
    generate, score = Sampler.generate, Learner.score

    def spy_generate(self, *args, **kw):
        roll = generate(self, *args, **kw)
        if roll.routes is not None:  # the step's rollout (greedy evaluations record nothing)
            rollouts.append(roll)
        return roll

    def spy_score(self, *args, **kw):
        sc = score(self, *args, **{**kw, "record_routes": True})
        scored.append((kw.get("routes"), kw.get("grad", False), sc))
        return sc

    monkeypatch.setattr(Sampler, "generate", spy_generate)
    monkeypatch.setattr(Learner, "score", spy_score)
    train(pretrained=base / "pre" / "model", data_dir=base / "data", out=tmp_path / "r3", seed=5, progress=False,
          cfg=dataclasses.replace(RL, steps=1), learner_profile="te-nvfp4-r3", sampler_profile="vllm-nvfp4",
          correction=None)
    (roll,) = rollouts
    assert [grad for _, grad, _ in scored] == [False, False, True, True]  # old log-probs, then the two updates
    n = len(roll.routes) // RL.mini_batches
    own_choice_differs = False
    for k, (given, _, sc) in enumerate(scored):
        rows = slice((k % 2) * n, (k % 2 + 1) * n)
        assert [id(x) for x in given] == [id(x) for x in roll.routes[rows]]  # this chunk's sampler routes
        for executed, recorded, router in zip(sc.routes, given, sc.router_routes):
            routed = (recorded[..., 0] >= 0).all(-1)
            assert torch.equal(executed[routed], recorded[routed])
            own_choice_differs |= bool((router.sort(-1).values != executed.sort(-1).values)[routed].any())
    assert own_choice_differs  # the learner's router alone would have routed some tokens elsewhere


def test_config_errors():
    with pytest.raises(ValueError, match="group_size"):
        RLConfig(group_size=1)
    with pytest.raises(ValueError, match="unknown correction"):
        train_mod.parse_correction("is")


def _scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_and_rollout_dump_survive_a_resume(base, tmp_path):
    """Event files beside metrics.csv under the frameworks' names; a run killed after step 3 with its checkpoint at
    step 2 replays step 3, and TensorBoard shows every step once (purge_step). The NeMo-RL-layout dump of a step
    reads back (diagnostics.layouts) to the k3 the CSV logged for that step."""
    from minite_core.diagnostics.external import measure
    from minite_core.diagnostics.layouts import load
    from minite_core.runs.state import read_state_file, write_state_file

    cfg = dataclasses.replace(RL, steps=3, checkpoint_every=2, rollout_dump_every=2)
    run = tmp_path / "r"
    (run / "rollouts").mkdir(parents=True)
    (run / "rollouts" / "train_data_step4.jsonl").write_text("{}\n")  # an earlier, longer run's: pruned
    _run(base, run, cfg=cfg)
    first = _scalars(run, "train/gen_kl_error")
    assert [s for s, _ in first] == [1, 2, 3]
    for tag in ("critic/score/mean", "response_length/mean", "response_length/clip_ratio", "actor/pg_clipfrac",
                "actor/entropy", "rollout_corr/k3_kl", "mismatch/k3", "timing_s/gen"):
        assert [s for s, _ in _scalars(run, tag)] == [1, 2, 3], tag
    ckpt_2 = tmp_path / "ref"
    _run(base, ckpt_2, cfg=dataclasses.replace(cfg, steps=2))  # the state a kill after step 3 leaves: step 2's
    ckpt = read_state_file(ckpt_2 / "state" / "state.pt")
    ckpt["config"]["steps"] = 3
    write_state_file(run / "state" / "state.pt", ckpt)
    _run(base, run, cfg=cfg)
    again = _scalars(run, "train/gen_kl_error")
    assert [s for s, _ in again] == [1, 2, 3] and again == first  # step 3 once, replayed exactly
    rows = _rows(run / "metrics.csv")
    dumped = load([run / "rollouts"], name="r")
    assert dumped.layout == "nemo-rl" and sorted({r.step for r in dumped.rows}) == [2]
    assert len(dumped.rows) == RL.prompts_per_step * RL.group_size
    m = measure(dumped)["metrics"]
    for key in ("mismatch/k3", "train/gen_kl_error", "rollout_corr/kl"):
        assert m[key] == pytest.approx(float(rows[1][key]), rel=1e-9, abs=1e-15), key

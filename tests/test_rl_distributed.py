"""`minite rl` on 2 ranks (rl/distributed.py; gloo on CPU, torch.multiprocessing spawn) against the
one-process loop on the same tiny MoE model (experts expert-parallel, the rest FSDP2), for bf16 and minite:
- step 1 (equal weights on both sides): rollouts, rewards, old log-probs (every mismatch/* column), entropy and
  the held-out evaluation bitwise; with one mini-batch also every actor/* metric (the new log-probs at ratio 1);
  the gradient norm within GRAD_TOL (the per-rank partial gradients are summed);
- the weights after the update, and step 2: gradients are sums of per-rank partial GEMMs (engines.distributed's
  GRAD_TOL), so they agree within WEIGHT_TOL, not bitwise;
- a 2-rank run killed after step 1 and resumed in fresh processes repeats the straight 2-rank run exactly.
The reward is test_rl_loop's stand-in ("the response contains a 7"), so groups carry signal and weights move.
"""
from __future__ import annotations

import dataclasses
import json
import socket

import pytest
import torch
import torch.multiprocessing as mp

from minite_core.model import load_pretrained
from minite_core.results import read_result
from minite_core.rl import train as train_mod
from minite_core.rl.train import TIMING_PREFIX, RLConfig, train
from minite_core.task.tasks import ArithmeticTask
from minite_core.runs.steplog import StepLog
import test_rl_loop

WORLD = 2
base = test_rl_loop.base  # the fixture: the same tiny pretrained MoE model (4 experts) and task
# 32 responses a step; minite's NVFP4 wgrad needs 16 rows per rank and mini-batch (rl/distributed.py)
RL = RLConfig(steps=2, prompts_per_step=8, group_size=4, mini_batches=1, lr=1e-3, max_new_tokens=12,
              eval_every=1, eval_n=4, eval_batch_size=4, checkpoint_every=2, calibration_examples=8)
PAIRS = {"bf16": dict(learner_profile="bf16", sampler_profile="bf16", correction=None,
                      cfg=dataclasses.replace(RL, mini_batches=2)),
         "minite": dict(learner_profile="minite", sampler_profile="minite", correction="tis", cfg=RL)}
EXACT = ("reward/", "response/", "mismatch/", "actor/entropy", "eval/")  # step-1 columns that must be bitwise
# max |w_dist - w_ref| after the 2 RL steps. bf16: each rank's dW partial is rounded to bf16 before the sum
# (2^-8 relative), and AdamW's lr·g/(|g| + eps) turns that into up to ~lr per step where |g| is small: bound
# 2·lr·steps, measured 1.3e-3. minite: its NVFP4 GEMMs emit fp32 dW (only norms / embedding are bf16):
# measured 4.2e-6, bound 1e-4.
WEIGHT_TOL = {"bf16": 2 * 1e-3 * RL.steps, "minite": 1e-4}
# the gradient norm's relative tolerance: tests/test_distributed.GRAD_TOL of a bf16-emitted dW (norm weights, the
# tied embedding / LM head, every GEMM under bf16: each rank's partial is rounded to bf16 before the sum)
GRAD_TOL = 2 ** -6


def _digit_reward(self, text, row, credit=0.0):
    return float("7" in text)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kw(base, out, pair, **extra):
    return dict(pretrained=base / "pre" / "model", data_dir=base / "data", out=out, seed=5, progress=False,
                **PAIRS[pair], **extra)


def _worker(rank, world, port, kw):
    torch.set_num_threads(1)
    ArithmeticTask.reward = _digit_reward
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    try:
        train(**kw)
    finally:
        torch.distributed.destroy_process_group()


def _two_ranks(kw):
    mp.spawn(_worker, args=(WORLD, _free_port(), kw), nprocs=WORLD, join=True)


def _rows(out):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIX)} for r in StepLog(out / "metrics.csv").rows()]


def _weights(out):
    return dict(load_pretrained(out / "final").named_parameters())


@pytest.fixture(scope="module")
def runs(base, tmp_path_factory):
    """{pair: (one-process out, 2-rank out)}, computed once per pair."""
    cache = {}

    def get(pair):
        if pair not in cache:
            root = tmp_path_factory.mktemp(pair)
            with pytest.MonkeyPatch.context() as mpatch:
                mpatch.setattr(ArithmeticTask, "reward", _digit_reward)
                train(**_kw(base, root / "one", pair))
            _two_ranks(_kw(base, root / "two", pair))
            cache[pair] = root / "one", root / "two"
        return cache[pair]
    return get


@pytest.mark.parametrize("pair", ["bf16", "minite"])
def test_two_ranks_equal_one_process(base, runs, one_thread, pair):
    one, two = runs(pair)
    ref, got = _rows(one), _rows(two)
    assert [r["step"] for r in got] == ["1", "2"] == [r["step"] for r in ref]
    first_ref, first = ref[0], got[0]
    assert set(first) == set(first_ref)
    exact = [k for k in first if k.startswith(EXACT) or (PAIRS[pair]["cfg"].mini_batches == 1
                                                          and k.startswith("actor/") and k != "actor/grad_norm")]
    assert any(k.startswith("actor/clip") for k in exact) == (pair == "minite")
    assert {k: first[k] for k in exact} == {k: first_ref[k] for k in exact}
    assert float(first["reward/groups_with_signal"]) > 0  # real updates
    assert float(first["actor/grad_norm"]) == pytest.approx(float(first_ref["actor/grad_norm"]), rel=GRAD_TOL)
    for k in first:  # the rest of step 1 (bf16's second mini-batch runs on moved weights): close
        if first[k] not in ("", "nan") and k not in exact:
            assert float(first[k]) == pytest.approx(float(first_ref[k]), rel=1e-2, abs=1e-5), (k, first[k])
    # step 2 samples with weights that differ at gradient rounding (log-probs by ~1e-3 here): the same tokens
    # for this seed (a flip needs a draw that close to a CDF boundary), so rewards and lengths are equal; the
    # mismatch/* columns are not compared (under bf16 one process's come from 5 of 344 tokens: rare events)
    second, second_ref = got[1], ref[1]
    assert {k: v for k, v in second.items() if k.startswith(("reward/", "response/"))} == \
        {k: v for k, v in second_ref.items() if k.startswith(("reward/", "response/"))}
    for k in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert float(second[k]) == pytest.approx(float(second_ref[k]), rel=5e-2), (k, second[k], second_ref[k])
    w_ref, w, w0 = _weights(one), _weights(two), dict(load_pretrained(base / "pre" / "model").named_parameters())
    assert set(w) == set(w_ref)
    assert any(not torch.equal(w_ref[n], w0[n]) for n in w_ref)  # the updates moved the weights
    worst = {n: float((w[n] - p).detach().abs().amax()) for n, p in w_ref.items()}
    print(f"max |w_dist - w_ref| ({pair}): {max(worst.values()):.3g}")
    bad = {n: v for n, v in worst.items() if v > WEIGHT_TOL[pair]}
    assert not bad, bad


def test_two_ranks_resume_exactly(base, runs, tmp_path, one_thread):
    """Killed after step 1 (its checkpoint), resumed by fresh ranks: the straight 2-rank run's rows and weights."""
    _, straight = runs("minite")
    out = tmp_path / "resumed"
    _two_ranks(_kw(base, out, "minite", stop_after=1))
    assert not (out / "metrics.csv").exists() and (out / "state" / "state.pt").exists()
    _two_ranks(_kw(base, out, "minite"))
    assert _rows(out) == _rows(straight)
    w, w_ref = _weights(out), _weights(straight)
    for name, p in w_ref.items():
        assert torch.equal(w[name], p), name
    assert read_result(out / "summary.json", stage="rl")["config"]["ranks"] == WORLD  # resumes on 2 ranks only


def test_nvfp4_learner_needs_16_rows_per_rank(base, tmp_path, one_thread):
    kw = _kw(base, tmp_path / "r", "minite")
    kw["cfg"] = dataclasses.replace(RL, prompts_per_step=4)  # 8 rows per rank
    with pytest.raises(mp.ProcessRaisedException, match="has 8 rows per rank and mini-batch; its NVFP4 wgrad"):
        _two_ranks(kw)


def _one_inf(module, args):
    """A forward-pre hook: the input with one element +inf (a clone: the graph below stays, as every rank's must)."""
    t = args[0].clone()
    t.view(-1)[0] = float("inf")
    return (t,)


def _poisoned_worker(rank, world, port, kw):
    """_worker, with rank 1's update forwards fed +inf into layer 0's o_proj (the other rank's are finite)."""
    from minite_core.engines.learner import Learner

    if rank == 1:
        logprobs = Learner.logprobs

        def poisoned(self, *args, **kwargs):
            if not kwargs.get("grad"):
                return logprobs(self, *args, **kwargs)
            o_proj = self.model.model.layers[0].self_attn.o_proj
            hook = o_proj.register_forward_pre_hook(_one_inf)
            try:
                return logprobs(self, *args, **kwargs)
            finally:
                hook.remove()
        Learner.logprobs = poisoned
    _worker(rank, world, port, kw)


def test_a_non_finite_operand_on_one_rank_stops_every_rank_naming_the_layer(base, tmp_path, one_thread):
    """Rank 1 alone is fed inf: every rank stops before the optimizer step, naming a layer and the ranks that saw
    non-finite values (rank 1, and rank 0 too where expert parallelism carried rank 1's tokens to its experts),
    instead of an all-reduced NaN norm that names nothing."""
    kw = _kw(base, tmp_path / "r", "minite")
    with pytest.raises(mp.ProcessRaisedException, match=r"rl step 1, mini-batch 0: non-finite .*\(inf/NaN\) at "
                                                        r"model\.layers\.[01]\..*ranks that saw non-finite values: "
                                                        r"\[(0, )?1\]"):
        mp.spawn(_poisoned_worker, args=(WORLD, _free_port(), kw), nprocs=WORLD, join=True)
    assert not (tmp_path / "r" / "summary.json").exists()


def _torchrun_cli_equals_one_process(base, tmp_path, pair, nproc, device):
    """`torchrun --standalone --nproc-per-node <nproc> -m minite_core.cli rl` (init_from_env, the real reward)
    against the one-process CLI on the same device: one step's rollout and mismatch columns bit for bit."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    spec = PAIRS[pair]
    cfg = json.dumps(dataclasses.asdict(dataclasses.replace(spec["cfg"], steps=1)))
    args = ["rl", "--pretrained", str(base / "pre" / "model"), "--data", str(base / "data"),
            "--learner", spec["learner_profile"], "--sampler", spec["sampler_profile"], "--seed", "5",
            "--device", device, "--threads", "1", "--no-progress", "--config-json", cfg]
    if spec["correction"]:
        args += ["--correction", spec["correction"]]
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                          str(nproc), "-m", "minite_core.cli", *args, "--out", str(tmp_path / "dist")], env=env,
                         cwd=root, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert res.stdout.count("rl: 1 steps") == 1  # rank 0 reports
    assert train_mod.main([*args[1:], "--out", str(tmp_path / "one")]) == 0
    (got,), (ref,) = _rows(tmp_path / "dist"), _rows(tmp_path / "one")
    exact = [k for k in ref if k.startswith(EXACT)]
    assert exact and {k: got[k] for k in exact} == {k: ref[k] for k in exact}


def test_torchrun_cli_equals_one_process(base, tmp_path, one_thread):
    """As the DAG launches it on CPU: 2 gloo ranks."""
    _torchrun_cli_equals_one_process(base, tmp_path, "bf16", 2, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("pair", ["bf16", "minite"])
def test_gpu_torchrun_cli_equals_one_process(base, tmp_path, pair):
    """The same on CUDA, where the ranks talk NCCL: 2 ranks on a node with 2 GPUs or more, else a group of one."""
    _torchrun_cli_equals_one_process(base, tmp_path, pair, min(2, torch.cuda.device_count()), "cuda")

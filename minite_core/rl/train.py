"""`minite rl`: one GRPO run for an engine pair (learner profile L, sampler profile S, rollout correction).

Shape legend: B = prompts per step, G = group size, N = B*G responses, T = longest response.

Each step s = 1..steps (the verl / NeMo-RL loop reduced to its numerics; one model tree, two execution profiles):
1. prompts: B training prompts drawn without replacement by derive_seed(run seed, "batch", s); each repeated G
   times (groups contiguous, as ``group_advantages`` expects).
2. rollout: the sampler under S generates the N responses (temperature / top-p from the config), seeded by
   derive_seed(run seed, "sample", s) and, inside the sampler, the response index; it returns the token log-probs
   of its processed distribution (vLLM's ``logprobs``). With a learner profile that replays routing (R3,
   ``routing_replay``) it also records the experts every MoE layer executed for every token it fed.
   The engine (``engines.make_sampler``): the command's execution picks it (``--sampler-engine``,
   $MINITE_SAMPLER; runs.execution), by default the fast CUDA-graph sampler on the GPU, the reference loop on CPU
   (bitwise the same results there).
3. reward: the task's reward of the decoded response (task/tasks.py: the arithmetic task's exact final answer, or
   the math reward on your own data: task/math_reward.py), 1/0; advantages ``group_advantages``.
4. old log-probs: the ``Learner`` under L recomputes log π_old of the sampled tokens (no grad), as verl's
   ``compute_log_prob`` does, on the same row chunks the update uses: the PPO ratio is always learner/learner
   and starts at exactly 1 (under R3 the old and new forwards both replay the sampler's routes, so the ratio
   moves only with the weights, never with a routing flip). The same numbers vs the sampler's give the
   step's ``mismatch/*`` metrics (engines.mismatch) — the quantity the paper is about.
5. update: the N responses are split into ``mini_batches`` contiguous chunks, one AdamW step each (so from the
   second chunk on the ratio moves off 1 and the 0.2/0.28 clip acts); learner log-probs use the sampler's
   processed distribution (temperature, top-p); loss = ``policy_loss`` token-mean, no KL,
   with the optional correction (tis / mis-token / mis-seq) built from the sampler's log-probs; gradient clipping.
   Stochastic-rounding seeds of L's backward: ``Learner.set_step(update index)``.
Weight sync is free: the sampler runs the learner's module tree (DESIGN.md: same weights, different execution).

Static activation scales: a sampler profile with static scales (vllm-nvfp4) is calibrated ONCE, at the start, on
``calibration_examples`` training prompts + reference responses (never held-out ones) with the initial weights;
the scales then stay fixed while the weights move — exactly what serving a calibrated NVFP4 checkpoint from a
training run does unless someone re-calibrates on every sync. That staleness is part of the naive stack's gap.

Logged every step to ``metrics.csv`` (row = step) and to TensorBoard event files beside it (rl/tensorboard.py:
verl's and NeMo-RL's metric names; `tensorboard --logdir results/<exp>/rl`): reward, accuracy, response length,
finished fraction, learner entropy, grad norm, the ``actor/*`` metrics of policy_loss (mean over mini-batches),
every ``mismatch/*`` metric and NeMo-RL's / verl's mismatch metrics (engines.framework_metrics),
sampling and learning tokens/s (``timing/*``, the only columns that differ between identical runs), held-out
greedy accuracy under S on evaluation steps (``eval/*``, else empty: rl/heldout.py — ``eval_n`` problems, the
same ones every time, at step 0, every ``eval_every`` steps and the last step). ``summary.json`` = results
contract, stage "rl": besides reward and mismatch summaries, ``heldout_n``, ``heldout_acc_initial`` /
``heldout_acc_final`` with their binomial SEs, and ``heldout_gain`` with its paired SE (same problems before and
after). ``final/``: the last weights in transformers format (fp32, with the calibrated scales and the
tokenizer) for lm-eval. ``rollouts/`` (``rollout_dump_every`` > 0): those steps' rollouts with both engines'
per-token log-probs in NeMo-RL's layout, for `minite diagnose --rollouts`.

On R ranks (`torchrun --nproc-per-node R -m minite_core.cli rl ...`, the DAG's launcher with gpus_per_job > 1):
the same loop, items 4 and 5 on the FSDP2 + expert-parallel learner (rl/distributed.py: every rank samples the
whole step on a full copy of the weights, rank 0 evaluates and writes); `OneProcess` is the one-process side.

Resume (runs/state.py: checked, `--restart` to start over; runs/lock.py: one writer per run directory): state every ``checkpoint_every`` steps beside the live CSV; a resumed run replays the
remaining steps exactly (same rows but ``timing/*``): tests/test_rl_loop.py runs K straight vs K/2 + resume + K/2.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minite_core.engines import Learner, Sampler, make_sampler, resolve_engine
from minite_core.engines.calibration import calibrate_on_examples
from minite_core.diagnostics.layouts import prune_steps_after, write_nemo_rl_step
from minite_core.engines.framework_metrics import framework_metrics
from minite_core.engines.mismatch import mismatch_metrics
from minite_core.model import load_pretrained, save_pretrained, use_profile
from minite_core.nn import track_optimizer
from minite_core.peers import te_learner, vllm_rollout
from minite_core.profiles import get_profile
from minite_core.results import atomic_write_bytes, config_to_dict, write_result
from minite_core.runs.cli import add_run_args, parse_run_args
from minite_core.runs.state import fingerprint
from minite_core.seeds import tagged
from minite_core.task.data import load_split
from minite_core.rl.grpo import group_advantages, parse_correction, run_name
from minite_core.rl.heldout import evaluate, heldout_set, paired_gain
from minite_core.rl import learner_side
from minite_core.rl.learner_side import FINAL, ROLLOUTS, OneProcess, pad_cols
from minite_core.rl.tensorboard import RunBoard
from minite_core.task.tasks import task_of
from minite_core.task.tokenizer import load_tokenizer, save_tokenizer

TIMING_PREFIX = "timing/"  # wall-clock columns: excluded when comparing runs for exactness


@dataclass(frozen=True)
class RLConfig:
    steps: int = 24  # smoke: a few dozen steps per pair (~1 s/step on 2 CPU cores for B*G = 16)
    prompts_per_step: int = 4  # B
    group_size: int = 4  # G: 4 responses/prompt; with base accuracy ~0.3-0.6 most groups carry signal
    mini_batches: int = 2  # optimizer steps per RL step (verl ppo_mini_batch = N / 2); >1 makes the clip act
    lr: float = 1e-4  # AdamW, constant; 30x below the SFT lr (RL fine-tunes a trained policy)
    weight_decay: float = 0.0  # verl's actor default is 0.01 on 1e-6 lrs; irrelevant over dozens of steps
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0  # verl actor grad_clip
    clip_low: float = 0.2  # DESIGN.md: clip 0.2 / 0.28 (DAPO clip-higher)
    clip_high: float = 0.28
    correction_cap: float = 2.0  # C of TIS / MIS (Yao et al.; diagnostics' ratio_outside_C uses the same C)
    temperature: float = 1.0  # sample from the policy itself (no tempering: logprobs are the policy's)
    top_p: float = 1.0
    max_new_tokens: int = 0  # 0 = longest reference response + <eos> + 16 (the arithmetic task; your data: set it)
    eval_every: int = 8  # held-out greedy accuracy under the sampler profile (also at step 0 and the last step)
    # held-out problems per evaluation (rl/heldout.py: round-robin over levels, the same set every time); 512 gives
    # a binomial SE <= 2.2 points, what a held-out claim needs; 0 = the whole held-out split
    eval_n: int = 512
    eval_batch_size: int = 512  # sampler rows per evaluation batch (one batch for the default eval_n)
    # sampler rows per rollout batch, 0 = all B*G rows at once; long responses of a large model need chunks (the
    # static KV cache holds rows x (prompt + max_new_tokens) slots)
    rollout_batch_size: int = 0
    checkpoint_every: int = 8
    calibration_examples: int = 64  # training examples (prompt + reference response) for static scales
    # reward for a well-formed but wrong ``answer:`` line (task.reward); 0 = pure correctness, DESIGN.md's reward
    format_credit: float = 0.0
    # every k-th step's rollouts (both engines' per-token log-probs) to rollouts/ in NeMo-RL's train_data_step{N}.jsonl
    # layout (diagnostics.layouts), which `minite diagnose --rollouts` reads; 0 = none (a step is ~N x T x 4 numbers)
    rollout_dump_every: int = 0

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError("RLConfig.group_size must be >= 2 (GRPO needs a group baseline)")
        if self.mini_batches < 1 or (self.prompts_per_step * self.group_size) % self.mini_batches:
            raise ValueError(f"RLConfig.mini_batches={self.mini_batches} must divide prompts_per_step*group_size")
        for key in ("steps", "prompts_per_step", "eval_every", "checkpoint_every", "calibration_examples",
                    "eval_batch_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"RLConfig.{key} must be >= 1, got {getattr(self, key)}")
        if self.rollout_dump_every < 0:
            raise ValueError(f"RLConfig.rollout_dump_every must be >= 0 (0 = no dump), got {self.rollout_dump_every}")
        if self.rollout_batch_size < 0:
            raise ValueError(f"RLConfig.rollout_batch_size must be >= 0 (0 = all rows), got {self.rollout_batch_size}")
        if self.eval_n < 0:
            raise ValueError(f"RLConfig.eval_n must be >= 0 (0 = the whole held-out split), got {self.eval_n}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"RLConfig needs temperature >= 0 and 0 < top_p <= 1, got {self.temperature}, {self.top_p}")


def calibrate_static(model, profiles, tok, train: list[dict], n: int, seed: int) -> dict | None:
    """Static activation scales for the first profile that needs them (initial weights, training examples: the
    module docstring), through the shared path (engines.calibration). None when no profile needs them."""
    for prof in profiles:
        if prof.needs_calibration:
            with use_profile(model, prof):
                return calibrate_on_examples(model, tok, train, n=n, seed=seed)
    return None


FINITE_KEYS = ("mismatch/k1", "mismatch/k3", "reward/mean", "actor/entropy", "actor/pg_loss")


def rl_step(step: int, *, cfg: RLConfig, seed: int, model, learner: Learner, sampler: Sampler, opt, tok,
            train: list[dict], train_prompts: list[list[int]], correction: str | None, max_new: int,
            old_logprobs=None, update=None, dump_dir: Path | None = None, task=None) -> dict:
    """One GRPO step (module docstring, items 1-5) -> the CSV row (without eval columns). old_logprobs / update:
    items 4 and 5 (default: one process, rl.learner_side; rl.distributed passes its data-parallel ones).
    dump_dir: where this step's rollouts go on a `rollout_dump_every` step (None: not this process's job).
    task: the data's (task/tasks.py; default: task_of(train))."""
    B, G = cfg.prompts_per_step, cfg.group_size
    task = task or task_of(train)
    g = torch.Generator().manual_seed(tagged(seed, "batch", step))
    pick = torch.randperm(len(train), generator=g)[:B].tolist()
    prompts = [train_prompts[i] for i in pick for _ in range(G)]  # (N,) groups contiguous
    rows = [train[i] for i in pick for _ in range(G)]

    t0 = time.perf_counter()
    roll = sampler.generate(prompts, max_new_tokens=max_new, temperature=cfg.temperature, top_p=cfg.top_p,
                            stop_ids=task.stop_ids(tok), seed=tagged(seed, "sample", step),
                            batch_size=cfg.rollout_batch_size or None,
                            record_routes=learner.profile.routing_replay)

    def routes(sl):  # the sampler's routes of these rows, replayed by an R3 learner (None: nothing recorded)
        return None if roll.routes is None else roll.routes[sl]
    t_sample = time.perf_counter() - t0
    rewards = torch.tensor([task.reward(task.decode(tok, r), row, cfg.format_credit)
                            for r, row in zip(roll.response_ids, rows)], device=learner.device)
    adv = group_advantages(rewards, G)  # (N,)
    rp = roll.padded(device=learner.device)

    t1 = time.perf_counter()
    learner.set_step(step * cfg.mini_batches)  # SR seeds unused without grad; set for a complete record
    n = len(prompts) // cfg.mini_batches
    slices = [slice(k * n, (k + 1) * n) for k in range(cfg.mini_batches)]
    parts = (old_logprobs or learner_side.old_logprobs)(learner, prompts, roll.response_ids, slices, cfg, routes)
    T = rp["mask"].shape[1]
    logp_old, entropy, mask, argmax_l = (torch.cat([pad_cols(p[i], T) for p in parts]) for i in range(4))
    if not torch.equal(mask, rp["mask"]):
        raise RuntimeError("learner and sampler disagree on the response mask")
    row = {"step": step}
    row.update(mismatch_metrics(logp_old, rp["logprobs"], mask, argmax_learner=argmax_l,
                                argmax_sampler=rp["argmax_ids"], cap=cfg.correction_cap))
    row.update(framework_metrics(logp_old, rp["logprobs"], mask))  # NeMo-RL's and verl's names, beside ours
    if dump_dir is not None and cfg.rollout_dump_every and step % cfg.rollout_dump_every == 0:
        write_nemo_rl_step(dump_dir, step, prompt_ids=prompts, response_ids=roll.response_ids,
                           logp_sampler=rp["logprobs"], logp_learner=logp_old, mask=mask, rewards=rewards.tolist(),
                           advantages=adv.tolist(),  # content: NeMo-RL's messages' texts
                           contents=[[row["prompt"], task.decode(tok, r)] for row, r in zip(rows, roll.response_ids)])

    grad_norms, actor = (update or learner_side.update)(step, cfg, model, learner, opt, prompts, roll.response_ids,
                                                        slices, logp_old, adv, mask, rp["logprobs"], correction, routes)
    t_learn = time.perf_counter() - t1

    n_tok = int(mask.sum())
    lens = [len(r) for r in roll.response_ids]
    row.update({
        "reward/mean": float(rewards.mean()),
        "reward/acc": float((rewards == 1.0).float().mean()),
        "reward/groups_with_signal": float((rewards.view(B, G).std(dim=1) > 0).float().mean()),
        "response/len_mean": sum(lens) / len(lens),
        "response/len_max": max(lens),
        "response/finished": sum(roll.finished) / len(roll.finished),
        "actor/entropy": float(torch.where(mask, entropy, torch.zeros_like(entropy)).sum() / max(n_tok, 1)),
        "actor/grad_norm": sum(grad_norms) / len(grad_norms),
        **{key: sum(v) / len(v) for key, v in actor.items()},
        "timing/sample_s": t_sample,
        "timing/learn_s": t_learn,
        "timing/sample_tokens_per_s": roll.num_tokens / t_sample,
        "timing/learn_tokens_per_s": n_tok / t_learn,  # old-logp recompute + update: a complete learner step
    })
    bad = [k for k in FINITE_KEYS if not math.isfinite(row[k])]
    if bad:  # one check per step, on numbers the step has synced anyway
        raise ValueError(f"rl step {step}: non-finite {', '.join(f'{k}={row[k]}' for k in bad)} (the learner or "
                         "sampler log-probs hold inf/NaN)")
    return row


@dataclass
class _GRPO:
    """Everything one GRPO run works with (built once by `_setup`)."""

    cfg: RLConfig
    learner: Learner
    sampler: Sampler
    opt: torch.optim.Optimizer
    tok: object
    task: object
    train: list
    train_prompts: list
    eval_set: list
    max_new: int
    correction: str | None
    name: str
    run_cfg: dict


def _setup(pretrained, data_dir, learner_profile, sampler_profile, correction, cfg, seed, device,
           sampler_engine) -> _GRPO:
    correction = parse_correction(correction)
    # real engines (peers): a `te:<mode>` learner (Transformer Engine), a `vllm:<mode>` sampler (vLLM); their
    # profile here is the one the run calibrates with (TE's host ops; the vLLM export's quantizer)
    te_mode, vllm_mode = te_learner.learner_mode(learner_profile), vllm_rollout.sampler_mode(sampler_profile)
    L = te_learner.get_mode(te_mode).host if te_mode else get_profile(learner_profile)
    S = vllm_rollout.get_mode(vllm_mode).profile if vllm_mode else get_profile(sampler_profile)
    if te_mode is None and not L.can_learn:
        raise ValueError(f"learner profile {L.name!r} has no backward (grad=None): it is a sampler profile")
    for require in ([te_learner.require] if te_mode else []) + ([vllm_rollout.require] if vllm_mode else []):
        require()  # before any work: one line naming what is missing
    model = load_pretrained(pretrained, dtype=torch.float32, device=device)  # names a missing / damaged checkpoint
    tok = load_tokenizer(Path(pretrained))
    train_set, heldout = load_split(data_dir, "train"), load_split(data_dir, "heldout")
    task = task_of(train_set)
    if task is not task_of(heldout):
        raise ValueError(f"{data_dir}: train.jsonl and heldout.jsonl hold different tasks")
    max_new = cfg.max_new_tokens or task.max_new_tokens(tok, train_set + heldout)
    if not max_new:
        raise ValueError(f"{data_dir} holds {task.name} problems without reference responses: set rl.max_new_tokens "
                         "(the response budget)")
    calibrate_static(model, (S, L), tok, train_set, cfg.calibration_examples, seed)
    # a TE learner is a copy of the model whose parameters share its storage (dense: the same tensors; experts:
    # per-expert views): the optimizer steps the copy's parameters, the sampler and checkpoints see the model
    learner = (te_learner.TELearner(model, te_mode, seed=tagged(seed, "learner"), share_weights=True) if te_mode
               else Learner(model, L, seed=tagged(seed, "learner")))
    opt = torch.optim.AdamW(learner.model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    track_optimizer(opt, model)  # quantized-weight caches are stale after each step
    if learner.model is not model:  # the TE copy's own modules (router, LM head) cache theirs
        track_optimizer(opt, learner.model)
    # vLLM: its own engine; else the command's execution (None: fast CUDA graphs on the GPU, the reference on CPU)
    engine = "vllm" if vllm_mode else resolve_engine(sampler_engine, device)
    learner_name, sampler_name = (learner_profile if te_mode else L.name), (sampler_profile if vllm_mode else S.name)
    run_cfg = {**config_to_dict(cfg), "seed": seed, "learner": learner_name, "sampler": sampler_name,
               "correction": correction or "none", "sampler_engine": engine, "pretrained": str(pretrained),
               "inputs": fingerprint(pretrained, Path(data_dir) / "train.jsonl", Path(data_dir) / "heldout.jsonl")}
    sampler = (vllm_rollout.VLLMRollout(model, vllm_mode, tokenizer=tok, seed=seed) if vllm_mode
               else make_sampler(model, S, engine=engine))
    return _GRPO(cfg, learner, sampler, opt, tok, task, train_set, task.prompt_ids(tok, train_set),
                 heldout_set(heldout, cfg.eval_n), max_new, correction,
                 run_name(learner_name, sampler_name, correction), run_cfg)


def train(*, pretrained: str | Path, data_dir: str | Path, out: str | Path, state_dir: str | Path | None = None,
          learner_profile: str, sampler_profile: str, correction: str | None, cfg: RLConfig, seed: int,
          experiment: str = "adhoc", device: str = "cpu", sampler_engine: str | None = None, progress: bool = True,
          stop_after: int | None = None, restart: bool = False, name: str | None = None,
          on_change: str = "error") -> dict:
    """Run (or resume) one GRPO run; returns summary metrics. ``sampler_engine``: the rollout engine (the
    command's execution; None: automatic for ``device``); ``stop_after``: stop after that many steps of this
    call, leaving a checkpoint (tests use it as a kill); ``restart`` sets the run in ``out`` aside and starts
    over; ``on_change``: what a run of another config in ``out`` gets (runs/state.py `resume`); ``name``: the
    run's name in summary.json (default ``run_name(learner, sampler, correction)``; the DAG passes its own, which
    carries the run seed)."""
    out = Path(out)
    state_dir = Path(state_dir) if state_dir is not None else out / "state"
    out.mkdir(parents=True, exist_ok=True)  # (every rank: idempotent)
    from minite_core.rl import distributed  # torchrun (WORLD_SIZE > 1) or a joined process group: R ranks

    dp = distributed.join()  # before the model is built: under torchrun it picks this rank's GPU
    run = _setup(pretrained, data_dir, learner_profile, sampler_profile, correction, cfg, seed, device, sampler_engine)
    side = OneProcess(run) if dp is None else distributed.DataParallelSide(run, dp)
    run = side.run
    model, S = run.sampler.model, run.sampler.profile  # full weights: evaluation, checkpoint, final/
    heldout = lambda: _heldout(run, model, S) if side.main else {}  # noqa: E731 - rank 0 evaluates
    with side.lock(state_dir):
        step, extra, log = side.resume(state_dir, restart, on_change, out)
        board = RunBoard(out if side.main else None, step)  # TensorBoard events beside metrics.csv (rank 0)
        dump_dir = out / ROLLOUTS if side.main and cfg.rollout_dump_every else None
        if dump_dir is not None:  # dumps past the resumed step: a killed process's, or an earlier run's
            prune_steps_after(dump_dir, step)
        if step == 0:
            extra["eval_initial"] = heldout()
        eval_keys = [f"eval/{k}" for k in extra["eval_initial"] if k != "correct"]
        bar = tqdm(total=cfg.steps, initial=step, desc=run.name, disable=not (progress and side.main),
                   mininterval=2.0)
        steps_this_call = 0
        while step < cfg.steps:
            step += 1
            row = rl_step(step, cfg=cfg, seed=seed, model=run.learner.model, learner=run.learner,
                          sampler=run.sampler, opt=run.opt, tok=run.tok, train=run.train,
                          train_prompts=run.train_prompts, correction=run.correction, max_new=run.max_new,
                          old_logprobs=side.old_logprobs, update=side.update, dump_dir=dump_dir, task=run.task)
            side.synced()
            row.update({k: None for k in eval_keys})
            if step % cfg.eval_every == 0 or step == cfg.steps:
                ev = heldout()
                row.update({f"eval/{k}": v for k, v in ev.items() if k != "correct"})
                extra["eval_last"] = ev
            log.append(row)
            board.log(row)
            bar.update(1)
            steps_this_call += 1
            killed = stop_after is not None and steps_this_call >= stop_after and step < cfg.steps
            if step % cfg.checkpoint_every == 0 or step == cfg.steps or killed:
                side.save(state_dir, step, extra)
                board.flush()
            if killed:
                bar.close()
                board.close()
                return {"stopped_at": step}
        bar.close()
        board.close()
        metrics = None
        if side.main:
            atomic_write_bytes(out / "metrics.csv", log.path.read_bytes())
            save_pretrained(model, out / FINAL, dtype=torch.float32)
            save_tokenizer(run.tok, out / FINAL)
            metrics = summarize(log.rows(), extra)
            write_result(out / "summary.json", stage="rl", experiment=experiment, config=run.run_cfg,
                         metrics=metrics, run=name or run.name)
        return side.share(metrics)


def _heldout(run: _GRPO, model, profile) -> dict:
    """One held-out evaluation under the sampler profile: its eval/* metrics + the per-problem outcomes (kept in
    the resume state, for the paired gain)."""
    ev = evaluate(model, profile, run.tok, run.eval_set, max_new_tokens=run.max_new,
                  batch_size=run.cfg.eval_batch_size, sampler=run.sampler)  # the rollout engine: graphs reused
    return {**ev.metrics(), "correct": list(ev.correct)}


def heldout_summary(initial: dict | None, final: dict | None) -> dict:
    """summary.json's held-out numbers from the first and last evaluation (rl/heldout.py): n, accuracies and
    their binomial SEs, the paired gain and its SE, the final accuracy per level."""
    nan = math.nan
    init, last = initial or {}, final or {}
    out = {"heldout_decoding": "greedy", "heldout_n": len(init.get("correct", ())),
           "heldout_acc_initial": init.get("acc", nan), "heldout_se_initial": init.get("se", nan),
           "heldout_acc_final": last.get("acc", nan), "heldout_se_final": last.get("se", nan),
           "heldout_gain": nan, "heldout_gain_se": nan}
    if init.get("correct") and last.get("correct"):
        out["heldout_gain"], out["heldout_gain_se"] = paired_gain(init["correct"], last["correct"])
    out.update({f"heldout_acc_final/{k[4:]}": v for k, v in last.items() if k.startswith("acc/")})
    return out


def summarize(rows: list[dict[str, str]], extra: dict) -> dict:
    """Run-level numbers for summary.json: first/last-quarter reward, held-out accuracy before/after
    (`heldout_summary`), mismatch mean/max over steps, median throughput."""
    def col(key):
        vals = [float(r[key]) for r in rows if r.get(key, "") not in ("", "nan")]
        return vals

    q = max(len(rows) // 4, 1)
    first, last = rows[:q], rows[-q:]
    mean = lambda rs, k: statistics.fmean(float(r[k]) for r in rs) if rs else math.nan  # noqa: E731
    out = {"steps": len(rows),
           "reward_first_quarter": mean(first, "reward/mean"), "reward_last_quarter": mean(last, "reward/mean"),
           **heldout_summary(extra.get("eval_initial"), extra.get("eval_last"))}
    for key in rows[0] if rows else []:
        if key.startswith("mismatch/") and col(key):
            out[f"{key}_mean"] = statistics.fmean(col(key))
            out[f"{key}_max"] = max(col(key))
    for key in ("timing/sample_tokens_per_s", "timing/learn_tokens_per_s"):
        if rows and col(key):
            out[f"{key}_median"] = statistics.median(col(key))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="minite rl", description=__doc__.splitlines()[0])
    p.add_argument("--pretrained", required=True, help="transformers checkpoint dir (with tokenizer)")
    p.add_argument("--data", required=True, help="`minite data` output directory")
    p.add_argument("--out", required=True, help="run directory (metrics.csv, summary.json, final/)")
    p.add_argument("--learner", required=True, help="learner profile, e.g. te-nvfp4")
    p.add_argument("--sampler", required=True, help="sampler profile, e.g. vllm-nvfp4")
    p.add_argument("--correction", default="none", help="none | tis | mis-token | mis-seq")
    p.add_argument("--name", default=None, help="run name in summary.json (default learner__sampler__correction)")
    add_run_args(p, "RLConfig fields as JSON (the experiment's `rl:` minus runs)")
    args, cfg = parse_run_args(p, argv, RLConfig)
    metrics = train(pretrained=args.pretrained, data_dir=args.data, out=args.out, state_dir=args.state,
                    learner_profile=args.learner, sampler_profile=args.sampler, correction=args.correction,
                    cfg=cfg, seed=args.seed, experiment=args.experiment, device=args.device,
                    sampler_engine=args.execution.sampler_engine, progress=not args.no_progress,
                    restart=args.restart, name=args.name, on_change="restart" if args.restart_if_changed else "error")
    if torch.distributed.is_initialized():  # torchrun: every rank returns rank 0's summary
        torch.distributed.destroy_process_group()
    if int(os.environ.get("RANK", "0")):
        return 0
    print(f"rl: {metrics['steps']} steps, reward {metrics['reward_first_quarter']:.3f} -> "
          f"{metrics['reward_last_quarter']:.3f}, held-out {metrics['heldout_acc_initial']:.3f} -> "
          f"{metrics['heldout_acc_final']:.3f}, k3 mean {metrics.get('mismatch/k3_mean', math.nan):.2e}")
    return 0

"""Held-out evaluation of a policy: greedy accuracy on a fixed set of n problems, its standard error, and the paired
gain between two evaluations of the same set — the numbers an RL claim ("BF16 learns", "this pair tracks BF16")
rests on.

What:
- ``heldout_set(examples, n)``: the evaluation set, chosen once per run: n problems taken round-robin over the
  levels in file order (per-level counts differ by at most one; your own math data: by data source, task/tasks.py), so every evaluation of a run, and every run of an
  experiment, scores the same problems. n = 0: the whole split.
- ``evaluate(model, profile, tok, examples, ...)``: greedy generation of every problem through the sampler engine
  (``engines.make_sampler``: the fast CUDA-graph decode on the GPU, the reference on CPU; or the caller's own
  sampler, e.g. an RL run's, whose captured graphs it then reuses), batched ``batch_size`` rows at a time, never a
  Python loop per problem; -> ``Heldout`` with the per-problem outcome (kept so that two evaluations can be
  compared problem by problem).
- ``binomial_se(acc, n)`` = sqrt(acc (1 - acc) / n): the standard error of an accuracy over n problems drawn from
  the task's distribution (512 problems: <= 2.2 points, at 50%). ``paired_gain(before, after)`` = mean of the
  per-problem difference and its standard error std(d) / sqrt(n) — smaller than sqrt(2) x the SE of either
  accuracy, because the problems that both evaluations solve (or both fail) cancel.

Greedy, not sampled (temperature 0; the engine's seed is fixed at 0 and unused by greedy decode), because:
- it is deterministic given the weights and the profile: the only noise in a curve is which n problems were
  drawn (the binomial SE), not the sampling noise of one draw per problem, and two evaluations of one run differ
  only by what the weights learned;
- it is the measure of the base model's band (pretraining's stopping rule, `pretrain.json`) and of lm-eval's
  `heldout_gen` exact match, so "held-out accuracy after RL >= base + 5 points" compares like with like.
What it does not measure: the expected reward at the rollout temperature, which is what GRPO maximises (the
``reward/*`` columns of the step log are that, on training prompts). Sharpening the distribution raises the
sampled reward without moving the greedy answer, so a greedy gain is the conservative reading of learning.
Run under the *sampler* profile: the accuracy of the policy as it is served (for an NVFP4 pair, quantized).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from minite_core.engines import make_sampler
from minite_core.profiles import get_profile
from minite_core.task.tasks import task_of


def heldout_set(examples: list[dict], n: int) -> list[dict]:
    """The first n problems in round-robin level order (level by level in file order); all when n == 0."""
    if n < 0:
        raise ValueError(f"held-out set size must be >= 0, got {n}")
    if n > len(examples):
        raise ValueError(f"asked for {n} held-out problems but the held-out split has {len(examples)}: lower "
                         "rl.eval_n or raise data.n_heldout_per_level")
    if n == 0:
        return list(examples)
    task = task_of(examples)
    by_group: dict[str, list[dict]] = {}
    for e in examples:
        by_group.setdefault(task.group(e), []).append(e)
    # levels in index order (as the task lists them), other groups (data sources) in order of first appearance
    queues = [iter(v) for v in sorted(by_group.values(), key=lambda v: v[0].get("level", 0)
                                      if isinstance(v[0].get("level"), int) else 0)]
    out: list[dict] = []
    while len(out) < n:  # terminates: n <= len(examples)
        for q in queues:
            e = next(q, None)
            if e is not None and len(out) < n:
                out.append(e)
    return out


def binomial_se(acc: float, n: int) -> float:
    """Standard error of an accuracy over n independent problems (nan for n = 0)."""
    return math.sqrt(acc * (1.0 - acc) / n) if n else math.nan


def paired_gain(before: list[bool], after: list[bool]) -> tuple[float, float]:
    """(mean(after - before), its standard error) over the same problems, in the same order."""
    if len(before) != len(after) or not before:
        raise ValueError(f"paired gain needs two non-empty evaluations of one set, got {len(before)} and "
                         f"{len(after)} outcomes")
    d = [float(a) - float(b) for a, b in zip(after, before)]
    n = len(d)
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var / n)


@dataclass(frozen=True)
class Heldout:
    """One evaluation: per-problem outcomes (in set order), their groups (levels / sources), mean response length."""

    correct: tuple[bool, ...]
    groups: tuple[str, ...]
    response_len: float

    @property
    def n(self) -> int:
        return len(self.correct)

    @property
    def acc(self) -> float:
        return sum(self.correct) / self.n if self.n else math.nan

    def metrics(self) -> dict[str, float]:
        """{"acc", "se", "acc/<group>", "response_len"}: the step log's ``eval/*`` columns."""
        out = {"acc": self.acc, "se": binomial_se(self.acc, self.n), "response_len": self.response_len}
        for name in dict.fromkeys(self.groups):
            hits = [c for c, g in zip(self.correct, self.groups) if g == name]
            out[f"acc/{name}"] = sum(hits) / len(hits)
        return out


def evaluate(model, profile, tok, examples: list[dict], *, max_new_tokens: int, batch_size: int = 512,
             sampler=None, engine: str | None = None) -> Heldout:
    """Greedy accuracy of ``model`` under ``profile`` on ``examples`` (module docstring), through ``sampler`` (a
    Sampler on this model under this profile) or a new ``make_sampler(engine=engine)`` one. Leaves the model in
    the train/eval mode and under the profile it had (the sampler's profile is scoped to its call)."""
    if not examples:
        raise ValueError("no held-out problems to evaluate (an empty set)")
    profile = get_profile(profile)
    if sampler is None:
        sampler = make_sampler(model, profile, engine=engine)
    elif sampler.model is not model or sampler.profile != profile:
        raise ValueError(f"evaluate: the sampler runs {sampler.profile.name!r} on another model or profile than "
                         f"the {profile.name!r} asked for")
    was_training = model.training
    task = task_of(examples)
    out = sampler.generate(task.prompt_ids(tok, examples), max_new_tokens=max_new_tokens, temperature=0.0, seed=0,
                           batch_size=batch_size, stop_ids=task.stop_ids(tok))
    correct = tuple(task.reward(task.decode(tok, r), e) == 1.0 for r, e in zip(out.response_ids, examples))
    model.train(was_training)
    return Heldout(correct, tuple(task.group(e) for e in examples), sum(map(len, out.response_ids)) / len(examples))

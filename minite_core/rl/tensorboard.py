"""TensorBoard event files of an RL run, beside its metrics.csv, under the names RL researchers read curves by.

`tensorboard --logdir results/<experiment>/rl` then shows every run (one sub-folder each) on one set of axes.
Written with TensorBoard's own writer (`torch.utils.tensorboard.SummaryWriter`, which needs the `tensorboard`
package), one scalar per metric and step, rank 0 only.

Names: where a framework logs the same quantity, its name (verl's trainer metrics, verl/trainer/ppo/metric_utils.py
and verl/workers/actor/dp_actor.py: `critic/score/mean`, `response_length/mean|max|clip_ratio`, `actor/pg_loss`,
`actor/pg_clipfrac`, `actor/pg_clipfrac_lower`, `actor/ppo_kl`, `actor/entropy`, `actor/grad_norm`, `timing_s/gen`;
NeMo-RL's `train/gen_kl_error`, `train/token_mult_prob_error`, `train/js_divergence_error`; verl's
`rollout_corr/*`: already the CSV's columns, engines.framework_metrics), else the CSV's own (`mismatch/*`,
`reward/acc`, `eval/*`, ...). response_length/clip_ratio is the fraction of responses cut at the length cap,
1 − response/finished.

Resume: the writer starts with `purge_step` = the first step this process logs, so TensorBoard drops whatever an
earlier, killed process logged from that step on (steps after its last checkpoint, replayed now): every step
shows once. A restart (`--restart`) purges from step 1.
"""
from __future__ import annotations

import math
from pathlib import Path

RENAMED = {  # metrics.csv column -> the framework's name
    "reward/mean": "critic/score/mean",
    "response/len_mean": "response_length/mean",
    "response/len_max": "response_length/max",
    "actor/clipfrac": "actor/pg_clipfrac",
    "actor/clipfrac_low": "actor/pg_clipfrac_lower",
    "timing/sample_s": "timing_s/gen",
}


def scalars(row: dict) -> dict[str, float]:
    """One metrics.csv row -> {TensorBoard tag: value}; empty cells (eval columns off evaluation steps) and
    non-numbers are left out."""
    out = {}
    for key, value in row.items():
        if key == "step" or value is None or value == "" or isinstance(value, bool):
            continue
        try:
            out[RENAMED.get(key, key)] = float(value)
        except (TypeError, ValueError):
            continue
    if "response/finished" in row and isinstance(row["response/finished"], (int, float)):
        out["response_length/clip_ratio"] = 1.0 - float(row["response/finished"])
    return out


class RunBoard:
    """The run's event-file writer; `RunBoard(None, ...)` (a rank other than 0) writes nothing."""

    def __init__(self, log_dir: str | Path | None, resumed_step: int):
        self.writer = None
        if log_dir is not None:
            from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package (pyproject)

            self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=resumed_step + 1)

    def log(self, row: dict) -> None:
        if self.writer is None:
            return
        step = int(row["step"])
        for tag, value in scalars(row).items():
            if not math.isnan(value):
                self.writer.add_scalar(tag, value, step)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

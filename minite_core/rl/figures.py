"""RL curves per engine pair: reward, held-out accuracy and learner<->sampler mismatch over steps (seaborn PNG).

Reads only the results contract (each run directory's ``metrics.csv`` + ``summary.json``), so any run that writes
those files — an external framework included — appears as one more line. One figure, four panels sharing the step
axis, hue = run (``{learner}__{sampler}__{correction}``):
  reward/mean           training reward (rolling mean over ``smooth`` steps: the per-step value is B*G samples)
  eval/acc              held-out greedy accuracy under the sampler profile (evaluation steps only, + step 0)
  mismatch/k3           per-step k3 of learner old log-probs vs sampler log-probs, log scale (the paper's gap)
  mismatch/ratio_outside_C  fraction of tokens whose ratio leaves [1/2, 2] (what MIS would reject)

Usage: ``python -m minite_core.rl.figures --runs results/smoke/rl/* --out results/smoke/rl/curves.png``.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: the DAG runs without a display

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

PANELS = (("reward/mean", "train reward", False), ("eval/acc", "held-out accuracy (sampler, greedy)", False),
          ("mismatch/k3", "mismatch k3 (learner vs sampler)", True),
          ("mismatch/ratio_outside_C", "tokens with ratio outside [1/2, 2]", False))


def load_runs(run_dirs: list[str | Path]) -> pd.DataFrame:
    """Long-format frame: one row per (run, step) with the CSV's columns + ``run``; step 0 carries the initial
    held-out accuracy from summary.json."""
    frames = []
    for d in map(Path, run_dirs):
        summary = json.loads((d / "summary.json").read_text())
        name = summary.get("run", d.name)
        df = pd.read_csv(d / "metrics.csv")
        init = summary["metrics"].get("heldout_acc_initial")
        if init is not None:
            df = pd.concat([pd.DataFrame({"step": [0], "eval/acc": [init]}), df], ignore_index=True)
        df["run"] = name
        frames.append(df)
    if not frames:
        raise ValueError("no run directories given")
    return pd.concat(frames, ignore_index=True)


def plot(df: pd.DataFrame, out: str | Path, smooth: int = 4) -> Path:
    sns.set_theme(style="whitegrid", context="paper")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    df = df.sort_values(["run", "step"])
    for ax, (key, title, log) in zip(axes.flat, PANELS):
        sub = df[["run", "step", key]].dropna()
        if key == "reward/mean":
            sub = sub.assign(**{key: sub.groupby("run")[key].transform(
                lambda s: s.rolling(smooth, min_periods=1).mean())})
        if key == "mismatch/k3":
            sub = sub[sub[key] > 0]  # log axis; k3 >= 0 and exactly 0 only for bit-identical engines
        sns.lineplot(data=sub, x="step", y=key, hue="run", marker="o" if key == "eval/acc" else None, ax=ax,
                     legend=ax is axes.flat[0])
        ax.set_title(title)
        ax.set_ylabel(key)
        if log and not sub.empty:
            ax.set_yscale("log")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if axes.flat[0].get_legend() is not None:
        axes.flat[0].get_legend().remove()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minite_core.rl.figures", description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", required=True, help="RL run directories (metrics.csv + summary.json)")
    p.add_argument("--out", required=True, help="PNG path")
    p.add_argument("--smooth", type=int, default=4, help="rolling-mean window of the reward panel (steps)")
    args = p.parse_args(argv)
    plot(load_runs(args.runs), args.out, smooth=args.smooth)
    print(f"figure -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

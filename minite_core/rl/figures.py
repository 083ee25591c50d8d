"""RL curves per engine pair with seed bands: reward, held-out accuracy, response length, entropy and mismatch over
steps (one PNG).

Reads only the results contract (each run directory's ``metrics.csv`` + ``summary.json``), so any run that writes
those files — an external framework included — appears as one more line. Runs are grouped by *pair* = (learner,
sampler, correction) from ``summary.json``'s config; the seeds of one pair (``rl.runs[i].seed``) make its band:
the line is the mean over seeds at each step, the shaded band their min–max range (no band for one seed: there is
nothing to spread). Panels, sharing the step axis:
  reward/mean           training reward (rolling mean over ``smooth`` steps: the per-step value is B*G samples)
  eval/acc              held-out greedy accuracy under the sampler profile (evaluation steps, + step 0)
  response/len_mean     mean sampled response length (tokens)
  actor/entropy         learner entropy of the sampled tokens (token mean)
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

PANELS = (("reward/mean", "train reward (rolling mean)", False),
          ("eval/acc", "held-out accuracy (sampler, greedy)", False),
          ("response/len_mean", "response length (tokens)", False),
          ("actor/entropy", "learner entropy", False),
          ("mismatch/k3", "mismatch k3 (learner vs sampler)", True),
          ("mismatch/ratio_outside_C", "tokens with ratio outside [1/2, 2]", False))


def pair_label(config: dict) -> str:
    """``learner:sampler`` (+ ``+<correction>``): the name a pair's seeds share."""
    corr = config.get("correction", "none")
    return f"{config['learner']}:{config['sampler']}" + ("" if corr in (None, "none") else f" +{corr}")


def load_runs(run_dirs: list[str | Path]) -> pd.DataFrame:
    """Long-format frame: one row per (run, step) with the CSV's columns + ``run``, ``pair``, ``seed``; step 0
    carries the initial held-out accuracy from summary.json."""
    frames = []
    for d in map(Path, run_dirs):
        summary = json.loads((d / "summary.json").read_text())
        df = pd.read_csv(d / "metrics.csv")
        init = summary["metrics"].get("heldout_acc_initial")
        if init is not None:
            df = pd.concat([pd.DataFrame({"step": [0], "eval/acc": [init]}), df], ignore_index=True)
        cfg = summary.get("config", {})
        df["run"] = summary.get("run", d.name)
        df["pair"] = pair_label(cfg) if "learner" in cfg else df["run"]
        df["seed"] = cfg.get("seed", 0)
        frames.append(df)
    if not frames:
        raise ValueError("no run directories given")
    return pd.concat(frames, ignore_index=True)


def seed_bands(df: pd.DataFrame, key: str, smooth: int = 1) -> pd.DataFrame:
    """Per (pair, step): ``mean``, ``lo``, ``hi`` (min / max over the pair's runs, one per seed) and ``seeds`` (how
    many runs have a value) of column ``key``; each run's series is first smoothed by a rolling mean over
    ``smooth`` of its own values."""
    run = "run" if "run" in df else "seed"
    sub = df[["pair", run, "step", key]].dropna().sort_values(["pair", run, "step"])
    if smooth > 1:
        sub = sub.assign(**{key: sub.groupby(["pair", run])[key].transform(
            lambda s: s.rolling(smooth, min_periods=1).mean())})
    g = sub.groupby(["pair", "step"])[key]
    return pd.DataFrame({"mean": g.mean(), "lo": g.min(), "hi": g.max(), "seeds": g.count()}).reset_index()


def plot(df: pd.DataFrame, out: str | Path, smooth: int = 4) -> Path:
    sns.set_theme(style="whitegrid", context="paper")
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5), sharex=True)
    pairs = sorted(df["pair"].unique())
    colors = dict(zip(pairs, sns.color_palette(n_colors=len(pairs))))
    for ax, (key, title, log) in zip(axes.flat, PANELS):
        if key not in df:
            ax.set_visible(False)
            continue
        bands = seed_bands(df, key, smooth if key == "reward/mean" else 1)
        if key == "mismatch/k3":
            bands = bands[bands["mean"] > 0]  # log axis; k3 >= 0 and exactly 0 only for bit-identical engines
        for pair, b in bands.groupby("pair"):
            n = int(b["seeds"].max())
            ax.plot(b["step"], b["mean"], color=colors[pair], marker="o" if key == "eval/acc" else None,
                    markersize=3, label=f"{pair} ({n} seed{'s' if n > 1 else ''})")
            if n > 1:
                ax.fill_between(b["step"], b["lo"], b["hi"], color=colors[pair], alpha=0.2, linewidth=0)
        ax.set_title(title)
        ax.set_ylabel(key)
        if log and not bands.empty:
            ax.set_yscale("log")
    handles = {}  # one legend entry per pair, from whichever panel drew it
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), 4), frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
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

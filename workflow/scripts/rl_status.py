"""Progress of the RL runs under a results folder, in one screen and in well under a second (`h200_rl.sh status`).

Per run directory (`<results>/rl/*`, and `<results>/../sweeps/*/rl/*` with --sweeps): the step reached (from the
live step log in `state/`, or the final `metrics.csv`), the training reward (mean of the last 10 steps), the last
held-out accuracy and its step, the median seconds per step (sampling + learning, last 10 steps) and, where the
total is known (`--config`: the experiment's rl.steps), the time left at that pace (evaluations excluded).
Reads only CSV / JSON files: no torch, so it answers while the GPU is busy.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

import yaml

RL_STEPS_DEFAULT = 24  # RLConfig.steps (not imported: this must not load torch)


def _rows(run: Path) -> list[dict]:
    for path in (run / "state" / "metrics.csv", run / "metrics.csv"):
        if path.exists():
            with path.open(newline="") as fh:
                return list(csv.DictReader(fh))
    return []


def _float(v) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def run_line(run: Path, total: int | None) -> str:
    rows = _rows(run)
    done = (run / "summary.json").exists()
    if done:
        m = json.loads((run / "summary.json").read_text())["metrics"]
        total = m.get("steps", total)
    step = int(rows[-1]["step"]) if rows else 0
    last = rows[-10:]
    reward = [x for x in (_float(r.get("reward/mean")) for r in last) if x is not None]
    evals = [(int(r["step"]), _float(r["eval/acc"])) for r in rows if _float(r.get("eval/acc")) is not None]
    step_s = [x for x in (_float(r.get("timing/sample_s", "")) for r in last) if x is not None]
    learn_s = [x for x in (_float(r.get("timing/learn_s", "")) for r in last) if x is not None]
    pace = statistics.median(a + b for a, b in zip(step_s, learn_s)) if step_s and learn_s else None
    parts = [f"{run.name:<44}", f"step {step}" + (f"/{total}" if total else ""),
             "done" if done else ("running" if rows else "waiting")]
    if reward:
        parts.append(f"reward {statistics.fmean(reward):.3f}")
    if evals:
        parts.append(f"held-out {evals[-1][1]:.3f} @{evals[-1][0]}")
    if done:
        m = json.loads((run / "summary.json").read_text())["metrics"]
        if m.get("heldout_gain") is not None:
            parts.append(f"gain {m['heldout_gain']:+.3f} ± {m.get('heldout_gain_se', float('nan')):.3f}")
    if pace is not None:
        parts.append(f"{pace:.2f} s/step")
        if total and not done:
            parts.append(f"ETA {pace * (total - step) / 60:.1f} min")
    return "  ".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", required=True, help="results/<experiment>")
    p.add_argument("--config", default=None, help="experiment YAML (for the total steps)")
    p.add_argument("--sweeps", action="store_true", help="also the runs of results/sweeps/*")
    args = p.parse_args(argv)
    results = Path(args.results)
    total = None
    if args.config:
        total = (yaml.safe_load(Path(args.config).read_text()).get("rl") or {}).get("steps", RL_STEPS_DEFAULT)
    groups = [("rl", sorted(p for p in (results / "rl").glob("*") if p.is_dir()), total)]
    if args.sweeps:
        for sweep in sorted((results.parent / "sweeps").glob("*")):
            groups.append((f"sweep {sweep.name}", sorted(p for p in (sweep / "rl").glob("*") if p.is_dir()), None))
            if (sweep / "sweep.csv").exists():
                groups[-1][1].append(sweep / "sweep.csv")
    for title, runs, n in groups:
        if not runs:
            continue
        print(f"-- {title}")
        for run in runs:
            print("  " + (f"{run} written" if run.is_file() else run_line(run, n)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

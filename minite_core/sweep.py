"""`minite sweep`: a short grid of GRPO runs (and, where the grid varies them, task data and base models) that
chooses an experiment's RL settings; its result is committed beside the config that uses it.

Sweep file (YAML; experiments/sweeps/*.yaml):

    experiment: experiments/smoke.yaml   # the base: its data / pretrain / rl sections are every point's defaults,
                                         # its device / kernels / seed are the run options
    out: results/sweeps/smoke-cpu        # everything the sweep writes
    runs: [bf16:bf16]                    # engine pairs run at every point (default: bf16:bf16)
    seeds: [0]                           # RL run seeds (default: the experiment's seed)
    grid:                                # "section.field": [values]; every combination is a point
      data.levels: [[add3]]              #   (or a list of such mappings: the union of their products;
      rl.lr: [1.0e-4, 3.0e-4]            #   `pairs: [...]` in one of them: its points' pairs instead of `runs`)
    data: null                           # or an existing `minite data` dir and `minite pretrain` model dir: the
    pretrained: null                     #   grid may then vary rl.* only (the H200 sweep reuses the DAG's)
    jobs: 1                              # commands run at once (subprocesses; on the GPU they share it)

What runs: `minite data` per distinct data section, `minite pretrain` per distinct (data, pretrain) pair, then
`minite rl` per (point, pair, seed) — each a subprocess with its own log, in a directory named by a hash of all
that defines it (sections, pair, seed, run options). A rerun therefore skips what finished, resumes what was killed
(the commands' own exact resume) and never reuses a run of a changed grid.

What it writes: `sweep.csv` and `sweep.json` (results contract, stage "sweep"): one row per (point, pair, seed)
with the varied values and the commit that ran it (a rerun after a code change reuses finished runs: the column
says so); the base model's steps and greedy held-out accuracy (`pretrain.json`); the run's
held-out accuracy before / after on `heldout_n` problems, the paired gain and its SE (rl/heldout.py), the
held-out curve (`curve`: "step:acc" at every evaluation, so one long run also tells what fewer steps would
give), the first / last-quarter training reward, the median seconds per RL step (sampling + learning, the
step log's `timing/*`); the wall and CPU seconds of its pretrain and RL commands (CPU seconds from
the kernel's per-child accounting, `os.wait4`: on a shared machine they measure the work, wall seconds the wait).
Rows are sorted by `gain_lcb` = gain − 2 SE (the gain's one-sided ~97.7% lower bound), best first, so a lucky
noisy point does not win over a reliably learning one; `best` names the top row.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import io
import itertools
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from minite_core.experiment import pretrain_section, rl_runs
from minite_core.rule_args import run_options
from minite_core.profiles import PROFILES
from minite_core.results import atomic_write_bytes, config_from_dict, read_result, write_result
from minite_core.rl.pretrain import PretrainConfig
from minite_core.rl.train import RLConfig
from minite_core.task.data import DataConfig

SECTIONS = {"data": DataConfig, "pretrain": PretrainConfig, "rl": RLConfig}
SPEC_KEYS = {"experiment", "out", "runs", "seeds", "grid", "data", "pretrained", "jobs"}


@dataclass(frozen=True)
class Sweep:
    """A parsed sweep file: the base experiment, the grid, and where to write."""

    base: dict  # the experiment YAML (sections as written; the commands fill defaults)
    out: Path
    runs: dict[str, dict]  # rl_runs() of the pairs
    seeds: tuple[int, ...]
    grids: list[dict[str, list]]  # each a product of its keys' values; the sweep is their union
    data: Path | None
    pretrained: Path | None
    jobs: int
    spec: dict  # the file as read (recorded in sweep.json)


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file; ValueError naming the key for anything it cannot run."""
    path = Path(path)
    spec = yaml.safe_load(path.read_text()) or {}
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: a sweep file is a mapping (experiment, out, grid, ...)")
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; known: {sorted(SPEC_KEYS)}")
    for key in ("experiment", "out"):
        if not spec.get(key):
            raise ValueError(f"{path}: `{key}` is required")
    base = yaml.safe_load(Path(spec["experiment"]).read_text())
    grids = spec.get("grid") or {}
    grids = [grids] if isinstance(grids, dict) else grids
    if not isinstance(grids, list) or not all(isinstance(g, dict) for g in grids):
        raise ValueError(f"{path}: `grid` is a mapping {{section.field: [values]}} or a list of such mappings")
    for grid in grids:
        for key, values in grid.items():
            if key == "pairs":
                continue
            section, _, name = key.partition(".")
            if section not in SECTIONS or name not in {f.name for f in fields(SECTIONS[section])}:
                raise ValueError(f"{path}: grid key {key!r} is not <data|pretrain|rl>.<field of DataConfig / "
                                 "PretrainConfig / RLConfig>")
            if not isinstance(values, list) or not values:
                raise ValueError(f"{path}: grid.{key} must be a non-empty list of values")
    keys = [k for g in grids for k in g if k != "pairs"]
    reuse = spec.get("pretrained"), spec.get("data")
    if any(reuse) and not all(reuse):
        raise ValueError(f"{path}: `pretrained` and `data` go together (an existing model and its task data)")
    if all(reuse) and any(not k.startswith("rl.") for k in keys):
        raise ValueError(f"{path}: with `pretrained` / `data` given the grid may vary rl.* only, got "
                         f"{sorted(k for k in keys if not k.startswith('rl.'))}")
    runs = _pairs(base, spec.get("runs") or ["bf16:bf16"])
    for grid in grids:
        if "pairs" in grid:
            _pairs(base, grid["pairs"])  # checked here, used by points()
    jobs = int(spec.get("jobs", 1))
    if jobs < 1:
        raise ValueError(f"{path}: jobs must be >= 1, got {jobs}")
    return Sweep(base, Path(spec["out"]), runs, tuple(spec.get("seeds") or [base.get("seed", 0)]), grids,
                 Path(reuse[1]) if all(reuse) else None, Path(reuse[0]) if all(reuse) else None, jobs, spec)


def _pairs(base: dict, entries: list) -> dict[str, dict]:
    """{run name: spec} of engine-pair entries (the rl.runs forms; experiment.rl_runs checks the names)."""
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"sweep pairs must be a non-empty list of learner:sampler[:correction], got {entries!r}")
    runs = rl_runs({"seed": base.get("seed", 0), "rl": {"runs": entries}})
    for name, spec in runs.items():
        for role in ("learner", "sampler"):
            if spec[role] not in PROFILES:
                raise ValueError(f"sweep pair {name}: unknown {role} profile {spec[role]!r}; registered: "
                                 f"{', '.join(sorted(PROFILES))}")
    return runs


def points(sweep: Sweep) -> list[tuple[dict[str, dict], dict[str, dict]]]:
    """Every grid combination (the union over `grids`, duplicates once) as ({"data", "pretrain", "rl"} sections —
    the base's with the point's values —, its pairs). Each config is built here, so a bad value fails before
    anything runs."""
    out, seen = [], set()
    for grid in sweep.grids:
        runs = _pairs(sweep.base, grid["pairs"]) if "pairs" in grid else sweep.runs
        grid = {k: v for k, v in grid.items() if k != "pairs"}
        keys = list(grid)
        for values in itertools.product(*(grid[k] for k in keys)):
            sections = {s: dict(sweep.base.get(s) or {}) for s in SECTIONS}
            sections["pretrain"] = pretrain_section(sweep.base)  # the RL base model's (`pretrain.size` resolved)
            for dag_key in ("runs", "gpus_per_job"):  # DAG keys, not RLConfig fields
                sections["rl"].pop(dag_key, None)
            for key, value in zip(keys, values):
                section, _, name = key.partition(".")
                sections[section][name] = value
            for s, cls in SECTIONS.items():
                try:
                    config_from_dict(cls, sections[s])
                except (TypeError, ValueError) as e:
                    raise ValueError(f"sweep point {dict(zip(keys, values))}: {s}: {e}") from None
            key = json.dumps([sections, runs], sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append((sections, runs))
    return out


def varied_keys(sweep: Sweep) -> list[str]:
    """The grid keys, in first-seen order (the CSV's leading columns)."""
    return list(dict.fromkeys(k for g in sweep.grids for k in g if k != "pairs"))


def _hash(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]


def _run_options(base: dict, seed: int | None = None, compute: bool = True) -> list[str]:
    """The base experiment's run options (rule_args.run_options; schema defaults for keys it leaves out)."""
    return run_options({"device": "cpu", "kernels": "auto", "seed": 0, **base}, seed=seed, compute=compute).split()


def _command(args: list[str], directory: Path, log: Path) -> dict:
    """Run `minite <args>` with its output in `log`; -> {"wall_s", "cpu_s"} of this call, accumulated over calls in
    `directory`/sweep_cost.json (a resumed command adds to what its killed call spent). Raises on failure."""
    directory.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "ab") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "minite_core.cli", *args], stdout=fh, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)  # per-child CPU time (the kernel's accounting)
        proc.returncode = os.waitstatus_to_exitcode(status)
    cost_file = directory / "sweep_cost.json"
    cost = json.loads(cost_file.read_text()) if cost_file.exists() else {"wall_s": 0.0, "cpu_s": 0.0}
    cost = {"wall_s": cost["wall_s"] + time.perf_counter() - t0,
            "cpu_s": cost["cpu_s"] + usage.ru_utime + usage.ru_stime}
    atomic_write_bytes(cost_file, json.dumps(cost).encode())
    if proc.returncode:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"minite {args[0]} failed (exit {proc.returncode}, log {log}): {tail[0]}")
    return cost


def _cost(directory: Path) -> dict:
    f = directory / "sweep_cost.json"
    return json.loads(f.read_text()) if f.exists() else {"wall_s": math.nan, "cpu_s": math.nan}


def _data(sweep: Sweep, sec: dict) -> Path:
    """The `minite data` directory of a point's data section (made once under out/)."""
    data = sweep.out / "data" / _hash(sec["data"], sweep.base.get("seed", 0))
    if not (data / "data.json").exists():
        _command(["data", "--out", str(data), *_run_options(sweep.base, compute=False), "--config-json",
                  json.dumps(sec["data"])], data, sweep.out / "logs" / f"data-{data.name}.log")
    return data


def _base_model(sweep: Sweep, sec: dict) -> tuple[Path, Path]:
    """(data dir, pretrained model dir) of a point: the given ones, or made (once) under out/."""
    if sweep.pretrained is not None:
        return sweep.data, sweep.pretrained
    data = _data(sweep, sec)
    pre = sweep.out / "pretrain" / _hash(sec["data"], sec["pretrain"], _run_options(sweep.base))
    if not (pre / "pretrain.json").exists():
        _command(["pretrain", "--data", str(data), "--out", str(pre), "--state", str(pre / "state"), "--threads",
                  "1", "--no-progress", "--restart-if-changed", *_run_options(sweep.base), "--config-json",
                  json.dumps(sec["pretrain"])],
                 pre, sweep.out / "logs" / f"pretrain-{pre.name}.log")
    return data, pre / "model"


def _rl(sweep: Sweep, sec: dict, name: str, spec: dict, seed: int, data: Path, model: Path) -> Path:
    run = sweep.out / "rl" / f"{name}__{_hash(sec, spec, seed, str(model), _run_options(sweep.base))}"
    if not (run / "summary.json").exists():
        _command(["rl", "--pretrained", str(model), "--data", str(data), "--out", str(run), "--name", name,
                  "--learner", spec["learner"], "--sampler", spec["sampler"], "--correction", spec["correction"],
                  "--threads", "1", "--no-progress", "--restart-if-changed", *_run_options(sweep.base, seed),
                  "--config-json", json.dumps(sec["rl"])], run, sweep.out / "logs" / f"rl-{run.name}.log")
    return run


def _row(sweep: Sweep, sec: dict, name: str, seed: int, model: Path, run: Path) -> dict:
    res = read_result(run / "summary.json", stage="rl")
    m = res["metrics"]
    row = {key: json.dumps(sec[key.split(".")[0]].get(key.split(".", 1)[1])) for key in varied_keys(sweep)}
    row.update({"run": name, "seed": seed, "dir": run.name, "commit": res["env"].get("commit")})
    pre_json = model.parent / "pretrain.json"
    if pre_json.exists():
        pm = read_result(pre_json, stage="pretrain")["metrics"]
        row.update({"pretrain_steps": pm["steps"], "base_acc": pm["heldout_accuracy"]})
        row.update({f"pretrain_{k}": v for k, v in _cost(model.parent).items()})
    gain, se = m.get("heldout_gain", math.nan), m.get("heldout_gain_se", math.nan)
    row.update({"heldout_n": m.get("heldout_n"), "acc_initial": m["heldout_acc_initial"],
                "acc_final": m["heldout_acc_final"], "gain": gain, "gain_se": se, "gain_lcb": gain - 2 * se,
                "reward_first_quarter": m["reward_first_quarter"], "reward_last_quarter": m["reward_last_quarter"],
                "steps": m["steps"], **_curve(run), **{f"rl_{k}": v for k, v in _cost(run).items()}})
    return row


def _curve(run: Path) -> dict:
    """{"curve": "step:acc ...", "step_s_median"} from the run's step log (evaluation steps; step 0 = initial)."""
    with open(run / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    init = read_result(run / "summary.json", stage="rl")["metrics"]["heldout_acc_initial"]
    curve = [(0, init)] + [(int(r["step"]), float(r["eval/acc"])) for r in rows if r.get("eval/acc")]
    step_s = sorted(float(r["timing/sample_s"]) + float(r["timing/learn_s"]) for r in rows)
    return {"curve": " ".join(f"{s}:{a:.3f}" for s, a in curve),
            "step_s_median": step_s[len(step_s) // 2] if step_s else math.nan}


def _base_key(sec: dict) -> str:
    return json.dumps([sec["data"], sec["pretrain"]], sort_keys=True)


def run_sweep(sweep: Sweep) -> list[dict]:
    """Run (or resume) every point; -> the rows, best first (module docstring)."""
    pts = points(sweep)
    distinct = list({_base_key(sec): sec for sec, _ in pts}.values())
    with ThreadPoolExecutor(max_workers=sweep.jobs) as pool:  # threads only wait on the subprocesses
        if sweep.pretrained is None:  # the data first, one at a time (points share data directories)
            for sec in distinct:
                _data(sweep, sec)
        bases = dict(zip(map(_base_key, distinct), pool.map(lambda sec: _base_model(sweep, sec), distinct)))
        jobs = [(sec, name, spec, seed, *bases[_base_key(sec)])
                for sec, runs in pts for name, spec in runs.items() for seed in sweep.seeds]
        runs = list(pool.map(lambda j: _try(_rl, sweep, *j), jobs))
    rows = [_row(sweep, sec, name, seed, model, run) if not isinstance(run, str) else
            {"run": name, "seed": seed, "error": run} for (sec, name, _, seed, _, model), run in zip(jobs, runs)]
    rows.sort(key=lambda r: -r["gain_lcb"] if math.isfinite(r.get("gain_lcb", math.nan)) else math.inf)
    _write(sweep, rows)
    failed = [r for r in rows if "error" in r]
    if failed:  # after the table is written: what finished is kept
        raise RuntimeError(f"{len(failed)} of {len(rows)} sweep runs failed (rows with `error` in "
                           f"{sweep.out / 'sweep.csv'}); first: {failed[0]['error']}")
    return rows


def _try(fn, *args):
    """fn(*args), or the error's message: one failed run does not stop the others (a GPU sweep keeps its bf16
    rows when an NVFP4 probe fails)."""
    try:
        return fn(*args)
    except RuntimeError as e:
        return str(e)


def _write(sweep: Sweep, rows: list[dict]) -> None:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_bytes(sweep.out / "sweep.csv", buf.getvalue().encode())
    write_result(sweep.out / "sweep.json", stage="sweep", experiment=str(sweep.base.get("experiment", "sweep")),
                 config=sweep.spec, metrics={"rows": rows, "best": rows[0] if rows else None})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="minite sweep", description=__doc__.splitlines()[0])
    p.add_argument("config", help="sweep file (YAML; module docstring)")
    p.add_argument("--jobs", type=int, default=None, help="commands at once (overrides the file's `jobs`)")
    args = p.parse_args(argv)
    sweep = load_sweep(args.config)
    if args.jobs is not None:
        if args.jobs < 1:
            p.error(f"--jobs must be >= 1, got {args.jobs}")
        sweep = dataclasses.replace(sweep, jobs=args.jobs)
    rows = run_sweep(sweep)
    varied = varied_keys(sweep)
    print(f"sweep: {len(rows)} runs -> {sweep.out / 'sweep.csv'}")
    for r in rows:  # (run_sweep raised if any failed)
        print("  " + " ".join(f"{k}={r[k]}" for k in varied) + f" {r['run']} s{r['seed']}: held-out "
              f"{r['acc_initial']:.3f} -> {r['acc_final']:.3f} (gain {r['gain']:+.3f} ± {r['gain_se']:.3f}), "
              f"rl {r['rl_wall_s']:.0f} s wall / {r['rl_cpu_s']:.0f} s cpu")
    return 0

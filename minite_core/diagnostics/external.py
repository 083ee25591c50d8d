"""`minite diagnose --rollouts FILE...`: the mismatch report from another RL framework's logged rollouts, no model.

verl, NeMo-RL, slime and OpenRLHF users already log the sampler's and the learner's log-probs of the tokens they
train on; this turns those logs into the report `minite diagnose` makes for this project's own engine pairs:
  - the metrics of engines.mismatch (k1, k3 ± SE, χ², ESS, |Δp|, max |Δ|, ...) and, beside them, the ones users
    gate on under their frameworks' names and definitions (engines.framework_metrics: NeMo-RL's
    train/gen_kl_error, token_mult_prob_error, js_divergence_error; verl's rollout_corr/kl, k3_kl, chi2, ppl);
  - by response position (the buckets of engines.mismatch) and by training step;
  - the full-vocabulary KL where both engines' logits are logged, else omitted with the reason;
  - the budget verdict: absolute ceilings per metric (`--ceiling gen_kl_error=0.03`) and the history gate
    (`--history` of earlier results: within x% of the last N runs, diagnostics.gate);
  - a results-contract JSON (stage "external"), figures, and a markdown report.
Each `--rollouts` group of files / directories is one engine pair (`--name`, `--format` per group, or once for all);
layouts: minite (docs/rollouts.md), nemo-rl, slime, verl (diagnostics.layouts cites each one's source). Argmax flips
and MoE routing are not in any of these logs: those columns stay empty.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path

import torch

from minite_core.diagnostics.gate import (
    HISTORY_LAST, HISTORY_TOLERANCE, check_ceilings, check_history, gate_line, parse_ceilings)
from minite_core.diagnostics.layouts import LAYOUTS, load
from minite_core.diagnostics.rollouts import Rollouts
from minite_core.engines.framework_metrics import framework_metrics
from minite_core.engines.mismatch import mismatch_by_position, mismatch_metrics
from minite_core.results import read_result, write_result

STAGE = "external"
NAME = re.compile(r"^[A-Za-z0-9._+-]+$")  # a pair name: no ":" (ceilings are PAIR:METRIC=X) and no spaces
COLUMNS = ("mismatch/k3", "mismatch/k3_se", "mismatch/k1", "mismatch/kl_full_vocab", "mismatch/max_abs_delta",
           "mismatch/chi2", "mismatch/ess", "train/gen_kl_error", "train/token_mult_prob_error",
           "train/js_divergence_error", "rollout_corr/kl", "rollout_corr/k3_kl", "mismatch/tokens")


def _metrics(p: dict, rows=slice(None)) -> dict:
    """Ours + the frameworks' over rows `rows` of the padded tensors (a kl of None leaves kl_full_vocab out)."""
    kl = None if p["kl"] is None else p["kl"][rows]
    out = mismatch_metrics(p["learner"][rows], p["sampler"][rows], p["mask"][rows], kl=kl)
    out.update(framework_metrics(p["learner"][rows], p["sampler"][rows], p["mask"][rows]))
    return out


def measure(ro: Rollouts) -> dict:
    """One pair's rollouts -> {"metrics", "by_position", "by_step", "source"}."""
    p = ro.padded()
    metrics = _metrics(p)
    steps = sorted(set(p["steps"].tolist()))
    metrics.update({"rollout/rows": len(ro.rows), "rollout/steps": len(steps)})
    by_step = [{"step": s, **_metrics(p, p["steps"] == s)} for s in steps]
    files = ro.files if len(ro.files) <= 3 else ro.files[:1] + [f"... {len(ro.files) - 2} more ..."] + ro.files[-1:]
    source = {"layout": ro.layout, "files": files, "num_files": len(ro.files), "rows": len(ro.rows),
              "steps": [steps[0], steps[-1]], "kl_full_vocab_omitted": ro.kl_reason()}
    return {"metrics": metrics, "by_position": mismatch_by_position(p["learner"], p["sampler"], p["mask"],
                                                                    kl=p["kl"]),
            "by_step": by_step, "source": source}


def diagnose_rollouts(pairs: list[Rollouts], *, ceilings: dict | None = None, history: list[dict] | None = None,
                      history_metrics=(), last: int = HISTORY_LAST, tolerance: float = HISTORY_TOLERANCE) -> dict:
    """Every pair measured + the gate -> the payload fields of the result ({"metrics", "by_position", "by_step",
    "sources", "omitted", "gate"}; gate None when no ceiling or history was given)."""
    out = {"metrics": {}, "by_position": {}, "by_step": {}, "sources": {}, "omitted": [], "gate": None}
    for ro in pairs:
        m = measure(ro)
        for key in ("metrics", "by_position", "by_step"):
            out[key][ro.name] = m[key]
        out["sources"][ro.name] = m["source"]
        if m["source"]["kl_full_vocab_omitted"]:
            out["omitted"].append({"pair": ro.name, "metric": "mismatch/kl_full_vocab",
                                   "reason": m["source"]["kl_full_vocab_omitted"]})
    if ceilings or (history and history_metrics):
        out["gate"] = (check_ceilings(out["metrics"], ceilings or {})
                       + check_history(out["metrics"], history or [], list(history_metrics), last=last,
                                       tolerance=tolerance))
    return out


def _num(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:.3e}" if isinstance(v, float) else str(v)


def markdown(payload: dict, figures: str | None = None) -> str:
    """The human report of one result payload (figures: their folder, relative to the report)."""
    lines = ["# Mismatch report of logged rollouts", "",
             "Δ = logπ_learner − logπ_sampler per logged token. Ours: k3 = mean(e^Δ − 1 − Δ) ± SE, k1 = mean(−Δ); "
             "NeMo-RL's `train/*` and verl's `rollout_corr/*` as those frameworks define them "
             "(minite_core/engines/framework_metrics.py): gen_kl_error and k3_kl are k3 without its ±20 clamp on Δ, so the "
             "three agree unless some |Δ| > 20.", "", "## Sources", "",
             "| pair | layout | files | rows | steps | full-vocabulary KL |", "|---|---|---|---|---|---|"]
    for pair, s in payload["sources"].items():
        kl = "logged" if not s["kl_full_vocab_omitted"] else f"omitted: {s['kl_full_vocab_omitted']}"
        lines.append(f"| {pair} | {s['layout']} | {s['num_files']} (`{s['files'][0]}`…) | {s['rows']} | "
                     f"{s['steps'][0]}–{s['steps'][1]} | {kl} |")
    lines += ["", "## Metrics", "", "| pair | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    lines += [f"| {pair} | " + " | ".join(_num(m.get(k)) for k in COLUMNS) + " |"
              for pair, m in payload["metrics"].items()]
    lines += ["", "## Budget", ""]
    if payload.get("gate") is None:
        lines.append("No ceiling or history given (`--ceiling METRIC=X`, `--history RESULT.json...`).")
    else:
        lines += ["| pair | metric | value | limit | rule | verdict |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['pair']} | {r['metric']} | {_num(r['value'])} | {_num(r['limit'])} | {r['rule']} | "
                  f"{'pass' if r['pass'] else '**FAIL**'} |" for r in payload["gate"]]
        if not payload["gate"]:
            lines.append("| – | – | – | – | no earlier run has these pairs and metrics | – |")
    if figures:
        lines += ["", "## Figures", ""] + [f"![{name}]({figures}/{name}.png)" for name in
                                           ("k3_by_pair", "k3_by_position", "by_step")]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minite diagnose", description=__doc__.splitlines()[0])
    p.add_argument("--rollouts", action="append", nargs="+", required=True, metavar="FILE",
                   help="rollout log files / directories of one engine pair (repeat for more pairs)")
    p.add_argument("--name", action="append", default=[], help="pair name per --rollouts (default: the path's)")
    p.add_argument("--format", action="append", default=[], choices=("auto",) + LAYOUTS,
                   help="layout per --rollouts, or once for all (default auto: detected from the records)")
    p.add_argument("--ceiling", action="append", default=[], metavar="[PAIR:]METRIC=X",
                   help="absolute ceiling, e.g. gen_kl_error=0.03 (NeMo-RL's W4A4 gate), k3=1e-3 (repeatable)")
    p.add_argument("--history", nargs="+", default=[], metavar="RESULT",
                   help="earlier results of this command, oldest first, for the history gate")
    p.add_argument("--history-metric", action="append", default=[], metavar="METRIC",
                   help="metrics gated against --history (default: k3 and every --ceiling metric)")
    p.add_argument("--history-last", type=int, default=HISTORY_LAST, help="runs of --history compared (SkyRL: 10)")
    p.add_argument("--history-tolerance", type=float, default=HISTORY_TOLERANCE * 100,
                   help="allowance in percent over the worst of those runs (SkyRL: 5)")
    p.add_argument("--out", required=True, help="result JSON (results contract, stage 'external')")
    p.add_argument("--report", default=None, help="markdown report (default: --out with .md)")
    p.add_argument("--figures", default=None, help="directory for PNG figures")
    p.add_argument("--experiment", default="adhoc", help="experiment name recorded in the result")
    return p


def _names(p, args) -> list[str]:
    names = args.name or []
    if names and len(names) != len(args.rollouts):
        p.error(f"--name given {len(names)} times for {len(args.rollouts)} --rollouts groups: one each, or none")
    names = names or [Path(group[0]).stem if Path(group[0]).is_file() else Path(group[0]).name
                      for group in args.rollouts]
    for n in names:
        if not NAME.match(n):
            p.error(f"--name {n!r}: use letters, digits and . _ + - (no ':' or spaces)")
    if len(set(names)) != len(names):
        p.error(f"pair names must differ, got {', '.join(names)}; pass --name per --rollouts")
    return names


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    names = _names(p, args)
    formats = args.format or ["auto"]
    if len(formats) not in (1, len(args.rollouts)):
        p.error(f"--format given {len(formats)} times for {len(args.rollouts)} --rollouts groups: once, or one each")
    formats = formats * len(args.rollouts) if len(formats) == 1 else formats
    if args.history_last < 1 or args.history_tolerance < 0:
        p.error("need --history-last >= 1 and --history-tolerance >= 0")
    try:
        ceilings = parse_ceilings(args.ceiling, names)
    except ValueError as e:
        p.error(str(e))
    history = [read_result(h, stage=STAGE)["metrics"] for h in args.history]
    gated = args.history_metric or ["mismatch/k3"] + sorted({m for own in ceilings.values() for m in own})
    torch.set_num_threads(min(torch.get_num_threads(), 4))  # small reductions: threads only contend
    pairs = [load(group, name=n, layout=f) for group, n, f in zip(args.rollouts, names, formats)]
    result = diagnose_rollouts(pairs, ceilings=ceilings, history=history, history_metrics=gated if history else (),
                               last=args.history_last, tolerance=args.history_tolerance / 100)
    config = {"pairs": [{"name": n, "paths": g, "format": f} for g, n, f in zip(args.rollouts, names, formats)],
              "ceilings": ceilings, "history": args.history, "history_metrics": gated if history else [],
              "history_last": args.history_last, "history_tolerance": args.history_tolerance / 100}
    write_result(args.out, stage=STAGE, experiment=args.experiment, config=config, **result)
    report = Path(args.report or Path(args.out).with_suffix(".md"))
    if args.figures:
        from minite_core.diagnostics.figures import write_figures

        write_figures(read_result(args.out, stage=STAGE), args.figures)
    report.write_text(markdown(read_result(args.out), args.figures and os.path.relpath(args.figures, report.parent)))
    for pair, m in result["metrics"].items():
        print(f"{pair}: k3={_num(m['mismatch/k3'])} gen_kl_error={_num(m['train/gen_kl_error'])} "
              f"rollout_corr/k3_kl={_num(m['rollout_corr/k3_kl'])} tokens={m['mismatch/tokens']}", file=sys.stderr)
    failed = [r for r in result["gate"] or [] if not r["pass"]]
    for row in failed:
        print(f"minite diagnose: error: {gate_line(row)}", file=sys.stderr)
    print(f"wrote {args.out}, {report}" + (f", figures in {args.figures}" if args.figures else ""), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

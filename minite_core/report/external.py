"""The report's external pairs: other engines' logged rollouts (`diagnostics.external`, measured by `minite diagnose
--rollouts` into diagnostics/external.json), as rows of the mismatch table beside this experiment's own pairs, and
the metrics under the names users gate on (NeMo-RL's train/*, verl's rollout_corr/*) for every pair, own and
external, with the external pairs' gate.
"""
from __future__ import annotations

from pathlib import Path

from minite_core.report.common import load, table

FRAMEWORK_KEYS = ("train/gen_kl_error", "train/token_mult_prob_error", "train/js_divergence_error",
                  "train/policy_kl_error", "rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/chi2_token",
                  "rollout_corr/ppl_ratio")
NOT_LOGGED = "not logged"


def _external(results: Path) -> dict | None:
    return load(results / "diagnostics" / "external.json", "external")


def label(pair: str, res: dict) -> str:
    return f"external: {pair} ({res['sources'][pair]['layout']} log)"


def external_rows(results: Path, keys: list[str]) -> list[list]:
    """Mismatch-table rows of the external pairs: the same `mismatch/<key>` columns (a KL that is not logged reads
    "not logged"), routing columns "not logged" (no dump carries expert ids)."""
    res = _external(results)
    if res is None:
        return []
    rows = []
    for pair, m in res["metrics"].items():
        cells = [m.get(f"mismatch/{k}", NOT_LOGGED if k == "kl_full_vocab" else None) for k in keys]
        rows.append([label(pair, res)] + cells + [NOT_LOGGED, NOT_LOGGED])
    return rows


def section_external(results: Path, own: dict | None) -> str:
    """Where each external pair comes from, the frameworks' metrics of every pair, the external gate."""
    res = _external(results)
    head = "\n### Other engines' logged rollouts, and the frameworks' own metrics\n\n"
    if res is None:
        return head + "_no external rollout log in this experiment_ (`diagnostics.external`, docs/rollouts.md)\n"
    src = []
    for pair, s in res["sources"].items():
        files = s["files"][0] + (f" … ({s['num_files']} files)" if s["num_files"] > 1 else "")
        src.append([label(pair, res), s["layout"], files, s["rows"], f"{s['steps'][0]}–{s['steps'][1]}",
                    s["kl_full_vocab_omitted"] or "logged"])
    pairs = {**(own or {}), **{label(p, res): m for p, m in res["metrics"].items()}}
    fw = [[pair] + [m.get(k) for k in FRAMEWORK_KEYS] for pair, m in pairs.items()]
    text = (head + "Rows marked *external* are measured by `minite diagnose --rollouts` from logged per-token "
            "log-probs of both engines, no model (docs/rollouts.md); argmax flips and routing are not in such logs. "
            "Their sources:\n\n"
            + table(["pair", "layout", "files", "rows", "steps", "full-vocabulary KL"], src)
            + "\nThe same mismatch under the names and definitions users gate on "
            "(`minite_core/engines/framework_metrics.py`): NeMo-RL's `train/*` (its loss function's metrics) and "
            "verl's `rollout_corr/*` (its off-policy diagnostics); gen_kl_error and k3_kl are k3 without its ±20 "
            "clamp.\n\n" + table(["pair"] + list(FRAMEWORK_KEYS), fw))
    gate = res.get("gate")
    if gate:
        rows = [[label(r["pair"], res), r["metric"], r["value"], r["limit"], r["rule"],
                 "pass" if r["pass"] else "**FAIL**"] for r in gate]
        text += "\nGate of the external pairs:\n\n" + table(["pair", "metric", "value", "limit", "rule", "gate"], rows)
    figs = results / "diagnostics" / "external_figures"
    if (figs / "by_step.png").exists():
        text += f"\n![external pairs by training step]({(figs / 'by_step.png').relative_to(results)})\n"
    return text

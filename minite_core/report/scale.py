"""The report's section on NVFP4's cost against model size, from `scale/*.json` alone (rl/scale.py writes one file a
size): a table with a row per size, a figure of each profile's drop from BF16 against the parameter count (log x),
the size the RL model's rule picks, and claim (c)'s verdict on the row of the model the RL runs started from.

The rule for the RL model's size (`pick_rl_size`), applied to the measured numbers, never written by hand: among
the sizes of at least MIN_RL_PARAMS parameters (the floor of a faithful scale), the smallest whose minite drop is at
most DROP_BUDGET (the point estimate); when none is, the largest measured (the one nearest real models). The
experiment config names the RL model's size explicitly (`pretrain.size`); the section says whether it is the one
the rule picks.

Which row the RL runs rest on: the size whose parameter count equals the RL base model's (pretrain/pretrain.json),
when the RL runs' final checkpoints (config.json: RL keeps the shape) have its shape. A results folder assembled
from runs of different commits can hold RL runs of an earlier base model than pretrain/: the section says so.
That row's claim (c) cell is report/rl.py's `claim_c_verdict` on this experiment's RL runs: the same rule at any scale.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from minite_core.report.common import load
from minite_core.report.rl import claim_c_verdict, load_summaries, pair_results
from minite_core.results import read_result

HEAD = "## NVFP4's cost against model size"
REFERENCE, ALIGNED = "bf16", "minite"
DROP_BUDGET = 0.02  # the minite drop (2 points) a size may cost to carry the RL runs
MIN_RL_PARAMS = 0.5e9  # the smallest RL model of a faithful scale
FIGURE = "drop_vs_params.png"


def load_sizes(results: Path) -> list[dict]:
    """Every size's scale/v1 result, smallest model first."""
    rows = [read_result(p, stage="scale") for p in sorted((results / "scale").glob("*.json"))]
    return sorted(rows, key=lambda r: r["metrics"]["num_parameters"])


def _drop(row: dict, profile: str) -> float:
    return row["metrics"]["profiles"].get(profile, {}).get("drop", math.nan)


def pick_rl_size(rows: list[dict]) -> tuple[str | None, str]:
    """(size name, why) by the module docstring's rule; (None, why) when no size reaches MIN_RL_PARAMS."""
    big = [r for r in rows if r["metrics"]["num_parameters"] >= MIN_RL_PARAMS]
    if not big:
        return None, f"no measured size has {MIN_RL_PARAMS / 1e9:g} B parameters"
    ok = [r for r in big if _drop(r, ALIGNED) <= DROP_BUDGET]
    if ok:
        return ok[0]["metrics"]["size"], (f"the smallest size of ≥ {MIN_RL_PARAMS / 1e9:g} B parameters whose "
                                          f"minite drop is ≤ {100 * DROP_BUDGET:g} points")
    return big[-1]["metrics"]["size"], (f"no size of ≥ {MIN_RL_PARAMS / 1e9:g} B parameters has a minite drop ≤ "
                                        f"{100 * DROP_BUDGET:g} points: the largest measured")


def params_text(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 5e8 else f"{n / 1e6:.0f} M" if n >= 1e7 else f"{n / 1e6:.2f} M"


def _pts(row: dict, profile: str) -> str:
    m = row["metrics"]["profiles"].get(profile)
    return "–" if m is None else f"{100 * m['drop']:+.1f} ± {100 * m['drop_se']:.1f}"


def _base(row: dict) -> str:
    b = row["metrics"].get("base") or {}
    if not b:
        return "–"
    band = "" if b.get("in_band") else ", out of band"
    return f"{b.get('steps')} ({b.get('stop_reason')}{band})"


_SHAPE = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
          "num_experts", "num_experts_per_tok", "moe_intermediate_size", "intermediate_size")


def _shape(config: dict) -> tuple:
    return tuple(config.get(k) for k in _SHAPE)


def _rl_base(results: Path) -> tuple[dict | None, tuple | None, bool]:
    """(pretrain/pretrain.json, the RL runs' model shape from rl/<run>/final/config.json — RL keeps the base model's
    shape — or None without final checkpoints, whether the RL runs started from pretrain/'s model)."""
    res = load(results / "pretrain" / "pretrain.json", "pretrain")
    configs = sorted((results / "rl").glob("*/final/config.json"))
    rl = _shape(json.loads(configs[-1].read_text())) if configs else None
    return res, rl, res is not None and (rl is None or rl == _shape(res.get("model_config", {})))


def rl_base_params(results: Path) -> int | None:
    """The parameter count of the model the RL runs started from: pretrain/pretrain.json's where the RL runs'
    final checkpoints have its shape (or there are none), else the sweep's size of their shape; None when unknown."""
    res, rl, same = _rl_base(results)
    if same:
        return res["metrics"].get("num_parameters")
    for row in load_sizes(results) if rl is not None else []:
        config = results / "scale" / row["metrics"]["size"] / "model" / "config.json"
        if config.exists() and _shape(json.loads(config.read_text())) == rl:
            return row["metrics"]["num_parameters"]
    return None


def rl_base_other(results: Path) -> str | None:
    """Where the RL runs' model is not pretrain/'s (a results folder assembled from runs of different commits): one
    sentence naming both; else None."""
    res, rl, same = _rl_base(results)
    if res is None or rl is None or same:
        return None
    shape = dict(zip(_SHAPE, rl))
    commits = sorted({c for s in load_summaries(results) if (c := (s.get("env") or {}).get("commit"))})
    return (f"The RL runs ({', '.join(f'`{c}`' for c in commits)}) started from another base model (hidden "
            f"{shape['hidden_size']}, {shape['num_hidden_layers']} layers, {shape['num_experts']} experts, vocabulary "
            f"{shape['vocab_size']}) than pretrain/ ({params_text(res['metrics']['num_parameters'])} parameters, "
            f"`{(res.get('env') or {}).get('commit')}`).")


def _claim_c_cell(results: Path) -> str:
    summaries = load_summaries(results)
    if not summaries:
        return "RL not run"
    word, _ = claim_c_verdict(pair_results(summaries))
    return f"RL base; claim (c) {word}"


def scale_table(results: Path, rows: list[dict]) -> str:
    profiles = list(dict.fromkeys(p for r in rows for p in r["metrics"]["profiles"] if p != REFERENCE))
    rl_params = rl_base_params(results)
    head = (["size", "parameters", "SFT steps", "held-out n", "BF16 accuracy"]
            + [f"{p} drop (points ± paired SE)" for p in profiles] + ["RL"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        m = r["metrics"]
        ref = m["profiles"][REFERENCE]
        rl = _claim_c_cell(results) if m["num_parameters"] == rl_params else "–"
        cells = [m["size"], params_text(m["num_parameters"]), _base(r), m["heldout_n"],
                 f"{100 * ref['acc']:.1f}% ± {100 * ref['se']:.1f}"] + [_pts(r, p) for p in profiles] + [rl]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def draw(results: Path, rows: list[dict] | None = None) -> Path | None:
    """scale/drop_vs_params.png: each NVFP4 profile's drop (points) against parameters, log x, paired-SE bars, the
    2-point budget dashed; None (nothing drawn) without scale results."""
    rows = load_sizes(results) if rows is None else rows
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")  # headless: the report runs without a display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    x = [r["metrics"]["num_parameters"] for r in rows]
    profiles = list(dict.fromkeys(p for r in rows for p in r["metrics"]["profiles"] if p != REFERENCE))
    for p in profiles:
        ys = [100 * _drop(r, p) for r in rows]
        se = [100 * r["metrics"]["profiles"].get(p, {}).get("drop_se", math.nan) for r in rows]
        ax.errorbar(x, ys, yerr=se, marker="o", capsize=3, label=p)
    ax.axhline(100 * DROP_BUDGET, color="grey", linestyle="--", linewidth=1, label=f"{100 * DROP_BUDGET:g} points")
    ax.axhline(0, color="black", linewidth=0.5)
    rl = rl_base_params(results)
    if rl is not None and rl in x:
        ax.axvline(rl, color="grey", linestyle=":", linewidth=1, label="RL base model")
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("held-out accuracy drop from BF16 (points)")
    ax.set_title("NVFP4's cost against model size (greedy, same problems)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = results / "scale" / FIGURE
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def section_scale(results: Path) -> str:
    rows = load_sizes(results)
    if not rows:
        return HEAD + "\n\n_not run_ (config `scale.sizes`)\n"
    pick, why = pick_rl_size(rows)
    rl = rl_base_params(results)
    rl_size = next((r["metrics"]["size"] for r in rows if r["metrics"]["num_parameters"] == rl), None)
    other = rl_base_other(results)
    if rl is None:
        chosen = "" if other else "No RL base model was trained in this experiment."
    elif rl_size is None:
        chosen = f"The RL base model ({params_text(rl)}) is none of these sizes."
    else:
        chosen = f"The RL runs start from size `{rl_size}`" + (", the one the rule picks." if rl_size == pick else
                                                               ", not the rule's pick.")
    chosen = " ".join(filter(None, [chosen, other]))
    figure = results / "scale" / FIGURE
    return (HEAD + "\n\n"
            "Each size is a Qwen3-MoE SFT'd by the same recipe into the same held-out band (`minite pretrain`; "
            "`scale.sizes`), then scored by greedy decoding on the same held-out problems under each profile "
            "(`minite scale`; static scales calibrated as an RL run's). A drop is BF16's accuracy minus the "
            "profile's, in points (> 0: the profile loses accuracy); its SE is the paired one over the problems "
            "(those both profiles solve, or both miss, cancel). The RL model's size by the rule of "
            f"`minite_core/report/scale.py` ({why}): **{pick or '–'}**. {chosen}\n\n"
            + scale_table(results, rows)
            + (f"\n![NVFP4's cost against model size](scale/{FIGURE})\n" if figure.exists() else ""))

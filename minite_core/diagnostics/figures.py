"""Figures of a diagnostics result (seaborn PNGs): k3 by pair, k3 and full-vocabulary KL by response position (and,
for logged rollouts, by training step), MoE routing disagreement per layer, attribution bars, and the per-op
relative error of the first-divergence trace. Input is the results-contract payload (`read_result`), so the report
stage can redraw them from the JSON alone.

k3 spans many decades (an aligned pair can be ~1e-9, a naive one ~1e-1) and can be exactly 0: the value axis is
logarithmic with zeros drawn at `FLOOR` (labelled in the axis title).
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: figures are files, never windows
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

FLOOR = 1e-12  # where k3 == 0 (bit-identical engines) is drawn on a log axis


def _floor(v):
    return FLOOR if v is None or (isinstance(v, float) and math.isnan(v)) or v <= FLOOR else v


def k3_by_pair(payload: dict, path) -> Path:
    df = pd.DataFrame([{"pair": pair, "k3": _floor(m["mismatch/k3"])} for pair, m in payload["metrics"].items()])
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    sns.barplot(data=df, x="pair", y="k3", hue="pair", ax=ax, legend=False)
    ax.set_yscale("log")
    ax.set_ylabel(f"k3 (learner‖sampler), 0 drawn at {FLOOR:g}")
    ax.set_xlabel("learner : sampler")
    ax.tick_params(axis="x", labelrotation=15)
    ax.axhline(1e-3, color="grey", ls="--", lw=0.8)  # NeMo-RL's "healthy" gen_kl_error bound
    return _save(fig, path)


def _by_position(payload: dict, path, key: str, ylabel: str) -> Path:
    """Metric `key` per response-position bucket, one line per pair (pairs without the key are left out)."""
    rows = [{"pair": pair, "position": r["lo"], "value": _floor(r[key])}
            for pair, buckets in payload["by_position"].items() for r in buckets if key in r]
    fig, ax = plt.subplots(figsize=(8.4, 3.6))
    if rows:
        sns.lineplot(data=pd.DataFrame(rows), x="position", y="value", hue="pair", marker="o", ax=ax)
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1, 1))  # outside: lines span the whole axis
    ax.set_xscale("symlog", linthresh=8)
    ax.set_yscale("log")
    ax.set_xlabel("response position (bucket start)")
    ax.set_ylabel(ylabel)
    return _save(fig, path)


def k3_by_position(payload: dict, path) -> Path:
    return _by_position(payload, path, "mismatch/k3", "k3")


def kl_by_position(payload: dict, path) -> Path:
    """Mean full-vocabulary KL(π_sampler ‖ π_learner) per response-position bucket."""
    return _by_position(payload, path, "mismatch/kl_full_vocab", f"KL(sampler‖learner), full vocab; 0 at {FLOOR:g}")


def by_step(payload: dict, path) -> Path:
    """Mismatch per training step of logged rollouts (`minite diagnose --rollouts`), one line per pair: k3 (which
    NeMo-RL's gen_kl_error and verl's k3_kl equal but for our ±20 clamp) and NeMo-RL's token_mult_prob_error
    (mean e^|Δ|, 1 = identical engines). Does the gap grow as training moves the weights?"""
    panels = (("mismatch/k3", "k3 = gen_kl_error = k3_kl", "log"),
              ("train/token_mult_prob_error", "token_mult_prob_error", "linear"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 3.6), squeeze=False)
    for ax, (key, label, scale) in zip(axes[0], panels):
        rows = [{"pair": pair, "step": r["step"], "value": _floor(r.get(key)) if scale == "log" else r.get(key)}
                for pair, steps in payload["by_step"].items() for r in steps]
        if rows:
            sns.lineplot(data=pd.DataFrame(rows), x="step", y="value", hue="pair", marker="o", ax=ax)
        ax.set_yscale(scale)
        ax.set_xlabel("training step")
        ax.set_ylabel(label + (f"; 0 at {FLOOR:g}" if scale == "log" else ""))
    return _save(fig, path)


def routing_pairs(payload: dict) -> dict[str, dict[int, float]]:
    """{pair: {decoder layer: topk_disagree}} of the pairs whose model has MoE routing."""
    prefix = "routing/topk_disagree/layer"
    return {pair: {int(k[len(prefix):]): v for k, v in m.items() if k.startswith(prefix)}
            for pair, m in payload["metrics"].items() if m.get("routing/applies")}


def routing_by_layer(payload: dict, path) -> Path:
    """Fraction of tokens whose top-k expert set differs between learner and sampler, per MoE layer and pair
    (a pair whose learner replays the sampler's routing executes the same sets: 0 by construction)."""
    rows = [{"pair": pair, "layer": layer, "disagree": v}
            for pair, layers in routing_pairs(payload).items() for layer, v in sorted(layers.items())]
    fig, ax = plt.subplots(figsize=(8.4, 3.6))
    sns.barplot(data=pd.DataFrame(rows), x="layer", y="disagree", hue="pair", ax=ax)
    for bars in ax.containers:  # small rates (aligned pairs) are invisible on a linear axis: print them
        ax.bar_label(bars, labels=[f"{b.get_height():.1e}" if b.get_height() else "0" for b in bars],
                     fontsize=6, rotation=90, padding=2)
    ax.set_xlabel("decoder layer (MoE)")
    ax.set_ylabel("tokens with a different top-k set")
    ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.15)
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1, 1))
    return _save(fig, path)


def attribution_bars(payload: dict, path) -> Path:
    """One-at-a-time k3 per knob (left) and, when measured, the cumulative path (right); line = naive pair."""
    att = payload["attribution"]
    panels = [("one knob at a time", att["rows"])] + ([("cumulative", att["cumulative"])]
                                                      if att.get("cumulative") else [])
    n = max(len(rows) for _, rows in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 0.45 * n + 1.4), squeeze=False)
    for ax, (title, rows) in zip(axes[0], panels):
        df = pd.DataFrame([{"knob": r["label"], "k3": _floor(r["mismatch/k3"])} for r in rows])
        sns.barplot(data=df, y="knob", x="k3", hue="knob", ax=ax, legend=False, orient="h")
        ax.set_xscale("log")
        ax.axvline(_floor(att["rows"][0]["mismatch/k3"]), color="black", lw=0.8)
        ax.set_title(f"{title}: {att['base']} → {att['target']}")
        ax.set_xlabel("k3")
        ax.set_ylabel("")
    return _save(fig, path)


def trace_profile(payload: dict, path) -> Path:
    """Relative error per op in execution order, one panel per SUT mode (prefill | decode), hue = pair."""
    rows = [{"pair": t["pair"], "mode": t["sut_mode"], "op": i, "rel_err": _floor(op["rel_err"])}
            for t in payload["trace"] for i, op in enumerate(t["ops"])]
    modes = sorted({r["mode"] for r in rows}, reverse=True)  # prefill, decode
    fig, axes = plt.subplots(1, max(len(modes), 1), figsize=(6.0 * max(len(modes), 1), 3.8), squeeze=False,
                             sharey=True)
    for ax, mode in zip(axes[0], modes):
        sns.lineplot(data=pd.DataFrame([r for r in rows if r["mode"] == mode]), x="op", y="rel_err", hue="pair",
                     ax=ax)
        ax.axhline(payload["trace"][0]["threshold"], color="grey", ls="--", lw=0.8)
        ax.set_yscale("log")
        ax.set_title(f"sampler side: {mode}")
        ax.set_xlabel("op (execution order)")
        ax.set_ylabel("‖a − b‖ / ‖a‖")
    return _save(fig, path)


def write_figures(payload: dict, directory) -> list[Path]:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sns.set_theme(style="whitegrid", context="paper")
    paths = [k3_by_pair(payload, directory / "k3_by_pair.png"),
             k3_by_position(payload, directory / "k3_by_position.png")]
    if any("mismatch/kl_full_vocab" in m for m in payload["metrics"].values()):  # logged rollouts may lack it
        paths.append(kl_by_position(payload, directory / "kl_by_position.png"))
    if payload.get("by_step"):
        paths.append(by_step(payload, directory / "by_step.png"))
    if routing_pairs(payload):
        paths.append(routing_by_layer(payload, directory / "routing_by_layer.png"))
    if payload.get("attribution"):
        paths.append(attribution_bars(payload, directory / "attribution.png"))
    if payload.get("trace"):
        paths.append(trace_profile(payload, directory / "trace.png"))
    return paths


def _save(fig, path) -> Path:
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path

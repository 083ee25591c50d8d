"""The report's Transformer Engine section, from the files under `results/<exp>/te/`:
- `agreement.json` (schema te/v1): `minite_core.peers.te_compare run` on a random model of the RL shape;
- `checkpoint/agreement.json` (te/v1, optional): the same on a trained checkpoint (`--checkpoint`, the DAG's base
  model): the end-to-end numbers claim (e) reads when present — a trained model's log-probs are what RL sees;
- `diag-4over6/mismatch.json` (diagnostics, optional): `minite diagnose` of the 4over6 profile beside bf16 and
  minite (reference kernels: the only backend with 4over6);
- `diag-te/mismatch.json` (diagnostics, optional): `minite diagnose` with real TE as the learner (`te:<mode>`
  pairs: TELearner rescoring the sampler's tokens) beside our emulated pairs on the same model and prompts;
- `learner.json` (bench/learner, optional): a learner bench with the real-TE rows (te:*) when they were measured
  apart from the DAG's throughput stage (results/h200/README.md says when and why).
The report may not import the peer (report/ reads only the results contract: tests/test_layers.py), so the tables
are built here from the metric keys te_compare documents:
- `quantizer/<variant>/{codes_equal,scales_equal}`: TE's NVFP4QuantizerRef vs our formats, bit for bit;
- `gemm/<mode>/<M>x<K>x<N>/<fprop|dgrad|wgrad>/{quant_rel, ours/{rel,max_abs,eq_bf16}, dataflow/{rel,eq_bf16}}`;
- `e2e/<mode>/{ours-vs-te,te-vs-te-bf16}/{k3,max_abs_delta,argmax_flip,...}`: learner log-probs end to end;
- `e2e/<mode>/trace/{threshold,first_nonzero,first_divergence,<op>/{step,rel,eq_bf16,routing_flip}}`: the
  first-divergence trace of those forwards.
`te_nvfp4_agreement` is the one number claim (e) reads: how far our `te-nvfp4` emulation's log-probs are from TE's.
"""
from __future__ import annotations

from pathlib import Path

from minite_core.report.common import load, table

HEAD = "## Transformer Engine on the H200 (real TE vs our te-nvfp4 emulation)\n\n"


def load_agreement(results: Path, model: str = "") -> dict | None:
    """te/agreement.json (model "": the random model) or te/<model>/agreement.json ("checkpoint")."""
    path = results / "te" / model / "agreement.json"
    return load(path, "te")  # another schema: an error naming the file


def claim_agreement(results: Path) -> dict | None:
    """The te/v1 result claim (e) reads: the trained checkpoint's when there is one, else the random model's."""
    return load_agreement(results, "checkpoint") or load_agreement(results)


def _bases(metrics: dict, prefix: str, suffix: str) -> list[str]:
    """Sorted key stems `prefix...` of the metrics that end in `suffix` (the suffix removed)."""
    return sorted(k[: -len(suffix)] for k in metrics if k.startswith(prefix) and k.endswith(suffix))


def te_nvfp4_agreement(res: dict) -> dict | None:
    """{mode, k3, max_abs_delta, te_quant_k3} of the TE mode our `te-nvfp4` profile emulates (config.modes), None
    when the file has no end-to-end comparison of it."""
    m = res["metrics"]
    for name, mode in sorted((res["config"].get("modes") or {}).items()):
        base = f"e2e/{name}/ours-vs-te"
        if (mode.get("emulated_by") or "").startswith("te-nvfp4") and f"{base}/k3" in m:
            return {"mode": name, "k3": m[f"{base}/k3"], "max_abs_delta": m.get(f"{base}/max_abs_delta"),
                    "te_quant_k3": m.get(f"e2e/{name}/te-vs-te-bf16/k3")}
    return None


def _frac(v, digits: int = 4) -> str | None:
    """A fraction of equal values with enough digits that 0.9996 never prints as 1.000."""
    return None if v is None else f"{v:.{digits}f}"


def _gemm_rows(m: dict, emulated_by: dict) -> list[list]:
    rows = []
    for base in _bases(m, "gemm/", "/quant_rel"):
        mode_shape, out = base[len("gemm/"):].rsplit("/", 1)
        mode = mode_shape.split("/")[0]
        rows.append([mode_shape, emulated_by.get(mode) or "– (not emulated)", out, m[base + "/quant_rel"],
                     m.get(base + "/ours/rel"), _frac(m.get(base + "/ours/eq_bf16")), m.get(base + "/dataflow/rel"),
                     _frac(m.get(base + "/dataflow/eq_bf16"))])
    return rows


def _e2e_rows(m: dict, emulated_by: dict) -> list[list]:
    modes = sorted({k.split("/")[1] for k in m if k.startswith("e2e/")})
    return [[mode, emulated_by.get(mode) or "–", m.get(f"e2e/{mode}/ours-vs-te/k3"),
             m.get(f"e2e/{mode}/ours-vs-te/max_abs_delta"), _frac(m.get(f"e2e/{mode}/ours-vs-te/argmax_flip")),
             m.get(f"e2e/{mode}/te-vs-te-bf16/k3")] for mode in modes]


def _probe_line(probe: dict) -> str:
    runs = {k: v for k, v in probe.items() if k.startswith("grouped/")}
    if not runs:
        return "te.GroupedLinear probe: not run.\n"
    failed = [f"`{k}` ({str(v).split(':')[0]})" for k, v in runs.items() if v != "ok"]
    return (f"te.GroupedLinear probe (forward + backward, own process): {len(runs) - len(failed)} of {len(runs)} "
            "cases ok" + (f"; failed: {', '.join(failed)} (error texts in te/summary.md)" if failed else "") + ".\n")


def section_te(results: Path) -> str:
    res = load_agreement(results)
    if res is None:
        return HEAD + ("_not run_ (a CUDA GPU with Transformer Engine: `python -m minite_core.peers.te_compare run "
                       f"--out results/{results.name}/te`)\n")
    m, c, env = res["metrics"], res["config"], res.get("env", {})
    emulated_by = {n: mode.get("emulated_by") for n, mode in (c.get("modes") or {}).items()}
    quant = [[b[len("quantizer/"):], _frac(m[b + "/codes_equal"], 6), _frac(m.get(b + "/scales_equal"), 6)]
             for b in _bases(m, "quantizer/", "/codes_equal")]
    errors = "".join(f"\nFailed: `{k}`: {v}\n" for k, v in (res.get("errors") or {}).items())
    return (HEAD + f"Real Transformer Engine {c.get('transformer_engine')} on {env.get('gpu')} (torch "
            f"{env.get('torch')}, commit `{env.get('commit')}`) against this harness's emulation of each TE mode "
            f"(our kernels: {c.get('our_kernels')}; model: {c.get('checkpoint')}; {c.get('prompts')} prompts). "
            "Written by `python -m minite_core.peers.te_compare run` (its module docstring defines every metric). "
            "TE recipe per mode: " + ", ".join(f"`{n}` {mode.get('recipe')}" for n, mode in (c.get("modes") or {}).items())
            + " (`nvfp4-ref`: a TE `CustomRecipe` on TE's reference quantizer `NVFP4QuantizerRef`; TE's native "
            "NVFP4 recipe needs sm_100+).\n\n"
            "**Quantizers** — fraction of FP4 codes and block scales equal, same CUDA tensor:\n\n"
            + table(["variant", "codes equal", "scales equal"], quant)
            + "\n**GEMMs** — one `te.Linear` vs our `QuantLinear` on the same operands; rel = ‖ours − TE‖/‖TE‖, "
            "eq bf16 = fraction of outputs equal in bf16; `dataflow` = TE's dataflow written with our formats, so "
            "what separates `ours` from `dataflow` is a knob of our profile:\n\n"
            + table(["mode / M×K×N", "our profile", "output", "TE quant. error (rel)", "ours vs TE rel",
                     "ours eq bf16", "dataflow vs TE rel", "dataflow eq bf16"], _gemm_rows(m, emulated_by))
            + "\n**End to end** — learner log-probs of the same tokens (k3 as in the mismatch section); the last "
            "column is TE's own quantization effect, TE <mode> vs TE bf16:\n\n"
            + table(E2E_HEADER, _e2e_rows(m, emulated_by)) + _trace_table(m) + _section_checkpoint(results, emulated_by)
            + "\n" + _probe_line(res.get("grouped_probe") or {}) + errors
            + _section_4over6(results) + _section_diag_te(results) + _section_learner(results))


E2E_HEADER = ["TE mode", "our profile", "k3 ours vs TE", "max abs Δ", "argmax flip", "k3 TE mode vs TE bf16"]


def _trace_cell(m: dict, base: str, which: str) -> str:
    name = m.get(f"{base}/{which}")
    if name in (None, "none"):
        return "none"
    flip = m.get(f"{base}/{name}/routing_flip")
    return (f"`{name}` (op {int(m[f'{base}/{name}/step'])}): rel {m[f'{base}/{name}/rel']:.2e}, eq bf16 "
            f"{m[f'{base}/{name}/eq_bf16']:.4f}" + ("" if flip is None else f", routing flip {flip:.4f}"))


def _trace_table(m: dict) -> str:
    """te_compare's first-divergence trace (`e2e/<mode>/trace/*`) per mode: the first op where ours and TE differ
    at all and the first above the threshold — the op a profile knob would have to close."""
    rows = [[b[len("e2e/"):], m.get(f"{b}/trace/threshold"), _trace_cell(m, f"{b}/trace", "first_nonzero"),
             _trace_cell(m, f"{b}/trace", "first_divergence")] for b in _bases(m, "e2e/", "/trace/first_divergence")]
    if not rows:
        return ""
    return ("\nFirst-divergence trace of those forwards (ours vs TE, every traced op in our execution order):\n\n"
            + table(["TE mode", "threshold", "first op with rel > 0", "first op with rel > threshold"], rows))


def _section_checkpoint(results: Path, emulated_by: dict) -> str:
    res = load_agreement(results, "checkpoint")
    if res is None:
        return ""
    c, env = res["config"], res.get("env", {})
    return (f"\n**End to end on a trained model** ({c.get('checkpoint')}, {c.get('prompts')} prompts, commit "
            f"`{env.get('commit')}`; te/checkpoint/): the numbers claim (e) reads.\n\n"
            + table(E2E_HEADER, _e2e_rows(res["metrics"], emulated_by)) + _trace_table(res["metrics"]))


def _diag_table(res: dict) -> str:
    rows = [[pair, v.get("mismatch/k3"), v.get("mismatch/k3_se"), v.get("mismatch/max_abs_delta"),
             v.get("mismatch/kl_full_vocab"), v.get("routing/topk_disagree")] for pair, v in res["metrics"].items()]
    return table(["pair", "k3", "k3 SE", "max abs Δ", "KL full vocab", "routing top-k disagree"], rows)


def _section_diag_te(results: Path) -> str:
    res = load(results / "te" / "diag-te" / "mismatch.json", "diagnostics")
    if res is None:
        return ""
    c, env = res["config"], res.get("env", {})
    skipped = "".join(f"\n- `{s['pair']}` {s['step']} skipped: {s['reason']}" for s in res.get("skipped") or [])
    return ("\n**Real TE as the learner of a pair** (te/diag-te/: `minite diagnose`, a `te:<mode>` learner is "
            "TELearner — our model with its decoder GEMMs as TE modules — rescoring the sampler's tokens; the other "
            f"pairs are our emulation on the same model and prompts; {c.get('te')}, kernels {env.get('kernels')}, "
            f"commit `{env.get('commit')}`):\n\n" + _diag_table(res) + skipped + "\n")


def _section_4over6(results: Path) -> str:
    res = load(results / "te" / "diag-4over6" / "mismatch.json", "diagnostics")
    if res is None:
        return ""
    env = res.get("env", {})
    return ("\n**TE's 4over6 block scales as a profile** (`minite-4over6`: miniTE with TE 2.20's 4over6 block-scale "
            "choice, formats/four_over_six.py, bitwise equal to TE's reference in the quantizer table above): "
            f"learner ↔ sampler mismatch on the base model (te/diag-4over6/, kernels {env.get('kernels')}, commit "
            f"`{env.get('commit')}`); its SQNR is in the quantization-error section (math `4over6-mae`).\n\n"
            + _diag_table(res))


def _section_learner(results: Path) -> str:
    res = load(results / "te" / "learner.json", "throughput")
    if res is None:
        return ""
    c, env = res["config"], res.get("env", {})
    rows = [[r["profile"], r.get("tokens_per_s"), r.get("speedup_vs_bf16"), r.get("mfu"), r.get("peak_mem_gb")]
            for r in res["rows"]]
    skipped = "".join(f"\n- `{s['profile']}` skipped: {s['reason']}" for s in res.get("skipped") or [])
    return (f"\n**Learner update with the real-TE rows** (te/learner.json: `minite bench learner`, {c.get('layers')} "
            f"layers of {c.get('model')}, batch {c.get('batch')} × {c.get('seq')}, one run, commit "
            f"`{env.get('commit')}`). A te:* row is our model with its decoder GEMMs as TE modules — one te.Linear "
            "per expert, a Python loop with a host sync per grouped GEMM, not te.GroupedLinear — so it is the cost "
            "of TE's per-GEMM recipe, not of a tuned TE MoE layer:\n\n"
            + table(["row", "tokens/s", "× bf16", "MFU", "peak GB"], rows) + skipped + "\n")


"""The report's Transformer Engine section, from `results/<exp>/te/agreement.json` (schema te/v1) alone.

`minite_core.peers.te_compare` runs real TE on a GPU and writes that file (and its own summary.md); the report may
not import the peer (report/ reads only the results contract: tests/test_layers.py), so the tables are built here
from the metric keys te_compare documents:
- `quantizer/<variant>/{codes_equal,scales_equal}`: TE's NVFP4QuantizerRef vs our formats, bit for bit;
- `gemm/<mode>/<M>x<K>x<N>/<fprop|dgrad|wgrad>/{quant_rel, ours/{rel,max_abs,eq_bf16}, dataflow/{rel,eq_bf16}}`;
- `e2e/<mode>/{ours-vs-te,te-vs-te-bf16}/{k3,max_abs_delta,argmax_flip,...}`: learner log-probs end to end.
`te_nvfp4_agreement` is the one number claim (e) reads: how far our `te-nvfp4` emulation's log-probs are from TE's.
"""
from __future__ import annotations

from pathlib import Path

from minite_core.report.common import load, table

HEAD = "## Transformer Engine on the H200 (real TE vs our te-nvfp4 emulation)\n\n"


def load_agreement(results: Path) -> dict | None:
    res = load(results / "te" / "agreement.json")
    if res is not None and res.get("schema") != "te/v1":
        raise ValueError(f"{results / 'te' / 'agreement.json'}: schema {res.get('schema')!r} is not te/v1; rerun "
                         "`python -m minite_core.peers.te_compare run`")
    return res


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
            + table(["TE mode", "our profile", "k3 ours vs TE", "max abs Δ", "argmax flip", "k3 TE mode vs TE bf16"],
                    _e2e_rows(m, emulated_by))
            + "\n" + _probe_line(res.get("grouped_probe") or {}) + errors)


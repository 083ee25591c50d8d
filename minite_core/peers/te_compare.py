"""Our NVFP4 emulation against Transformer Engine 2.20.2 itself, on a CUDA GPU (the H200): `te/v1` results.

  python -m minite_core.peers.te_compare run --out results/h200/te [--checkpoint DIR]

writes results/<exp>/te/agreement.json (schema te/v1; every number measured in that run) and summary.md:
- quantizer/*: TE's NVFP4QuantizerRef vs `formats` on the same CUDA tensor, bit for bit (fraction of codes and
  block scales equal): plain 1×16 / 16×16, `row_scaled_nvfp4` (= miniTE's per-token quantizer), 4over6, and the
  RHT'd wgrad operand (TE's reference rotates in the input dtype, bf16: `rht_wgrad_bf16` is our
  `wgrad_rht_dtype="bfloat16"`, te-nvfp4's; `rht_wgrad_fp32` the fp32 rotation, every other profile's).
- gemm/<mode>/<M>x<K>x<N>/<out>/<sut>/{max_abs,rel,eq_bf16}: one GEMM forward output (fprop), dgrad, wgrad of a
  `te.Linear` under the mode vs (sut=ours) our `QuantLinear` under `mode.emulated_by` on the same bf16 input,
  fp32 weight and bf16 output gradient, and vs (sut=dataflow) TE's reference dataflow written with our `formats`
  (every operand quantized as NVFP4QuantizerRef quantizes it, RHT rounded to bf16, fp32 GEMM). `ours` runs TE's
  reference GEMM order (emulated_by's w4a4_gemm="te-ref": bitwise TE's qgemm on CPU, tests/test_te_gemm.py), so
  any difference left there is an input to the GEMM; `dataflow` keeps the plain fp32 GEMM, so what remains between
  it and TE is GEMM rounding (results/h200/te at f4f5852: eq_bf16 0.9996-0.9999), and it equals `ours` under
  w4a4_gemm="reference" bit for bit (tests/test_te_wgrad.py). rel = ‖a − b‖_F / ‖b‖_F with b = TE; eq_bf16 =
  fraction equal once both are in bf16 (TE's output dtype). quant_rel = ‖TE − exact‖ / ‖exact‖ (exact: the fp32 GEMM of the unquantized operands) sizes the
  quantization error the agreement is to be read against.
- e2e/<pair>/*: learner log-probs of task responses on one checkpoint (N prompts, teacher-forced gold answers):
  max |Δ| and the mismatch metrics (k3, ...) of ours vs TE's, per mode — bf16 vs TE bf16 is the floor the NVFP4
  pairs are judged against — and TE <mode> vs TE bf16 (the quantization effect).
- e2e/<mode>/trace/*: the first-divergence trace of those two forwards (ours under emulated_by, TE's copy; the
  same input, module names shared): forward hooks on every module of the decoder layers (norms, attention, each
  GEMM, router, MLP / MoE and experts, the layer), the final norm and the LM head. Per module `<name>/step`
  (position in our execution order), `<name>/rel` = ‖ours − TE‖_F / ‖TE‖_F over all rows (pads included; inf
  when the shapes differ, e.g. expert rows after a routing flip) and `<name>/eq_bf16`; `first_nonzero` and
  `first_divergence`: the first module with rel > 0 / rel > `threshold` (engines.mismatch.TRACE_THRESHOLD), or
  "none" — the op to give the profile a knob for; routers also `<name>/routing_flip` (tokens whose top-k set
  differs: past a flip, expert rows are shifted and their rel is no longer arithmetic).
- grouped_probe: te.GroupedLinear forward + backward in a subprocess (bf16 with and without the grouped-tensor
  path, FP8 current / blockwise; routings: every expert 512 tokens, one expert none, 512 tokens in all at random),
  each "ok" or the error text: the `create_2D_tensor_map: invalid argument` failure seen once. From TE's
  source: only quantization kernels create TMA descriptors (common/common.cu create_2D_tensor_map, called from
  cast/*, hadamard_transform/*, transpose/quantize_transpose_square_blockwise.cu); the bf16 legacy path
  (torch.split + nvte_multi_tensor_gemm = multi-stream cuBLAS, which skips empty GEMMs) creates none, and
  cuTensorMapEncodeTiled returns CUDA_ERROR_INVALID_VALUE ("invalid argument") for a zero global dimension — an
  expert with no token — or a row stride that is not a multiple of 16 bytes. The probe tells which one it was.

Our side runs on the reference kernel backend by default (`--kernels`): the same numerics as Triton (tested
bitwise), no compile per shape, and the only backend with 4over6. Shape legend: M tokens, K in, N out.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import subprocess
import sys
from pathlib import Path

import torch

from minite_core.engines.learner import Learner
from minite_core.engines.mismatch import TRACE_THRESHOLD, mismatch_metrics, rel_error
from minite_core.formats.e2m1 import unpack_fp4
from minite_core.formats.four_over_six import quantize_4over6
from minite_core.formats.nvfp4 import dequantize, quantize
from minite_core.formats.rht import rht
from minite_core.kernels.dispatch import using_backend
from minite_core.model import CausalLM, ModelConfig, load_pretrained
from minite_core.nn import QuantLinear
from minite_core.peers import te_learner
from minite_core.peers.te_learner import MODES, TELinear, TEMode, get_mode
from minite_core.results import write_json, write_result
from minite_core.runs.execution import Execution
from minite_core.seeds import example_seed
from minite_core.task.arithmetic import make_example
from minite_core.task.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_tokenizer, encode

STAGE = "te"
NVFP4_MODES = ("nvfp4", "nvfp4-rowscaled", "nvfp4-4over6")
GEMM_SHAPES = ((256, 512, 384), (1024, 2048, 768))  # a small case; a Qwen3-30B-A3B expert (hidden x width)
# the RL model of experiments/h200.yaml (its `pretrain:` shape, as rl.pretrain builds it), used when no
# checkpoint is given; vocabulary: the task tokenizer's, rounded up to 16 (rl.pretrain.model_vocab)
H200_RL_MODEL = ModelConfig(vocab_size=-(-len(build_tokenizer()) // 16) * 16, hidden_size=256, intermediate_size=512,
                            moe_intermediate_size=256, num_hidden_layers=4, num_attention_heads=8,
                            num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2,
                            rope_theta=10000.0, max_position_embeddings=512, tie_word_embeddings=False,
                            bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)


@contextlib.contextmanager
def kernels(backend: str | None):
    """Run our side on kernel backend `backend` (None: the run's backend), through dispatch.using_backend (the
    command's execution installed the run's backend once, runs.execution)."""
    if backend is None:
        yield
        return
    with using_backend(backend):
        yield


def agreement(sut: torch.Tensor, te: torch.Tensor) -> dict:
    """sut rounded to bf16 (TE's output dtype: fprop, dgrad and wgrad are bf16 in every mode) against te:
    max |Δ|, ‖Δ‖_F / ‖te‖_F, and the fraction of elements equal."""
    a, b = sut.bfloat16().double(), te.double()
    return {"max_abs": float((a - b).abs().max()), "rel": float((a - b).norm() / b.norm().clamp_min(1e-300)),
            "eq_bf16": float((a == b).double().mean())}


# ---- TE's reference dataflow, written with our formats ----------------------------------------------------------
def _q(t: torch.Tensor, mode: TEMode, *, block=(1, 16), row=False, four="off") -> torch.Tensor:
    """Dequantized fp32 operand quantized as one NVFP4QuantizerRef would: plain exact, or 4over6 (E4M3 bound 256)."""
    scale_mode = "row" if row else "tensor"
    if four != "off":
        return dequantize(quantize_4over6(t, block=block, scale_mode=scale_mode, err_mode=four))
    return dequantize(quantize(t, block=block, scale_mode=scale_mode, math="exact", check=False))


def te_reference_dataflow(x, w, dy, mode: TEMode) -> dict:
    """(fprop, dgrad, wgrad) fp32 as TE's Linear + NVFP4QuantizerRef compute them (module/linear.py forward/backward,
    custom_recipes/gemm.py custom_gemm operand choice, reference_nvfp4.py `_quantize`): rowwise x and W for fprop;
    rowwise dy and columnwise W (= W^T quantized alone) for dgrad; columnwise dy and x (their transposes, RHT'd in
    the input dtype when configured, row-scaled per row of x^T when the input is row-scaled) for wgrad."""
    four, wt = mode.four_over_six, mode.weight_tile
    rot = (lambda t: rht(t).to(t.dtype)) if mode.rht else (lambda t: t)  # reference_nvfp4.py _apply_rht: x.dtype
    x_t, dy_t = x.t().contiguous(), dy.t().contiguous()
    fprop = _q(x, mode, row=mode.row_scaled, four=four) @ _q(w, mode, block=wt, four=four).t()
    dgrad = _q(dy, mode) @ _q(w.t().contiguous(), mode, block=wt, four=four).t()
    wgrad = _q(rot(dy_t), mode) @ _q(rot(x_t), mode, row=mode.row_scaled, four=four).t()
    return {"fprop": fprop, "dgrad": dgrad, "wgrad": wgrad}


# ---- per GEMM ---------------------------------------------------------------------------------------------------
def _fwd_bwd(module, x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, dx, dW) fp32 of module(x) with output gradient dy."""
    x_in = x.clone().requires_grad_(True)
    y = module(x_in)
    y.backward(dy)
    return y.detach().float(), x_in.grad.float(), module.weight.grad.float()


def compare_gemm(mode: str | TEMode, m: int, k: int, n: int, *, seed: int = 0,
                 backend: str | None = "reference", device: str = "cuda") -> dict:
    """One te.Linear (fprop, dgrad, wgrad) vs our QuantLinear (sut=ours) and vs TE's reference dataflow in our
    formats (sut=dataflow, NVFP4 modes). -> {"gemm/<mode>/<M>x<K>x<N>/<out>/...": float}."""
    mode = get_mode(mode)
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(m, k, generator=g, device=dev).bfloat16()
    w = torch.randn(n, k, generator=g, device=dev) * k ** -0.5  # fp32 master
    dy = torch.randn(m, n, generator=g, device=dev).bfloat16()
    te = dict(zip(("fprop", "dgrad", "wgrad"), _fwd_bwd(TELinear(w, mode), x, dy)))
    exact = {"fprop": x.float() @ w.t(), "dgrad": dy.float() @ w, "wgrad": dy.float().t() @ x.float()}
    suts = {}
    if mode.emulated_by is not None:
        ours = QuantLinear(k, n).to(dev)
        with torch.no_grad():
            ours.weight.copy_(w)
        ours.profile = mode.emulated_by
        with kernels(backend):
            suts["ours"] = dict(zip(("fprop", "dgrad", "wgrad"), _fwd_bwd(ours, x, dy)))
    if mode.recipe == "nvfp4-ref":
        suts["dataflow"] = te_reference_dataflow(x, w, dy, mode)
    key, out = f"gemm/{mode.name}/{m}x{k}x{n}", {}
    for o in ("fprop", "dgrad", "wgrad"):
        out[f"{key}/{o}/quant_rel"] = agreement(te[o], exact[o])["rel"]
        for name, sut in suts.items():
            out.update({f"{key}/{o}/{name}/{metric}": v for metric, v in agreement(sut[o], te[o]).items()})
    return out


# ---- quantizers, bit for bit on the GPU -------------------------------------------------------------------------
def compare_quantizers(*, seed: int = 0, m: int = 256, k: int = 512, device: str = "cuda") -> dict:
    """NVFP4QuantizerRef (reference_nvfp4.py) vs formats on the same CUDA bf16 tensors: fraction of codes / block
    scale bytes equal, per configuration and data (Gaussian, heavy-tailed)."""
    from transformer_engine.pytorch.custom_recipes.reference_nvfp4 import NVFP4QuantizerRef
    from transformer_engine.pytorch.custom_recipes.reference_utils import Fp4Formats

    g = torch.Generator(device=device).manual_seed(seed)
    chi2 = torch.randn(2, m, k, generator=g, device=device).pow(2).sum(0)
    data = {"gauss": torch.randn(m, k, generator=g, device=device).bfloat16(),
            "student_t": (torch.randn(m, k, generator=g, device=device) / (chi2 / 2).sqrt()).bfloat16()}
    four = dict(nvfp4_use_4over6=True, nvfp4_e4m3_max=256, nvfp4_4over6_err_mode="MAE")
    cases = {  # name: (NVFP4QuantizerRef kwargs, ours)
        "1x16": ({}, lambda x: quantize(x)),
        "16x16": ({"quant_tile_shape": (16, 16)}, lambda x: quantize(x, block=(16, 16))),
        "row_scaled": ({"row_scaled_nvfp4": True}, lambda x: quantize(x, scale_mode="row")),
        "4over6": (four, lambda x: quantize_4over6(x)),
        "4over6_row_scaled": ({**four, "row_scaled_nvfp4": True}, lambda x: quantize_4over6(x, scale_mode="row")),
        "4over6_16x16": ({**four, "quant_tile_shape": (16, 16)}, lambda x: quantize_4over6(x, block=(16, 16))),
    }
    out = {}

    def record(key, te_data, te_scale, t):
        out[f"quantizer/{key}/codes_equal"] = float((unpack_fp4(te_data) == unpack_fp4(t.data)).double().mean())
        out[f"quantizer/{key}/scales_equal"] = float((te_scale.view(torch.uint8) == t.scale.view(torch.uint8))
                                                     .double().mean())

    for dist, x in data.items():
        for name, (kw, ours) in cases.items():
            t = NVFP4QuantizerRef(dtype=Fp4Formats.E2M1, columnwise=False, **kw).quantize(x)
            record(f"{name}/{dist}", t.data, t.scale, ours(x))
        # the wgrad operand: RHT along tokens of x^T, TE's in the input dtype (bf16), ours in fp32 or rounded
        t = NVFP4QuantizerRef(dtype=Fp4Formats.E2M1, with_rht=True).quantize(x)
        rot = rht(x.t().contiguous())
        record(f"rht_wgrad_fp32/{dist}", t.data_t, t.scale_t, quantize(rot))
        record(f"rht_wgrad_bf16/{dist}", t.data_t, t.scale_t, quantize(rot.bfloat16()))
    return out


# ---- end to end -------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def record_outputs(model, names):
    """Forward hooks on `model`'s modules `names`: yields {name: [output (n, F) fp32, one per call]}, its keys in
    the order the modules first ran (a tuple output: its first element)."""
    rec, handles = {}, []
    for name in names:
        def hook(module, args, out, _name=name):
            t = out[0] if isinstance(out, tuple) else out
            rec.setdefault(_name, []).append(t.detach().float().reshape(-1, t.shape[-1]))
        handles.append(model.get_submodule(name).register_forward_hook(hook))
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()


def trace_names(model) -> list[str]:
    """The traced modules: every module of the decoder layers (norms, attention, q/k/v/o, MLP / MoE, router,
    experts, each GEMM), the final norm and the LM head — names the TE copy shares (te_learner docstring)."""
    return [n for n, _ in model.named_modules() if n.startswith("model.layers.")] + ["model.norm", "lm_head"]


def trace_compare(ours: dict, te: dict, key: str, threshold: float = TRACE_THRESHOLD,
                  top_k: int | None = None) -> dict:
    """Per module in our execution order: rel = ‖ours − TE‖ / ‖TE‖ and eq_bf16 (fraction of elements equal once
    both are rounded to bf16; rel = inf and eq_bf16 = 0 where the shapes differ), and the first module whose
    rel > 0 / > threshold ("none" if no module). Routers (`*.mlp.gate`, with top_k): routing_flip, the fraction of
    tokens whose top-k expert set differs — after a flip the experts' rows (sorted by expert) no longer align, so
    their rel measures the shift, not arithmetic. -> {f"{key}/...": ...}."""
    out, first = {f"{key}/threshold": threshold}, {"first_nonzero": "none", "first_divergence": "none"}
    for step, (name, chunks) in enumerate(ours.items()):
        a, b = torch.cat(chunks), torch.cat(te[name]) if name in te else None
        if b is None or a.shape != b.shape:
            rel, eq = math.inf, 0.0
        else:
            rel, eq = rel_error(b, a), float((a.bfloat16() == b.bfloat16()).double().mean())
        out.update({f"{key}/{name}/step": float(step), f"{key}/{name}/rel": rel, f"{key}/{name}/eq_bf16": eq})
        if top_k and name.endswith(".mlp.gate") and b is not None and a.shape == b.shape:
            sets = [t.topk(top_k, dim=-1).indices.sort(-1).values for t in (a, b)]
            out[f"{key}/{name}/routing_flip"] = float((sets[0] != sets[1]).any(-1).double().mean())
        for which, limit in (("first_nonzero", 0.0), ("first_divergence", threshold)):
            if first[which] == "none" and rel > limit:
                first[which] = name
    return out | {f"{key}/{k}": v for k, v in first.items()}


def task_batch(n: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """n task prompts (<bos> + prompt) and their gold responses (+ <eos>), three difficulty levels."""
    return encode(build_tokenizer(), [make_example(example_seed(seed, i), i % 3) for i in range(n)])


def _pair(key: str, lp_a, lp_b, mask, am_a, am_b) -> dict:
    out = mismatch_metrics(lp_a, lp_b, mask, argmax_learner=am_a, argmax_sampler=am_b, prefix=f"{key}/")
    out[f"{key}/max_abs_delta"] = float((lp_a.double() - lp_b.double())[mask].abs().max())
    return out


def compare_e2e(model: CausalLM, prompts, responses, *, modes=tuple(MODES),
                backend: str | None = "reference", trace: bool = True) -> dict:
    """Learner log-probs of the same tokens: ours (mode.emulated_by) vs TE's (TELearner), where we emulate the
    mode, and TE <mode> vs TE bf16 (the quantization effect). Modes must start with bf16 (the floor).
    trace: also the first-divergence trace of the same forwards (`trace_compare`, keys e2e/<mode>/trace/...)."""
    if modes[0] != "bf16":
        raise ValueError(f"compare_e2e needs 'bf16' first (the floor every pair is read against), got {modes}")
    out, te_bf16 = {}, None
    for name in modes:
        mode = get_mode(name)
        te = te_learner.TELearner(model, mode)
        traced = mode.emulated_by is not None and trace
        with record_outputs(te.model, trace_names(model) if traced else []) as te_out:
            lp_te, _, mask, am_te = te.logprobs(prompts, responses, with_argmax=True)
        del te
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if mode.emulated_by is not None:
            with kernels(backend), record_outputs(model, trace_names(model) if traced else []) as ours_out:
                lp, _, _, am = Learner(model, mode.emulated_by).logprobs(prompts, responses, with_argmax=True)
            out.update(_pair(f"e2e/{mode.name}/ours-vs-te", lp, lp_te, mask, am, am_te))
            if traced:
                out.update(trace_compare(ours_out, te_out, f"e2e/{mode.name}/trace",
                                         top_k=model.config.num_experts_per_tok))
        del te_out
        if te_bf16 is None:
            te_bf16 = (lp_te, am_te)
        else:
            out.update(_pair(f"e2e/{mode.name}/te-vs-te-bf16", lp_te, te_bf16[0], mask, am_te, te_bf16[1]))
    return out


# ---- te.GroupedLinear probe (own process: a sticky CUDA error must not poison the rest) -------------------------
PROBE_SHAPE = (128, 2048, 1536, 512)  # experts, hidden, 2 x expert width (gate|up), tokens per expert: Qwen3-30B


def grouped_probe() -> dict:
    """te.GroupedLinear forward + backward per (mode, routing): "ok" or the error text."""
    import transformer_engine.pytorch as te
    import transformer_engine_torch as tex

    E, K, N, per = PROBE_SHAPE
    results = {"cublaslt_version": int(tex.get_cublasLt_version())}
    # GPU.md's failing case read as 512 tokens in all, routed at random (experts with 0 and with odd counts)
    random_512 = torch.bincount(torch.randint(0, E, (512,), generator=torch.Generator().manual_seed(0)), minlength=E)
    routings = {"all-experts": [per] * E, "one-empty": [0] + [2 * per] + [per] * (E - 2),
                "512-random": random_512.tolist()}
    for mode_name, grouped_tensor in (("bf16", False), ("bf16", True), ("fp8-current", False), ("fp8-block", False)):
        ok, why = te_learner.mode_available(mode_name)
        for routing, sizes in routings.items():
            key = f"grouped/{mode_name}{'+grouped_tensor' if grouped_tensor else ''}/{routing}"
            if not ok:
                results[key] = f"skipped: {why}"
                continue
            try:
                lin = te.GroupedLinear(E, K, N, bias=False, params_dtype=torch.float32, device="cuda",
                                       use_grouped_tensor=grouped_tensor)
                x = torch.randn(sum(sizes), K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                splits = torch.tensor(sizes, dtype=torch.int64, device="cuda" if grouped_tensor else "cpu")
                with te_learner.te_autocast(mode_name):  # the grouped-tensor path wants m_splits on the GPU
                    y = lin(x, splits)
                y.float().sum().backward()
                torch.cuda.synchronize()
                results[key] = "ok"
            except (RuntimeError, ValueError, AssertionError, TypeError, NotImplementedError) as e:  # TE's checks
                results[key] = f"{type(e).__name__}: {str(e)[:400]}"
            torch.cuda.empty_cache()
    return results


def _probe_subprocess(path: Path) -> dict:
    cmd = [sys.executable, "-m", "minite_core.peers.te_compare", "probe", "--out", str(path)]
    rc = subprocess.run(cmd, capture_output=True, text=True)
    if rc.returncode != 0 or not path.exists():
        return {"grouped/probe": f"crashed (rc={rc.returncode}): {rc.stderr[-600:]}"}
    return json.loads(path.read_text())


# ---- CLI --------------------------------------------------------------------------------------------------------
def _model(a) -> tuple[CausalLM, str]:
    if a.checkpoint:
        return load_pretrained(a.checkpoint, device=a.device), str(a.checkpoint)
    model = CausalLM(H200_RL_MODEL).init_weights(a.seed, std=a.std).to(a.device)
    return model, f"random, experiments/h200.yaml RL shape, init std {a.std}"


def _summary(metrics: dict, probe: dict) -> str:
    lines = ["# Transformer Engine vs our emulation (H200)", "",
             "| GEMM | output | TE quant. error (rel) | ours vs TE: rel / max abs / eq bf16 | TE dataflow in our "
             "formats vs TE: rel / eq bf16 |", "|---|---|---|---|---|"]
    for key in sorted(k for k in metrics if k.startswith("gemm/") and k.endswith("/quant_rel")):
        base = key[: -len("/quant_rel")]
        ours = (f"{metrics[base + '/ours/rel']:.2e} / {metrics[base + '/ours/max_abs']:.2e} / "
                f"{metrics[base + '/ours/eq_bf16']:.4f}") if base + "/ours/rel" in metrics else "—"
        flow = (f"{metrics[base + '/dataflow/rel']:.2e} / {metrics[base + '/dataflow/eq_bf16']:.4f}"
                if base + "/dataflow/rel" in metrics else "—")
        gemm, out = base[len("gemm/"):].rsplit("/", 1)
        lines.append(f"| {gemm} | {out} | {metrics[key]:.2e} | {ours} | {flow} |")
    lines += ["", "| log-probs (end to end) | max abs Δ | k3 | argmax flip |", "|---|---|---|---|"]
    for key in sorted(k for k in metrics if k.startswith("e2e/") and k.endswith("/k3")):
        base = key[: -len("/k3")]
        lines.append(f"| {base[len('e2e/'):]} | {metrics[base + '/max_abs_delta']:.3e} | {metrics[key]:.3e} | "
                     f"{metrics[base + '/argmax_flip']:.4f} |")
    traced = sorted(k[: -len("/first_divergence")] for k in metrics if k.endswith("/trace/first_divergence"))
    if traced:
        lines += ["", "| first-divergence trace (ours vs TE, execution order) | first rel > 0: rel / eq bf16 | "
                  "first rel > threshold: rel / eq bf16 |", "|---|---|---|"]
    for base in traced:
        cells = []
        for which in ("first_nonzero", "first_divergence"):
            name = metrics[f"{base}/{which}"]
            cells.append(name if name == "none" else
                         f"`{name}`: {metrics[f'{base}/{name}/rel']:.2e} / {metrics[f'{base}/{name}/eq_bf16']:.4f}")
        mode = base[len("e2e/"):-len("/trace")]
        lines.append(f"| {mode} (threshold {metrics[base + '/threshold']:.0e}) | {cells[0]} | {cells[1]} |")
    lines += ["", "| quantizer (TE NVFP4QuantizerRef vs formats, CUDA) | codes equal | scales equal |", "|---|---|---|"]
    for key in sorted(k for k in metrics if k.startswith("quantizer/") and k.endswith("/codes_equal")):
        base = key[: -len("/codes_equal")]
        lines.append(f"| {base[len('quantizer/'):]} | {metrics[key]:.6f} | {metrics[base + '/scales_equal']:.6f} |")
    lines += ["", "te.GroupedLinear probe:", ""] + [f"- `{k}`: {v}" for k, v in probe.items()]
    return "\n".join(lines) + "\n"


def run_main(a) -> int:
    ok, reason = te_learner.available()
    if not ok:
        print(f"te_compare: error: {reason}", file=sys.stderr)
        return 2
    import transformer_engine

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    # "env": the run's backend, $MINITE_KERNELS or automatic, resolved and recorded as every command's (runs.execution)
    backend = Execution.resolve(device=a.device).install().kernels if a.kernels == "env" else a.kernels
    metrics: dict = {}
    errors: dict = {}  # one failing piece is recorded, the rest still measured

    def attempt(key, fn):
        try:
            metrics.update(fn())
            print(f"te_compare: {key} done", flush=True)
        except (RuntimeError, ValueError, AssertionError, NotImplementedError, TypeError) as e:  # TE's errors
            errors[key] = f"{type(e).__name__}: {str(e)[:600]}"
            print(f"te_compare: {key} FAILED: {errors[key]}", flush=True)

    attempt("quantizers", lambda: compare_quantizers(seed=a.seed, device=a.device))
    modes = [n for n in MODES if te_learner.mode_available(n)[0]]
    errors.update({f"mode/{n}": te_learner.mode_available(n)[1] for n in MODES if n not in modes})
    for name in modes:
        for m, k, n in GEMM_SHAPES:
            attempt(f"gemm/{name}/{m}x{k}x{n}",
                    lambda: compare_gemm(name, m, k, n, seed=a.seed, backend=backend, device=a.device))
    model, checkpoint = _model(a)
    prompts, responses = task_batch(a.prompts, a.seed)
    attempt("e2e", lambda: compare_e2e(model, prompts, responses, modes=tuple(modes), backend=backend))
    probe = {} if a.skip_probe else _probe_subprocess(out / "grouped_probe.tmp.json")
    (out / "grouped_probe.tmp.json").unlink(missing_ok=True)
    config = {"transformer_engine": transformer_engine.__version__, "checkpoint": checkpoint,
              "prompts": a.prompts, "seed": a.seed, "our_kernels": a.kernels, "gemm_shapes": GEMM_SHAPES,
              "modes": {n: {"recipe": m.recipe, "emulated_by": m.emulated_by.name if m.emulated_by else None,
                            "host": m.host.name} for n, m in MODES.items()},
              "tf32": torch.backends.cuda.matmul.allow_tf32}
    write_result(out / "agreement.json", stage=STAGE, experiment=a.experiment, config=config, metrics=metrics,
                 grouped_probe=probe, errors=errors)
    summary = _summary(metrics, probe) + "".join(f"\nFAILED `{k}`: {v}\n" for k, v in errors.items())
    (out / "summary.md").write_text(summary)
    print(summary)
    return 1 if errors and not metrics else 0


def probe_main(a) -> int:
    ok, reason = te_learner.available()
    if not ok:
        print(f"te_compare probe: error: {reason}", file=sys.stderr)
        return 2
    write_json(a.out, grouped_probe())
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minite_core.peers.te_compare", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="every comparison; writes <out>/agreement.json (te/v1) and summary.md")
    r.add_argument("--out", default="results/h200/te")
    r.add_argument("--experiment", default="h200")
    r.add_argument("--checkpoint", default=None, help="a checkpoint dir (default: a random model of the RL shape)")
    r.add_argument("--prompts", type=int, default=32)
    r.add_argument("--std", type=float, default=0.1, help="init std of the random model (not flat logits)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--kernels", default="reference", choices=("reference", "triton", "env"),
                   help="our side's kernel backend (env: $MINITE_KERNELS, else automatic)")
    r.add_argument("--skip-probe", action="store_true", help="no te.GroupedLinear probe")
    r.add_argument("--device", default="cuda", help="cuda (cpu only serves the tests' TE stand-in)")
    p = sub.add_parser("probe", help="te.GroupedLinear probes only (run by `run` in a subprocess)")
    p.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    return {"run": run_main, "probe": probe_main}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())

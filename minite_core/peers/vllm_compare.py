"""Real peer measurement: our engines against the real vLLM sampler (BF16 and NVFP4), on CPU.

What: `python -m minite_core.peers.vllm_compare run --out results/vllm-cpu` (in the vLLM peer venv) builds small
random checkpoints, samples rollouts from them with real vLLM (`peers.vllm_trace capture`: vLLM's generation with
every op recorded), scores the same tokens with our engines under several profiles, and writes one results-contract
JSON per (engine, profile, sampler) pair (stage `vllm_peer`), the first-divergence traces, the NVFP4 and MoE
k3 over the dense bf16 floor against their targets (`ratios.json`) and `summary.md`. Our two engines score vLLM's
tokens: the learner (one full-sequence forward) and our sampler (`Sampler.score`: teacher-forced, generate's own
prefill + cached-decode schedule).

  bf16-dense / bf16-moe   our bf16 (the floor) and vllm-bf16-cpu (vLLM's CPU kernels around bf16 GEMMs) vs vLLM
                          bf16; fp32 vs vLLM fp32 is the plumbing anchor (MoE).
  nvfp4-dense             the dense checkpoint exported by `model.nvfp4_io` after `model.calibrate` (vLLM has no CPU
                          NVFP4 MoE), run by vLLM's emulation kernel (`peers.vllm_sampler`). A knob ladder from
                          the GPU profile `vllm-nvfp4` to `vllm-nvfp4-cpu`, one knob a rung (w4a4_gemm, rope_dtype,
                          attention_dtype, kernel_rounding, fused_add_norm), each found by the trace; plus the
                          te-nvfp4 / minite / bf16 learners against the same vLLM NVFP4 rollouts.
`kernel-check` compares, per Linear of the NVFP4 checkpoint, vLLM's own `ref_nvfp4_quant` / `run_nvfp4_emulations`
with our quantizer / `kernels.vllm_cpu.gemm` on random inputs: bit-exact or not.

Checkpoints are random (`init_weights(seed, std)` with a large std so the logits are not flat, entropy reported)
unless a trained one is given; head_dim is 32 because vLLM's CPU attention rejects head_dim 16 (the tiny presets).
Each vLLM engine runs in its own subprocess, one engine per process as vLLM's offline API prefers.

Shape legend: M = tokens, K = in features, N = out features.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from minite_core.engines.mismatch import mismatch_metrics
from minite_core.model.nvfp4_io import (
    CheckpointWeight,
    amax_for_encode_scale,
    export_nvfp4,
    load_nvfp4,
    quantize_checkpoint_weights,
)
from minite_core.engines.calibration import calibrate_on_examples
from minite_core.engines.learner import Learner
from minite_core.engines.sampler import Rollout, Sampler
from minite_core.formats.e2m1 import e2m1_decode, unpack_fp4
from minite_core.formats.nvfp4 import BLOCK, dequantize, global_encode_scale, quantize
from minite_core.kernels import vllm_cpu
from minite_core.model import PRESETS, CausalLM, load_pretrained, save_pretrained
from minite_core.peers.vllm_sampler import rollout_from_json, rollout_to_json
from minite_core.profiles import get_profile
from minite_core.results import write_json, write_result
from minite_core.runs.execution import Execution
from minite_core.seeds import example_seed
from minite_core.task.arithmetic import make_example
from minite_core.task.tokenizer import EOS_ID, build_tokenizer, save_tokenizer

STAGE, EXPERIMENT = "vllm_peer", "vllm-cpu"
FP32 = get_profile("bf16").replace(name="fp32", dtype="float32", router_dtype="float32", lm_head_dtype="float32")
# vLLM's CPU attention supports head_dim 32 but not 16 (RuntimeError "Unsupported CPU attention configuration").
MOE = PRESETS["tiny-moe"].replace(hidden_size=64, head_dim=32, intermediate_size=128, moe_intermediate_size=32)
DENSE = PRESETS["tiny-dense"].replace(hidden_size=64, head_dim=32, intermediate_size=128)


# ---- vLLM's CPU NVFP4 emulation arithmetic on a checkpoint weight ------------------------------------------------
def vllm_cpu_gemm(x: torch.Tensor, w: CheckpointWeight, input_encode_scale: torch.Tensor) -> torch.Tensor:
    """y = x Wᵀ as vLLM's EmulationNvFp4LinearKernel computes it on CPU, x (M, K) in the compute dtype -> (M, N):
    our fast static quantizer with the checkpoint's S_enc (amax chosen so 2688/amax == S_enc bit for bit), then
    `kernels.vllm_cpu.gemm` (the profile knob w4a4_gemm="vllm-cpu")."""
    s_enc = input_encode_scale.float().reshape(())  # vLLM: input_global_scale_inv, 0-dim fp32
    x_q = quantize(x, amax=amax_for_encode_scale(s_enc), math="fast", check=False)
    return vllm_cpu.gemm(x_q, s_enc, w.nvfp4, x.dtype)


# ---- data ---------------------------------------------------------------------------------------------------
def _task_examples(n: int, seed: int) -> list[dict]:
    return [make_example(example_seed(seed, i), i % 3) for i in range(n)]


def _task_prompts(n: int, seed: int, tok) -> list[list[int]]:
    return [tok(r["prompt"])["input_ids"] for r in _task_examples(n, seed)]


def calibrate_dense(model, tok, rows: list[dict], seed: int) -> dict:
    """Static scales of the NVFP4 checkpoint: the task examples `rows` through the calibration path every stage
    shares (engines.calibration)."""
    return calibrate_on_examples(model, tok, rows, n=len(rows), seed=seed)


# ---- one vLLM engine per process ------------------------------------------------------------------------------
def sample_main(args) -> int:
    from minite_core.peers.vllm_sampler import VLLMSampler, available

    ok, version = available()
    if not ok:
        raise RuntimeError(version)
    prompts = json.loads(Path(args.prompts).read_text())
    t0 = time.perf_counter()
    sampler = VLLMSampler(args.checkpoint, dtype=args.dtype, seed=args.seed, **json.loads(args.llm_kwargs))
    t1 = time.perf_counter()
    r = sampler.generate(prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         top_p=args.top_p, stop_ids=(EOS_ID,), seed=args.seed)
    t2 = time.perf_counter()
    write_json(args.out, {**rollout_to_json(r), "vllm": version, "dtype": args.dtype,
                          "init_s": t1 - t0, "generate_s": t2 - t1})
    return 0


# ---- kernel check ---------------------------------------------------------------------------------------------
def kernel_check_main(args) -> int:
    """vLLM's emulation functions vs ours on every Linear of an NVFP4 checkpoint (random inputs, incl. values
    above the calibrated amax so saturation is exercised)."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import (
        ref_nvfp4_quant,
        run_nvfp4_emulations,
    )

    model, weights = load_nvfp4(args.checkpoint)
    gen = torch.Generator().manual_seed(args.seed)
    rows = []
    for name, w in weights.items():
        m = model.get_submodule(name)
        amax = m.input_amax.float()
        s_enc = global_encode_scale(amax)  # == the file's input_global_scale (load_nvfp4 guarantees it)
        K = w.nvfp4.data.shape[1] * 2
        x = (torch.randn(37, K, generator=gen) * amax / 2).to(torch.bfloat16)  # ~5% of |x| above amax
        # activation quantizer: vLLM ref_nvfp4_quant -> fp4 values (fp32) + block scales (fp32)
        xq_ref, sf_ref = ref_nvfp4_quant(x, s_enc.reshape(()), BLOCK)
        xq_sut = quantize(x, amax=amax, math="fast", check=False)
        vals_sut = e2m1_decode(unpack_fp4(xq_sut.data))
        codes_equal = torch.equal(xq_ref.view(torch.int32), vals_sut.view(torch.int32)) or bool(
            (xq_ref == vals_sut).all())  # ±0 differ in bits only
        scales_equal = torch.equal(sf_ref.view(torch.int32), xq_sut.scale.float().view(torch.int32))
        # whole GEMM
        y_ref = run_nvfp4_emulations(x=x, input_global_scale=s_enc.reshape(()), weight=w.nvfp4.data,
                                     weight_scale_swizzled=w.nvfp4.scale,
                                     weight_global_scale=1.0 / w.encode_scale.reshape(()), swizzle=False)
        y_sut = vllm_cpu_gemm(x, w, s_enc)
        y_reference = (dequantize(xq_sut) @ dequantize(w.nvfp4).t()).to(torch.bfloat16)  # nn's reference GEMM
        rows.append({
            "module": name, "K": K, "N": w.nvfp4.data.shape[0],
            "act_codes_bitexact": bool(codes_equal), "act_scales_bitexact": bool(scales_equal),
            "saturated_frac": float((x.float().abs() > amax).float().mean()),
            "gemm_vllm_cpu_gemm_bitexact": bool(torch.equal(y_ref, y_sut)),
            "gemm_vllm_cpu_gemm_max_abs": float((y_ref.float() - y_sut.float()).abs().max()),
            "gemm_our_reference_max_rel": float((y_ref.float() - y_reference.float()).abs().max()
                                                / y_ref.float().abs().max()),
        })
    summary = {
        "act_codes_bitexact": all(r["act_codes_bitexact"] for r in rows),
        "act_scales_bitexact": all(r["act_scales_bitexact"] for r in rows),
        "gemm_vllm_cpu_gemm_bitexact": all(r["gemm_vllm_cpu_gemm_bitexact"] for r in rows),
        "gemm_our_reference_max_rel": max(r["gemm_our_reference_max_rel"] for r in rows),
        "modules": len(rows),
    }
    write_json(args.out, {"summary": summary, "per_module": rows})
    return 0


# ---- our side ----------------------------------------------------------------------------------------------------
def _metrics(logp, mask, argmax, rollout: Rollout) -> dict:
    pad = rollout.padded()  # on the CPU: our side (on the GPU when the model is) is brought there
    logp, mask, argmax = logp.cpu(), mask.cpu(), None if argmax is None else argmax.cpu()
    m = mismatch_metrics(logp, pad["logprobs"], mask, argmax_learner=argmax, argmax_sampler=pad["argmax_ids"])
    m["mismatch/max_abs_delta"] = float((logp.double() - pad["logprobs"].double())[mask].abs().max())
    return m


def _score(model, profile, rollout: Rollout, engine: str = "learner") -> dict:
    """Mismatch metrics of our `engine` ("learner": full-sequence forward; "sampler": teacher-forced decode with
    generate's schedule) under `profile` against the rollout's own log-probs, on the rollout's tokens."""
    if engine == "sampler":
        logp, mask, amx = Sampler(model, profile).score(rollout.prompt_ids, rollout.response_ids)
    else:
        logp, _, mask, amx = Learner(model, profile).logprobs(rollout.prompt_ids, rollout.response_ids,
                                                               temperature=1.0, with_argmax=True)
    return _metrics(logp, mask, amx, rollout)


def _entropy(model, rollout: Rollout) -> float:
    learner = Learner(model, FP32)
    _, ent, mask = learner.logprobs(rollout.prompt_ids, rollout.response_ids, with_entropy=True)
    return float(ent[mask].mean())


# The nvfp4-dense knob ladder: from the GPU profile to vLLM's CPU path, one knob a rung (profiles.py says why).
LADDER = (("vllm-nvfp4", {}), ("+w4a4_gemm", {"w4a4_gemm": "vllm-cpu"}), ("+rope_dtype", {"rope_dtype": "float32"}),
          ("+attention_dtype", {"attention_dtype": "float32"}), ("+kernel_rounding", {"kernel_rounding": "rtz"}),
          ("+fused_add_norm", {"fused_add_norm": True}))


def _vllm_capture(checkpoint: Path, dtype: str, prompts_file: Path, out: Path, a) -> tuple[dict, Path]:
    """One vLLM engine in a subprocess (`vllm_trace capture`): (rollout dict, capture file)."""
    cmd = [sys.executable, "-m", "minite_core.peers.vllm_trace", "capture", "--checkpoint", str(checkpoint),
           "--dtype", dtype, "--prompts", str(prompts_file), "--out", str(out), "--seed", str(a.seed),
           "--max-new-tokens", str(a.max_new_tokens), "--temperature", str(a.temperature), "--top-p", str(a.top_p)]
    log = out.with_suffix(".log")
    with open(log, "w") as fh:
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise RuntimeError(f"vLLM capture failed (rc={rc}); see {log}:\n" + log.read_text()[-3000:])
    return torch.load(out)["rollout"], out


def _traces(out: Path, section: str, capture_file: Path, model, profiles, results_cfg: dict) -> dict:
    """First-divergence trace + isolated op checks against vLLM, per profile -> {profile: short summary}."""
    from minite_core.peers.vllm_trace import isolate, trace_against

    cap = torch.load(capture_file)
    short = {}
    for prof in profiles:
        t = trace_against(cap, model, prof)
        iso = isolate(cap, model, prof)
        name = get_profile(prof).name
        write_result(out / STAGE / "trace" / f"{section}__{name}.json", stage=STAGE, experiment=EXPERIMENT,
                     config={**results_cfg, "section": section, "profile": name, "reference": "real vLLM"},
                     metrics={"first_divergence": (t["first_divergence"] or {}).get("op"),
                              "first_nonzero": (t["first_nonzero"] or {}).get("op")},
                     ops=t["ops"], isolated=iso)
        short[name] = {"first_divergence": (t["first_divergence"] or {}).get("op"),
                       "first_nonzero": (t["first_nonzero"] or {}).get("op"),
                       "not_bitwise_isolated": [f"{r['op']} ({r['equal']:.4f} equal)" for r in iso if r["equal"] < 1]}
    return short


def run_main(a) -> int:
    Execution.resolve().install()  # our side on CPU: the reference kernels unless $MINITE_KERNELS says, recorded
    out = Path(a.out)
    work = Path(a.work or out / "work")
    work.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    prompts = _task_prompts(a.prompts, a.seed, tok)
    prompts_file = work / "prompts.json"
    prompts_file.write_text(json.dumps(prompts))
    common = {"prompts": a.prompts, "max_new_tokens": a.max_new_tokens, "temperature": a.temperature,
              "top_p": a.top_p, "seed": a.seed, "init_std": a.std, "logprobs": "processed_logprobs",
              "command": "python -m minite_core.peers.vllm_compare run " + " ".join(a.argv)}
    results: list[tuple[str, str, str, str, dict]] = []  # (section, engine, profile, sampler, metrics)

    def record(section, engine, profile_name, sampler_name, metrics, **cfg):
        config = {**common, **cfg, "section": section, "engine": engine, "profile": profile_name,
                  "sampler": sampler_name}
        name = f"{section}__{engine}-{profile_name}__{sampler_name}".replace("/", "-")
        write_result(out / STAGE / f"{name}.json", stage=STAGE, experiment=EXPERIMENT, config=config,
                     metrics=metrics)
        results.append((section, engine, profile_name, sampler_name, metrics))
        print(f"{section:11s} {engine:7s} {profile_name:30s} {sampler_name:12s} k3={metrics['mismatch/k3']:.3e} "
              f"max|Δ|={metrics['mismatch/max_abs_delta']:.3e}", flush=True)

    def both(section, net, prof, rollout, sampler_name, **cfg):
        for engine in ("learner", "sampler"):
            record(section, engine, prof, sampler_name, _score(net, prof, rollout, engine), **cfg)

    traces = {}
    # (a) BF16 MoE and dense ----------------------------------------------------------------------------------
    floors = {}
    for section, cfg_model, seed in (("bf16-moe", MOE, a.seed), ("bf16-dense", DENSE, a.seed + 1)):
        ckpt = work / f"{section}-ckpt"
        save_pretrained(CausalLM(cfg_model).init_weights(seed, std=a.std), ckpt, dtype=torch.bfloat16)
        save_tokenizer(tok, ckpt)
        model = load_pretrained(ckpt)  # fp32 masters holding the bf16 values vLLM loads: identical weights
        r16, cap16 = _vllm_capture(ckpt, "bfloat16", prompts_file, work / f"{section}_vllm_bf16.pt", a)
        r16 = rollout_from_json(r16)
        cfg = {"checkpoint": f"random {'Qwen3-MoE' if cfg_model.is_moe else 'dense Qwen3'} (bf16)",
               "model": cfg_model.to_hf(), "mean_entropy_nats": _entropy(model, r16)}
        for prof in ("bf16", "vllm-bf16-cpu"):
            both(section, model, prof, r16, "vllm-bf16", **cfg)
        floors[section] = results[-4][4]["mismatch/k3"], results[-3][4]["mismatch/k3"]  # bf16 learner, sampler
        if cfg_model.is_moe:
            r32 = rollout_from_json(
                _vllm_capture(ckpt, "float32", prompts_file, work / f"{section}_vllm_fp32.pt", a)[0])
            record(section, "learner", "fp32", "vllm-fp32", _score(model, FP32, r32), **cfg)
        traces[section] = _traces(out, section, cap16, model, ("bf16", "vllm-bf16-cpu"), common)

    # (b) NVFP4 dense -----------------------------------------------------------------------------------------
    dense = load_pretrained(work / "bf16-dense-ckpt")
    calibrate_dense(dense, tok, _task_examples(32, a.seed + 7919), a.seed)  # disjoint from the prompts' draw
    nv_dir = work / "nvfp4-dense-ckpt"
    export_nvfp4(dense, nv_dir, profile="vllm-nvfp4")
    save_tokenizer(tok, nv_dir)
    _, ckpt_weights = load_nvfp4(nv_dir)
    ours = quantize_checkpoint_weights(dense, "vllm-nvfp4")  # what our nn runs: the file's codes, bit for bit?
    codes_equal = all(torch.equal(ours[k].nvfp4.data, w.nvfp4.data) and torch.equal(
        ours[k].nvfp4.scale.view(torch.uint8), w.nvfp4.scale.view(torch.uint8)) for k, w in ckpt_weights.items())
    rn, cap_nv = _vllm_capture(nv_dir, "bfloat16", prompts_file, work / "nvfp4-dense_vllm_nvfp4.pt", a)
    rn = rollout_from_json(rn)
    cfg_nv = {"checkpoint": "the bf16-dense checkpoint, NVFP4 W4A4 compressed-tensors (model.nvfp4_io)",
              "model": DENSE.to_hf(), "calibration": "32 task examples, engines.calibration (bf16)",
              "nn_weight_codes_equal_checkpoint": codes_equal, "mean_entropy_nats": _entropy(dense, rn)}
    prof = get_profile("vllm-nvfp4")
    for rung, knobs in LADDER:
        prof = prof.replace(**knobs)
        record("nvfp4-dense", "learner", rung, "vllm-nvfp4", _score(dense, prof, rn), **cfg_nv, knobs=knobs)
    for name in ("vllm-nvfp4", "vllm-nvfp4-cpu"):
        record("nvfp4-dense", "sampler", name, "vllm-nvfp4", _score(dense, name, rn, "sampler"), **cfg_nv)
    for name in ("te-nvfp4", "minite", "bf16"):
        record("nvfp4-dense", "learner", name, "vllm-nvfp4", _score(dense, name, rn), **cfg_nv)
    traces["nvfp4-dense"] = _traces(out, "nvfp4-dense", cap_nv, dense, ("vllm-nvfp4", "vllm-nvfp4-cpu"), common)

    ratios = _ratios(results)
    kcheck = _kernel_check(nv_dir, work / "kernel_check.json", a.seed)
    vllm_version = torch.load(cap_nv).get("vllm", _vllm_version())
    write_result(out / STAGE / "nvfp4_kernel_check.json", stage=STAGE, experiment=EXPERIMENT,
                 config={"checkpoint": cfg_nv["checkpoint"], "rows_per_module": 37, "seed": a.seed,
                         "vllm": vllm_version}, metrics=kcheck["summary"], per_module=kcheck["per_module"])
    write_result(out / STAGE / "ratios.json", stage=STAGE, experiment=EXPERIMENT, config=common, metrics=ratios,
                 traces=traces, floors_bf16_learner_sampler=floors)
    _write_summary(out / STAGE / "summary.md", results, kcheck["summary"], ratios, traces, vllm_version, common)
    return 0


def _ratios(results: list[tuple[str, str, str, str, dict]]) -> dict:
    """k3 of each NVFP4 / MoE configuration over the dense BF16 floor, against the fidelity targets."""
    k3 = {(s, e, p, v): m["mismatch/k3"] for s, e, p, v, m in results}
    floor = k3[("bf16-dense", "learner", "bf16", "vllm-bf16")]
    ratios = {
        "dense_floor_k3": floor,
        "nvfp4_sampler_k3": k3[("nvfp4-dense", "sampler", "vllm-nvfp4-cpu", "vllm-nvfp4")],
        "nvfp4_over_floor": _ratio(k3[("nvfp4-dense", "sampler", "vllm-nvfp4-cpu", "vllm-nvfp4")], floor),
        "nvfp4_gpu_profile_over_floor": _ratio(k3[("nvfp4-dense", "sampler", "vllm-nvfp4", "vllm-nvfp4")], floor),
        "moe_bf16_sampler_k3": k3[("bf16-moe", "sampler", "bf16", "vllm-bf16")],
        "moe_over_floor": _ratio(k3[("bf16-moe", "sampler", "bf16", "vllm-bf16")], floor),
        "moe_vllm_bf16_cpu_sampler_k3": k3[("bf16-moe", "sampler", "vllm-bf16-cpu", "vllm-bf16")],
        "moe_vllm_bf16_cpu_over_floor": _ratio(k3[("bf16-moe", "sampler", "vllm-bf16-cpu", "vllm-bf16")], floor),
        "targets": {"nvfp4_over_floor": 3.0, "moe_over_floor": 2.0},
    }
    ratios["nvfp4_ok"] = ratios["nvfp4_over_floor"] <= 3.0
    ratios["moe_ok"] = ratios["moe_over_floor"] <= 2.0
    return ratios


def _kernel_check(nv_dir: Path, out: Path, seed: int) -> dict:
    """vLLM's own NVFP4 functions on the checkpoint's modules, in a subprocess (importing vLLM here would change
    torch's threading)."""
    rc = subprocess.run([sys.executable, "-m", "minite_core.peers.vllm_compare", "kernel-check",
                         "--checkpoint", str(nv_dir), "--out", str(out), "--seed", str(seed)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if rc.returncode != 0:
        raise RuntimeError(f"kernel-check failed: {rc.stderr[-3000:]}")
    return json.loads(out.read_text())


def _ratio(x: float, floor: float) -> float:
    return x / floor if floor > 0 else (0.0 if x == 0 else float("inf"))


def _vllm_version() -> str:
    from minite_core.peers.vllm_sampler import available

    return available()[1]


def _write_summary(path: Path, results, kcheck: dict, ratios: dict, traces: dict, vllm_version: str,
                   common: dict) -> None:
    keys = ("k1", "k3", "abs_dp_mean", "max_abs_delta", "chi2", "argmax_flip", "tokens")
    lines = [f"# Real vLLM peer on CPU ({vllm_version})", "",
             f"Command: `{common['command']}`", "",
             "Per response token: Δ = logπ_ours − logπ_vLLM on vLLM's tokens (DESIGN.md metrics). Engine `learner` = "
             "our full-sequence forward; `sampler` = our sampler's prefill + cached decode, teacher-forced.", "",
             "## Ratios", "",
             f"- dense floor k3(our bf16 learner ↔ vLLM bf16) = {ratios['dense_floor_k3']:.3g}",
             f"- k3(our vllm-nvfp4-cpu sampler ↔ vLLM NVFP4) = {ratios['nvfp4_sampler_k3']:.3g} → "
             f"{ratios['nvfp4_over_floor']:.3g}× the floor (target ≤ 3×: {'met' if ratios['nvfp4_ok'] else 'NOT met'});"
             f" the GPU profile vllm-nvfp4 as is: {ratios['nvfp4_gpu_profile_over_floor']:.3g}×",
             f"- MoE k3(our bf16 sampler ↔ vLLM bf16) = {ratios['moe_bf16_sampler_k3']:.3g} → "
             f"{ratios['moe_over_floor']:.3g}× the dense floor (target ≤ 2×: {'met' if ratios['moe_ok'] else 'NOT met'});"
             f" with vllm-bf16-cpu (vLLM's CPU kernels around bf16 GEMMs): {ratios['moe_vllm_bf16_cpu_sampler_k3']:.3g}"
             f" → {ratios['moe_vllm_bf16_cpu_over_floor']:.3g}×", "",
             "## All pairs", "",
             "| section | engine | profile | vLLM | " + " | ".join(keys) + " |", "|---" * (4 + len(keys)) + "|"]
    for section, engine, prof, sampler, m in results:
        vals = [str(int(m[f"mismatch/{k}"])) if k == "tokens" else f"{m[f'mismatch/{k}']:.3g}" for k in keys]
        lines.append(f"| {section} | {engine} | {prof} | {sampler} | " + " | ".join(vals) + " |")
    lines += ["", "## First-divergence trace against real vLLM (`trace/*.json`: every op, propagated and isolated)", "",
              "| section | profile | first op > 1e-3 | first op not bitwise | ops not bitwise on vLLM's own inputs |",
              "|---|---|---|---|---|"]
    for section, per in traces.items():
        for prof, t in per.items():
            lines.append(f"| {section} | {prof} | {t['first_divergence']} | {t['first_nonzero']} | "
                         f"{', '.join(t['not_bitwise_isolated']) or 'none'} |")
    lines += ["", "NVFP4 kernel check (vLLM `ref_nvfp4_quant` / `run_nvfp4_emulations` vs ours, every Linear):", "",
              *(f"- {k}: {v}" for k, v in kcheck.items())]
    path.write_text("\n".join(lines) + "\n")


def dag_main(a) -> int:
    """The DAG's optional rule (workflow/rules/peers.smk): run `run` with the vLLM peer venv's python when vllm is
    importable there, else record why not. Writes a status JSON either way (the rule's output)."""
    probe = [a.python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"]
    try:
        importable = subprocess.run(probe, capture_output=True).returncode == 0
        reason = "" if importable else f"vllm is not importable by {a.python}"
    except OSError as e:
        importable, reason = False, f"no vLLM peer python at {a.python} ({e.strerror})"
    status = {"status": "skipped", "reason": reason + "; install the vLLM peer venv (docs/peers.md, 'vLLM on CPU') or set "
              "MINITE_VLLM_PYTHON", "out": a.out}
    if importable:
        root = str(Path(__file__).resolve().parents[2])  # this checkout, whatever the peer venv's editable install
        env = {**os.environ, "PYTHONPATH": root}
        cmd = [a.python, "-m", "minite_core.peers.vllm_compare", "run", "--out", a.out, "--work", a.work]
        rc = subprocess.run(cmd, env=env).returncode
        if rc != 0:
            raise RuntimeError(f"vLLM peer comparison failed (rc={rc}): {' '.join(cmd)}")
        ratios = json.loads((Path(a.out) / STAGE / "ratios.json").read_text())["metrics"]
        status = {"status": "ran", "out": a.out, "command": " ".join(cmd[1:]), "ratios": ratios}
    print(json.dumps(status))
    write_json(a.status, status)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minite_core.peers.vllm_compare")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="the whole measurement (results JSON + summary.md)")
    r.add_argument("--out", default="results/vllm-cpu")
    r.add_argument("--work", default=None, help="checkpoints and rollouts (default: <out>/work)")
    r.add_argument("--prompts", type=int, default=16)
    r.add_argument("--std", type=float, default=0.3, help="init std of the random checkpoints (not flat logits)")
    s = sub.add_parser("sample", help="one vLLM engine: rollouts of a checkpoint to JSON")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--dtype", default="bfloat16")
    s.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    s.add_argument("--out", required=True)
    s.add_argument("--llm-kwargs", default="{}", help="JSON keyword arguments of vllm.LLM (e.g. linear_backend)")
    for p in (r, s):
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--max-new-tokens", type=int, default=64)
        p.add_argument("--temperature", type=float, default=1.0)
        p.add_argument("--top-p", type=float, default=1.0)
    d = sub.add_parser("dag", help="(project venv) run `run` with the vLLM venv's python if vllm is there")
    d.add_argument("--python", required=True, help="python of the vLLM peer venv")
    d.add_argument("--out", default="results/vllm-cpu")
    d.add_argument("--work", required=True)
    d.add_argument("--status", required=True, help="status JSON (ran / skipped + reason)")
    k = sub.add_parser("kernel-check", help="vLLM's NVFP4 emulation functions vs ours on a checkpoint")
    k.add_argument("--checkpoint", required=True)
    k.add_argument("--out", required=True)
    k.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    a.argv = list(sys.argv[2:] if argv is None else argv[1:])
    return {"run": run_main, "sample": sample_main, "kernel-check": kernel_check_main, "dag": dag_main}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())

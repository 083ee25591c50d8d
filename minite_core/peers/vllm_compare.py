"""Real peer measurement: our learners against the real vLLM sampler (BF16 and NVFP4), on CPU.

What: `python -m minite_core.peers.vllm_compare run --out results/vllm-cpu` (in the vLLM peer venv) builds two
small random checkpoints, samples rollouts from them with real vLLM (`VLLMSampler`), scores the same tokens with
our `Learner` under several profiles, and writes one results-contract JSON per (learner, sampler) pair
(stage `vllm_peer`) plus `summary.md`:

  (a) BF16, Qwen3-MoE: our bf16 / fp32 learner <-> vLLM bf16 (and fp32 <-> vLLM fp32 as the plumbing anchor),
      next to our own bf16 sampler <-> bf16 learner pair.
  (b) NVFP4 W4A4, dense Qwen3 (vLLM has no CPU NVFP4 MoE): the checkpoint is written by `model.nvfp4_io` from our
      model after `model.calibrate`; vLLM runs it with its emulation kernel (see `peers.vllm_sampler`). Does our
      `vllm-nvfp4` emulation reproduce vLLM? Three rungs, each closing one cause:
        vllm-nvfp4                 our profile as the nn runs it today: per-matrix weight global scales;
        vllm-nvfp4+ckpt-codes      the checkpoint's own codes (shared q/k/v and gate/up scales) pinned
                                   (`export.pinned_weights`), activations by our fast static quantizer;
        vllm-nvfp4+vllm-cpu-gemm   + the arithmetic of vLLM's CPU emulation kernel: dequantized operands with the
                                   global scale folded in and rounded to bf16, bf16 matmul (`vllm_cpu_emulation`).
      and the te-nvfp4 / minite / bf16 learners against the same vLLM NVFP4 rollouts.
  `kernel-check` compares, per Linear of the NVFP4 checkpoint, vLLM's own `ref_nvfp4_quant` /
  `run_nvfp4_emulations` with our quantizer / `vllm_cpu_gemm` on random inputs: bit-exact or not.

Checkpoints are random (`init_weights(seed, std)` with a large std so the logits are not flat, entropy reported)
unless a trained one is given; head_dim is 32 because vLLM's CPU attention rejects head_dim 16 (the tiny presets).
Each vLLM engine runs in its own subprocess (`sample`), one engine per process as vLLM's offline API prefers.

Shape legend: M = tokens, K = in features, N = out features.
"""
from __future__ import annotations

import argparse
import json
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
    pinned_weights,
)
from minite_core.engines.calibration import calibrate_on_examples
from minite_core.engines.learner import Learner
from minite_core.engines.sampler import Rollout, Sampler
from minite_core.formats.e2m1 import e2m1_decode, unpack_fp4
from minite_core.formats.nvfp4 import BLOCK, dequantize, global_encode_scale, quantize
from minite_core.model import PRESETS, CausalLM, load_pretrained, save_pretrained
from minite_core.profiles import get_profile
from minite_core.results import write_json, write_result
from minite_core.seeds import example_seed
from minite_core.task.arithmetic import make_example
from minite_core.task.tokenizer import EOS_ID, build_tokenizer, save_tokenizer

STAGE, EXPERIMENT = "vllm_peer", "vllm-cpu"
FP32 = get_profile("bf16").replace(name="fp32", dtype="float32", router_dtype="float32", lm_head_dtype="float32")
# vLLM's CPU attention supports head_dim 32 but not 16 (RuntimeError "Unsupported CPU attention configuration").
MOE = PRESETS["tiny-moe"].replace(hidden_size=64, head_dim=32, intermediate_size=128, moe_intermediate_size=32)
DENSE = PRESETS["tiny-dense"].replace(hidden_size=64, head_dim=32, intermediate_size=128)


# ---- vLLM's CPU NVFP4 emulation arithmetic, in plain torch ---------------------------------------------------
def vllm_cpu_gemm(x: torch.Tensor, w: CheckpointWeight, input_encode_scale: torch.Tensor) -> torch.Tensor:
    """y = x Wᵀ as vLLM 0.32's EmulationNvFp4LinearKernel computes it on CPU (`run_nvfp4_emulations`):
    x (M, K) in the compute dtype -> (M, N) in that dtype. Differs from our reference GEMM (fp32 dequantized
    operands, global scales applied after e2m1·sf) in three roundings: x̂ = q·fl(sf / S_enc) and
    ŵ = q·fl(sf · (1/S_enc_w)) fold the global scale into the block scale, both are rounded to bf16, and the
    matmul runs in bf16. Activation codes and block scales equal our `fast` static quantizer's bit for bit."""
    dtype = x.dtype
    M, K = x.shape
    s_enc = input_encode_scale.float().reshape(())  # vLLM: input_global_scale_inv, 0-dim fp32
    # activation: our fast quantizer with the checkpoint's S_enc (amax chosen so 2688/amax == S_enc bit for bit)
    x_q = quantize(x, amax=amax_for_encode_scale(s_enc), math="fast", check=False)
    vals = e2m1_decode(unpack_fp4(x_q.data)).view(M, K // BLOCK, BLOCK)
    x_dq = (vals * (x_q.scale.float().unsqueeze(-1) / s_enc)).reshape(M, K).to(dtype)
    # weight: dequantize_to_dtype(..., global_scale = 1.0 / weight_global_scale)
    t = w.nvfp4
    N = t.data.shape[0]
    w_dec = 1.0 / w.encode_scale.float().reshape(())
    w_vals = e2m1_decode(unpack_fp4(t.data)).view(N, K // BLOCK, BLOCK)
    w_dq = (w_vals * (t.scale.float() * w_dec).unsqueeze(-1)).reshape(N, K).to(dtype)
    return torch.matmul(x_dq, w_dq.t())


class vllm_cpu_emulation(pinned_weights):
    """pinned_weights whose GEMM is `vllm_cpu_gemm` (vLLM's CPU emulation arithmetic) instead of our reference."""

    def __enter__(self):
        for name, w in self.weights.items():
            m = self.model.get_submodule(name)
            s_enc = global_encode_scale(m.input_amax.float())

            def hook(module, args, output, w=w, s_enc=s_enc):
                x = args[0]
                y = vllm_cpu_gemm(x.reshape(-1, x.shape[-1]).to(output.dtype), w, s_enc)
                return y.reshape(output.shape)

            self.handles.append(m.register_forward_hook(hook))
        return self.model


# ---- data ---------------------------------------------------------------------------------------------------
def _task_examples(n: int, seed: int) -> list[dict]:
    return [make_example(example_seed(seed, i), i % 3) for i in range(n)]


def _task_prompts(n: int, seed: int, tok) -> list[list[int]]:
    return [tok(r["prompt"])["input_ids"] for r in _task_examples(n, seed)]


def calibrate_dense(model, tok, rows: list[dict], seed: int) -> dict:
    """Static scales of the NVFP4 checkpoint: the task examples `rows` through the calibration path every stage
    shares (engines.calibration)."""
    return calibrate_on_examples(model, tok, rows, n=len(rows), seed=seed)


def _rollout_json(r: Rollout) -> dict:
    return {"prompt_ids": r.prompt_ids, "response_ids": r.response_ids, "logprobs": r.logprobs,
            "finished": r.finished, "argmax_ids": r.argmax_ids}


def _rollout(d: dict) -> Rollout:
    return Rollout(d["prompt_ids"], d["response_ids"], d["logprobs"], d["finished"], d["argmax_ids"])


# ---- one vLLM engine per process ------------------------------------------------------------------------------
def sample_main(args) -> int:
    from minite_core.peers.vllm_sampler import VLLMSampler, available

    ok, version = available()
    if not ok:
        raise RuntimeError(version)
    prompts = json.loads(Path(args.prompts).read_text())
    t0 = time.perf_counter()
    sampler = VLLMSampler(args.checkpoint, dtype=args.dtype, seed=args.seed)
    t1 = time.perf_counter()
    r = sampler.generate(prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         top_p=args.top_p, stop_ids=(EOS_ID,), seed=args.seed)
    t2 = time.perf_counter()
    write_json(args.out, {**_rollout_json(r), "vllm": version, "dtype": args.dtype,
                          "init_s": t1 - t0, "generate_s": t2 - t1})
    return 0


def _vllm_sample(checkpoint: Path, dtype: str, prompts_file: Path, out: Path, a) -> dict:
    cmd = [sys.executable, "-m", "minite_core.peers.vllm_compare", "sample", "--checkpoint", str(checkpoint),
           "--dtype", dtype, "--prompts", str(prompts_file), "--out", str(out), "--seed", str(a.seed),
           "--max-new-tokens", str(a.max_new_tokens), "--temperature", str(a.temperature), "--top-p", str(a.top_p)]
    log = out.with_suffix(".log")
    with open(log, "w") as fh:
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise RuntimeError(f"vLLM sampling failed (rc={rc}); see {log}:\n" + log.read_text()[-3000:])
    return json.loads(out.read_text())


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


# ---- learner side -----------------------------------------------------------------------------------------------
def _score(model, profile, rollout: Rollout, ctx=None) -> dict:
    learner = Learner(model, profile)
    if ctx is None:
        logp, _, mask, amx = learner.logprobs(rollout.prompt_ids, rollout.response_ids, temperature=1.0,
                                              with_argmax=True)
    else:
        with ctx:
            logp, _, mask, amx = learner.logprobs(rollout.prompt_ids, rollout.response_ids, temperature=1.0,
                                                  with_argmax=True)
    pad = rollout.padded()
    m = mismatch_metrics(logp, pad["logprobs"], mask, argmax_learner=amx, argmax_sampler=pad["argmax_ids"])
    delta = (logp.double() - pad["logprobs"].double())[mask]
    m["mismatch/max_abs_delta"] = float(delta.abs().max())
    return m


def _entropy(model, rollout: Rollout) -> float:
    learner = Learner(model, FP32)
    _, ent, mask = learner.logprobs(rollout.prompt_ids, rollout.response_ids, with_entropy=True)
    return float(ent[mask].mean())


def run_main(a) -> int:
    out = Path(a.out)
    work = Path(a.work or out / "work")
    work.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    prompts = _task_prompts(a.prompts, a.seed, tok)
    prompts_file = work / "prompts.json"
    prompts_file.write_text(json.dumps(prompts))
    common = {"prompts": a.prompts, "max_new_tokens": a.max_new_tokens, "temperature": a.temperature,
              "top_p": a.top_p, "seed": a.seed, "init_std": a.std, "logprobs": "processed_logprobs",
              "learner_forward": "full-sequence, right-padded batch"}
    results: list[tuple[str, str, str, dict, dict]] = []  # (section, learner, sampler, metrics, config)

    def record(section, learner_name, sampler_name, metrics, **cfg):
        config = {**common, **cfg, "section": section, "learner": learner_name, "sampler": sampler_name}
        name = f"{section}__{learner_name}__{sampler_name}".replace("/", "-")
        write_result(out / STAGE / f"{name}.json", stage=STAGE, experiment=EXPERIMENT, config=config,
                     metrics=metrics)
        results.append((section, learner_name, sampler_name, metrics, config))
        print(f"{section:10s} {learner_name:28s} {sampler_name:22s} k3={metrics['mismatch/k3']:.3e} "
              f"max|Δ|={metrics['mismatch/max_abs_delta']:.3e}", flush=True)

    # (a) BF16 MoE ------------------------------------------------------------------------------------------
    moe_dir = work / "moe-bf16"
    save_pretrained(CausalLM(MOE).init_weights(a.seed, std=a.std), moe_dir, dtype=torch.bfloat16)
    save_tokenizer(tok, moe_dir)
    moe = load_pretrained(moe_dir)  # fp32 masters holding the bf16 values vLLM loads: identical weights
    cfg_moe = {"checkpoint": "random Qwen3-MoE (bf16)", "model": MOE.to_hf()}
    r_v16 = _vllm_sample(moe_dir, "bfloat16", prompts_file, work / "moe_vllm_bf16.json", a)
    r_v32 = _vllm_sample(moe_dir, "float32", prompts_file, work / "moe_vllm_fp32.json", a)
    ent = _entropy(moe, _rollout(r_v16))
    for lp, name in ((get_profile("bf16"), "bf16"), (FP32, "fp32")):
        record("bf16-moe", name, "vllm-bf16", _score(moe, lp, _rollout(r_v16)), **cfg_moe,
               mean_entropy_nats=ent, vllm_generate_s=r_v16["generate_s"])
    record("bf16-moe", "fp32", "vllm-fp32", _score(moe, FP32, _rollout(r_v32)), **cfg_moe, mean_entropy_nats=ent)
    ours = Sampler(moe, "bf16").generate(prompts, max_new_tokens=a.max_new_tokens, temperature=a.temperature,
                                         top_p=a.top_p, seed=a.seed)
    record("bf16-moe", "bf16", "minite-sampler-bf16", _score(moe, "bf16", ours), **cfg_moe, mean_entropy_nats=ent)

    # (b) NVFP4 dense -----------------------------------------------------------------------------------------
    dense_dir, nv_dir = work / "dense-bf16", work / "dense-nvfp4"
    save_pretrained(CausalLM(DENSE).init_weights(a.seed + 1, std=a.std), dense_dir, dtype=torch.bfloat16)
    save_tokenizer(tok, dense_dir)
    dense = load_pretrained(dense_dir)
    calibrate_dense(dense, tok, _task_examples(32, a.seed + 7919), a.seed)  # examples apart from the prompts
    export_nvfp4(dense, nv_dir, profile="vllm-nvfp4")
    save_tokenizer(tok, nv_dir)
    ckpt_model, ckpt_weights = load_nvfp4(nv_dir)
    cfg_nv = {"checkpoint": "random dense Qwen3, NVFP4 W4A4 compressed-tensors (model.nvfp4_io)",
              "model": DENSE.to_hf(), "calibration": "32 task texts, model.calibrate (bf16)"}
    r_d16 = _vllm_sample(dense_dir, "bfloat16", prompts_file, work / "dense_vllm_bf16.json", a)
    r_nv = _vllm_sample(nv_dir, "bfloat16", prompts_file, work / "dense_vllm_nvfp4.json", a)
    ent_d = _entropy(dense, _rollout(r_nv))
    record("nvfp4-dense", "bf16", "vllm-bf16", _score(dense, "bf16", _rollout(r_d16)), **cfg_nv,
           mean_entropy_nats=ent_d)
    rn = _rollout(r_nv)
    vn = get_profile("vllm-nvfp4")
    record("nvfp4-dense", "vllm-nvfp4", "vllm-nvfp4", _score(dense, vn, rn), **cfg_nv, mean_entropy_nats=ent_d,
           emulation="nn as is: per-matrix weight global scales")
    record("nvfp4-dense", "vllm-nvfp4+ckpt-codes", "vllm-nvfp4",
           _score(ckpt_model, vn, rn, pinned_weights(ckpt_model, ckpt_weights)), **cfg_nv,
           mean_entropy_nats=ent_d, emulation="checkpoint codes pinned (shared q/k/v, gate/up global scales)")
    record("nvfp4-dense", "vllm-nvfp4+vllm-cpu-gemm", "vllm-nvfp4",
           _score(ckpt_model, vn, rn, vllm_cpu_emulation(ckpt_model, ckpt_weights)), **cfg_nv,
           mean_entropy_nats=ent_d, emulation="checkpoint codes + vLLM CPU kernel arithmetic (bf16 operands)")
    for name in ("te-nvfp4", "minite", "bf16"):
        record("nvfp4-dense", name, "vllm-nvfp4", _score(dense, name, rn), **cfg_nv, mean_entropy_nats=ent_d)
    # Self-consistency yardstick: our own sampler (KV-cache decode) vs our own learner (full sequence) with the
    # *same* NVFP4 arithmetic. Static-scale NVFP4 is discontinuous (a code or block-scale flip is a whole grid
    # step), so bf16-level differences in attention (prefill vs decode, or vLLM's kernel vs SDPA) are amplified;
    # the vLLM gap is judged against this one.
    gen = dict(max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_p=a.top_p, seed=a.seed)
    with vllm_cpu_emulation(ckpt_model, ckpt_weights):
        own = Sampler(ckpt_model, vn).generate(prompts, **gen)
        m = _score(ckpt_model, vn, own)
    record("nvfp4-dense", "vllm-nvfp4+vllm-cpu-gemm", "minite-sampler-vllm-nvfp4+vllm-cpu-gemm", m, **cfg_nv,
           mean_entropy_nats=ent_d)
    record("nvfp4-dense", "bf16", "minite-sampler-bf16", _score(dense, "bf16", Sampler(dense, "bf16").generate(
        prompts, **gen)), **cfg_nv, mean_entropy_nats=ent_d)

    # kernel check (vLLM's functions, in a subprocess: importing vLLM here would change torch's threading)
    kc = work / "kernel_check.json"
    rc = subprocess.run([sys.executable, "-m", "minite_core.peers.vllm_compare", "kernel-check",
                         "--checkpoint", str(nv_dir), "--out", str(kc), "--seed", str(a.seed)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if rc.returncode != 0:
        raise RuntimeError(f"kernel-check failed: {rc.stderr[-3000:]}")
    kcheck = json.loads(kc.read_text())
    write_result(out / STAGE / "nvfp4_kernel_check.json", stage=STAGE, experiment=EXPERIMENT,
                 config={"checkpoint": cfg_nv["checkpoint"], "rows_per_module": 37, "seed": a.seed,
                         "vllm": r_nv["vllm"]}, metrics=kcheck["summary"], per_module=kcheck["per_module"])
    _write_summary(out / STAGE / "summary.md", results, kcheck["summary"], r_nv["vllm"])
    return 0


def _write_summary(path: Path, results, kcheck: dict, vllm_version: str) -> None:
    keys = ("k1", "k3", "abs_dp_mean", "max_abs_delta", "chi2", "ratio_outside_C", "argmax_flip", "tokens")
    lines = [f"# Real vLLM peer on CPU ({vllm_version})", "",
             "Per response token: Δ = logπ_learner − logπ_sampler on the sampler's tokens (DESIGN.md metrics).", "",
             "| section | learner | sampler | " + " | ".join(keys) + " |",
             "|---" * (3 + len(keys)) + "|"]
    for section, learner, sampler, m, _ in results:
        vals = []
        for k in keys:
            v = m[f"mismatch/{k}"]
            vals.append(str(int(v)) if k == "tokens" else f"{v:.3g}")
        lines.append(f"| {section} | {learner} | {sampler} | " + " | ".join(vals) + " |")
    lines += ["", "NVFP4 kernel check (vLLM `ref_nvfp4_quant` / `run_nvfp4_emulations` vs ours, every Linear):", "",
              *(f"- {k}: {v}" for k, v in kcheck.items())]
    path.write_text("\n".join(lines) + "\n")


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
    for p in (r, s):
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--max-new-tokens", type=int, default=64)
        p.add_argument("--temperature", type=float, default=1.0)
        p.add_argument("--top-p", type=float, default=1.0)
    k = sub.add_parser("kernel-check", help="vLLM's NVFP4 emulation functions vs ours on a checkpoint")
    k.add_argument("--checkpoint", required=True)
    k.add_argument("--out", required=True)
    k.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    return {"run": run_main, "sample": sample_main, "kernel-check": kernel_check_main}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())

"""Learner-update throughput (`minite bench learner`): BF16 vs TE-NVFP4 vs miniTE on one model, one process.
(Launched by torchrun, the same command times the scale-out learner instead: bench.learner_dist.)

What is timed: a COMPLETE learner update — forward (logits), next-token cross-entropy (token mean; the RL
objective's cost is the same log-softmax + gather), backward, AdamW step, zero_grad — as the paper's "tokens/s
for complete learner updates". One model with fp32 master weights and one AdamW serve every profile; only the
profile on the model (`use_profile`, outside the timed step) changes between steps, so model, batch, sequence
length, optimizer state and allocator are shared. Configs, model, the update and MFU: bench.learner_setup;
real Transformer Engine rows (`te:<mode>`) and the one-optimizer-state-at-a-time memory: bench.learner_te.

How it differs from timing each profile in its own run: profiles are interleaved round-robin (the starting
profile rotates each round), so clock/thermal drift and allocator growth hit every profile alike, and the
ratios (speedup_vs_bf16, speedup_vs_te_nvfp4, saved_act_ratio_vs_bf16) come from the same run. Each step is one
timing sample (CUDA events on GPU, perf_counter on CPU; `bench.timing`); tokens/s = B·T / median step time;
p20_tokens_per_s = B·T / p80 step time (the slow end), p80_tokens_per_s = B·T / p20 step time.

Peak memory: `torch.cuda.max_memory_allocated`, reset before every step, max over the profile's timed steps (it
includes the weights, grads and the AdamW state of the row's own optimizer; not the idle optimizer's:
bench.learner_te).

Saved-activation bytes: one extra forward per profile, counted by `bench.saved_activations` (parameters, their
view/cast copies and the modules' weight caches excluded; the loss's own log-softmax excluded — identical for
every profile — the count covers `model(ids)`). The NVFP4 learners recompute their RMSNorms and SwiGLU in backward
(profile knob `recompute_elementwise`, `nn.recompute`): they keep their inputs, not their fp32 upcasts and
elementwise intermediates; bf16 keeps autograd's plain graph, as its users run it (and as the baseline's speed).

A row named `<profile>+fused` (e.g. `minite+fused`) is that profile with its expert GEMMs' activation, dgrad and
wgrad quantizers run inside the grouped GEMMs (`GroupedLinear.fused_quant`, kernels/quant_prologue.py): the same bits as
the plain row, timed beside it in the same rounds, so the ratio of the two rows is what the fusion buys end to end.
A row named `<profile>+lowmem` keeps the expert GEMMs' input codes instead of their outputs for backward, which
makes the outputs again (`GroupedLinear.remake_output`, nn/experts.py): the same bits again, so the two rows give
its saved-activation bytes and its step time. Suffixes combine (`minite+fused+lowmem`: the forward's quantizer
then runs as the separate pass, which writes the codes; dgrad's stays fused); a profile without NVFP4 activations
(bf16) ignores both.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime
import os
import time
from pathlib import Path

import torch

from minite_core.bench.learner_setup import (CEILING_REPS, CEILING_SHAPE, GB, PAPER, QUANTIZE_KERNELS, SCHEMA, TARGETS,
                                             LearnerBenchConfig, build, check_fits, gemm_ceiling_tflops, kernel_backend,
                                             learner_step, model_flops, resolve_config, set_step_seed)
from minite_core.bench.learner_te import OptimizerSwap, te_mode, te_models
from minite_core.bench.op_profile import kernel_table, profiled, summary
from minite_core.bench.saved_activations import saved_activation_bytes
from minite_core.bench.timing import Stats, round_robin, timed_rounds
from minite_core.model import use_profile
from minite_core.nn import GroupedLinear, clear_weight_caches, track_optimizer
from minite_core.profiles import get_profile
from minite_core.results import env_info, write_json
from minite_core.runs.cli import add_common_args, parse_with_config


# row-name suffixes -> the GroupedLinear knob each turns on (module docstring); any of them, in any order
ROW_KNOBS = {"fused": "fused_quant", "lowmem": "remake_output"}


def parse_row(name: str) -> tuple[str, tuple[str, ...]]:
    """`<profile>[+<suffix>...]` -> (the profile's name, the GroupedLinear knobs its suffixes turn on). An unknown
    suffix raises ValueError naming the known ones."""
    profile, *suffixes = name.split("+")
    unknown = [s for s in suffixes if s not in ROW_KNOBS]
    if unknown:
        raise ValueError(f"row {name!r}: unknown suffix {'+' + unknown[0]!r}; known: "
                         f"{', '.join('+' + s for s in ROW_KNOBS)}")
    return profile, tuple(ROW_KNOBS[s] for s in suffixes)


@contextlib.contextmanager
def use_row(model, name: str):
    """The row's profile on the model and every GroupedLinear's knobs as its suffixes say (`parse_row`: on if
    named, off if not); all put back on exit."""
    profile, knobs = parse_row(name)
    experts = [m for m in model.modules() if isinstance(m, GroupedLinear)]
    before = [{k: getattr(m, k) for k in ROW_KNOBS.values()} for m in experts]
    with use_profile(model, profile):
        for m in experts:
            for k in ROW_KNOBS.values():
                setattr(m, k, k in knobs)
        try:
            yield
        finally:
            for m, was in zip(experts, before):
                for k, v in was.items():
                    setattr(m, k, v)


# ---- the benchmark ----------------------------------------------------------------------------------------
def run(cfg: LearnerBenchConfig, device: torch.device, log=print) -> dict:
    """Run the bench; return the throughput/v1 payload (without writing it)."""
    for name in cfg.profiles:
        if te_mode(name) is None:  # unknown names and suffixes fail before any work
            get_profile(parse_row(name)[0])
    t_start = time.perf_counter()
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    threads = torch.get_num_threads()
    if not cuda and cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    try:
        return _run(cfg, device, log, t_start, cuda)
    finally:
        torch.set_num_threads(threads)


def _rows(profiles: list[str], samples: dict, peaks: dict, saved: dict, tokens: int, flops: float,
          ceiling: float | None) -> list[dict]:
    """One result row per profile from its timed steps, peak memory and saved activations; ratios vs bf16/te."""
    stats = {name: Stats.of(samples[name]) for name in profiles}
    rows = []
    for name in profiles:
        s, sv = stats[name], saved[name]
        rows.append({
            "profile": name,
            "tokens_per_s": tokens / (s.median_ms / 1e3),
            "model_tflops_per_s": flops / (s.median_ms / 1e3) / 1e12,
            "mfu": None if ceiling is None else flops / (s.median_ms / 1e3) / 1e12 / ceiling,
            "p20_tokens_per_s": tokens / (s.p80_ms / 1e3),
            "p80_tokens_per_s": tokens / (s.p20_ms / 1e3),
            "step_ms": s.median_ms, "step_ms_p20": s.p20_ms, "step_ms_p80": s.p80_ms, "n_steps": s.n,
            "peak_mem_gb": peaks[name] / GB if name in peaks else None,
            "saved_act_gb": sv["total"] / GB,
            "saved_act_decoder_gb": sv["decoder"] / GB,
            "saved_act_by_dtype_gb": {k: v / GB for k, v in sorted(sv["by_dtype"].items())},
            "saved_act_by_producer_gb": {k: v / GB for k, v in sorted(sv["by_producer"].items(),
                                                                      key=lambda kv: -kv[1])},
        })
    by_name = {row["profile"]: row for row in rows}
    for row in rows:
        bf16, te = by_name.get("bf16"), by_name.get("te-nvfp4")
        row["saved_act_ratio_vs_bf16"] = row["saved_act_gb"] / bf16["saved_act_gb"] if bf16 else None
        row["saved_act_decoder_ratio_vs_bf16"] = (row["saved_act_decoder_gb"] / bf16["saved_act_decoder_gb"]
                                                  if bf16 and bf16["saved_act_decoder_gb"] else None)
        row["speedup_vs_bf16"] = row["tokens_per_s"] / bf16["tokens_per_s"] if bf16 else None
        row["speedup_vs_te_nvfp4"] = row["tokens_per_s"] / te["tokens_per_s"] if te else None
    return rows


def _run(cfg: LearnerBenchConfig, device: torch.device, log, t_start: float, cuda: bool) -> dict:
    ceiling = gemm_ceiling_tflops(device)
    if ceiling is not None:
        log(f"cuBLAS bf16 {CEILING_SHAPE}^3: {ceiling:.0f} TFLOP/s (the MFU ceiling of this run)")
    check_fits(cfg, device)
    model, opt, input_ids, labels = build(cfg, device)
    copies, te_opt, skipped = te_models(cfg, model, log)
    swap = OptimizerSwap(*(o for o in (opt, te_opt) if o is not None))
    if te_opt is not None:
        for m in (model, *copies.values()):  # both optimizers update the shared storage
            track_optimizer(te_opt, m)
            if m is not model:
                track_optimizer(opt, m)
    profiles = tuple(p for p in cfg.profiles if p not in skipped)
    if not profiles:
        raise ValueError(f"no profile left to time: every row was skipped ({skipped})")
    tokens = input_ids.numel()
    flops = model_flops(cfg.model_config(), *input_ids.shape)

    def one_round(r: int, timed: bool):  # peaks of timed steps only: warm-up may hold Triton autotuning buffers
        def prepare(name):  # untimed: this row's optimizer state onto the device, profile, SR seeds
            if name in copies:
                from minite_core.peers.te_learner import te_train_step

                swap.activate(te_opt)
                return lambda: te_train_step(copies[name], te_opt, input_ids, labels)
            swap.activate(opt)
            set_step_seed(model, r, cfg.seed)
            return lambda: learner_step(model, opt, input_ids, labels)

        def scope(name):  # the row's profile on the model, put on and taken off outside the timed step
            return contextlib.nullcontext() if name in copies else use_row(model, name)

        round_robin(profiles, r, prepare, device, samples if timed else None, peaks, scope)

    samples = {name: [] for name in profiles}
    peaks: dict[str, int] = {}
    round_s, warmup = 0.0, cfg.warmup
    for r in range(cfg.warmup):
        t0 = time.perf_counter()
        one_round(r, False)
        round_s = time.perf_counter() - t0
        log(f"warm-up round {r + 1}/{cfg.warmup}: {round_s:.2f} s")
        # budget: keep room for the saved-activation forwards (~1/3 round) and 3 timed rounds
        if r + 1 < cfg.warmup and time.perf_counter() - t_start + 4.5 * round_s > cfg.budget_s:
            warmup = r + 1
            log(f"budget {cfg.budget_s:.0f} s: stopping warm-up after {warmup} rounds")
            break

    saved = {}
    for name in profiles:  # counted after warm-up: kernels compiled, same weights as the timed steps
        if name in copies:
            saved[name] = saved_activation_bytes(copies[name], input_ids)
            continue
        with use_row(model, name):
            saved[name] = saved_activation_bytes(model, input_ids)
        clear_weight_caches(model)  # no optimizer step follows: drop this profile's cached operands now
    if cuda:
        torch.cuda.synchronize(device)

    iters = timed_rounds(cfg.iters, cfg.budget_s - (time.perf_counter() - t_start), round_s)  # within budget_s
    for r in range(iters):
        one_round(warmup + r, True)
        if r + 1 >= 3 and time.perf_counter() - t_start > cfg.budget_s:
            log(f"budget {cfg.budget_s:.0f} s reached after {r + 1} timed rounds")
            iters = r + 1
            break
    log(f"{iters} timed rounds, {time.perf_counter() - t_start:.1f} s total")
    swap.activate(opt)
    op_tables = {name: _op_profile(model, opt, input_ids, labels, name, log) for name in profiles
                 if name not in copies} if cfg.op_profile else {}

    rows = _rows(profiles, samples, peaks, saved, tokens, flops, ceiling)
    by_name = {row["profile"]: row for row in rows}

    mcfg = cfg.model_config()
    config = {**dataclasses.asdict(cfg), "warmup_run": warmup, "iters_run": iters, "tokens_per_step": tokens,
              "device": str(device),
              "model_config": dataclasses.asdict(mcfg), "num_parameters": model.num_parameters(),
              "kernel_backend": kernel_backend(), "optimizer": "AdamW(fused)" if cuda else "AdamW(foreach)",
              "model_flops_per_step": flops, "gemm_ceiling_tflops": ceiling,
              "gemm_ceiling": f"cuBLAS bf16 torch.mm {CEILING_SHAPE}^3, median of {CEILING_REPS}, same run",
              "loss": "next-token cross-entropy, token mean"}
    return {"schema": SCHEMA, "experiment": None, "config": config, "env": env_info(), "rows": rows,
            "skipped": [{"profile": name, "reason": why} for name, why in skipped.items()],
            "targets": _check_targets(by_name, op_tables, cuda), "paper": PAPER,
            **({"op_profile": op_tables} if op_tables else {})}


def _op_profile(model, opt, input_ids, labels, name: str, log) -> dict:
    """One learner step of `name` under torch.profiler: its kernels (bench.op_profile; untimed)."""
    with use_row(model, name), profiled(input_ids.device) as prof:
        learner_step(model, opt, input_ids, labels)
    table = kernel_table(prof, groups={"quantize": QUANTIZE_KERNELS})
    log(f"kernels, {name}: {summary(table, 12)}")
    return table


def _check_targets(by_name: dict, op_tables: dict, cuda: bool) -> dict:
    """TARGETS on the measured rows as `checks` [{target, value, met}] (the report lists them): BF16's MFU;
    minite's tokens/s against BF16 and TE-NVFP4; the share of minite's kernel time in separate quantize passes
    (with `--op-profile`); the lowest saved-activation ratio of the minite rows (`minite`, `minite+lowmem`, ...)."""
    t, checks = TARGETS, []

    def check(target: str, value, ok):
        checks.append({"target": target, "value": value, "met": None if value is None else bool(ok(value))})

    b, m = by_name.get("bf16"), by_name.get("minite")
    check(f"BF16 MFU ≥ {t['bf16_mfu_min']:.2f}", b and b.get("mfu"), lambda v: v >= t["bf16_mfu_min"])
    check(f"miniTE ≥ {t['minite_vs_bf16_min']:.2f}× BF16 tokens/s (aim {t['minite_vs_bf16_aim']:.2f}×)",
          m and m["speedup_vs_bf16"], lambda v: v >= t["minite_vs_bf16_min"])
    check(f"miniTE ≥ {t['minite_vs_te_nvfp4_min']:.2f}× TE-NVFP4 tokens/s", m and m["speedup_vs_te_nvfp4"],
          lambda v: v >= t["minite_vs_te_nvfp4_min"])
    prof = op_tables.get("minite", {})
    share = (prof["group_ms_per_step"]["quantize"] / prof["kernel_ms_per_step"]
             if prof.get("group_ms_per_step") and prof["kernel_ms_per_step"] else None)
    check(f"miniTE's separate quantize passes ≤ {t['minite_quantize_share_max']:.0%} of its kernel time",
          share, lambda v: v <= t["minite_quantize_share_max"])
    mins = [r for name, r in by_name.items() if name.split("+")[0] == "minite" and r["saved_act_ratio_vs_bf16"]]
    low = min(mins, key=lambda r: r["saved_act_ratio_vs_bf16"], default=None)
    check(f"saved activations ≤ {t['minite_saved_act_ratio_max']:.2f}× BF16"
          + (f" ({low['profile']}, the lowest miniTE row)" if low else ""),
          low and low["saved_act_ratio_vs_bf16"], lambda v: v <= t["minite_saved_act_ratio_max"])
    return {**t, "applicable": cuda, "checks": checks,
            "note": "targets are for the H200 run; CPU smoke only checks the code"}


# ---- outputs ----------------------------------------------------------------------------------------------
CSV_METRICS = ("tokens_per_s", "mfu", "model_tflops_per_s", "p20_tokens_per_s", "p80_tokens_per_s", "step_ms",
               "step_ms_p20", "step_ms_p80", "peak_mem_gb", "saved_act_gb", "saved_act_decoder_gb", "saved_act_ratio_vs_bf16",
               "speedup_vs_bf16", "speedup_vs_te_nvfp4")


def write_csv(path, payload: dict) -> Path:
    """Long format: one line per (profile, metric), with GPU / torch / commit / time on every line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    env, now = payload["env"], datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["experiment", "profile", "metric", "value", "gpu", "torch", "commit", "time"])
        for row in payload["rows"]:
            for metric in CSV_METRICS:
                w.writerow([payload["experiment"], row["profile"], metric, row[metric], env.get("gpu"),
                            env.get("torch"), env.get("commit"), now])
    return path


# ---- CLI --------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    # the optimizer swap frees and reuses blocks of very different sizes (one state tensor per expert weight vs
    # thousands of small ones): expandable segments keep the allocator from fragmenting. Read when CUDA's
    # allocator starts (after this line); a user's own setting wins.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    ap = argparse.ArgumentParser(prog="minite bench learner", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="tiny | h200 | JSON file | inline JSON (default: h200 on CUDA, "
                                                   "tiny on CPU)")
    ap.add_argument("--profiles", default=None, help="comma list, e.g. bf16,te-nvfp4,minite,minite+fused+lowmem "
                    "(+fused: the expert GEMMs' quantizers in their prologue; +lowmem: their outputs made again in "
                    "backward from their inputs' codes); real TE rows te:<mode>[+grouped], e.g. te:bf16, "
                    "te:fp8-block+grouped (+grouped: te.GroupedLinear experts, not one te.Linear each)")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--model", default=None, help="a model preset or a checkpoint directory whose shape to time "
                                                   "(config.json; random weights)")
    ap.add_argument("--vocab", type=int, dest="vocab_size")
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--iters", type=int)
    ap.add_argument("--budget-s", type=float, dest="budget_s", help="wall-clock cap for the whole bench")
    ap.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--op-profile", action="store_true", default=None, dest="op_profile",
                    help="one extra step per profile under torch.profiler (top kernels by GPU time)")
    ap.add_argument("--out", required=True, help="output JSON (schema throughput/v1)")
    ap.add_argument("--csv", default=None, help="also write a long-format CSV")
    ap.add_argument("--compare-plain", action=argparse.BooleanOptionalAction, default=True, dest="compare_plain",
                    help="under torchrun: also time the plain 1-process learner on rank 0 in the same invocation "
                         "(the scaling-efficiency baseline)")
    add_common_args(ap, config_help="the experiment's `throughput:` section as JSON (keys = the flags above)")
    args = parse_with_config(ap, argv)
    device = torch.device(args.device)
    profiles = tuple(p.strip() for p in args.profiles.split(",") if p.strip()) if args.profiles else None
    cfg = resolve_config(args.config, device, profiles=profiles, batch=args.batch, seq=args.seq, layers=args.layers,
                         model=args.model,
                         vocab_size=args.vocab_size, warmup=args.warmup, iters=args.iters, budget_s=args.budget_s,
                         tf32=args.tf32, seed=args.seed, op_profile=args.op_profile)
    from minite_core.bench import learner_dist

    if learner_dist.launched_by_torchrun():  # the scale-out learner (bench.learner_dist); rank 0 writes
        device = learner_dist.rank_device(device)
        payload = learner_dist.run(cfg, device, compare_plain=args.compare_plain, log=lambda s: print(s, flush=True))
        if payload is None:
            return 0
    else:
        print(f"learner bench: config {cfg.name} on {device}: {cfg}", flush=True)
        payload = run(cfg, device, log=lambda s: print(s, flush=True))
    payload["experiment"] = args.experiment
    write_json(args.out, payload)
    if args.csv:
        write_csv(args.csv, payload)
    for row in payload["rows"]:
        print(f"{row['profile']}: {row['tokens_per_s']:,.0f} tokens/s, step {row['step_ms']:.1f} ms", flush=True)
        if "scaling_efficiency" in row:
            plain, eff = row["plain_tokens_per_s"], row["scaling_efficiency"]
            plain_s, eff_s = ("—", "—") if plain is None else (f"{plain:,.0f}", f"{eff:.3f}")
            print(f"  {payload['config']['world_size']} ranks: {row['per_gpu_tokens_per_s']:,.0f} tokens/s per GPU; "
                  f"plain 1-process learner {plain_s} tokens/s; scaling efficiency {eff_s}", flush=True)
    return 0

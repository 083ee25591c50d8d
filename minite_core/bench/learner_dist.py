"""Learner-update throughput of the scale-out learner: `minite bench learner` launched by torchrun.

What is timed: one `engines.distributed.pg_step` per profile and round — the data-parallel policy-gradient update
(forward, token-mean surrogate, backward with FSDP2's reduce-scatters, sharded AdamW step), the step the gloo
tests prove equal to one process — on an FSDP2-sharded model (MoE experts expert-parallel, `install` before
`shard_model`, as the RL learner would run it). Each rank runs `batch` rows of `seq` tokens (weak scaling: the
per-GPU work is the 1-GPU run's), so the global batch is batch·world rows. Model and batch are bench.learner's
(`random_model`'s draws, the same seed on every rank, each rank's rows of one global batch); the sharded model
is built on the meta device and only this rank's part made (`sharded_model`), so every rank's expert slice holds
the same values (routing, not expert values, sets the work). A row is seq/4 prompt tokens + the rest response,
every row full length (no pads); tokens/s counts all seq tokens of a row.

Reported per profile (rank 0 writes a throughput/v1 JSON whose rows the report's table reads):
- tokens_per_s (total) = global tokens / median over steps of the SLOWEST rank's step time (a step ends when the
  last rank's does); per_gpu_tokens_per_s = total / world; p20/p80 the same way;
- plain_tokens_per_s: the 1-process reference measured IN THE SAME INVOCATION (`--compare-plain`, default on):
  before the distributed part, rank 0 alone times `pg_step(dp=None)` on a plain (unsharded, no expert
  parallelism) model with the same config, per-GPU batch and timing loop, while the other ranks wait; the model
  is freed before the sharded one is built, so memory is never held twice;
- scaling_efficiency = total / (world · plain) — at world 1, the distributed path's overhead against the plain
  learner: FSDP2's unshard and reduce-scatter copies (local at one rank) and its hooks and DTensor optimizer;
  a group of one has no amax all-reduces and no all-to-alls (engines.distributed, engines.expert_parallel).
Round counts must agree over ranks (every step is a collective), so the budget decision uses the max round time
over ranks. Saved-activation bytes and MFU are not measured here (None): bench.learner's one-process run has them.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import os
import time

import torch
import torch.distributed as dist

from minite_core.bench.learner_setup import (PAPER, SCHEMA, LearnerBenchConfig, draw_random_, kernel_backend,
                                             random_model)
from minite_core.bench.timing import Stats, round_robin, timed_rounds
from minite_core.engines import distributed as D
from minite_core.engines import expert_parallel as EP
from minite_core.engines.learner import Learner
from minite_core.model.qwen3_moe import CausalLM
from minite_core.nn import track_optimizer
from minite_core.profiles import get_profile
from minite_core.results import env_info

GB = 1e9


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def rank_device(device: torch.device) -> torch.device:
    """cuda -> this rank's GPU (LOCAL_RANK); cpu unchanged."""
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if device.type == "cuda" else device


# ---- the global batch -----------------------------------------------------------------------------------------
def global_batch(cfg: LearnerBenchConfig, world: int, vocab: int, device: torch.device):
    """batch·world rows of seq tokens (prompt seq/4, response the rest) and their advantages, the same on every
    rank (one CPU generator from the seed): (prompt lists, response lists, adv (N,))."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    N, P = cfg.batch * world, max(1, cfg.seq // 4)
    ids = torch.randint(0, vocab, (N, cfg.seq), generator=g)  # (N, seq)
    adv = torch.randn(N, generator=g)
    return [r[:P].tolist() for r in ids], [r[P:].tolist() for r in ids], adv.to(device)


def _optimizer(model, cfg: LearnerBenchConfig, device: torch.device):
    """AdamW as bench.learner builds it, over `engines.distributed.param_groups`."""
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(D.param_groups(model), lr=cfg.lr, weight_decay=0.0, **fused)
    track_optimizer(opt, model)  # quantized-weight caches are stale after each step
    return opt


# ---- the timing loop (one for the plain and the distributed step) ---------------------------------------------
def time_rounds(cfg: LearnerBenchConfig, device: torch.device, step, agree, log) -> tuple[dict, dict]:
    """Warm-up then timed rounds, each one `step(profile, round)` per profile, the starting profile rotated every
    round (bench.learner's loop). agree(x) -> max of x over the ranks that step together. -> (samples ms by
    profile, peak bytes by profile)."""
    names = cfg.profiles
    samples, peaks = {n: [] for n in names}, {}
    t_start, round_s = time.perf_counter(), 0.0

    def one_round(r: int, timed: bool):
        round_robin(names, r, lambda name: functools.partial(step, name, r), device,
                    samples if timed else None, peaks)

    for r in range(cfg.warmup):
        t0 = time.perf_counter()
        one_round(r, False)
        round_s = agree(time.perf_counter() - t0)
        log(f"warm-up round {r + 1}/{cfg.warmup}: {round_s:.2f} s")
    # as bench.learner: the timed rounds capped by budget_s (the same count on all ranks: agreed times)
    iters = timed_rounds(cfg.iters, cfg.budget_s - agree(time.perf_counter() - t_start), round_s)
    for r in range(iters):
        one_round(cfg.warmup + r, True)
    log(f"{iters} timed rounds, {time.perf_counter() - t_start:.1f} s")
    return samples, peaks


def _learners(model, cfg: LearnerBenchConfig) -> dict:
    return {name: Learner(model, name, seed=cfg.seed) for name in cfg.profiles}


def plain_samples(cfg: LearnerBenchConfig, device: torch.device, batch, log) -> dict:
    """The 1-process reference: pg_step(dp=None) on an unsharded model, batch = one rank's rows."""
    model, _ = random_model(cfg.model_config(), getattr(torch, cfg.param_dtype), device, cfg.seed)
    opt, learners = _optimizer(model, cfg, device), _learners(model, cfg)
    prompts, responses, adv = batch

    def step(name, r):
        learners[name].set_step(r)
        D.pg_step(learners[name], opt, prompts, responses, adv)

    return time_rounds(cfg, device, step, lambda x: x, log)[0]  # the model is freed on return


def sharded_model(cfg: LearnerBenchConfig, device: torch.device, dp: D.DataParallel):
    """The model as this rank holds it, built without ever holding all of it (the full-depth model is 122 GB of
    fp32 weights): on the meta device, this rank's experts kept (EP.install, a no-op without MoE layers), then
    made on `device`, drawn as random_model draws, and FSDP2-sharded. -> (model, parameter count of the whole)."""
    mcfg = cfg.model_config()
    with torch.device("meta"):
        model = CausalLM(mcfg)
    n_params = model.num_parameters()
    EP.install(model, dp.rank, dp.world)
    model.to_empty(device=device).to(getattr(torch, cfg.param_dtype))
    if mcfg.tie_word_embeddings:  # to_empty made the two a parameter each
        model.lm_head.weight = model.model.embed_tokens.weight
    draw_random_(model, device, cfg.seed)  # the same draws on every rank: equal non-expert weights
    return D.shard_model(model), n_params


def dist_samples(cfg: LearnerBenchConfig, device: torch.device, dp: D.DataParallel, batch, log):
    """Every rank: pg_step(dp) on the sharded model -> (this rank's samples, peaks, parameter count)."""
    model, n_params = sharded_model(cfg, device, dp)
    opt, learners = _optimizer(model, cfg, device), _learners(model, cfg)
    prompts, responses, adv = batch

    def step(name, r):
        learners[name].set_step(r)
        D.pg_step(learners[name], opt, prompts, responses, adv, dp=dp)

    def agree(x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    samples, peaks = time_rounds(cfg, device, step, agree, log)
    return samples, peaks, n_params


# ---- results ---------------------------------------------------------------------------------------------------
def rows(cfg: LearnerBenchConfig, world: int, rank_samples: list[dict], rank_peaks: list[dict],
         plain: dict | None) -> list[dict]:
    """One row per profile (module docstring): a step's time is the slowest rank's."""
    local_tokens = cfg.batch * cfg.seq
    tokens = local_tokens * world
    out = []
    for name in cfg.profiles:
        steps = [max(s[name][i] for s in rank_samples) for i in range(len(rank_samples[0][name]))]
        s = Stats.of(steps)
        peak = [p[name] for p in rank_peaks if name in p]
        total = tokens / (s.median_ms / 1e3)
        p_tps = local_tokens / (Stats.of(plain[name]).median_ms / 1e3) if plain else None
        out.append({
            "profile": name, "tokens_per_s": total, "per_gpu_tokens_per_s": total / world,
            "p20_tokens_per_s": tokens / (s.p80_ms / 1e3), "p80_tokens_per_s": tokens / (s.p20_ms / 1e3),
            "step_ms": s.median_ms, "step_ms_p20": s.p20_ms, "step_ms_p80": s.p80_ms, "n_steps": s.n,
            "plain_tokens_per_s": p_tps, "plain_step_ms": Stats.of(plain[name]).median_ms if plain else None,
            "scaling_efficiency": total / (world * p_tps) if p_tps else None,
            "peak_mem_gb": max(peak) / GB if peak else None,
            "mfu": None, "model_tflops_per_s": None, "saved_act_gb": None, "saved_act_decoder_gb": None,
            "saved_act_ratio_vs_bf16": None, "saved_act_decoder_ratio_vs_bf16": None,
        })
    by_name = {r["profile"]: r for r in out}
    for r in out:
        bf16, te = by_name.get("bf16"), by_name.get("te-nvfp4")
        r["speedup_vs_bf16"] = r["tokens_per_s"] / bf16["tokens_per_s"] if bf16 else None
        r["speedup_vs_te_nvfp4"] = r["tokens_per_s"] / te["tokens_per_s"] if te else None
    return out


def run(cfg: LearnerBenchConfig, device: torch.device, *, compare_plain: bool = True, log=print) -> dict | None:
    """Every rank calls it (under torchrun); -> the payload on rank 0, None elsewhere."""
    for name in cfg.profiles:
        get_profile(name)  # unknown names fail before any work
    if (cfg.batch * cfg.seq) % 16:
        raise ValueError(f"batch x seq = {cfg.batch * cfg.seq} tokens a rank: the NVFP4 wgrad's 16-token blocks "
                         "would straddle ranks; use a multiple of 16")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    elif cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    dp = D.init_from_env()
    rank_log = (lambda s: log(f"[rank 0/{dp.world}] {s}")) if dp.rank == 0 else (lambda s: None)
    batch = global_batch(cfg, dp.world, cfg.model_config().vocab_size, device)
    mine = dp.rows(len(batch[0]))
    plain = None
    if compare_plain and dp.rank == 0:
        rank_log(f"plain learner (one process, {cfg.batch} rows): pg_step(dp=None)")
        plain = plain_samples(cfg, device, (batch[0][mine], batch[1][mine], batch[2][mine]), rank_log)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the plain model's memory back before the sharded one is built
    dist.barrier()  # the other ranks wait here while rank 0 times the plain learner
    rank_log(f"distributed learner: {dp.world} ranks x {cfg.batch} rows, FSDP2 + expert parallelism")
    samples, peaks, n_params = dist_samples(cfg, device, dp, batch, rank_log)
    gathered = [None] * dp.world
    dist.all_gather_object(gathered, (samples, peaks))
    payload = None
    if dp.rank == 0:
        mcfg = cfg.model_config()
        config = {**dataclasses.asdict(cfg), "warmup_run": cfg.warmup, "iters_run": len(samples[cfg.profiles[0]]),
                  "tokens_per_step": cfg.batch * cfg.seq * dp.world, "device": str(device),
                  "model_config": dataclasses.asdict(mcfg), "num_parameters": n_params,
                  "kernel_backend": kernel_backend(),
                  "optimizer": "AdamW(fused)" if device.type == "cuda" else "AdamW(foreach)",
                  "gemm_ceiling_tflops": None, "model_flops_per_step": None,
                  "loss": "policy-gradient token-mean surrogate (engines.distributed.pg_step)",
                  "world_size": dp.world, "batch_per_gpu": cfg.batch,
                  "distributed": "torchrun, FSDP2 (engines.distributed) + expert parallelism (engines.expert_parallel)",
                  "baseline": ("plain pg_step(dp=None) on rank 0, one process, same invocation" if compare_plain
                               else None)}
        payload = {"schema": SCHEMA, "experiment": None, "config": config, "env": env_info(),
                   "rows": rows(cfg, dp.world, [g[0] for g in gathered], [g[1] for g in gathered], plain),
                   "targets": {"applicable": False, "note": "distributed run: see scaling_efficiency"},
                   "paper": PAPER}
    dist.barrier()
    dist.destroy_process_group()
    return payload

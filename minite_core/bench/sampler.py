"""Sampler throughput (`minite bench sampler`): decode tokens/s per profile × shape × batch, bf16 in the same run.

What is timed: the fast sampler (engines.fast_sampler) on random prompts with no stop token, so every row
decodes `new_tokens`: after an untimed prefill, the max_new_tokens - 1 decode steps — CUDA-graph replays on a
GPU, eager steps on CPU — bracketed by one pair of CUDA events (bench.timing.Timer; perf_counter on CPU), `reps`
times after a warm-up call (Triton compile, graph capture). tokens_per_s = batch · (new_tokens - 1) / median;
p20/p80 from the slow/fast ends as in bench/learner.py. `generate_tokens_per_s` times one whole `generate()`
(prefill, decode with its every-16-steps host reads, read-back): what the RL stage sees. The "before" number is
the reference sampler (engines.sampler, per-row host syncs) on the RL shape at `reference_batch`, timed the same
way as generate. If the decode step cannot be captured (a host sync in the model: FastSampler says which), the
row records the error and the eager fast path is measured in an extra row (`engine: fast-eager`).

Shapes: "rl" = a small RL model (hidden 256, 4 layers, 8/2 heads × 32, 8 experts top-2 × 256, vocab 64: the
earlier RL results' kind), fp32 master weights as the RL stage holds them; "weight-bound" = a dense Qwen3-8B-like model
(hidden 4096, 8 layers, 32/8 heads × 128, SwiGLU 12288, vocab 32,768) with bf16 weights (what a server holds),
batch <= 16. CPU ("tiny"): the same code on tiny models. `--model DIR` (a checkpoint directory, or a model preset):
one shape, "model", that model's config.json at the RL batches in bf16 with random weights — your model's decode
speed under each profile (the DAG passes the experiment's RL base model where `sampler_bench.shapes` lists
"model"). Static-scale profiles are calibrated on random tokens.

Profiles: bf16, the three NVFP4 sampler profiles with cached-bf16 decode GEMMs, and the same three with packed-weight
decode GEMMs (`<profile>-packed`, profiles.py `decode_gemm`; rows carry `decode_gemm` and, for packed rows,
`speedup_vs_cached` = tokens/s over the cached-bf16 row of the same profile, shape and batch, same run).

Output: `throughput/v1` JSON, rows {profile, shape, batch, engine, tokens_per_s, speedup_vs_bf16, ...},
`reference` rows, `targets` (`TARGETS`, checked on CUDA only); the report's table is report/tables.sampler_table.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass

import torch

from minite_core.bench.decode_bytes import step_bytes
from minite_core.bench.learner_setup import random_model
from minite_core.bench.op_profile import kernel_table, profiled, summary
from minite_core.bench.plain_decode import time_plain
from minite_core.bench.timing import Stats, Timer, copy_bandwidth
from minite_core.engines import FastSampler, Sampler
from minite_core.engines.fast_sampler import GraphCaptureError
from minite_core.engines.sampler import batch_bucket, cache_slots
from minite_core.model import PRESETS, CausalLM, ModelConfig, use_profile
from minite_core.model.io import read_model_config
from minite_core.model.calibrate import calibrate
from minite_core.profiles import get_profile
from minite_core.results import env_info, write_json
from minite_core.runs.cli import add_common_args, parse_with_config

SCHEMA = "throughput/v1"
NVFP4 = ("vllm-nvfp4", "vllm-marlin-w4a16", "minite")
PLAIN = "plain-torch"  # weight-bound rows: bench.plain_decode, bf16 as a user writes it in plain PyTorch
# the same profiles with packed-weight decode GEMMs (profiles.py `decode_gemm`), timed in the same run
PACKED = tuple(f"{name}-packed" for name in NVFP4)
# H200, one run: RL shape batch 64 bf16 >= 100k tokens/s and every NVFP4 profile >= 0.9x bf16 there; weight-bound
# shape (bytes dominate) every packed NVFP4 profile >= 2x bf16, and bf16 itself >= the plain-PyTorch decode and
# >= 70% of the copy bandwidth at batch 1; the model shape (the experiment's RL base model, an MoE) every NVFP4
# profile >= 0.9x bf16 at batch 64 and every packed one >= 1.5x bf16 at batch <= 16
TARGETS = {"rl_bf16_tokens_per_s_min": 100_000.0, "rl_nvfp4_vs_bf16_min": 0.9, "weight_bound_packed_vs_bf16_min": 2.0,
           "weight_bound_bf16_vs_plain_min": 1.0, "weight_bound_bf16_bw_frac_min": 0.7,
           "model_packed_vs_bf16_min": 1.5, "model_packed_max_batch": 16}
TARGET_BATCH = 64


@dataclass(frozen=True)
class SamplerBenchConfig:
    name: str
    shapes: tuple[str, ...] = ("rl", "weight-bound")
    rl_batches: tuple[int, ...] = (1, 16, 64, 256)
    weight_bound_batches: tuple[int, ...] = (1, 16)  # weight-bound: batch <= 16
    profiles: tuple[str, ...] = ("bf16",) + NVFP4 + PACKED  # bf16 first: the ratio baseline
    prompt_len: int = 32
    new_tokens: int = 128  # RL responses are 64-256 tokens (DESIGN.md)
    reps: int = 5  # timed decodes per row (median)
    reference_batch: int = TARGET_BATCH  # the "before" number: reference sampler, RL shape
    budget_s: float = 330.0  # rows left when it is spent are recorded as skipped (7 profiles: ~300 s on the H200)
    tiny: bool = False  # CPU: tiny models, same code
    cpu_threads: int | None = None
    seed: int = 0
    op_profile: bool = False  # per profile, the kernels of one decode step (untimed): RL shape at reference_batch,
    # the others at batch 1 ("<shape>/<profile>") and 16 ("<shape>/<profile>/b16")
    model: str | None = None  # a checkpoint dir / preset: the "model" shape (module docstring)


CONFIGS = {
    "tiny": SamplerBenchConfig(name="tiny", rl_batches=(1, 4), weight_bound_batches=(1, 4), prompt_len=8,
                               new_tokens=8, reps=2, reference_batch=4, budget_s=60.0, tiny=True, cpu_threads=1),
    "h200": SamplerBenchConfig(name="h200"),
}


def shape_config(shape: str, tiny: bool, model: str | None = None) -> tuple[ModelConfig, torch.dtype]:
    """(model config, parameter dtype) of a bench shape (module docstring)."""
    if shape == "model":
        if model is None:
            raise ValueError("shape 'model' needs --model (a checkpoint directory or a model preset)")
        return (PRESETS[model] if model in PRESETS else read_model_config(model)), torch.bfloat16
    common = dict(rope_theta=10000.0, max_position_embeddings=4096, bos_token_id=None, eos_token_id=None,
                  tie_word_embeddings=False)
    if shape == "rl":
        size = (dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     num_experts=4, moe_intermediate_size=64) if tiny else
                dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                     num_experts=8, moe_intermediate_size=256))  # experiments/h200.yaml `pretrain`
        cfg = ModelConfig(vocab_size=64, intermediate_size=2 * size["hidden_size"], num_experts_per_tok=2,
                          mlp_only_layers=(), **size, **common)
        return cfg, torch.float32
    if shape == "weight-bound":
        size = (dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16) if tiny else
                dict(vocab_size=32768, hidden_size=4096, intermediate_size=12288, num_hidden_layers=8,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128))
        cfg = ModelConfig(num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0, mlp_only_layers=(),
                          **size, **common)
        return cfg, torch.bfloat16
    raise ValueError(f"unknown bench shape {shape!r}; one of rl, weight-bound, model")


def build(shape: str, cfg: SamplerBenchConfig, device: torch.device) -> CausalLM:
    """Random model on `device` (bench.learner.random_model), static activation scales calibrated on random
    tokens when a profile needs them."""
    mcfg, dtype = shape_config(shape, cfg.tiny, cfg.model)
    model, gen = random_model(mcfg, dtype, device, cfg.seed)
    for name in cfg.profiles:
        if get_profile(name).needs_calibration:
            with use_profile(model, name):
                calibrate(model, [torch.randint(0, mcfg.vocab_size, (8, cfg.prompt_len), generator=gen,
                                                device=device)])
            break
    return model


def _prompts(batch: int, cfg: SamplerBenchConfig, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(cfg.seed + batch)
    return torch.randint(0, vocab, (batch, cfg.prompt_len), generator=g).tolist()


def _gen_kwargs(cfg: SamplerBenchConfig) -> dict:
    return dict(max_new_tokens=cfg.new_tokens, temperature=1.0, stop_ids=(), seed=cfg.seed)


def _time_generate(sampler, prompts, cfg, device) -> float:
    with Timer(device) as t:
        sampler.generate(prompts, **_gen_kwargs(cfg))
    return len(prompts) * cfg.new_tokens / (t.elapsed_ms / 1e3)


def time_fast(model, profile: str, prompts, cfg: SamplerBenchConfig, device, graph: bool) -> dict:
    """One row: decode-only tokens/s of the fast sampler (module docstring) and whole-generate tokens/s."""
    sampler = FastSampler(model, profile, device=device, graph=graph)
    sampler.generate(prompts, **_gen_kwargs(cfg))  # warm-up: kernels compiled, graph captured
    samples = []
    for _ in range(cfg.reps):
        st = sampler.start(prompts, **_gen_kwargs(cfg))
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the prefill stays out of the timed region
        with Timer(device) as t:
            for _ in range(cfg.new_tokens - 1):
                sampler.step(st)
        samples.append(t.elapsed_ms)
    s, steps = Stats.of(samples), cfg.new_tokens - 1
    tokens = len(prompts) * steps
    return {"engine": "fast" if graph else "fast-eager", "tokens_per_s": tokens / (s.median_ms / 1e3),
            "p20_tokens_per_s": tokens / (s.p80_ms / 1e3), "p80_tokens_per_s": tokens / (s.p20_ms / 1e3),
            "step_ms": s.median_ms / steps, "n_reps": s.n,
            "generate_tokens_per_s": _time_generate(sampler, prompts, cfg, device)}


def _rows_for(model, shape, batch, cfg, device, deadline, log) -> list[dict]:
    prompts = _prompts(batch, cfg, model.config.vocab_size)
    rows = []
    for name in cfg.profiles:
        base = {"profile": name, "shape": shape, "batch": batch, "new_tokens": cfg.new_tokens,
                "prompt_len": cfg.prompt_len, "decode_gemm": get_profile(name).decode_gemm}
        if time.perf_counter() > deadline:
            rows.append({**base, "engine": None, "tokens_per_s": None, "skipped": "budget"})
            continue
        graph = device.type == "cuda"
        base.update(_bytes(model, name, batch, cfg))
        try:
            rows.append({**base, **time_fast(model, name, prompts, cfg, device, graph)})
        except GraphCaptureError as e:  # measured, not hidden: the error row, then the eager fast path
            rows.append({**base, "engine": "fast", "tokens_per_s": None, "error": str(e).splitlines()[0]})
            rows.append({**base, **time_fast(model, name, prompts, cfg, device, False)})
        log(f"{shape} batch {batch} {name}: " + ", ".join(f"{r['engine']} {r['tokens_per_s'] or 0:,.0f} tok/s"
                                                         for r in rows if r["profile"] == name))
    if shape == "weight-bound" and time.perf_counter() <= deadline:  # the plain-PyTorch baseline, same weights
        row = time_plain(model, prompts, cfg.new_tokens, cfg.reps, device)
        rows.append({"profile": PLAIN, "shape": shape, "batch": batch, "new_tokens": cfg.new_tokens,
                     "prompt_len": cfg.prompt_len, "decode_gemm": None, "weight_bytes_per_step":
                     row.pop("weight_bytes_per_step"), "kv_bytes_per_step": _bytes(model, "bf16", batch, cfg)[
                         "kv_bytes_per_step"], "bytes_estimated": False, **row})
        log(f"{shape} batch {batch} {PLAIN}: {row['tokens_per_s']:,.0f} tok/s")
    return rows


def _bytes(model, profile: str, batch: int, cfg: SamplerBenchConfig) -> dict:
    """Bytes a decode step of this row reads (bench.decode_bytes), at the sampler's bucket rows and cache slots."""
    b = step_bytes(model, profile, batch_bucket(batch), cache_slots(cfg.prompt_len, cfg.new_tokens))
    return {"weight_bytes_per_step": b["weights"], "kv_bytes_per_step": b["kv"], "bytes_estimated": b["estimated"]}


def _reference_rows(model, cfg, device, deadline) -> list[dict]:
    prompts = _prompts(cfg.reference_batch, cfg, model.config.vocab_size)
    out = []
    for name in (p for p in cfg.profiles if get_profile(p).decode_gemm == "cached-bf16"):  # "before": as it was
        row = {"profile": name, "shape": "rl", "batch": cfg.reference_batch, "engine": "reference",
               "new_tokens": cfg.new_tokens}
        if time.perf_counter() > deadline:
            out.append({**row, "tokens_per_s": None, "skipped": "budget"})
            continue
        sampler = Sampler(model, name, device=device)
        sampler.generate(prompts, **{**_gen_kwargs(cfg), "max_new_tokens": 2})  # warm-up: kernels compiled
        out.append({**row, "tokens_per_s": _time_generate(sampler, prompts, cfg, device)})
    return out


def run(cfg: SamplerBenchConfig, device: torch.device, log=print) -> dict:
    """Run the bench; return the throughput/v1 payload (without writing it)."""
    for name in cfg.profiles:
        get_profile(name)  # unknown names fail before any work
    threads = torch.get_num_threads()
    if device.type != "cuda" and cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    try:
        t0 = time.perf_counter()
        deadline = t0 + cfg.budget_s
        rows, reference, profiles = [], [], {}
        for shape in cfg.shapes:
            model = build(shape, cfg, device)
            for batch in cfg.weight_bound_batches if shape == "weight-bound" else cfg.rl_batches:
                rows += _rows_for(model, shape, batch, cfg, device, deadline, log)
            if shape == "rl":
                reference = _reference_rows(model, cfg, device, deadline)
                if cfg.op_profile:
                    prompts = _prompts(cfg.reference_batch, cfg, model.config.vocab_size)
                    profiles = {name: op_profile(model, name, prompts, cfg, device, log) for name in cfg.profiles}
            elif cfg.op_profile:  # weight-bound, model: batch 1 and 16, where a step's time goes against the bytes
                for batch in (1, 16):
                    prompts = _prompts(batch, cfg, model.config.vocab_size)
                    profiles.update({f"{shape}/{name}" + ("" if batch == 1 else f"/b{batch}"):
                                     op_profile(model, name, prompts, cfg, device, log) for name in cfg.profiles})
            del model
        log(f"sampler bench: {time.perf_counter() - t0:.1f} s")
    finally:
        torch.set_num_threads(threads)
    copy_gbps = copy_bandwidth(device) if device.type == "cuda" else None
    _add_ratios(rows, reference, copy_gbps)
    config = {**dataclasses.asdict(cfg), "device": str(device),
              "model_configs": {s: dataclasses.asdict(shape_config(s, cfg.tiny, cfg.model)[0]) for s in cfg.shapes}}
    return {"schema": SCHEMA, "experiment": None, "config": config, "env": env_info(), "rows": rows,
            "reference": reference, "ceilings": {"copy_gbps": copy_gbps},
            "targets": check_targets(rows, device.type == "cuda"),
            **({"op_profile": profiles} if profiles else {})}


def op_profile(model, profile: str, prompts, cfg: SamplerBenchConfig, device, log, steps: int = 4) -> dict:
    """`steps` eager decode steps of the fast sampler under torch.profiler (bench.op_profile; eager so the host
    side shows too — the kernels are the ones a captured graph replays)."""
    sampler = FastSampler(model, profile, device=device, graph=False)
    st = sampler.start(prompts, **_gen_kwargs(cfg))
    sampler.step(st)  # warm-up: compiled kernels, weight caches
    steps = min(steps, cfg.new_tokens - 2)  # the cache holds new_tokens - 1 decode steps, one was the warm-up
    with profiled(device) as prof:
        for _ in range(steps):
            sampler.step(st)
    table = {"batch": len(prompts), **kernel_table(prof, steps, top=20)}
    log(f"decode step, {profile}: {summary(table)}")
    return table


def _add_ratios(rows: list[dict], reference: list[dict], copy_gbps: float | None = None) -> None:
    bf16 = {(r["shape"], r["batch"]): r["tokens_per_s"] for r in rows if r["profile"] == "bf16" and r["tokens_per_s"]}
    plain = {(r["shape"], r["batch"]): r["tokens_per_s"] for r in rows if r["profile"] == PLAIN and r["tokens_per_s"]}
    for r in rows:
        base = bf16.get((r["shape"], r["batch"]))
        r["speedup_vs_bf16"] = r["tokens_per_s"] / base if base and r["tokens_per_s"] else None
        base = plain.get((r["shape"], r["batch"]))
        if base:
            r["speedup_vs_plain"] = r["tokens_per_s"] / base if r["tokens_per_s"] else None
        if r.get("step_ms") and r.get("weight_bytes_per_step") is not None:  # bytes per token, bandwidth
            step_bytes_ = r["weight_bytes_per_step"] + r["kv_bytes_per_step"]
            r["bytes_per_token"] = step_bytes_ / r["batch"]
            r["gbps"] = step_bytes_ / (r["step_ms"] / 1e3) / 1e9
            r["bw_frac"] = r["gbps"] / copy_gbps if copy_gbps else None
    best = {}  # packed vs cached-bf16 decode of the same profile, same shape and batch (best engine each)
    for r in rows:
        key = (r["profile"], r["shape"], r["batch"])
        if r["tokens_per_s"] and r["tokens_per_s"] > best.get(key, 0.0):
            best[key] = r["tokens_per_s"]
    for r in rows:
        cached = best.get((r["profile"].removesuffix("-packed"), r["shape"], r["batch"]))
        if r["profile"].endswith("-packed"):
            r["speedup_vs_cached"] = r["tokens_per_s"] / cached if cached and r["tokens_per_s"] else None
    fast = {(r["profile"], r["batch"]): r["generate_tokens_per_s"] for r in rows
            if r["shape"] == "rl" and r["tokens_per_s"] and r["engine"] == "fast"}
    fast_eager = {(r["profile"], r["batch"]): r["generate_tokens_per_s"] for r in rows
                  if r["shape"] == "rl" and r["tokens_per_s"] and r["engine"] == "fast-eager"}
    for r in reference:  # whole generate() against whole generate()
        f = fast.get((r["profile"], r["batch"])) or fast_eager.get((r["profile"], r["batch"]))
        r["fast_speedup_vs_reference"] = f / r["tokens_per_s"] if f and r["tokens_per_s"] else None


def check_targets(rows: list[dict], cuda: bool) -> dict:
    """The sampler's targets on the measured rows (the best engine of each profile/shape/batch): RL shape batch 64
    bf16 tokens/s and every NVFP4 profile's ratio to bf16; weight-bound shape every packed NVFP4 profile's ratio
    to bf16 (4-bit weights: fewer bytes), bf16 against the plain-PyTorch decode and against copy bandwidth; model
    shape every NVFP4 profile's ratio at batch 64 and every packed one's at batch <= 16."""
    best = {}
    for r in rows:
        key = (r["profile"], r["shape"], r["batch"])
        if r["tokens_per_s"] and (key not in best or r["tokens_per_s"] > best[key]["tokens_per_s"]):
            best[key] = r
    checks = []

    def check(target, value, floor):
        checks.append({"target": target, "value": value, "met": None if value is None else value >= floor})

    bf16 = best.get(("bf16", "rl", TARGET_BATCH))
    check(f"rl batch {TARGET_BATCH}: bf16 >= {TARGETS['rl_bf16_tokens_per_s_min']:,.0f} tok/s",
          bf16["tokens_per_s"] if bf16 else None, TARGETS["rl_bf16_tokens_per_s_min"])
    for (p, s, b), r in sorted(best.items()):
        bf = best.get(("bf16", s, b))
        ratio = r["tokens_per_s"] / bf["tokens_per_s"] if bf else None
        if s in ("rl", "model") and b == TARGET_BATCH and p in NVFP4 + PACKED:
            check(f"{s} batch {b}: {p} >= {TARGETS['rl_nvfp4_vs_bf16_min']}x bf16", ratio,
                  TARGETS["rl_nvfp4_vs_bf16_min"])
        if s == "model" and b <= TARGETS["model_packed_max_batch"] and p in PACKED:
            check(f"model batch {b}: {p} >= {TARGETS['model_packed_vs_bf16_min']}x bf16", ratio,
                  TARGETS["model_packed_vs_bf16_min"])
        if s == "weight-bound" and p in PACKED:
            check(f"weight-bound batch {b}: {p} >= {TARGETS['weight_bound_packed_vs_bf16_min']}x bf16", ratio,
                  TARGETS["weight_bound_packed_vs_bf16_min"])
        if s == "weight-bound" and p == "bf16":
            plain = best.get((PLAIN, s, b))
            check(f"weight-bound batch {b}: bf16 >= {TARGETS['weight_bound_bf16_vs_plain_min']}x plain PyTorch",
                  r["tokens_per_s"] / plain["tokens_per_s"] if plain else None,
                  TARGETS["weight_bound_bf16_vs_plain_min"])
            if b == 1:
                check(f"weight-bound batch 1: bf16 >= {TARGETS['weight_bound_bf16_bw_frac_min']:.0%} of copy "
                      "bandwidth", r.get("bw_frac"), TARGETS["weight_bound_bf16_bw_frac_min"])
    return {**TARGETS, "applicable": cuda, "checks": checks,
            "note": "targets are for the H200 run; a CPU run only checks the code"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="minite bench sampler", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="tiny | h200 (default: h200 on CUDA, tiny on CPU)")
    ap.add_argument("--profiles", default=None, help="comma list (bf16 first is the baseline)")
    ap.add_argument("--shapes", default=None, help="comma list of rl, weight-bound (model: with --model)")
    ap.add_argument("--model", default=None, help="a checkpoint directory or model preset: time its shape only")
    ap.add_argument("--new-tokens", type=int, dest="new_tokens")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--budget-s", type=float, dest="budget_s", help="wall-clock budget (rows left are skipped)")
    ap.add_argument("--op-profile", action="store_true", default=None, dest="op_profile",
                    help="per profile, the kernels of one decode step (RL shape at the reference batch, the others at "
                         "batch 1; untimed)")
    ap.add_argument("--out", required=True, help="output JSON (schema throughput/v1)")
    add_common_args(ap, config_help="the experiment's `sampler_bench:` section as JSON (keys = the flags above)")
    args = parse_with_config(ap, argv)
    device = torch.device(args.device)
    name = args.config or ("h200" if device.type == "cuda" else "tiny")
    if name not in CONFIGS:
        ap.error(f"--config {name!r}: one of {', '.join(CONFIGS)}")
    over = {"profiles": tuple(p.strip() for p in args.profiles.split(",") if p.strip()) if args.profiles else None,
            "shapes": tuple(s.strip() for s in args.shapes.split(",") if s.strip()) if args.shapes else None,
            "new_tokens": args.new_tokens, "reps": args.reps, "budget_s": args.budget_s, "seed": args.seed,
            "op_profile": args.op_profile, "model": args.model,
            **({"shapes": ("model",)} if args.model and not args.shapes else {})}
    try:
        cfg = dataclasses.replace(CONFIGS[name], **{k: v for k, v in over.items() if v is not None})
        for shape in cfg.shapes:
            shape_config(shape, cfg.tiny, cfg.model)
        if cfg.new_tokens < 2 or cfg.reps < 1:
            raise ValueError(f"need --new-tokens >= 2 and --reps >= 1, got {cfg.new_tokens}, {cfg.reps}")
        if cfg.op_profile and cfg.new_tokens < 3:
            raise ValueError(f"--op-profile needs --new-tokens >= 3 (a warm-up step, then a profiled one), got "
                             f"{cfg.new_tokens}")
    except ValueError as e:
        ap.error(str(e))
    print(f"sampler bench: config {cfg.name} on {device}: {cfg}", flush=True)
    payload = run(cfg, device, log=lambda s: print(s, flush=True))
    payload["experiment"] = args.experiment
    write_json(args.out, payload)
    for r in payload["rows"]:
        tps = "—" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        print(f"{r['shape']} batch {r['batch']} {r['profile']} ({r.get('engine')}): {tps} tokens/s", flush=True)
    return 0

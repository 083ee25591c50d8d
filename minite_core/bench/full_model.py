"""`minite bench full-model`: the harness at a real model's full shape — Qwen3-30B-A3B's by default (48 layers, 128
experts top-8, hidden 2048, expert width 768, vocabulary 151,936), or your checkpoint's config.json — with random
weights drawn on the device (no file): the fast sampler decodes under each sampler profile, and the diagnostics
score learner against sampler on engine pairs. It answers "does this code run at the paper's scale, how fast does
it decode, how much memory does it take", and shows the mismatch at that depth and width (numerics only: random
weights are not a trained policy, so no accuracy is measured).

How: the model is built on the meta device, cast to bf16 there and materialised once on the device, its values
drawn there from one generator (bench.learner_setup.draw_random_: N(0, 0.02), norms 1). Per profile (`--profiles`, in
order; static-scale profiles calibrated on random tokens first): the fast sampler (CUDA graphs on a GPU) decodes
`--batch` random prompts of `--prompt-len` tokens for `--new-tokens` tokens with no stop token, timed as
`minite bench sampler` times it (bench.sampler.time_fast: decode-only tokens/s over `--reps` repetitions after a
warm-up), and the device's peak allocated memory over that profile's work is recorded. Then `diagnose` (the
function `minite diagnose` runs) measures each pair of `--pairs` on `--diag-prompts` random prompts: k3 and the
other mismatch metrics, routing agreement per MoE layer. Quantized weight caches are dropped between profiles.

Memory plan (`plan_memory`, checked against the device's free memory before anything is allocated): the bf16
weights; the largest per-profile cache of GEMM operands (the Triton path keeps every quantized weight dequantized
to bf16, once per weight version; minite's fp32 router and LM head keep three bf16 pieces each); the KV cache of
the decode batch; the diagnostics' processed log-prob rows and learner logits; and a fixed margin (CUDA context,
graph pools, allocator slack). At Qwen3-30B-A3B's shape on one GPU: 61 GB of weights + 60 GB of NVFP4 operand
cache + a few GB — within an H200's 141 GB, one NVFP4 profile at a time. A plan over the free memory is a one-line
error naming the parts; an out-of-memory error during a phase is one line naming the phase, after the phases done
so far are written (the output JSON is rewritten after every phase).

Output: results contract stage "full_model": `rows` per profile (tokens/s, p20/p80, step ms, whole-generate
tokens/s, peak GB, engine), `metrics` {"<profile>/tokens_per_s", "<profile>/peak_gb", "<pair>/k3", ...}, the
diagnostics' per-pair metrics, and the memory plan next to the measured peaks.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass

import torch

from minite_core.bench.learner_setup import draw_random_
from minite_core.bench.sampler import SamplerBenchConfig, time_fast
from minite_core.diagnostics.cli import diagnose, parse_pairs, random_prompts
from minite_core.engines.fast_sampler import GraphCaptureError
from minite_core.engines.sampler import batch_bucket, cache_slots
from minite_core.model import PRESETS, CausalLM, ModelConfig, set_profile
from minite_core.model.calibrate import calibrate
from minite_core.model.io import read_model_config
from minite_core.nn import clear_weight_caches, gemm_modules
from minite_core.profiles import get_profile
from minite_core.results import write_result
from minite_core.runs.cli import add_common_args, parse_with_config

GB = 1e9
MARGIN_BYTES = 6 * GB  # CUDA context, graph memory pools, allocator slack (not measured per shape: a reserve)


@dataclass(frozen=True)
class FullModelConfig:
    model: str = "qwen3-30b-a3b"  # a model preset or a checkpoint directory (its config.json)
    layers: int | None = None  # num_hidden_layers override (None = the model's)
    vocab_size: int | None = None  # vocabulary override (None = the model's)
    profiles: tuple[str, ...] = ("bf16", "vllm-nvfp4", "minite")  # sampler profiles, timed in this order
    pairs: tuple[str, ...] = ("bf16:bf16", "minite:minite")  # diagnostics pairs (learner:sampler)
    batch: int = 64  # decode rows (the RL shape's batch of bench.sampler)
    prompt_len: int = 32
    new_tokens: int = 128
    reps: int = 3  # timed decodes per profile (median); one untimed warm-up first
    diag_prompts: int = 16
    diag_new_tokens: int = 64
    seed: int = 0

    def model_config(self) -> ModelConfig:
        cfg = PRESETS[self.model] if self.model in PRESETS else read_model_config(self.model)
        over = {}
        if self.layers is not None:
            over["num_hidden_layers"] = self.layers
            over["mlp_only_layers"] = tuple(i for i in cfg.mlp_only_layers if i < self.layers)
        if self.vocab_size is not None:
            over["vocab_size"] = self.vocab_size
        return cfg.replace(**over) if over else cfg


def _layer(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[1] == "layers" else None


def operand_cache_bytes(model: CausalLM, profile) -> int:
    """Bytes of GEMM operands `profile` caches beside the bf16 weights (module docstring; an upper bound on CPU,
    which keeps quantized weights packed)."""
    profile, L, total = get_profile(profile), model.config.num_hidden_layers, 0
    for name, m in gemm_modules(model):
        layer = _layer(name)
        p = profile if layer is None else profile.for_layer(layer, L)
        if getattr(m, "role", "linear") == "linear":
            total += 2 * m.weight.numel() if p.weight is not None else 0  # dequantized bf16 operand
        elif (p.router_dtype if m.role == "router" else p.lm_head_dtype) == "float32":
            total += 3 * 2 * m.weight.numel()  # fp32 split into three bf16 pieces (nn.fp32_split)
    return total


def plan_memory(cfg: FullModelConfig) -> dict:
    """Bytes each part of the run needs at its peak (module docstring), on a meta-device model: nothing allocated."""
    mcfg = cfg.model_config()
    with torch.device("meta"):
        model = CausalLM(mcfg)
    weights = 2 * model.num_parameters()
    caches = {name: operand_cache_bytes(model, name) for name in {*cfg.profiles,
                                                                  *(n for p in cfg.pairs for n in p.split(":"))}}
    slots = cache_slots(cfg.prompt_len, max(cfg.new_tokens, cfg.diag_new_tokens))
    kv = (batch_bucket(max(cfg.batch, cfg.diag_prompts)) * slots * mcfg.num_hidden_layers * 2
          * mcfg.num_key_value_heads * mcfg.head_dim * 2)
    rows = cfg.diag_prompts * cfg.diag_new_tokens * mcfg.vocab_size * 4  # one fp32 (rows, V) tensor
    work = max(3 * rows, 4 * batch_bucket(cfg.batch) * mcfg.vocab_size * 4)  # log-prob rows, logits, log-softmax
    plan = {"weights": weights, "operand_cache_max": max(caches.values()), "kv_cache": kv, "work": work,
            "margin": MARGIN_BYTES}
    return {"bytes": plan, "total": sum(plan.values()), "operand_cache": caches,
            "parameters": model.num_parameters()}


def _gb(n) -> float:
    return round(n / GB, 2)


def check_plan(plan: dict, device: torch.device) -> None:
    """ValueError, one line, when the plan exceeds the device's free memory (CUDA only)."""
    if device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(device)
    if plan["total"] > free:
        parts = ", ".join(f"{k} {_gb(v)}" for k, v in plan["bytes"].items())
        raise ValueError(f"full-model: the memory plan needs {_gb(plan['total'])} GB ({parts}), {device} has "
                         f"{_gb(free)} GB free of {_gb(total)}: lower --layers, --batch or --new-tokens")


def build(cfg: FullModelConfig, device: torch.device) -> CausalLM:
    """The model on the meta device, cast to bf16 there, allocated once on `device`, values drawn on `device`."""
    with torch.device("meta"):
        model = CausalLM(cfg.model_config()).to(torch.bfloat16)
    model.to_empty(device=device)
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    draw_random_(model, device, cfg.seed)
    return model.eval()


class _Phase:
    """Runs one phase: peak memory over it (CUDA), and an out-of-memory error as one line naming the phase."""

    def __init__(self, name: str, device: torch.device):
        self.name, self.device, self.peak_gb = name, device, None

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, kind, exc, tb):
        if self.device.type == "cuda":
            self.peak_gb = _gb(torch.cuda.max_memory_allocated(self.device))
        if kind is not None and issubclass(kind, torch.OutOfMemoryError):
            used = _gb(torch.cuda.memory_allocated(self.device)) if self.device.type == "cuda" else None
            raise RuntimeError(f"full-model: out of memory in {self.name} (peak {self.peak_gb} GB, {used} GB still "
                               "allocated): lower --batch, --new-tokens or --layers") from None
        return False


def _decode_row(model, name: str, cfg: FullModelConfig, device) -> dict:
    scfg = SamplerBenchConfig(name="full-model", new_tokens=cfg.new_tokens, reps=cfg.reps, prompt_len=cfg.prompt_len,
                              seed=cfg.seed)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    prompts = torch.randint(0, model.config.vocab_size, (cfg.batch, cfg.prompt_len), generator=g).tolist()
    if get_profile(name).needs_calibration:  # static scales: random tokens of the prompts' stream, once
        set_profile(model, name)
        calibrate(model, [torch.tensor(prompts[: min(8, cfg.batch)], device=device)])
    graph = device.type == "cuda"
    try:
        return time_fast(model, name, prompts, scfg, device, graph)
    except GraphCaptureError as e:  # measured, not hidden: the eager fast path, with the capture error
        return {**time_fast(model, name, prompts, scfg, device, False), "graph_error": str(e).splitlines()[0]}


def run(cfg: FullModelConfig, device: torch.device, out=None, experiment: str = "adhoc", log=print) -> dict:
    """Plan, build, decode per profile, diagnose per pair; the result is (re)written to `out` after every phase."""
    plan = plan_memory(cfg)
    log(f"full-model: {plan['parameters'] / 1e9:.2f} B parameters; plan {_gb(plan['total'])} GB: "
        + ", ".join(f"{k} {_gb(v)}" for k, v in plan["bytes"].items()))
    check_plan(plan, device)
    state = {"rows": [], "diagnostics": {}, "phases": {}}

    def save():
        if out is not None:
            metrics = {f"{r['profile']}/{k}": r[k] for r in state["rows"] for k in ("tokens_per_s", "peak_gb")}
            metrics.update({f"{pair}/{k}": m[k] for pair, m in state["diagnostics"].items()
                            for k in ("mismatch/k3", "mismatch/kl_full_vocab", "routing/topk_disagree") if k in m})
            write_result(out, stage="full_model", experiment=experiment,
                         config={**dataclasses.asdict(cfg), "device": str(device),
                                 "model_config": dataclasses.asdict(cfg.model_config())},
                         metrics=metrics, rows=state["rows"], diagnostics=state["diagnostics"],
                         memory={"plan_gb": {k: _gb(v) for k, v in plan["bytes"].items()},
                                 "plan_total_gb": _gb(plan["total"]),
                                 "operand_cache_gb": {k: _gb(v) for k, v in plan["operand_cache"].items()},
                                 "phase_peak_gb": state["phases"]})

    t0 = time.perf_counter()
    with _Phase("build", device) as ph:
        model = build(cfg, device)
    state["phases"]["build"] = ph.peak_gb
    log(f"built on {device} in {time.perf_counter() - t0:.1f} s (peak {ph.peak_gb} GB)")
    for name in cfg.profiles:
        with _Phase(f"decode {name}", device) as ph:
            row = _decode_row(model, name, cfg, device)
        state["rows"].append({"profile": name, "batch": cfg.batch, "new_tokens": cfg.new_tokens, **row,
                              "peak_gb": ph.peak_gb})
        state["phases"][f"decode {name}"] = ph.peak_gb
        log(f"decode {name}: {row['tokens_per_s']:,.0f} tokens/s ({row['engine']}), peak {ph.peak_gb} GB")
        clear_weight_caches(model)
        save()
    prompts = random_prompts(cfg.diag_prompts, model.config.vocab_size, cfg.seed)
    for pair in cfg.pairs:
        with _Phase(f"diagnose {pair}", device) as ph:
            res = diagnose(model, parse_pairs(pair), prompts, max_new_tokens=cfg.diag_new_tokens, seed=cfg.seed,
                           stop_ids=())
        state["diagnostics"][pair] = res["metrics"][pair]
        state["phases"][f"diagnose {pair}"] = ph.peak_gb
        log(f"diagnose {pair}: k3 {res['metrics'][pair]['mismatch/k3']:.3e}, peak {ph.peak_gb} GB")
        clear_weight_caches(model)
        save()
    log(f"full-model: {time.perf_counter() - t0:.1f} s")
    save()
    return state


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="minite bench full-model", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=FullModelConfig.model, help="a model preset or a checkpoint directory")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's)")
    ap.add_argument("--vocab", type=int, default=None, dest="vocab_size", help="vocabulary (default: the model's)")
    ap.add_argument("--profiles", default=",".join(FullModelConfig.profiles), help="sampler profiles, in order")
    ap.add_argument("--pairs", default=",".join(FullModelConfig.pairs), help="diagnostics pairs learner:sampler")
    for flag in ("batch", "prompt_len", "new_tokens", "reps", "diag_prompts", "diag_new_tokens"):
        ap.add_argument("--" + flag.replace("_", "-"), type=int, default=getattr(FullModelConfig, flag))
    ap.add_argument("--out", required=True, help="result JSON (results contract, stage full_model)")
    add_common_args(ap)
    args = parse_with_config(ap, argv)
    cfg = FullModelConfig(model=args.model, layers=args.layers, vocab_size=args.vocab_size,
                          profiles=tuple(p for p in args.profiles.split(",") if p),
                          pairs=tuple(p for p in args.pairs.split(",") if p), batch=args.batch,
                          prompt_len=args.prompt_len, new_tokens=args.new_tokens, reps=args.reps,
                          diag_prompts=args.diag_prompts, diag_new_tokens=args.diag_new_tokens, seed=args.seed)
    for name in cfg.profiles:
        get_profile(name)  # unknown names fail before any work
    parse_pairs(",".join(cfg.pairs))
    if min(cfg.batch, cfg.prompt_len, cfg.reps, cfg.diag_prompts) < 1 or min(cfg.new_tokens, cfg.diag_new_tokens) < 2:
        ap.error("--batch, --prompt-len, --reps, --diag-prompts must be >= 1, --new-tokens / --diag-new-tokens >= 2")
    run(cfg, torch.device(args.device), out=args.out, experiment=args.experiment, log=lambda s: print(s, flush=True))
    return 0

"""Learner-update throughput (`minite bench learner`): BF16 vs TE-NVFP4 vs miniTE on one model, one process.
(Launched by torchrun, the same command times the scale-out learner instead: bench.learner_dist.)

What is timed: a COMPLETE learner update — forward (logits), next-token cross-entropy (token mean; the RL
objective's cost is the same log-softmax + gather), backward, AdamW step, zero_grad — as the paper's "tokens/s
for complete learner updates". One model with fp32 master weights and one AdamW serve every profile; only
`set_profile` changes between steps, so model, batch, sequence length, optimizer state and allocator are shared.

How it differs from timing each profile in its own run: profiles are interleaved round-robin (the starting
profile rotates each round), so clock/thermal drift and allocator growth hit every profile alike, and the
ratios (speedup_vs_bf16, speedup_vs_te_nvfp4, saved_act_ratio_vs_bf16) come from the same run. Each step is one
timing sample (CUDA events on GPU, perf_counter on CPU; `bench.timing`); tokens/s = B·T / median step time;
p20_tokens_per_s = B·T / p80 step time (the slow end), p80_tokens_per_s = B·T / p20 step time.

Peak memory: `torch.cuda.max_memory_allocated`, reset before every step, max over the profile's timed steps (it
includes the weights, grads and the AdamW state of the row's own optimizer; not the idle optimizer's, see below).

Real Transformer Engine rows (`te:<mode>`, e.g. te:bf16, te:fp8-current, te:fp8-block; modes of peers.te_learner):
the same model and batch through `te_learner.build_te_model(model, mode, share_weights=True)` (decoder GEMMs as
te.Linear, one per expert; every copy shares the model's parameter storage) and `te_learner.te_train_step`,
interleaved with the other profiles. The TE copies share one Parameter set (expert views included), so one
second AdamW serves every TE row (its state is apart from the main optimizer's, as the parameters are its own
Parameter objects); every optimizer step clears every copy's weight caches. When TE cannot run a mode here (not
installed, no CUDA, an FP8 recipe this GPU lacks) its row is skipped: the reason is printed and recorded in the
payload's `skipped`, and no number is made up.

Memory with TE rows (`OptimizerSwap`): two AdamW states would sit on the GPU at once — at 4 Qwen3-30B-A3B layers
(2.63B fp32 params) 21.0 GB each beside 10.5 GB of weights and 10.5 GB of grads; with the six rows of
experiments/h200.yaml that ran out of memory on the H200 (137 GB allocated). So only the optimizer of the row about to run keeps its state in device
memory: when the round switches between our rows and TE rows, the idle optimizer's state tensors (exp_avg,
exp_avg_sq, step) are copied to pinned CPU memory and the active one's copied back to where they were, bitwise,
before the step's timer starts and before the peak counter is reset. So the GPU holds weights + grads + one
state (42 GB at that shape) and each row's peak is what it would be with its own optimizer alone. Cost, all
outside the timed steps (it lengthens the rounds, so the budget may allow fewer of them): 21 GB each way per
switch, ~1 s at PCIe gen5 rates; with our rows and the TE rows listed as two blocks, at most 3 switches a round.
Host memory holds both states in pinned buffers (torch rounds each up to a power of two: ~2x27 GB at 4 layers).
Grads are freed by every step (zero_grad(set_to_none=True)), so they are never held twice. Why
not alias the TE optimizer's state to the main one's (experts as views W[e] of its exp_avg): AdamW's `step`
count is a tensor per parameter, and the 128 expert views would share W's — `_foreach_add_` would bump it 128
times per step — or count apart from it, so bias correction would no longer be AdamW's. Before any work, a row
whose weights + grads + AdamW state alone exceed the GPU's memory stops the bench with a one-line error.

Saved-activation bytes: one extra forward per profile, counted by `bench.saved_activations` (parameters, their
view/cast copies and the modules' weight caches excluded; the loss's own log-softmax excluded — identical for
every profile — the count covers `model(ids)`). The NVFP4 learners recompute their RMSNorms and SwiGLU in backward
(profile knob `recompute_elementwise`, `nn.recompute`): they keep their inputs, not their fp32 upcasts and
elementwise intermediates; bf16 keeps autograd's plain graph, as its users run it (and as the baseline's speed).

MFU = model FLOPs per second / the cuBLAS bf16 GEMM rate measured in the same run (torch.mm at 8192³, bf16 in,
bf16 out, random data, median of `CEILING_REPS`). Model FLOPs per update (`model_flops`), counted from the config:
    6 · N_active · tokens + 6 · L · H · Dh · T · tokens
N_active = the GEMM parameters one token uses (q, k, v, o projections, router, the top-k experts' gate/up/down
or the dense MLP, and the LM head; embeddings excluded), 6 = forward (2) + backward (4) per multiply-add;
the second term is causal attention (QKᵀ and PV, 2 · 2 · T · H · Dh per token forward, halved for causality, ×3
with backward). Recomputation and pad rows do not count: this is the model's arithmetic, not the kernels'.

Shapes: on the GPU, Qwen3-30B-A3B's layer shapes (hidden 2048, 32 query / 4 KV heads, head_dim 128, 128 experts
top-8, expert width 768) with fewer layers (fit the time budget) and the vocabulary reduced from 151,936 to
32,768 (LM head + embedding are the same for every profile except miniTE's fp32 LM head; a smaller vocabulary
keeps them from dominating a few-layer model). On CPU a tiny MoE runs the same code.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from minite_core.bench.op_profile import kernel_table, profiled, summary
from minite_core.bench.saved_activations import saved_activation_bytes
from minite_core.bench.timing import Stats, round_robin, timed_rounds
from minite_core.model import PRESETS, CausalLM, set_profile
from minite_core.model.io import read_model_config
from minite_core.nn import clear_weight_caches, track_optimizer
from minite_core.profiles import get_profile
from minite_core.results import env_info, write_json
from minite_core.runs.cli import add_common_args, parse_with_config

SCHEMA = "throughput/v1"
GB = 1e9

# The paper's headline (arXiv 2610.23928 abstract): one B300 node, Qwen3-30B-A3B, complete learner updates.
# Never mixed into measured rows. The implied baselines are our arithmetic, not the paper's numbers.
PAPER = {
    "source": "arXiv 2610.23928 (abstract)",
    "hardware": "one NVIDIA B300 node (sm_100, native FP4 tensor cores)",
    "model": "Qwen3-30B-A3B",
    "minite_tokens_per_s": 33540,
    "speedup_vs_bf16": 1.39,
    "speedup_vs_te_nvfp4": 1.47,
    "implied_bf16_tokens_per_s": round(33540 / 1.39),
    "implied_te_nvfp4_tokens_per_s": round(33540 / 1.47),
    "note": "the paper's numbers, not measured here; implied_* = 33540 / speedup (our arithmetic)",
}

# Targets for this reproduction on the H200 (sm_90, no FP4 tensor cores), all from the same run.
TARGETS = {"bf16_mfu_min": 0.35, "minite_vs_bf16_min": 0.90, "minite_vs_te_nvfp4_min": 1.25,
           "minite_saved_act_ratio_max": 0.40}
CEILING_SHAPE, CEILING_REPS = 8192, 20


@dataclass(frozen=True)
class LearnerBenchConfig:
    name: str
    model: str = "qwen3-30b-a3b"  # a model PRESETS key (layer shapes of the paper's model) or a checkpoint dir
    layers: int | None = None  # num_hidden_layers override (None = preset's)
    vocab_size: int | None = None  # vocabulary override (None = preset's)
    batch: int = 4
    seq: int = 2048
    warmup: int = 3  # untimed rounds (Triton compile/autotune, allocator growth)
    iters: int = 10  # timed rounds (each = one step of every profile), capped by budget_s
    budget_s: float = 110.0  # wall-clock cap for the whole bench (the H200 DAG gets ~10 min in total)
    profiles: tuple[str, ...] = ("bf16", "te-nvfp4", "minite")
    param_dtype: str = "float32"  # fp32 master weights, as an RL learner keeps them
    lr: float = 1e-6  # small: weights (and so MoE routing) barely move across the timed steps
    tf32: bool = False  # torch default; True speeds fp32 GEMMs (miniTE's fp32 LM head) at TF32 precision
    cpu_threads: int | None = None  # CPU only: torch intra-op threads for the run (None = leave as is)
    op_profile: bool = False  # one extra step per profile under torch.profiler: top kernels by GPU time
    seed: int = 0
    model_overrides: dict = field(default_factory=dict)  # any other ModelConfig field

    def model_config(self):
        """The preset's shape, or a checkpoint directory's (its config.json; the weights stay random)."""
        cfg = PRESETS[self.model] if self.model in PRESETS else read_model_config(self.model)
        over = dict(self.model_overrides)
        if self.layers is not None:
            over["num_hidden_layers"] = self.layers
            over.setdefault("mlp_only_layers", tuple(i for i in cfg.mlp_only_layers if i < self.layers))
        if self.vocab_size is not None:
            over["vocab_size"] = self.vocab_size
        return cfg.replace(**over)


CONFIGS = {
    # CPU smoke: tiny MoE (MoE, dense, MoE layers; hidden 64 so GEMM inputs are a realistic share of the saved
    # activations), seconds on 2 cores. One thread: on the shared 2-core dev box, multi-threaded tiny GEMMs were
    # 30-50x slower than single-threaded (OpenMP spin-waits under contention; 400 ms vs 8 ms per bf16 step).
    "tiny": LearnerBenchConfig(name="tiny", model="tiny-moe", batch=2, seq=32, warmup=2, iters=5, budget_s=60.0,
                               cpu_threads=1, model_overrides={"hidden_size": 64, "intermediate_size": 128,
                                                               "moe_intermediate_size": 64}),
    # H200: Qwen3-30B-A3B layer shapes. 6 layers = 3.9B params -> 63 GB of fp32 weights + grads + AdamW state,
    # 4 x 4096 = 16,384 tokens per update. Vocabulary 32,768 instead of 151,936 (see module docstring).
    "h200": LearnerBenchConfig(name="h200", model="qwen3-30b-a3b", layers=6, vocab_size=32768, batch=4, seq=4096,
                               warmup=3, iters=10, budget_s=150.0),
}


def resolve_config(spec: str | None, device: torch.device, **overrides) -> LearnerBenchConfig:
    """`tiny` | `h200` | path to a JSON file | inline JSON object ({"base": "h200", ...fields}); None = h200 on
    CUDA, tiny on CPU. `overrides` with value None are ignored (CLI flags not given)."""
    if spec is None:
        spec = "h200" if device.type == "cuda" else "tiny"
    if spec in CONFIGS:
        cfg = CONFIGS[spec]
    else:
        text = Path(spec).read_text() if not spec.lstrip().startswith("{") else spec
        fields = json.loads(text)
        base = CONFIGS[fields.pop("base", "h200" if device.type == "cuda" else "tiny")]
        if "profiles" in fields:
            fields["profiles"] = tuple(fields["profiles"])
        fields.setdefault("name", f"{base.name}+custom")
        cfg = dataclasses.replace(base, **fields)
    over = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(cfg, **over) if over else cfg


# ---- model, data, one learner update ----------------------------------------------------------------------
def build(cfg: LearnerBenchConfig, device: torch.device):
    """Model (built on `device` directly), AdamW, and one fixed batch. Init N(0, 0.02) / norms 1 from a generator
    on the device: CausalLM.init_weights draws on CPU for device-independence, which throughput does not need
    and which costs tens of seconds at 4B parameters."""
    mcfg = cfg.model_config()
    model, gen = random_model(mcfg, getattr(torch, cfg.param_dtype), device, cfg.seed)
    fused = device.type == "cuda"  # one kernel over all parameters on GPU; CPU uses the default (foreach)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0, **({"fused": True} if fused else {}))
    track_optimizer(opt, model)  # quantized-weight caches are stale after each step
    ids = torch.randint(0, mcfg.vocab_size, (cfg.batch, cfg.seq + 1), generator=gen, device=device)
    return model, opt, ids[:, :-1].contiguous(), ids[:, 1:].contiguous()  # (B, T) inputs, (B, T) labels


def check_fits(cfg: LearnerBenchConfig, device: torch.device) -> None:
    """One-line error before any work when one row's weights + grads + AdamW state (2 moments), activations not
    counted, exceed the GPU's memory (counted on a meta-device model)."""
    if device.type != "cuda":
        return
    with torch.device("meta"):
        n = CausalLM(cfg.model_config()).num_parameters()
    need = 4 * n * getattr(torch, cfg.param_dtype).itemsize  # weights, grads, exp_avg, exp_avg_sq
    total = torch.cuda.get_device_properties(device).total_memory
    if need > total:
        raise ValueError(f"config {cfg.name!r} at {cfg.model_config().num_hidden_layers} layers needs {need / GB:.1f} GB "
                         f"for weights, grads and AdamW state alone, {device} has {total / GB:.1f} GB: use fewer --layers")


class OptimizerSwap:
    """Keeps only one optimizer's state in device memory (module docstring, "Memory with TE rows"): `activate(opt)`
    copies the other optimizers' state tensors to CPU memory (pinned when they are on a GPU) and `opt`'s back to
    the devices they came from, bitwise. A no-op when `opt` is already the active one."""

    def __init__(self, *optimizers: torch.optim.Optimizer):
        self.optimizers, self.active = optimizers, None
        self.homes: dict = {}  # parked optimizer -> [(its state dict of one param, key, the tensor's device)]

    def activate(self, opt: torch.optim.Optimizer) -> None:
        if opt is self.active:
            return
        for other in self.optimizers:
            if other is not opt and other not in self.homes:
                self.park(other)
        for state, key, home in self.homes.pop(opt, []):
            state[key] = state[key].to(home, non_blocking=True)
        self.active = opt
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # sync point: the copies are done before the step's timer starts

    def park(self, opt: torch.optim.Optimizer) -> None:
        """Move `opt`'s state tensors to CPU memory (asynchronous from a GPU: `activate` synchronises)."""
        homes = []
        for state in opt.state.values():
            for key, t in state.items():
                if isinstance(t, torch.Tensor):
                    homes.append((state, key, t.device))
                    cpu = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
                    state[key] = cpu.copy_(t, non_blocking=t.is_cuda)  # the device copy is freed (stream-ordered)
        self.homes[opt] = homes
        if self.active is opt:
            self.active = None


def random_model(mcfg, dtype: torch.dtype, device: torch.device, seed: int):
    """CausalLM built on `device` in `dtype`, N(0, 0.02) / norms 1 from a device generator (returned, for the
    caller's further draws): the benchmarks' model, which needs no cross-device determinism."""
    with torch.device(device):
        model = CausalLM(mcfg)
    model.to(dtype)
    return model, draw_random_(model, device, seed)


@torch.no_grad()
def draw_random_(model, device: torch.device, seed: int) -> torch.Generator:
    """random_model's values, drawn into `model`'s parameters in place -> the generator."""
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.normal_(0.0, 0.02, generator=gen)
    return gen


def _set_step_seed(model, step: int, seed: int = 0) -> None:
    """Stochastic-rounding seeds as the Learner sets them: module j gets derive_seed(run seed, step, j)."""
    from minite_core.nn.walk import set_sr_seeds

    set_sr_seeds(model, seed, step)


def model_flops(mcfg, batch: int, seq: int) -> float:
    """FLOPs of one learner update (forward + backward) on batch x seq tokens; formula in the module docstring."""
    D, L = mcfg.hidden_size, mcfg.num_hidden_layers
    H, Hkv, Dh = mcfg.num_attention_heads, mcfg.num_key_value_heads, mcfg.head_dim
    attn = D * H * Dh * 2 + D * Hkv * Dh * 2  # q, o + k, v
    active = 0
    for i in range(L):
        if mcfg.is_moe_layer(i):
            active += attn + D * mcfg.num_experts + mcfg.num_experts_per_tok * 3 * D * mcfg.moe_intermediate_size
        else:
            active += attn + 3 * D * mcfg.intermediate_size
    active += D * mcfg.vocab_size  # LM head
    tokens = batch * seq
    return 6.0 * active * tokens + 6.0 * L * H * Dh * seq * tokens


def gemm_ceiling_tflops(device: torch.device) -> float | None:
    """cuBLAS bf16 GEMM rate at 8192³ on random data, measured now (None on CPU)."""
    if device.type != "cuda":
        return None
    from minite_core.bench.timing import bench

    n = CEILING_SHAPE
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    stats = bench(lambda: torch.mm(a, b), warmup=3, reps=CEILING_REPS, device=device)
    return 2 * n ** 3 / (stats.median_ms / 1e3) / 1e12


def learner_step(model, opt, input_ids, labels) -> torch.Tensor:
    logits = model(input_ids)  # (B, T, V) fp32
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


# ---- the benchmark ----------------------------------------------------------------------------------------


def _te_mode(name: str):
    """The peers.te_learner mode of a `te:<mode>` row, else None."""
    from minite_core.peers import te_learner

    mode = te_learner.learner_mode(name)
    return None if mode is None else te_learner.get_mode(mode)


def te_models(cfg: LearnerBenchConfig, model, log=print) -> tuple[dict, torch.optim.Optimizer | None, dict]:
    """({row: TE copy of model}, the TE rows' AdamW or None, {row: reason} of the rows TE cannot run here)."""
    from minite_core.peers import te_learner

    copies, skipped = {}, {}
    for name in cfg.profiles:
        mode = _te_mode(name)
        if mode is None:
            continue
        ok, why = te_learner.mode_available(mode)
        if not ok:
            skipped[name] = why
            log(f"skipping {name}: {why}")
            continue
        copies[name] = te_learner.build_te_model(model, mode, share_weights=True)
    if not copies:
        return copies, None, skipped
    first = next(iter(copies.values()))
    shared = dict(first.named_parameters())
    for te_model in copies.values():  # one Parameter set for all copies (expert views are new per copy)
        for mod_name, mod in te_model.named_modules():
            if isinstance(mod, te_learner.TELinear):
                mod.linear.register_parameter("weight", shared[f"{mod_name}.linear.weight"])
    fused = next(model.parameters()).is_cuda
    opt = torch.optim.AdamW(first.parameters(), lr=cfg.lr, weight_decay=0.0, **({"fused": True} if fused else {}))
    return copies, opt, skipped


def run(cfg: LearnerBenchConfig, device: torch.device, log=print) -> dict:
    """Run the bench; return the throughput/v1 payload (without writing it)."""
    for name in cfg.profiles:
        if _te_mode(name) is None:  # unknown names fail before any work
            get_profile(name)
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
            set_profile(model, name)
            _set_step_seed(model, r, cfg.seed)
            return lambda: learner_step(model, opt, input_ids, labels)

        round_robin(profiles, r, prepare, device, samples if timed else None, peaks)

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
        set_profile(model, name)
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
              "kernel_backend": _kernel_backend(), "optimizer": "AdamW(fused)" if cuda else "AdamW(foreach)",
              "model_flops_per_step": flops, "gemm_ceiling_tflops": ceiling,
              "gemm_ceiling": f"cuBLAS bf16 torch.mm {CEILING_SHAPE}^3, median of {CEILING_REPS}, same run",
              "loss": "next-token cross-entropy, token mean"}
    return {"schema": SCHEMA, "experiment": None, "config": config, "env": env_info(), "rows": rows,
            "skipped": [{"profile": name, "reason": why} for name, why in skipped.items()],
            "targets": _check_targets(by_name, cuda), "paper": PAPER, **({"op_profile": op_tables} if op_tables else {})}


def _op_profile(model, opt, input_ids, labels, name: str, log) -> dict:
    """One learner step of `name` under torch.profiler: its kernels (bench.op_profile; untimed)."""
    set_profile(model, name)
    with profiled(input_ids.device) as prof:
        learner_step(model, opt, input_ids, labels)
    table = kernel_table(prof)
    log(f"kernels, {name}: {summary(table, 12)}")
    return table


def _kernel_backend() -> str:
    try:
        from minite_core.kernels.dispatch import select_backend
    except ImportError as e:
        return f"unavailable ({e})"
    try:
        return select_backend()
    except RuntimeError as e:
        return f"unusable ({e})"


def _check_targets(by_name: dict, cuda: bool) -> dict:
    out = {**TARGETS, "applicable": cuda, "note": "targets are for the H200 run; CPU smoke only checks the code"}
    b = by_name.get("bf16")
    out["bf16_mfu"] = b.get("mfu") if b else None
    out["bf16_mfu_met"] = None if out["bf16_mfu"] is None else bool(out["bf16_mfu"] >= TARGETS["bf16_mfu_min"])
    m = by_name.get("minite")
    if m is None:
        return out
    out["minite_vs_bf16"] = m["speedup_vs_bf16"]
    out["minite_vs_te_nvfp4"] = m["speedup_vs_te_nvfp4"]
    out["minite_saved_act_ratio"] = m["saved_act_ratio_vs_bf16"]
    checks = [(m["speedup_vs_bf16"], lambda v: v >= TARGETS["minite_vs_bf16_min"]),
              (m["speedup_vs_te_nvfp4"], lambda v: v >= TARGETS["minite_vs_te_nvfp4_min"]),
              (m["saved_act_ratio_vs_bf16"], lambda v: v <= TARGETS["minite_saved_act_ratio_max"])]
    out["met"] = [None if v is None else bool(ok(v)) for v, ok in checks]
    return out


# ---- outputs ----------------------------------------------------------------------------------------------
CSV_METRICS = ("tokens_per_s", "mfu", "model_tflops_per_s", "p20_tokens_per_s", "p80_tokens_per_s", "step_ms", "step_ms_p20", "step_ms_p80",
               "peak_mem_gb", "saved_act_gb", "saved_act_decoder_gb", "saved_act_ratio_vs_bf16",
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
    ap.add_argument("--profiles", default=None, help="comma list, e.g. bf16,te-nvfp4,minite")
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

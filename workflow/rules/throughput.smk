# Stage: learner-update throughput — BF16 vs TE-NVFP4 vs miniTE, one process, profiles interleaved round-robin.
# GPU run: Qwen3-30B-A3B layer shapes (config "h200"), <= ~2 min of the H200 DAG's 10 (budget_s caps the timed
# rounds); CPU smoke: config "tiny", seconds. Ratios (x BF16, x TE-NVFP4, saved activations) come from this run.

_THROUGHPUT_FLAGS = {"batch": "--batch", "seq": "--seq", "layers": "--layers", "vocab": "--vocab",
                     "warmup": "--warmup", "iters": "--iters"}


def throughput_overrides():
    """Optional shape/repetition overrides of the named bench config, as CLI flags (absent/null = config's)."""
    node = config.get("throughput", {})
    return " ".join(f"{flag} {node[key]}" for key, flag in _THROUGHPUT_FLAGS.items() if node.get(key) is not None)


rule throughput:
    output:
        json=f"{RESULTS}/throughput/learner.json",
        csv=f"{RESULTS}/throughput/learner.csv",
        table=f"{RESULTS}/throughput/learner.md",
    log:
        f"{RESULTS}/logs/throughput.log",
    benchmark:
        f"{RESULTS}/benchmarks/throughput.tsv"
    params:
        config=cfg("throughput", "config"),
        profiles=",".join(cfg("throughput", "profiles")),
        budget_s=cfg("throughput", "budget_s"),
        overrides=throughput_overrides(),
        device=cfg("device"),
        seed=cfg("seed"),
    priority: 10  # first, while the GPU is still free of the other stages
    resources:
        gpu=cfg("gpu_slots"),  # the whole GPU: timings are not shared with other jobs
    shell:
        "minite bench learner --config {params.config} --profiles {params.profiles} --budget-s {params.budget_s} "
        "{params.overrides} --device {params.device} --seed {params.seed} --experiment {EXP} "
        "--out {output.json} --csv {output.csv} --markdown {output.table} > {log} 2>&1"


rule throughput_sampler:
    # Decode tokens/s of the fast sampler per profile x shape x batch, bf16 and the reference sampler in the same
    # run (minite_core/bench/sampler.py). CPU smoke: config "tiny", seconds; H200: config "h200".
    output:
        json=f"{RESULTS}/throughput/sampler.json",
        table=f"{RESULTS}/throughput/sampler.md",
    log:
        f"{RESULTS}/logs/throughput_sampler.log",
    benchmark:
        f"{RESULTS}/benchmarks/throughput_sampler.tsv"
    params:
        config=cfg("sampler_bench", "config"),
        profiles=",".join(cfg("sampler_bench", "profiles")),
        budget_s=cfg("sampler_bench", "budget_s"),
        device=cfg("device"),
        seed=cfg("seed"),
    priority: 10  # with the learner bench, while the GPU is still free of the other stages
    resources:
        gpu=cfg("gpu_slots"),  # the whole GPU: timings are not shared with other jobs
    shell:
        "minite bench sampler --config {params.config} --profiles {params.profiles} --budget-s {params.budget_s} "
        "--device {params.device} --seed {params.seed} --experiment {EXP} --out {output.json} "
        "--markdown {output.table} > {log} 2>&1"

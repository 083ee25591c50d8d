# Stage: learner-update throughput — BF16 vs TE-NVFP4 vs miniTE, one process, profiles interleaved round-robin.
# With gpus_per_job > 1 (throughput.gpus_per_job, else the top-level key): `torchrun --standalone --nproc-per-node N`, the scale-out learner (bench.learner_dist:
# per-GPU and total tokens/s, scaling efficiency against the plain learner timed in the same job).
# GPU run: Qwen3-30B-A3B layer shapes (config "h200"), <= ~2 min of the H200 DAG's 10 (budget_s caps the timed
# rounds); CPU smoke: config "tiny", seconds. Ratios (x BF16, x TE-NVFP4, saved activations) come from this run.
# With your model (config model.path) both benchmarks time its shape (its config.json; random weights): the learner
# at throughput.layers of them, the sampler at the RL batches.
import shlex

BENCH_MODEL = f"--model {shlex.quote(MODEL)}" if MODEL else ""
# the sampler bench's "model" shape (sampler_bench.shapes): your model, else the experiment's RL base model
SAMPLER_MODEL = MODEL or (BASE_MODEL if "model" in config.get("sampler_bench", {}).get("shapes", ()) else None)


rule throughput:
    input:
        kernels=rules.kernels_check.output.json,
        params=stamp(
            RESULTS,
            "throughput",
            launcher(config, "throughput"),
            RUN,
            section_json(config, "throughput"),
        ),
    output:
        json=f"{RESULTS}/throughput/learner.json",
        csv=f"{RESULTS}/throughput/learner.csv",
    log:
        f"{RESULTS}/logs/throughput.log",
    benchmark:
        f"{RESULTS}/benchmarks/throughput.tsv"
    priority: 10  # first, while the GPU is still free of the other stages
    conda:
        ENV
    resources:
        gpu=config["gpu_slots"],  # the whole GPU: timings are not shared with other jobs
        gres=slurm_gres(config, "throughput"),  # Slurm only (workflow/profiles/slurm): the job's GPUs, on one node
    params:
        launch=launcher(config, "throughput"),  # `minite`, or torchrun with gpus_per_job > 1 (bench.learner_dist)
        run=RUN,
        config=section_json(config, "throughput", drop=("gpus_per_job",)),
        model=BENCH_MODEL,
    shell:
        "{params.launch} bench learner --out {output.json} --csv {output.csv} {params.model} {params.run} "
        "--config-json {params.config:q} > {log} 2>&1"


rule throughput_sampler:
    # Decode tokens/s of the fast sampler per profile x shape x batch, bf16 and the reference sampler in the same
    # run (minite_core/bench/sampler.py). CPU smoke: config "tiny", seconds; H200: config "h200".
    input:
        kernels=rules.kernels_check.output.json,
        model=[SAMPLER_MODEL] if SAMPLER_MODEL and not MODEL else [],  # its config.json: the shape, random weights
        params=stamp(
            RESULTS,
            "throughput_sampler",
            RUN,
            section_json(config, "sampler_bench"),
        ),
    output:
        json=f"{RESULTS}/throughput/sampler.json",
    log:
        f"{RESULTS}/logs/throughput_sampler.log",
    benchmark:
        f"{RESULTS}/benchmarks/throughput_sampler.tsv"
    priority: 10  # with the learner bench, while the GPU is still free of the other stages
    conda:
        ENV
    resources:
        gpu=config["gpu_slots"],  # the whole GPU: timings are not shared with other jobs
    params:
        run=RUN,
        config=section_json(config, "sampler_bench"),
        model=f"--model {shlex.quote(SAMPLER_MODEL)}" if SAMPLER_MODEL else "",
    shell:
        "minite bench sampler --out {output.json} {params.model} {params.run} "
        "--config-json {params.config:q} > {log} 2>&1"

# Stage: long-horizon GRPO, one job per engine pair (minite_core.rl.train; `minite rl`), and the curves figure.
#
# Config `rl:` = RLConfig fields (minite_core/rl/train.py) + `runs`: a list of
#   {learner: <profile>, sampler: <profile>, correction: none|tis|mis-token|mis-seq (default none),
#    seed: <run seed> (default: the experiment's)}
# (or the string "learner:sampler[:correction]"). Run name = `{learner}__{sampler}__{correction}`, + `__s<seed>`
# for a seed other than the experiment's (seeds of one pair: the report's seed bands); outputs under
# {RESULTS}/rl/{run}/: metrics.csv (one row per step), summary.json (stage "rl"), final/ (transformers checkpoint
# for lm-eval). Resume state in {RESULTS}/rl/{run}/state/ (not an output: survives a killed job); a run of a
# changed config is kept under {RESULTS}/rl/{run}/previous/<time>/ (--restart-if-changed), never overwritten.
# gpus_per_job > 1 (rl.gpus_per_job, else the top-level key): `torchrun --standalone --nproc-per-node N -m minite_core.cli rl ...` (rl/distributed.py: every
# rank samples the step, the learner is FSDP2 + expert parallel, rank 0 writes), claiming the job's N GPUs.
import re

RL_RUNS = rl_runs(config)


rule rl:
    input:
        kernels=rules.kernels_check.output.json,
        checkpoint=BASE_MODEL,  # the DAG's pretrained model, or yours (model.path)
        train=rules.data.output.train,
        heldout=rules.data.output.heldout,
        # a run's learner, sampler, correction and seed are in its name (its output path): the rest is shared
        params=stamp(
            RESULTS,
            "rl",
            launcher(config, "rl"),
            run_options(config),
            section_json(config, "rl", drop=("runs",)),
        ),
    output:
        metrics=f"{RESULTS}/rl/{{run}}/metrics.csv",
        summary=f"{RESULTS}/rl/{{run}}/summary.json",
        final=directory(f"{RESULTS}/rl/{{run}}/final"),
    log:
        f"{RESULTS}/logs/rl/{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/rl/{{run}}.tsv"
    wildcard_constraints:
        run="|".join(re.escape(name) for name in RL_RUNS) or "(?!)",
    conda:
        ENV
    threads: 1  # see pretrain.smk: tiny CPU GEMMs do not scale; the 2 smoke cores run two pairs at once
    resources:
        gpu=learner_gpu_slots(config, "rl"),  # one slot; with gpus_per_job > 1 the node's GPUs (torchrun)
        gres=slurm_gres(config, "rl"),  # Slurm only (workflow/profiles/slurm): gpus_per_job GPUs on one node
    params:
        launch=launcher(config, "rl"),  # `minite`, or torchrun with gpus_per_job > 1 (rl/distributed.py)
        data=lambda wildcards, input: str(Path(input.train).parent),
        out=lambda wildcards, output: str(Path(output.summary).parent),
        learner=lambda wildcards: RL_RUNS[wildcards.run]["learner"],
        sampler=lambda wildcards: RL_RUNS[wildcards.run]["sampler"],
        correction=lambda wildcards: RL_RUNS[wildcards.run]["correction"],
        run=lambda wildcards: run_options(config, seed=RL_RUNS[wildcards.run]["seed"]),
        config=section_json(config, "rl", drop=("runs", "gpus_per_job")),
    shell:
        "{params.launch} rl --pretrained {input.checkpoint} --data {params.data} --out {params.out} --name {wildcards.run} "
        "--learner {params.learner} --sampler {params.sampler} --correction {params.correction} "
        "--threads {threads} --no-progress --restart-if-changed {params.run} --config-json {params.config:q} "
        "> {log} 2>&1"


rule rl_figures:
    input:
        summaries=expand(rules.rl.output.summary, run=RL_RUNS),
        metrics=expand(rules.rl.output.metrics, run=RL_RUNS),
    output:
        png=report(
            f"{RESULTS}/rl/curves.png",
            caption="../report/rl_curves.rst",
            category="RL",
        ),
    log:
        f"{RESULTS}/logs/rl/figures.log",
    conda:
        ENV
    params:
        runs=lambda wildcards, input: " ".join(
            str(Path(s).parent) for s in input.summaries
        ),
    shell:
        "python -m minite_core.rl.figures --runs {params.runs} --out {output.png} > {log} 2>&1"

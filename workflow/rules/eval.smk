# Stage: lm-eval of the RL runs' final checkpoints under execution profiles (fully offline: local JSONL tasks built
# at run time, the `minite` lm-eval model). One job per checkpoint x profile; the report collects them.
# Inputs: the `data` rule's held-out split (+ train split: the calibration set of static-scale profiles whose
# checkpoint carries no calibrated scales) and the `rl` rule's final checkpoints (transformers layout + tokenizer);
# the files of lm-eval's own tasks named in config eval.lm_eval (eval/local_tasks.py: gsm8k, minerva_math500, ...).
# Include after data.smk and rl.smk (uses rules.data, rules.rl and RL_RUNS).
# Outputs: {RESULTS}/eval/{run}.{profile}.json (run names contain "__" but no dot; profiles neither).
EVAL_RUNS = list(
    config["eval"]["runs"] or RL_RUNS
)  # empty = every run of the `rl` stage
EVAL_PROFILES = list(config["eval"]["profiles"])
LM_EVAL_FILES = [f for files in config["eval"]["lm_eval"].values() for f in files.values()]


rule eval_checkpoint:
    input:
        kernels=rules.kernels_check.output.json,
        checkpoint=rules.rl.output.final,
        heldout=rules.data.output.heldout,
        calib=rules.data.output.train,
        tokenizer=DATA_TOKENIZER,
        lm_eval=LM_EVAL_FILES,
        params=stamp(
            RESULTS, "eval", RUN, section_json(config, "eval", drop=("runs", "profiles"))
        ),
    output:
        json=f"{RESULTS}/eval/{{run}}.{{profile}}.json",
        samples=f"{RESULTS}/eval/samples/{{run}}.{{profile}}.jsonl",
    log:
        f"{RESULTS}/logs/eval/{{run}}.{{profile}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/eval/{{run}}.{{profile}}.tsv"
    wildcard_constraints:  # rule-level: other stages' {run} / {profile} wildcards are not constrained by these
        run="[A-Za-z0-9_-]+",
        profile="|".join(re.escape(p) for p in EVAL_PROFILES),
    conda:
        ENV
    resources:
        gpu=GPU,
    params:
        data_dir=lambda wildcards, input: str(Path(input.heldout).parent),
        run=RUN,
        config=section_json(config, "eval", drop=("runs", "profiles")),
    shell:
        "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 minite eval --checkpoint {input.checkpoint} "
        "--profile {wildcards.profile} --data-dir {params.data_dir} --calib {input.calib} --run {wildcards.run} "
        "--out {output.json} --samples {output.samples} {params.run} --config-json {params.config:q} > {log} 2>&1"


rule rl_eval:
    # A target, not a stage: every RL run, its curves and lm-eval of its final checkpoint — what a long GPU run
    # needs (workflow/scripts/h200_rl.sh start rl_eval) without the benchmarks and diagnostics of `all`.
    input:
        rules.rl_figures.output.png,
        expand(rules.eval_checkpoint.output.json, run=EVAL_RUNS, profile=EVAL_PROFILES),

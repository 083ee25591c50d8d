# Stage: SFT-pretrain the RL base model (Qwen3-MoE-shaped, from scratch) on the task to partial accuracy
# (minite_core.rl.pretrain; `minite pretrain`). Every RL run starts from this one checkpoint. Its config: the
# `pretrain:` section, or with `pretrain.size` that size of the scale sweep (experiment.py pretrain_section).
# Resume state lives in {RESULTS}/pretrain/state/, outside the outputs: Snakemake's cleanup of a failed or
# killed job leaves it, and the rerun continues from the last checkpoint; a run of a changed config is kept under
# {RESULTS}/pretrain/previous/<time>/ (--restart-if-changed).
# With your own model (config model.path) there is nothing to pretrain: BASE_MODEL is your checkpoint directory.
import json

PRETRAIN_CONFIG = json.dumps(pretrain_section(config))  # pretrain.size resolved

if MODEL:
    BASE_MODEL = MODEL
    PRETRAIN_JSON = []

else:

    rule pretrain:
        input:
            kernels=rules.kernels_check.output.json,
            train=rules.data.output.train,
            heldout=rules.data.output.heldout,
            tokenizer=DATA_TOKENIZER,
            params=stamp(RESULTS, "pretrain", RUN, PRETRAIN_CONFIG),
        output:
            checkpoint=directory(f"{RESULTS}/pretrain/model"),
            json=f"{RESULTS}/pretrain/pretrain.json",
            loss=f"{RESULTS}/pretrain/loss.csv",
        log:
            f"{RESULTS}/logs/pretrain.log",
        benchmark:
            f"{RESULTS}/benchmarks/pretrain.tsv"
        conda:
            ENV
        threads: 1  # tiny CPU GEMMs: a second OpenMP thread only spins (measured 20x slower on a loaded 2-core box)
        resources:
            gpu=GPU,
        params:
            data=lambda wildcards, input: str(Path(input.train).parent),
            out=lambda wildcards, output: str(Path(output.json).parent),
            run=RUN,
            config=PRETRAIN_CONFIG,
        shell:
            "minite pretrain --data {params.data} --out {params.out} --state {params.out}/state --threads {threads} "
            "--no-progress --restart-if-changed {params.run} --config-json {params.config:q} > {log} 2>&1"

    BASE_MODEL = rules.pretrain.output.checkpoint
    PRETRAIN_JSON = rules.pretrain.output.json

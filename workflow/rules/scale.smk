# Stage: NVFP4's cost against model size (minite_core/rl/scale.py; `minite scale`). Every size of `scale.sizes` is
# SFT'd by `minite pretrain` (the `pretrain:` recipe with the size's shape and settings over it: experiment.py
# pretrain_section), then its held-out greedy accuracy is measured under each of `scale.profiles`, with each
# profile's drop from bf16 and its paired SE. Two jobs a size, so a machine hold can take any subset of sizes
# (config `holds`); a killed SFT resumes from {RESULTS}/scale/{size}/state/ (not an output: Snakemake's cleanup of
# a failed job leaves it). The RL base model's size (`pretrain.size`) is SFT'd once, by the `pretrain` rule: its
# measurement reads that checkpoint, so the table's row and the RL runs rest on one model.
# Outputs: {RESULTS}/scale/{size}.json (results contract, stage "scale"); the report's table and figure read them.
# Include after pretrain.smk (uses rules.pretrain).
import json
import re

SCALE_SIZES = scale_sizes(config)
RL_SIZE = config["pretrain"]["size"]


rule scale_pretrain:
    input:
        kernels=rules.kernels_check.output.json,
        train=rules.data.output.train,
        heldout=rules.data.output.heldout,
        tokenizer=DATA_TOKENIZER,
        params=lambda wildcards: stamp(
            RESULTS, f"scale_pretrain.{wildcards.size}", RUN, pretrain_section(config, wildcards.size)
        ),
    output:
        checkpoint=directory(f"{RESULTS}/scale/{{size}}/model"),
        json=f"{RESULTS}/scale/{{size}}/pretrain.json",
        loss=f"{RESULTS}/scale/{{size}}/loss.csv",
    log:
        f"{RESULTS}/logs/scale/{{size}}-pretrain.log",
    benchmark:
        f"{RESULTS}/benchmarks/scale/{{size}}-pretrain.tsv"
    wildcard_constraints:  # the RL base model's size is the pretrain rule's
        size="|".join(re.escape(s) for s in SCALE_SIZES if s != RL_SIZE) or "(?!)",
    conda:
        ENV
    threads: 1  # see pretrain.smk
    resources:
        gpu=GPU,
    params:
        data=lambda wildcards, input: str(Path(input.train).parent),
        out=lambda wildcards, output: str(Path(output.json).parent),
        run=RUN,
        config=lambda wildcards: json.dumps(pretrain_section(config, wildcards.size)),
    shell:
        "minite pretrain --data {params.data} --out {params.out} --state {params.out}/state --threads {threads} "
        "--no-progress --restart-if-changed {params.run} --config-json {params.config:q} > {log} 2>&1"


rule scale_measure:
    input:
        kernels=rules.kernels_check.output.json,
        pretrain=lambda wildcards: f"{scale_run_dir(config, RESULTS, wildcards.size)}/pretrain.json",
        train=rules.data.output.train,
        heldout=rules.data.output.heldout,
        params=stamp(RESULTS, "scale_measure", RUN, section_json(config, "scale", drop=("sizes",))),
    output:
        json=f"{RESULTS}/scale/{{size}}.json",
    log:
        f"{RESULTS}/logs/scale/{{size}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/scale/{{size}}.tsv"
    wildcard_constraints:
        size="|".join(re.escape(s) for s in SCALE_SIZES) or "(?!)",
    conda:
        ENV
    threads: 1
    resources:
        gpu=GPU,
    params:
        checkpoint=lambda wildcards: f"{scale_run_dir(config, RESULTS, wildcards.size)}/model",
        data=lambda wildcards, input: str(Path(input.train).parent),
        run=RUN,
        config=section_json(config, "scale", drop=("sizes",)),
    shell:
        "minite scale --checkpoint {params.checkpoint} --data {params.data} --size {wildcards.size} "
        "--out {output.json} --threads {threads} --no-progress {params.run} --config-json {params.config:q} "
        "> {log} 2>&1"


rule scale:
    # A target, not a stage: every size of the sweep.
    input:
        expand(rules.scale_measure.output.json, size=SCALE_SIZES),

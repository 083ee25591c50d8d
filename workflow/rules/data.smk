# Stage: the RL task's data — train / held-out JSONL of the arithmetic task + the character-level tokenizer
# (minite_core.task.data; `minite data`). Deterministic in (config `data:`, `seed`).
# With your math data (config data.train / data.heldout, with model.path): the files imported into the same
# train / held-out JSONL (task/math_data.py reads verl's, GSM8K's and MATH's layouts); the model's tokenizer is used.
DATA_TOKENIZER = []  # the character tokenizer's directory (the DAG's own task only)

if DATA_FILES:

    rule data:
        input:
            train=DATA_FILES["train"],
            heldout=DATA_FILES["heldout"],
            params=stamp(RESULTS, "data", run_options(config, compute=False), section_json(config, "data")),
        output:
            train=f"{RESULTS}/data/train.jsonl",
            heldout=f"{RESULTS}/data/heldout.jsonl",
            json=f"{RESULTS}/data/data.json",
        log:
            f"{RESULTS}/logs/data.log",
        conda:
            ENV
        params:
            out=lambda wildcards, output: str(Path(output.json).parent),
            run=run_options(config, compute=False),
        shell:
            "minite data --train {input.train:q} --heldout {input.heldout:q} --out {params.out} {params.run} "
            "> {log} 2>&1"

else:

    rule data:
        input:
            params=stamp(
                RESULTS,
                "data",
                run_options(config, compute=False),
                section_json(config, "data", drop=("train", "heldout")),
            ),
        output:
            train=f"{RESULTS}/data/train.jsonl",
            heldout=f"{RESULTS}/data/heldout.jsonl",
            tokenizer=directory(f"{RESULTS}/data/tokenizer"),
            json=f"{RESULTS}/data/data.json",
        log:
            f"{RESULTS}/logs/data.log",
        conda:
            ENV
        params:
            out=lambda wildcards, output: str(Path(output.json).parent),
            run=run_options(config, compute=False),
            config=section_json(config, "data", drop=("train", "heldout")),
        shell:
            "minite data --out {params.out} {params.run} --config-json {params.config:q} > {log} 2>&1"

    DATA_TOKENIZER = rules.data.output.tokenizer

# Stage: the RL task's data — train / held-out JSONL of the arithmetic task + the character-level tokenizer
# (minite_core.task.data; `minite data`). Deterministic in (config `data:`, `seed`).


rule data:
    input:
        params=stamp(
            RESULTS,
            "data",
            run_options(config, compute=False),
            section_json(config, "data"),
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
        config=section_json(config, "data"),
    shell:
        "minite data --out {params.out} {params.run} --config-json {params.config:q} > {log} 2>&1"

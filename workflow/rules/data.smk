# Stage: the RL task's data — train / held-out JSONL of the arithmetic task + the character-level tokenizer
# (minite_core.task.data; `minite data`). Deterministic in (config `data:`, `seed`).
import json


rule data:
    output:
        train=f"{RESULTS}/data/train.jsonl",
        heldout=f"{RESULTS}/data/heldout.jsonl",
        tokenizer=directory(f"{RESULTS}/data/tokenizer"),
        json=f"{RESULTS}/data/data.json",
    log:
        f"{RESULTS}/logs/data.log",
    params:
        out=f"{RESULTS}/data",
        cfg=json.dumps(config.get("data", {})),
        seed=cfg("seed"),
    shell:
        "minite data --out {params.out} --seed {params.seed} --config-json {params.cfg:q} "
        "--experiment {EXP} > {log} 2>&1"

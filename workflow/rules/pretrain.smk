# Stage: SFT-pretrain the RL base model (Qwen3-MoE-shaped, from scratch) on the task to partial accuracy
# (minite_core.rl.pretrain; `minite pretrain`). Every RL run starts from this one checkpoint.
# Resume state lives in {RESULTS}/pretrain/state/, outside the outputs: Snakemake's cleanup of a failed or
# killed job leaves it, and the rerun continues from the last checkpoint.
import json


rule pretrain:
    input:
        train=rules.data.output.train,
        heldout=rules.data.output.heldout,
        tokenizer=rules.data.output.tokenizer,
    output:
        checkpoint=directory(f"{RESULTS}/pretrain/model"),
        json=f"{RESULTS}/pretrain/pretrain.json",
        loss=f"{RESULTS}/pretrain/loss.csv",
    log:
        f"{RESULTS}/logs/pretrain.log",
    benchmark:
        f"{RESULTS}/benchmarks/pretrain.tsv"
    threads: 1  # tiny CPU GEMMs: a second OpenMP thread only spins (measured 20x slower on a loaded 2-core box)
    resources:
        gpu=1 if config.get("device", "cpu") == "cuda" else 0,
    params:
        data=f"{RESULTS}/data",
        out=f"{RESULTS}/pretrain",
        state=f"{RESULTS}/pretrain/state",
        cfg=json.dumps(config.get("pretrain", {})),
        seed=cfg("seed"),
        device=config.get("device", "cpu"),
    shell:
        KERNELS_ENV + "minite pretrain --data {params.data} --out {params.out} --state {params.state} "
        "--seed {params.seed} --device {params.device} --config-json {params.cfg:q} --threads {threads} "
        "--experiment {EXP} > {log} 2>&1"

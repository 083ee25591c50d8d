# Stage: lm-eval of the RL runs' final checkpoints under execution profiles (fully offline: local JSONL tasks built
# at run time, the `minite` lm-eval model). One job per checkpoint x profile; `eval_table` collects them.
# Inputs: the `data` rule's held-out split (+ train split: the calibration set of static-scale profiles whose
# checkpoint carries no calibrated scales) and the `rl` rule's final checkpoints (transformers layout + tokenizer).
# Include after data.smk and rl.smk (uses rules.data, rules.rl and RL_RUNS).
# Outputs: {RESULTS}/eval/{run}.{profile}.json (run names contain "__" but no dot; profiles neither).
import json
import re
from pathlib import Path

from minite_core.profiles import get_profile


def eval_cfg(key, default=None):
    return config.get("eval", {}).get(key, default)


def eval_runs():
    """RL runs to evaluate: config `eval.runs` (run names), else every run of the `rl` stage."""
    return list(eval_cfg("runs") or RL_RUNS)


def eval_profiles():
    return list(eval_cfg("profiles", ["bf16", "minite"]))


def eval_calib_flag(wildcards, input):
    """Static-scale profiles (vllm-nvfp4) use the checkpoint's calibrated scales when it has them (an RL run whose
    sampler was vllm-nvfp4 saves the scales it sampled with), else calibrate on the train split."""
    if get_profile(wildcards.profile).needs_calibration:
        return f"--calib {input.calib} --calib-n {eval_cfg('calib_n', 32)}"
    return ""


def eval_limit_flag():
    limit = eval_cfg("limit")
    return f"--limit {limit}" if limit is not None else ""


def eval_profile_regex():
    """Only the configured profile names (a run name is never mistaken for a profile)."""
    return "|".join(re.escape(p) for p in eval_profiles())


rule eval_checkpoint:
    input:
        checkpoint=rules.rl.output.final,
        heldout=rules.data.output.heldout,
        calib=rules.data.output.train,
        tokenizer=rules.data.output.tokenizer,
    output:
        json=f"{RESULTS}/eval/{{run}}.{{profile}}.json",
        samples=f"{RESULTS}/eval/samples/{{run}}.{{profile}}.jsonl",
    log:
        f"{RESULTS}/logs/eval/{{run}}.{{profile}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/eval/{{run}}.{{profile}}.tsv"
    wildcard_constraints:  # rule-level: other stages' {run} / {profile} wildcards are not constrained by these
        run="[A-Za-z0-9_-]+",
        profile=eval_profile_regex(),
    params:
        data_dir=lambda wildcards, input: str(Path(input.heldout).parent),
        tasks=",".join(eval_cfg("tasks", ["heldout_gen", "heldout_mc", "heldout_ppl"])),
        limit=eval_limit_flag(),
        calib=eval_calib_flag,
        dtype=eval_cfg("dtype", "auto"),
        batch_size=eval_cfg("batch_size", 16),
        spec=json.dumps(eval_cfg("spec", {})),
        device=cfg("device"),
    resources:
        gpu=1,
    shell:
        KERNELS_ENV + "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "
        "minite eval --checkpoint {input.checkpoint} --profile {wildcards.profile} --data-dir {params.data_dir} "
        "--tasks {params.tasks} {params.limit} {params.calib} --dtype {params.dtype} "
        "--batch-size {params.batch_size} --device {params.device} --spec-json '{params.spec}' "
        "--experiment {EXP} --run {wildcards.run} --out {output.json} --samples {output.samples} > {log} 2>&1"


rule eval_table:
    input:
        results=expand(rules.eval_checkpoint.output.json, run=eval_runs(), profile=eval_profiles()),
    output:
        table=f"{RESULTS}/eval/table.md",
    log:
        f"{RESULTS}/logs/eval/table.log",
    shell:
        "minite eval table --out {output.table} {input.results} > {log} 2>&1"

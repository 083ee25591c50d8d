# Shared by the rules: how each of them passes its config to its command, the same way everywhere:
#   params: run=RUN (--experiment --seed --device --kernels), config=<the stage's config section as JSON>
#   shell:  minite <command> <inputs/outputs> {params.run} --config-json {params.config:q} > {log} 2>&1
# (minite_core/rule_args.py builds both; minite_core/runs/cli.py reads them.)
# Each rule's inputs include its params stamp, `params=stamp(RESULTS, <name>, <values>)`, the file
# results/<exp>/params/<name>.json rewritten only when the values change; so a changed parameter or input path
# reruns that step and what it feeds by modification time, provenance records or not (rule_args.py, `stamp`).
from pathlib import Path

from snakemake.exceptions import WorkflowError

from minite_core.experiment import (
    data_files,
    external_args,
    external_pairs,
    kernel_check_config,
    pretrain_section,
    rl_runs,
    scale_run_dir,
    scale_sizes,
    your_model,
)
from minite_core.rule_args import (
    gpu_slots,
    input_path,
    launcher,
    learner_gpu_slots,
    report_extras,
    run_options,
    section_json,
    slurm_gres,
    stamp,
)

ENV = "../../environment.yml"  # every rule runs in the project's one environment (conda is optional)
RUN = run_options(config)
GPU = gpu_slots(
    config
)  # one slot of the shared GPU per small job on CUDA (`--resources gpu=<gpu_slots>`)
MODEL = your_model(config)  # your Hugging Face checkpoint (model.path), or None: the DAG makes its own
DATA_FILES = data_files(config)  # your math data (data.train / data.heldout), or {}: the arithmetic task


def hold_inputs(hold, items):
    """The files a machine hold makes (config `holds`, holds.smk): called after every stage's rules exist."""
    files = []
    for item in items:
        kind, _, name = item.partition(":")
        if kind == "rl" and name:
            files += expand(rules.rl.output, run=name)
            if name in EVAL_RUNS:
                files += expand(rules.eval_checkpoint.output.json, run=name, profile=EVAL_PROFILES)
        elif kind == "scale" and name:
            files += expand(rules.scale_measure.output.json, size=name)
        else:
            try:
                named = getattr(rules, item)
            except WorkflowError:
                raise SystemExit(f"invalid experiment config:\nconfig: holds.{hold}: {item!r} is neither rl:<run>, "
                                 "scale:<size> nor a rule of the DAG") from None
            rule_files = list(named.output) or list(named.input)
            if any("{" in str(f) for f in rule_files):
                raise SystemExit(f"invalid experiment config:\nconfig: holds.{hold}: {item!r} has wildcards (one job "
                                 "a run or size): name its jobs rl:<run> or scale:<size>")
            files += rule_files
    return files


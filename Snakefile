# miniTE reproduction DAG. Default experiment: the CPU smoke run (experiments/smoke.yaml);
# on one H200: `snakemake --cores 16 --resources gpu=4 --configfile experiments/h200.yaml`.
from snakemake.utils import min_version, validate

from minite_core import experiment
from minite_core.runs import workflow as tie

min_version("9.0")

# A SIGKILLed snakemake leaves no orphan job (they watch this pid) and no stale lock or incomplete marker for the
# next run to trip on (minite_core/runs/workflow.py); only the main process clears (not a cluster job's snakemake).
tie.export_pid()
if workflow.exec_mode.name == "DEFAULT":
    tie.take_over(".snakemake")


# The CPU smoke experiment, unless --configfile names another (loading it always would merge its keys into
# every other experiment's config).
if not workflow.overwrite_configfiles:

    configfile: "experiments/smoke.yaml"


# Config errors are found here, at parse time (`snakemake -n`), one line each naming the key path:
# the schema first, then its defaults filled in, then the semantic checks (minite_core/experiment.py).
experiment.check_schema(config, "workflow/schemas/config.schema.yaml")
validate(config, "workflow/schemas/config.schema.yaml")
experiment.check_semantics(config)

EXP = config["experiment"]
RESULTS = f"results/{EXP}"


include: "workflow/rules/common.smk"
include: "workflow/rules/kernels.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/pretrain.smk"
include: "workflow/rules/throughput.smk"  # after pretrain: the sampler bench may time the RL base model
include: "workflow/rules/scale.smk"
include: "workflow/rules/rl.smk"
include: "workflow/rules/diagnostics.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/peers.smk"
include: "workflow/rules/holds.smk"


rule all:
    default_target: True
    input:
        rules.report.output,

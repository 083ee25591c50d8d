# miniTE reproduction DAG. Default experiment: the CPU smoke run (experiments/smoke.yaml);
# on one H200: `snakemake --cores 16 --resources gpu=4 --configfile experiments/h200.yaml`.
from snakemake.utils import min_version, validate

min_version("9.0")


if not workflow.overwrite_configfiles:  # the CPU smoke experiment, unless --configfile names another
    # (loading it always would merge its keys into every other experiment's config)

    configfile: "experiments/smoke.yaml"


validate(config, "workflow/schemas/config.schema.yaml")

EXP = config["experiment"]
RESULTS = f"results/{EXP}"


include: "workflow/rules/common.smk"
include: "workflow/rules/kernels.smk"
include: "workflow/rules/throughput.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/pretrain.smk"
include: "workflow/rules/rl.smk"
include: "workflow/rules/diagnostics.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/peers.smk"


rule all:
    input:
        rules.report.output,
    default_target: True

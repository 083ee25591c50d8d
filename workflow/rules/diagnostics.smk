# Stage: execution diagnostics — learner<->sampler mismatch of every profile pair on one checkpoint,
# first-divergence trace, one-knob attribution (minite_core.diagnostics; `minite diagnose`).
#
# Config `diagnostics:` (workflow/schemas/config.schema.yaml documents every key): the keys that name inputs
# (checkpoint, prompts, calib: paths, null = the base model (the DAG's or yours) / held-out split / train split) become
# rule inputs; the others go to the command as --config-json, each the default of its flag.
DIAGNOSTICS_INPUTS = ("checkpoint", "prompts", "calib")


rule diagnostics:
    input:
        kernels=rules.kernels_check.output.json,
        checkpoint=input_path(config, "diagnostics", "checkpoint", BASE_MODEL),
        prompts=input_path(config, "diagnostics", "prompts", rules.data.output.heldout),
        calib=input_path(config, "diagnostics", "calib", rules.data.output.train),
        params=stamp(RESULTS, "diagnostics", RUN, section_json(config, "diagnostics")),  # input paths included
    output:
        json=f"{RESULTS}/diagnostics/mismatch.json",
        figures=report(
            directory(f"{RESULTS}/diagnostics/figures"),
            patterns=["{name}.png"],
            caption="../report/diagnostics.rst",
            category="Diagnostics",
        ),
    log:
        f"{RESULTS}/logs/diagnostics.log",
    benchmark:
        f"{RESULTS}/benchmarks/diagnostics.tsv"
    conda:
        ENV
    resources:
        gpu=GPU,
    params:
        run=RUN,
        config=section_json(config, "diagnostics", drop=DIAGNOSTICS_INPUTS + ("external",)),
    shell:
        "minite diagnose --checkpoint {input.checkpoint} --prompts {input.prompts} --calib {input.calib} "
        "--out {output.json} --figures {output.figures} {params.run} --config-json {params.config:q} > {log} 2>&1"


# Other engines' logged rollouts (`diagnostics.external`: a file / directory in any layout of docs/rollouts.md, or an
# RL run's own rollouts/ dump), measured without a model; the report shows them beside the pairs above.
EXTERNAL = external_pairs(config)


rule diagnostics_external:
    input:
        logs=[e["input"] for e in EXTERNAL],
    output:
        json=f"{RESULTS}/diagnostics/external.json",
        md=f"{RESULTS}/diagnostics/external.md",
        figures=report(
            directory(f"{RESULTS}/diagnostics/external_figures"),
            patterns=["{name}.png"],
            caption="../report/diagnostics_external.rst",
            category="Diagnostics",
        ),
    log:
        f"{RESULTS}/logs/diagnostics_external.log",
    conda:
        ENV
    params:
        rollouts=external_args(config),
        experiment=config["experiment"],
    shell:
        "minite diagnose {params.rollouts} --out {output.json} --report {output.md} --figures {output.figures} "
        "--experiment {params.experiment} > {log} 2>&1"

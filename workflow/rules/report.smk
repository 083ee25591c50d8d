# Stage: the report — tables and figures from results/<exp>/ (reads only the results contract).


rule report:
    input:
        kernels=rules.kernels_check.output.json,
        quant_error=rules.quant_error.output.json,
        throughput=rules.throughput.output.json,
        throughput_sampler=rules.throughput_sampler.output.json,
        pretrain=PRETRAIN_JSON,
        diagnostics=rules.diagnostics.output.json,
        external=rules.diagnostics_external.output.json if EXTERNAL else [],
        rl_figures=rules.rl_figures.output.png,
        eval=expand(
            rules.eval_checkpoint.output.json, run=EVAL_RUNS, profile=EVAL_PROFILES
        ),
        peers=report_extras(RESULTS),  # committed peer measurements it also reads
        scale=rules.scale.input,
    output:
        report=report(
            f"{RESULTS}/report.md", caption="../report/report.rst", category="Report"
        ),
        # the NVFP4-cost-against-size figure, drawn by the report from every size's results (none without sizes)
        scale_figure=[
            report(
                f"{RESULTS}/scale/drop_vs_params.png",
                caption="../report/scale.rst",
                category="Scale",
            )
        ]
        if SCALE_SIZES
        else [],
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        ENV
    params:
        results=lambda wildcards, output: str(Path(output.report).parent),
    shell:
        "minite report --results {params.results} --out {output.report} > {log} 2>&1"

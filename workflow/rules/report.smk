# Stage: the report — tables and figures from results/<exp>/ (reads only the results contract).


rule report:
    input:
        quant_error=rules.quant_error.output.json,
        throughput=rules.throughput.output.json,
        throughput_sampler=rules.throughput_sampler.output.json,
        pretrain=rules.pretrain.output.json,
        diagnostics=rules.diagnostics.output.json,
        rl_figures=rules.rl_figures.output.png,
        eval_table=rules.eval_table.output.table,
    output:
        report=report(f"{RESULTS}/report.md", caption="../report/report.rst", category="Report"),
    log:
        f"{RESULTS}/logs/report.log",
    shell:
        "minite report --results {RESULTS} --out {output.report} > {log} 2>&1"

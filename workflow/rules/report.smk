# Stage: the report — tables and figures from results/<exp>/ (reads only the results contract).


rule report:
    input:
        quant_error=rules.quant_error.output.json,
    output:
        report=f"{RESULTS}/report.md",
    log:
        f"{RESULTS}/logs/report.log",
    shell:
        "minite report --results {RESULTS} --out {output.report} > {log} 2>&1"

# Stage: NVFP4 numerics — quantization error of every quantizer variant.


rule quant_error:
    output:
        json=f"{RESULTS}/quant_error/sqnr.json",
        table=f"{RESULTS}/quant_error/sqnr.md",
    log:
        f"{RESULTS}/logs/quant_error.log",
    params:
        rows=cfg("quant_error", "rows"),
        cols=cfg("quant_error", "cols"),
        seed=cfg("seed"),
    shell:
        "minite quant-error --rows {params.rows} --cols {params.cols} --seed {params.seed} "
        "--experiment {EXP} --out {output.json} --markdown {output.table} > {log} 2>&1"

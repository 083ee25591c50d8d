# Stage: NVFP4 numerics — quantization error of every quantizer variant (`minite quant-error`).


rule quant_error:
    output:
        json=f"{RESULTS}/quant_error/sqnr.json",
    log:
        f"{RESULTS}/logs/quant_error.log",
    conda:
        ENV
    params:
        run=RUN,
        config=section_json(config, "quant_error"),
    shell:
        "minite quant-error --out {output.json} {params.run} --config-json {params.config:q} > {log} 2>&1"

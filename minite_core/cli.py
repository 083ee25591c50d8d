"""`minite <command> ...`: one subcommand per stage. Each command lives in its own module with a
`main(argv)`; this file only maps names to modules, so importing the CLI imports nothing heavy. Errors print
`minite <command>: error: <one line>`; `--debug` (or MINITE_DEBUG=1) shows the traceback (runs/cli.py)."""
from __future__ import annotations

import os
import sys

COMMANDS = {
    "kernels": ("minite_core.bench.kernel_check", "compile and check every W4A4 kernel the experiment uses"),
    "quant-error": ("minite_core.bench.quant_error", "SQNR of every NVFP4 quantizer variant"),
    "bench": ("minite_core.bench.cli", "benchmarks: `bench kernels`, `bench learner`, `bench sampler`"),
    "diagnose": ("minite_core.diagnostics.cli", "learner<->sampler mismatch, first divergence, attribution"),
    "data": ("minite_core.task.data", "make the task's train/held-out JSONL and the tokenizer"),
    "pretrain": ("minite_core.rl.pretrain", "SFT-pretrain the base model on the task"),
    "rl": ("minite_core.rl.train", "GRPO run for one (learner, sampler, correction) pair"),
    "scale": ("minite_core.rl.scale", "held-out accuracy of one base model under each profile: NVFP4's cost"),
    "sweep": ("minite_core.sweep", "a short grid of GRPO runs (and base models) that picks the RL settings"),
    "eval": ("minite_core.eval.cli", "lm-eval on a checkpoint under an execution profile"),
    "export": ("minite_core.peers.export", "NVFP4 checkpoint export (compressed-tensors layout)"),
    "report": ("minite_core.report.build", "tables and figures from results/<exp>/"),
    "doctor": ("minite_core.doctor", "what this machine can run: packages, GPU, kernel backend, profiles"),
}


def main(argv: list[str] | None = None) -> int:
    from minite_core.runs.cli import debug_enabled, dispatch
    from minite_core.runs.workflow import stop_with_workflow

    stop_with_workflow()  # a job of a Snakemake workflow stops with it (runs/workflow.py)
    debug, argv = debug_enabled(sys.argv[1:] if argv is None else list(argv))
    if debug:
        os.environ["MINITE_DEBUG"] = "1"
    return dispatch(argv, COMMANDS, "minite")


if __name__ == "__main__":
    sys.exit(main())

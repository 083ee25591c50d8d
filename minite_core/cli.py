"""`minite <command> ...`: one subcommand per stage. Each command lives in its own module with a
`main(argv)`; this file only maps names to modules, so importing the CLI imports nothing heavy."""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "quant-error": ("minite_core.bench.quant_error", "SQNR of every NVFP4 quantizer variant"),
    "bench": ("minite_core.bench.cli", "benchmarks: `bench kernels`, `bench learner`"),
    "diagnose": ("minite_core.diagnostics.cli", "learner<->sampler mismatch, first divergence, attribution"),
    "data": ("minite_core.rl.data", "make the task's train/held-out JSONL and the tokenizer"),
    "pretrain": ("minite_core.rl.pretrain", "SFT-pretrain the base model on the task"),
    "rl": ("minite_core.rl.train", "GRPO run for one (learner, sampler, correction) pair"),
    "eval": ("minite_core.eval.cli", "lm-eval on a checkpoint under an execution profile"),
    "export": ("minite_core.engines.export", "NVFP4 checkpoint export (compressed-tensors layout)"),
    "report": ("minite_core.report.build", "tables and figures from results/<exp>/"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        width = max(map(len, COMMANDS))
        lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
        print("usage: minite <command> [args...]\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"minite: unknown command {name!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())

"""`minite <command> ...`: one subcommand per stage. Each command lives in its own module with a
`main(argv)`; this file only maps names to modules, so importing the CLI imports nothing heavy."""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "quant-error": ("minite_core.bench.quant_error", "SQNR of every NVFP4 quantizer variant"),
    "bench": ("minite_core.bench.cli", "benchmarks: `bench kernels`, `bench learner`, `bench sampler`"),
    "diagnose": ("minite_core.diagnostics.cli", "learner<->sampler mismatch, first divergence, attribution"),
    "data": ("minite_core.rl.data", "make the task's train/held-out JSONL and the tokenizer"),
    "pretrain": ("minite_core.rl.pretrain", "SFT-pretrain the base model on the task"),
    "rl": ("minite_core.rl.train", "GRPO run for one (learner, sampler, correction) pair"),
    "eval": ("minite_core.eval.cli", "lm-eval on a checkpoint under an execution profile"),
    "export": ("minite_core.engines.export", "NVFP4 checkpoint export (compressed-tensors layout)"),
    "report": ("minite_core.report.build", "tables and figures from results/<exp>/"),
}


def dispatch(argv: list[str], commands: dict[str, tuple[str, str]], prog: str, noun: str = "command") -> int:
    """Run `commands[argv[0]]`'s module `main(argv[1:])`; help / unknown names print the list."""
    if not argv or argv[0] in ("-h", "--help"):
        width = max(map(len, commands))
        lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in commands.items()]
        print(f"usage: {prog} <{noun}> [args...]\n\n{noun}s:\n" + "\n".join(lines))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(f"{prog}: unknown {noun} {name!r}; choose one of {', '.join(commands)}", file=sys.stderr)
        return 2
    return importlib.import_module(commands[name][0]).main(rest) or 0


def main(argv: list[str] | None = None) -> int:
    return dispatch(sys.argv[1:] if argv is None else argv, COMMANDS, "minite")


if __name__ == "__main__":
    sys.exit(main())

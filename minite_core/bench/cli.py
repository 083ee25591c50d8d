"""`minite bench <kernels|learner> ...`: maps each benchmark to its module's `main(argv)`; imports lazily so
`minite bench learner` does not load the Triton kernels' benchmark (and vice versa)."""
from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "kernels": ("minite_core.bench.kernels", "kernel micro-benchmarks vs their baselines (GPU)"),
    "learner": ("minite_core.bench.learner", "learner-update tokens/s: bf16 vs te-nvfp4 vs minite, one process"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        lines = [f"  {name:<8}  {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
        print("usage: minite bench <benchmark> [args...]\n\nbenchmarks:\n" + "\n".join(lines))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"minite bench: unknown benchmark {name!r}; choose one of {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    return importlib.import_module(SUBCOMMANDS[name][0]).main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())

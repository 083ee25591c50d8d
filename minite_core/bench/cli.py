"""`minite bench <kernels|learner|sampler|full-model> ...`: maps each benchmark to its module's `main(argv)`; imports lazily so
`minite bench learner` does not load the Triton kernels' benchmark (and vice versa)."""
from __future__ import annotations

import sys

from minite_core.runs.cli import dispatch

SUBCOMMANDS = {
    "kernels": ("minite_core.bench.kernels", "kernel micro-benchmarks vs their baselines (GPU)"),
    "learner": ("minite_core.bench.learner", "learner-update tokens/s: bf16 vs te-nvfp4 vs minite, one process"),
    "sampler": ("minite_core.bench.sampler", "decode tokens/s per profile x shape x batch, bf16 in the same run"),
    "full-model": ("minite_core.bench.full_model", "a full-shape model (random weights on the device): decode per "
                   "profile, memory, diagnostics"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch(sys.argv[1:] if argv is None else argv, SUBCOMMANDS, "minite bench", noun="benchmark")


if __name__ == "__main__":
    sys.exit(main())

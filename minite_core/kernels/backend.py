"""The kernel backend of the process: "reference" (plain torch, `formats`), "triton" (Hopper and newer: fused Triton
quantizers + exact bf16-tensor-core W4A4 GEMMs), "native" (sm_100+: Triton quantizer + torch._scaled_mm on
float4_e2m1fn_x2). kernels.dispatch is the API over it; every entry point takes an optional `backend=`.

Selection, first match wins: the `backend=` argument, the process's backend (`set_backend`: a command's resolved
execution sets it once, runs.execution), then automatic (native on sm_100+, triton on other CUDA GPUs, reference
on CPU). A backend that cannot run raises with the reason — never a silent fallback (STYLE.md). "triton" also runs
on CPU tensors under TRITON_INTERPRET=1 (tests, the smoke kernel check).
"""
from __future__ import annotations

import functools
import os
from contextlib import contextmanager

import torch

BACKENDS = ("reference", "triton", "native")
_RUN_BACKEND: str | None = None  # set_backend; None = automatic


def interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"

def backend_available(name: str) -> tuple[bool, str]:
    if name == "reference":
        return True, ""
    if name == "triton":
        if not torch.cuda.is_available() and not interpret():
            return False, "backend 'triton' needs a CUDA GPU (none visible) or TRITON_INTERPRET=1 (CPU, tests)"
        try:
            import triton  # noqa: F401
        except ImportError as e:
            return False, f"backend 'triton' needs triton ({e}); install the test extra or use 'reference'"
        return True, ""
    if name == "native":
        from minite_core.kernels.native import native_available

        return native_available()
    return False, f"unknown kernel backend {name!r}; choose one of {list(BACKENDS)}"

def set_backend(name: str | None) -> None:
    """The process's kernel backend (a command's execution sets it, runs.execution; None or "auto" = automatic).
    Checked now, so a bad choice fails before any work."""
    global _RUN_BACKEND
    name = None if name == "auto" else name
    if name is not None:
        ok, reason = backend_available(name)
        if not ok:
            raise ValueError(f"kernel backend {name!r} is not usable here: {reason}")
    _RUN_BACKEND = name

@contextmanager
def using_backend(name: str | None):
    """`set_backend(name)` for a block; the run's backend is restored afterwards (a stage run in-process, e.g. the
    kernels check, must not switch the backend of whatever runs next in the same process)."""
    before = _RUN_BACKEND
    set_backend(name)
    try:
        yield
    finally:
        set_backend(before)

def current_backend() -> str:
    """The backend a call without `backend=` uses now (what results record in their `env`)."""
    return select_backend()

def select_backend(backend: str | None = None) -> str:
    """Argument > the process's backend (set_backend) > auto (native on sm_100+, triton on CUDA, reference on
    CPU)."""
    name = backend or _RUN_BACKEND
    if name is None:
        return auto_backend()
    ok, reason = _checked(name, interpret())
    if not ok:
        raise RuntimeError(f"kernel backend {name!r} is not usable here: {reason}")
    return name

# Both answers are asked once per process: every kernel call selects a backend (~100 times a layer in a learner
# step), and asking the CUDA driver each time cost ~15 us a call (cProfile on the H200)
@functools.cache
def auto_backend() -> str:
    """The automatic backend: native on sm_100+, triton on other CUDA GPUs, reference without a GPU."""
    if not torch.cuda.is_available():
        return "reference"
    return "native" if torch.cuda.get_device_capability()[0] >= 10 else "triton"

@functools.cache
def _checked(name: str, interpret: bool) -> tuple[bool, str]:
    return backend_available(name)  # keyed on TRITON_INTERPRET too: tests switch it

def fast_path(x: torch.Tensor, backend: str | None = None) -> bool:
    """True when `x` goes through the Triton kernels (a GPU backend on CUDA, or triton under the interpreter)."""
    name = select_backend(backend)
    return name != "reference" and (x.is_cuda or interpret())

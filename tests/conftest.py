"""Test-session setup. Without a GPU, Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET must be set
before anything imports triton (minite_core.kernels does, through the nn layers), so it is set here, first."""
import os

import pytest
import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="module")
def one_thread():
    """Tiny GEMMs: OpenMP threads only spin against each other (on a loaded 2-core box 2 threads ran 20x slower
    than 1). Restored afterwards so other test modules keep their setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _restore_kernel_backend():
    """A test that runs a CLI in-process (`--kernels ...`) sets the process's kernel backend; the next test gets the
    backend the session started with (a leaked `triton` ran later CPU tests in the interpreter, ~100x slower)."""
    from minite_core.kernels import backend

    before = backend._RUN_BACKEND
    yield
    backend._RUN_BACKEND = before

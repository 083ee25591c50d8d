"""Test-session setup. Without a GPU, Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET must be set
before anything imports triton (minite_core.kernels does, through the nn layers), so it is set here, first."""
import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

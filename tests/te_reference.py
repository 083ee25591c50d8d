"""Load Transformer Engine 2.20.2's pure-torch NVFP4 reference quantizer on CPU, without TE's C++ extension.

`transformer_engine/pytorch/custom_recipes/reference_nvfp4.py` (NVFP4QuantizerRef) is plain torch, but it imports
two TE modules that pull in the CUDA extension: `transformer_engine.pytorch.quantized_tensor` (for the base classes
`Quantizer` / `QuantizedTensorStorage`) and `custom_recipes.gemm` (for the `GEMMType` / `MMParams` names used in
`qgemm`'s signature). `load()` executes the real reference file (and the real `reference_utils.py`) from the files
workflow/scripts/te_fetch.sh extracted into .te/src/, with those two imports answered by minimal stand-ins
(the base `Quantizer.__init__` only records rowwise/columnwise usage — TE's does the same, quantized_tensor.py).
`sys.modules` is touched only inside `load()` and restored before it returns. The quantize arithmetic that the
tests compare is TE's own code, unchanged; only `qgemm` (not used here) depends on the stand-ins.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib.util
import os
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REF_DIR = Path(os.environ.get("MINITE_TE_SRC", REPO / ".te" / "src")) / "transformer_engine/pytorch/custom_recipes"


class _Quantizer:  # stand-in for transformer_engine.pytorch.quantized_tensor.Quantizer
    def __init__(self, *, rowwise: bool, columnwise: bool) -> None:
        self.rowwise_usage, self.columnwise_usage, self.internal = rowwise, columnwise, False


class _Storage:  # stand-in for QuantizedTensorStorage (a base class; NVFP4TensorRef is a dataclass over it)
    pass


class _GEMMType(enum.Enum):
    FPROP = "fprop"
    DGRAD = "dgrad"
    WGRAD = "wgrad"


@dataclasses.dataclass(frozen=True)
class _MMParams:
    out_dtype: object = None
    use_split_accumulator: bool = True


def available() -> tuple[bool, str]:
    path = REF_DIR / "reference_nvfp4.py"
    if not path.is_file():
        return False, (f"TE's reference quantizer is not on this machine ({path}); run workflow/scripts/te_fetch.sh "
                       "(or set MINITE_TE_SRC to a folder holding transformer_engine/pytorch/custom_recipes/)")
    return True, str(path)


def _exec(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load() -> types.ModuleType:
    """TE's reference_nvfp4 module (NVFP4QuantizerRef, cast_to_fp4x2, ...), executed from .te/src/."""
    ok, reason = available()
    if not ok:
        raise FileNotFoundError(reason)
    pkg = "transformer_engine.pytorch.custom_recipes"
    stubs = {
        "transformer_engine": types.ModuleType("transformer_engine"),
        "transformer_engine.pytorch": types.ModuleType("transformer_engine.pytorch"),
        pkg: types.ModuleType(pkg),
        "transformer_engine.pytorch.quantized_tensor": types.ModuleType("transformer_engine.pytorch.quantized_tensor"),
        f"{pkg}.gemm": types.ModuleType(f"{pkg}.gemm"),
    }
    stubs["transformer_engine.pytorch.quantized_tensor"].Quantizer = _Quantizer
    stubs["transformer_engine.pytorch.quantized_tensor"].QuantizedTensorStorage = _Storage
    stubs[f"{pkg}.gemm"].GEMMType, stubs[f"{pkg}.gemm"].MMParams = _GEMMType, _MMParams
    names = list(stubs) + [f"{pkg}.reference_utils", f"{pkg}.reference_nvfp4"]
    saved = {n: sys.modules[n] for n in names if n in sys.modules}
    try:
        sys.modules.update(stubs)
        stubs[pkg].gemm = stubs[f"{pkg}.gemm"]
        stubs[pkg].reference_utils = _exec(f"{pkg}.reference_utils", REF_DIR / "reference_utils.py")
        return _exec(f"{pkg}.reference_nvfp4", REF_DIR / "reference_nvfp4.py")
    finally:
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved)


def te_reference_gemms(ref, mode, x, w, dy) -> dict:
    """fprop, dgrad, wgrad (fp32 of TE's bf16 outputs) as custom_gemm (custom_recipes/gemm.py) calls
    NVFP4QuantizerRef.qgemm for one te.Linear under `mode` (peers.te_learner.TEMode): `ref` = load()'s module."""
    import torch

    from minite_core.peers.te_learner import nvfp4_ref_factory

    qf = nvfp4_ref_factory(mode, ref_module=ref)
    qi, qw, qg = (qf(types.SimpleNamespace(module_type="linear", tensor_type=t, name=""))
                  for t in ("input", "weight", "grad_output"))
    X, W, DY = qi.quantize(x), qw.quantize(w), qg.quantize(dy)
    G, bf16 = ref.gemm.GEMMType, torch.bfloat16
    fprop = qi.qgemm(X.data, W.data, None, bf16, X.scale, W.scale, gemm_type=G.FPROP, qresult_x=X, qresult_w=W)
    dgrad = qg.qgemm(DY.data, W.data_t, None, bf16, DY.scale, W.scale_t, gemm_type=G.DGRAD, qresult_x=DY,
                     qresult_w=W)
    wgrad = qg.qgemm(DY.data_t, X.data_t, None, bf16, DY.scale_t, X.scale_t, gemm_type=G.WGRAD, qresult_x=DY,
                     qresult_w=X)
    return {"fprop": fprop.float(), "dgrad": dgrad.float(), "wgrad": wgrad.float()}


def quantlinear_gemms(profile, x, w, dy) -> dict:
    """fprop, dgrad, wgrad (fp32) of our QuantLinear(weight w) under `profile` on the reference kernels."""
    import torch

    from minite_core.kernels.dispatch import using_backend
    from minite_core.nn import QuantLinear

    lin = QuantLinear(w.shape[1], w.shape[0])
    with torch.no_grad():
        lin.weight.copy_(w)
    lin.profile = profile
    x_in = x.clone().requires_grad_(True)
    with using_backend("reference"):
        y = lin(x_in)
        y.backward(dy)
    return {"fprop": y.detach().float(), "dgrad": x_in.grad.float(), "wgrad": lin.weight.grad.float()}

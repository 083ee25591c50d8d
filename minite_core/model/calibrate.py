"""Static activation scales: record per-GEMM input amax the way a calibrated NVFP4 checkpoint stores
`input_global_scale` (compressed-tensors / ModelOpt run the high-precision model over calibration data and keep
the max |x| seen at each Linear's input; vLLM then quantizes activations with that fixed scale).

`calibrate` runs the model with every GEMM in high precision (bf16 numerics in the model's compute dtype),
stores `input_amax` on each QuantLinear / GroupedLinear (role "linear"), and restores the profiles it found.
Data above the calibrated amax saturates at run time — part of the execution gap this project measures.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from minite_core.nn.experts import GroupedLinear
from minite_core.nn.linear import QuantLinear
from minite_core.profiles import PROFILES


def _gemm_modules(model):
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, GroupedLinear) or (isinstance(m, QuantLinear) and m.role == "linear")]


@torch.no_grad()
def calibrate(model: torch.nn.Module, batches: Iterable) -> dict[str, float]:
    """batches: input_ids tensors [B, T] or dicts of model kwargs (input_ids, attention_mask, ...).
    Returns {module name: amax}; also sets `module.input_amax` (fp32 scalar buffer)."""
    modules = _gemm_modules(model)
    if not modules:
        raise ValueError("calibrate: the model has no QuantLinear / GroupedLinear layers")
    amax: dict[str, torch.Tensor] = {}
    saved = {name: m.profile for name, m in modules}
    hp = PROFILES["bf16"].replace(dtype=getattr(model, "profile", PROFILES["bf16"]).dtype)

    def hook(name):
        def record(module, args):
            a = args[0].detach().abs().amax().float()
            amax[name] = torch.maximum(amax[name], a) if name in amax else a
        return record

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in modules]
    n_batches = 0
    try:
        for name, m in modules:
            m.profile = hp
        for batch in batches:
            model(**batch) if isinstance(batch, dict) else model(batch)
            n_batches += 1
    finally:
        for h in handles:
            h.remove()
        for name, m in modules:
            m.profile = saved[name]
    if n_batches == 0:
        raise ValueError("calibrate: got no calibration batches")
    for name, m in modules:
        m.input_amax = amax[name].clone() if name in amax else torch.zeros((), device=m.weight.device)
    return {name: float(v) for name, v in amax.items()}

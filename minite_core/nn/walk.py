"""The one walker over a model's profile-driven GEMMs (QuantLinear, GroupedLinear), in `named_modules()` order.

Everything that visits "every GEMM" goes through it: SR seeds per module index (engines.learner), calibration and
its completeness check (model.calibrate, eval, diagnostics), the NVFP4 export (model.nvfp4_io).
"""
from __future__ import annotations

import torch

from minite_core.nn.experts import GroupedLinear
from minite_core.nn.linear import QuantLinear
from minite_core.seeds import module_seed


def gemm_modules(model: torch.nn.Module, *, linear_only: bool = False) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every QuantLinear / GroupedLinear. linear_only: only the GEMMs that NVFP4 quantizes and
    calibrates (role "linear" and the expert GEMMs), i.e. not the router and the LM head."""
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, GroupedLinear)
            or (isinstance(m, QuantLinear) and (not linear_only or m.role == "linear"))]


def is_calibrated(model: torch.nn.Module) -> bool:
    """Every calibratable GEMM carries a static activation amax (`input_amax`)."""
    mods = gemm_modules(model, linear_only=True)
    return bool(mods) and all(m.input_amax is not None for _, m in mods)


def set_sr_seeds(model: torch.nn.Module, seed: int, step: int) -> None:
    """Stochastic-rounding seeds of one optimizer step: GEMM j (walker order) gets seeds.module_seed(seed, step, j)."""
    for j, (_, module) in enumerate(gemm_modules(model)):
        module.seed = module_seed(seed, step, j)

"""Minimal Qwen3-MoE / dense Qwen3 causal LM, interchangeable with transformers (config.json + safetensors),
whose GEMMs run the numerics of the profile put on it (`use_profile` for a block, model/profile_scope.py). Names resolve lazily (PEP 562): importing model.config
(the DAG's config checks do) does not load the model code. Calibration: `minite_core.model.calibrate.calibrate`
(not re-exported: a lazy name would clash with the submodule of the same name)."""
from __future__ import annotations

import importlib

_EXPORTS = {"PRESETS": "config", "ModelConfig": "config", "CausalLM": "qwen3_moe", "set_profile": "profile_scope",
            "use_profile": "profile_scope", "KVCache": "kv_cache", "load_pretrained": "io", "save_pretrained": "io"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"minite_core.model.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'minite_core.model' has no attribute {name!r}")

"""Minimal Qwen3-MoE / dense Qwen3 causal LM, interchangeable with transformers (config.json + safetensors),
whose GEMMs run the numerics of the profile set on it."""
from minite_core.model.calibrate import calibrate
from minite_core.model.config import PRESETS, ModelConfig
from minite_core.model.io import load_pretrained, save_pretrained
from minite_core.model.kv_cache import KVCache
from minite_core.model.qwen3_moe import CausalLM, set_profile

__all__ = ["PRESETS", "ModelConfig", "CausalLM", "KVCache", "set_profile", "load_pretrained", "save_pretrained",
           "calibrate"]

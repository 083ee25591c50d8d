"""Profile-driven GEMM layers: every Linear and expert GEMM of the model runs the numerics of the profile
set on it (`set_profile`)."""
from minite_core.nn.linear import QuantLinear
from minite_core.nn.experts import GroupedLinear

__all__ = ["QuantLinear", "GroupedLinear"]

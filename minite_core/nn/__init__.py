"""Profile-driven GEMM layers: every Linear and expert GEMM of the model runs the numerics of the profile
set on it (`minite_core.model.set_profile`); `calibrate` records static activation scales."""
from minite_core.nn.calibrate import calibrate
from minite_core.nn.experts import GroupedLinear, grouped_linear  # noqa: F401
from minite_core.nn.linear import QuantLinear, clear_weight_caches, linear, track_optimizer

__all__ = ["QuantLinear", "GroupedLinear", "linear", "grouped_linear", "calibrate", "clear_weight_caches",
           "track_optimizer"]

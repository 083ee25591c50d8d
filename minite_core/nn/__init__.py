"""Profile-driven GEMM layers: every Linear and expert GEMM of the model runs the numerics of the profile
put on it (`minite_core.model.use_profile`); `minite_core.model.calibrate` records static activation scales."""
from minite_core.nn.experts import GroupedLinear, grouped_linear  # noqa: F401
from minite_core.nn.linear import QuantLinear, linear
from minite_core.nn.operands import clear_weight_caches, track_optimizer
from minite_core.nn.walk import gemm_modules, is_calibrated

__all__ = ["QuantLinear", "GroupedLinear", "linear", "grouped_linear", "clear_weight_caches", "gemm_modules", "is_calibrated",
           "track_optimizer"]

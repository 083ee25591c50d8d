"""QuantLinear (STUB: high-precision path only; the profile-driven autograd function replaces it)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minite_core.profiles import PROFILES, Profile


class QuantLinear(nn.Module):
    """y = x @ W^T under `self.profile`. role: "linear" | "router" | "lm_head" (precision knobs)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, role: str = "linear"):
        super().__init__()
        self.in_features, self.out_features, self.role = in_features, out_features, role
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.profile: Profile = PROFILES["bf16"]
        self.register_buffer("input_amax", None)  # static activation amax from calibrate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

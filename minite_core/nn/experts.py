"""GroupedLinear (STUB: high-precision loop; the profile-driven grouped GEMM replaces it)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minite_core.profiles import PROFILES, Profile


class GroupedLinear(nn.Module):
    """Per-expert y_e = x_e @ W_e^T for tokens already sorted by expert. weight: [E, N, K]."""

    def __init__(self, num_experts: int, in_features: int, out_features: int):
        super().__init__()
        self.num_experts, self.in_features, self.out_features = num_experts, in_features, out_features
        self.weight = nn.Parameter(torch.empty(num_experts, out_features, in_features))
        self.profile: Profile = PROFILES["bf16"]
        self.register_buffer("input_amax", None)  # [E] static activation amax from calibrate()

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        # x: (T_sorted, K) grouped by expert in order; counts: (E,) tokens per expert
        outs = [F.linear(xe, self.weight[e].to(x.dtype)) for e, xe in enumerate(x.split(counts.tolist()))]
        return torch.cat(outs) if outs else x.new_empty(0, self.out_features)

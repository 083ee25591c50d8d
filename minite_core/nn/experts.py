"""GroupedLinear: the MoE expert GEMM (tokens sorted by expert) under an execution profile.

Each expert's slice is one `nn.linear.linear` call, so an expert GEMM has exactly the numerics of a dense
QuantLinear on its tokens: per-tensor dynamic activation scales are per expert (as TE's grouped GEMM, one
quantizer per split), per-token scales are per token, and a static scale (calibrated) is one amax for the
whole grouped GEMM. Stochastic-rounding seeds differ per expert. The loop is the reference; GPU backends
could replace it with one grouped kernel (`kernels.dispatch.grouped_gemm`, benchmarked but not yet wired here).
"""
from __future__ import annotations

import torch
from torch import nn

from minite_core.nn.linear import linear, torch_dtype
from minite_core.profiles import PROFILES, Profile
from minite_core.seeds import expert_seed


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor, profile: Profile, *,
                   input_amax: torch.Tensor | None = None, seed: int = 0, cache: dict | None = None) -> torch.Tensor:
    """x: (T_sorted, K) grouped by expert in order; weight: (E, N, K); counts: (E,) -> (T_sorted, N)."""
    outs = []
    for e, x_e in enumerate(x.split(counts.tolist())):  # .tolist(): one host sync per grouped GEMM
        if x_e.shape[0]:
            outs.append(linear(x_e, weight[e], profile, input_amax=input_amax, seed=expert_seed(seed, e),
                               cache=cache, key=e))
    if not outs:
        return x.new_empty(0, weight.shape[1], dtype=torch_dtype(profile.dtype))
    return torch.cat(outs)


class GroupedLinear(nn.Module):
    """Per-expert y_e = x_e @ W_eᵀ for tokens already sorted by expert. weight: [E, N, K]."""

    def __init__(self, num_experts: int, in_features: int, out_features: int):
        super().__init__()
        self.num_experts, self.in_features, self.out_features = num_experts, in_features, out_features
        self.weight = nn.Parameter(torch.empty(num_experts, out_features, in_features))
        self.profile: Profile = PROFILES["bf16"]
        self.seed = 0  # stochastic-rounding seed, set per step by the learner
        self.register_buffer("input_amax", None)  # static activation amax (one per grouped GEMM) from calibrate()
        self.weight_cache: dict = {}  # quantized expert weights (key: expert index), see nn.linear._weight_operand

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return grouped_linear(x, self.weight, counts, self.profile, input_amax=self.input_amax, seed=self.seed,
                              cache=self.weight_cache)

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, in={self.in_features}, out={self.out_features}, profile={self.profile.name}"

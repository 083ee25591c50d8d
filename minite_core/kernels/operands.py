"""GEMM operands as the Hopper kernels consume them — plain torch, no Triton, so the CPU path imports nothing
heavy.

A quantized operand reaches the exact Hopper GEMM as `DqOperand` = (values_bf16 = e2m1(q)·sf, global_scale =
S_dec): e2m1 × e4m3 has at most 6 significant bits and lies in [2^-10, 2688], so e2m1(q)·sf is exactly a bf16,
and a bf16 tensor-core GEMM with fp32 accumulation computes Σ_k (q_a sf_a)(q_b sf_b) up to accumulation order; the
global scales are applied once in the epilogue. Activations get the bf16 copy for free from the fused quantizer
(`quantize_triton(..., emit_dq=True)`); weights are dequantized once per optimizer step and cached.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minite_core.formats import nvfp4 as ref


@dataclass
class DqOperand:
    """values_bf16 = e2m1(q)*sf [R, K] (or [E, R, K]); global_scale = fp32 S_dec, [] / [E] per tensor or
    [R, 1] / [E, R, 1] per row."""

    values_bf16: torch.Tensor
    global_scale: torch.Tensor


def dq_operand(t: ref.NVFP4Tensor) -> DqOperand:
    """Dequantize once (e.g. weights per optimizer step): exact bf16 e2m1(q)*sf plus S_dec."""
    return DqOperand(ref.dequantize_unscaled(t).to(torch.bfloat16), t.global_scale)


@dataclass
class PackedExperts:
    """MoE expert weights as NVFP4 codes for the packed-weight grouped GEMM (kernels/decode.py): data uint8
    [E, N, K/2], scale float8_e4m3fn [E, N, K/16], s_dec fp32 S_dec [E] (one per expert) or [E, N] (per row)."""

    data: torch.Tensor
    scale: torch.Tensor
    s_dec: torch.Tensor

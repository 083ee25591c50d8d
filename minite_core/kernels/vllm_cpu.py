"""vLLM's CPU NVFP4 W4A4 GEMM arithmetic, in plain torch (the `w4a4_gemm="vllm-cpu"` profile knob).

What: y = x̂ ŵᵀ exactly as vLLM 0.32's `EmulationNvFp4LinearKernel` (`run_nvfp4_emulations`) computes it on
CPU, from our quantized operands. The codes and block scales are the same as our `fast` static quantizer's (the
kernel check in `peers.vllm_compare` proves it bit for bit); the arithmetic after them differs from an NVFP4
tensor core (our reference GEMM: fp32 operands, fp32 accumulation, global scales in the epilogue) in three
roundings:

  activation  x̂ = e2m1(q) · fl(sf / S_enc)      the global scale is folded into the block scale by a division
                                                  by the *encode* scale (vLLM's input_global_scale), then
  weight      ŵ = e2m1(q) · fl(sf · S_dec)       (S_dec = fl(1 / weight_global_scale), a multiplication)
              both rounded to the compute dtype (bf16: 8 significant bits, so sf/S_enc loses bits),
  matmul      x̂ @ ŵᵀ in the compute dtype (torch.matmul on bf16 operands: fp32 accumulation, one rounding).

Blackwell-dependent: on sm_100 vLLM runs CUTLASS / FlashInfer FP4 GEMMs (fp32 accumulation, alpha = the
product of the global scales in the epilogue), i.e. our reference arithmetic; this knob describes the CPU peer
only and does not carry into the GPU `vllm-nvfp4` profile.

Shape legend: M = tokens, K = in features, N = out features.
"""
from __future__ import annotations

import torch

from minite_core.formats.e2m1 import e2m1_decode, unpack_fp4
from minite_core.formats.nvfp4 import BLOCK, NVFP4Tensor


def _values(t: NVFP4Tensor) -> torch.Tensor:
    """e2m1(q) as fp32 [M, K/16, 16] (exact)."""
    M, K = t.shape
    return e2m1_decode(unpack_fp4(t.data)).view(M, K // BLOCK, BLOCK)


def dequantize_folded(t: NVFP4Tensor, dtype: torch.dtype, *, encode_scale: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """x̂ [M, K] in `dtype` with the global scale folded into each block scale before one rounding to `dtype`:
    fl(sf / S_enc) when `encode_scale` (S_enc, fp32 []) is given (vLLM's activation path), else fl(sf · S_dec)
    with the tensor's own per-tensor S_dec (vLLM's weight path)."""
    if not isinstance(t, NVFP4Tensor):
        raise TypeError(f"vllm-cpu GEMM takes NVFP4Tensor operands (packed codes), got {type(t).__name__}")
    if t.global_scale.numel() != 1:
        raise ValueError(f"vllm-cpu GEMM needs a per-tensor global scale, got shape {tuple(t.global_scale.shape)}")
    M, K = t.shape
    sf = t.scale.float()  # (M, K/16)
    if encode_scale is not None:
        folded = sf / encode_scale.float().reshape(())
    else:
        folded = sf * t.global_scale.float().reshape(())
    return (_values(t) * folded.unsqueeze(-1)).reshape(M, K).to(dtype)


def gemm(x_q: NVFP4Tensor, x_encode_scale: torch.Tensor, w_q: NVFP4Tensor, dtype: torch.dtype) -> torch.Tensor:
    """y (M, N) in `dtype` = vLLM CPU W4A4 GEMM of x_q (M, K) with static activation encode scale S_enc (fp32 [],
    the checkpoint's input_global_scale) and w_q (N, K) with per-tensor S_dec."""
    x_dq = dequantize_folded(x_q, dtype, encode_scale=x_encode_scale)  # (M, K)
    w_dq = dequantize_folded(w_q, dtype)  # (N, K)
    return torch.matmul(x_dq, w_dq.t())

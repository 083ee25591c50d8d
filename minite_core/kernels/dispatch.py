"""Kernel dispatch: one API over three backends — "reference" (plain torch, `formats`), "triton" (Hopper and
newer: fused Triton quantizers + exact bf16-tensor-core W4A4 GEMMs, dense and grouped), "native" (sm_100+:
Triton quantizer + torch._scaled_mm on float4_e2m1fn_x2). Everything above kernels/ (nn/, model/, engines/)
reaches a kernel through this module, which picks the reference or the Triton path per call.

The API, by family (each family in a file of its own; Triton is imported only when a Triton backend is chosen,
so the CPU reference path imports none):
- the backend (kernels/backend.py): `set_backend` / `using_backend` (a command's execution sets it once,
  runs.execution), `select_backend`, `fast_path`; selection rules there;
- quantizers and operand forms (kernels/quantize_ops.py): `quantize`, `quantize_dq` (with the GEMM-ready
  `DqOperand`), `quantize_cols` (along tokens), `quantize_rows_cols`, `decode_scale`, `dequantize_bf16`, `as_dq`,
  `row_amax`, `col_block_amax`, `split3`;
- GEMMs (kernels/gemm_ops.py): `gemm`, `grouped_gemm`, `gemm_quant` / `grouped_gemm_quant` (the A operand
  quantized in the GEMM's prologue, `fused_quant_spec`), `kgrouped_gemm` / `kgrouped_gemm_quant` (wgrad's dyᵀ
  quantized along tokens in its prologue), `grouped_schedule`, the packed-weight
  `decode_gemm` / `grouped_decode_gemm` / `grouped_decode_schedule`, `prepare_weight`, `gemm_w4a16`, and the peer
  arithmetics `gemm_te_reference`, `gemm_vllm_cpu`;
- the model's other ops (kernels/model_ops.py): `attention`, `rms_norm`, `rms_norm_fused`, `rms_norm_nograd`,
  `rms_norm_tail`, `rope`, `silu_mul`, `swiglu`, `moe_layout`, `moe_permute`, `moe_combine`, `uniform_rows`.
Results equal across backends: codes and scales bitwise, GEMM outputs up to fp32 accumulation order.
"""
from __future__ import annotations

from minite_core.kernels.backend import (BACKENDS, auto_backend, backend_available, current_backend, fast_path,
                                         select_backend, set_backend, using_backend)
from minite_core.kernels.gemm_ops import (decode_gemm, fused_quant_spec, gemm, gemm_quant, gemm_te_reference,
                                          gemm_vllm_cpu, gemm_w4a16, grouped_decode_gemm, grouped_decode_schedule,
                                          grouped_gemm, grouped_gemm_quant, grouped_schedule, kgrouped_gemm,
                                          kgrouped_gemm_quant, prepare_weight)
from minite_core.kernels.model_ops import (attention, moe_combine, moe_layout, moe_permute, rms_norm, rms_norm_fused,
                                           rms_norm_nograd, rms_norm_tail, rope, silu_mul, swiglu, uniform_rows)
from minite_core.kernels.operands import DqOperand, PackedExperts
from minite_core.kernels.quantize_ops import (as_dq, col_block_amax, decode_scale, dequantize_bf16, quantize,
                                              quantize_cols, quantize_dq, quantize_rows_cols, row_amax,
                                              rows_cols_spec, split3)

__all__ = [
    "BACKENDS", "auto_backend", "backend_available", "current_backend", "fast_path", "select_backend", "set_backend",
    "using_backend",
    "DqOperand", "PackedExperts",
    "as_dq", "col_block_amax", "decode_scale", "dequantize_bf16", "quantize", "quantize_cols", "quantize_dq",
    "quantize_rows_cols", "row_amax", "rows_cols_spec", "split3",
    "decode_gemm", "fused_quant_spec", "gemm", "gemm_quant", "gemm_te_reference", "gemm_vllm_cpu", "gemm_w4a16",
    "grouped_decode_gemm", "grouped_decode_schedule", "grouped_gemm", "grouped_gemm_quant", "grouped_schedule",
    "kgrouped_gemm", "kgrouped_gemm_quant", "prepare_weight",
    "attention", "moe_combine", "moe_layout", "moe_permute", "rms_norm", "rms_norm_fused", "rms_norm_nograd",
    "rms_norm_tail", "rope",
    "silu_mul", "swiglu", "uniform_rows",
]

"""Kernel dispatch: one API over three backends — "reference" (plain torch, `formats`), "triton" (Hopper and
newer: fused Triton quantizer + exact bf16-tensor-core W4A4 GEMM), "native" (sm_100+: Triton quantizer +
torch._scaled_mm on float4_e2m1fn_x2).

Selection, first match wins: the `backend=` argument, env MINITE_KERNELS, then automatic (native on sm_100+,
triton on other CUDA GPUs, reference on CPU). A backend that cannot run raises with the reason — never a silent
fallback (STYLE.md).

Operands: `quantize` returns the reference's `NVFP4Tensor`; `quantize_dq` also returns the GEMM-ready
`DqOperand` (bf16 e2m1(q)*sf + S_dec) the Hopper GEMM consumes, emitted by the same kernel for free. `gemm` /
`grouped_gemm` take either form (NVFP4Tensor operands are dequantized on the fly — cache a `DqOperand` for
weights, once per optimizer step). Results: a_hat @ b_hat^T, equal across backends up to fp32 accumulation
order.

HOPPER_GEMM picks the Hopper GEMM implementation, from the H200 measurement in results/h200/bench/.
"""
from __future__ import annotations

import os

import torch

from minite_core.formats import nvfp4 as ref
from minite_core.kernels import gemm as _gemm
from minite_core.kernels.gemm import DqOperand
from minite_core.profiles import Quant

BACKENDS = ("reference", "triton", "native")
ENV_VAR = "MINITE_KERNELS"
# Dense Hopper GEMM: cuBLAS fp32-out + scale kernel measured 0.832 ms vs Triton fused 0.956 ms (best swept tile
# 0.876) at 16384x4096x4096 on the H200 (results/h200/bench). Grouped: Triton always (the only exact one).
HOPPER_GEMM = "cublas"  # "cublas" | "triton"


def backend_available(name: str) -> tuple[bool, str]:
    if name == "reference":
        return True, ""
    if name == "triton":
        if not torch.cuda.is_available():
            return False, "backend 'triton' needs a CUDA GPU (none visible; TRITON_INTERPRET=1 is for tests)"
        try:
            import triton  # noqa: F401
        except ImportError as e:
            return False, f"backend 'triton' needs triton: {e}"
        return True, ""
    if name == "native":
        from minite_core.kernels.native import native_available

        return native_available()
    return False, f"unknown kernel backend {name!r}; one of {list(BACKENDS)}"


def select_backend(backend: str | None = None) -> str:
    """Argument > env MINITE_KERNELS > auto (native on sm_100+, triton on CUDA, reference on CPU)."""
    name = backend or os.environ.get(ENV_VAR) or None
    if name is None:
        if not torch.cuda.is_available():
            return "reference"
        return "native" if torch.cuda.get_device_capability()[0] >= 10 else "triton"
    ok, reason = backend_available(name)
    if not ok:
        raise RuntimeError(f"kernel backend {name!r} is not usable here: {reason}")
    return name


def _quant_kwargs(quant: Quant | None, kwargs: dict) -> dict:
    q = dict(block=(1, 16), scale_mode="tensor", math="exact", rounding="rne", four_over_six="off")
    if quant is not None:
        q.update(block=tuple(quant.block), scale_mode=quant.scale_mode, math=quant.math, rounding=quant.rounding,
                 four_over_six=quant.four_over_six)
    q.update(kwargs)
    return q


def _quantize_impl(x, quant, amax, seed, rht, emit_dq, backend, check, kwargs):
    q = _quant_kwargs(quant, kwargs)
    if quant is not None and quant.static and amax is None:
        raise ValueError("Quant.static=True needs the calibrated amax (amax=...)")
    name = select_backend(backend)
    if name == "reference" or not x.is_cuda:
        if name != "reference":
            raise RuntimeError(f"backend {name!r} needs a CUDA tensor, got one on {x.device}")
        from minite_core.kernels.quantize import quantize_reference

        return quantize_reference(x, amax=amax, seed=seed, rht=rht, emit_dq=emit_dq, check=check, **q)
    from minite_core.kernels.quantize import quantize_triton

    return quantize_triton(x, amax=amax, seed=seed, rht=rht, emit_dq=emit_dq, check=check, **q)


def quantize(x: torch.Tensor, quant: Quant | None = None, amax=None, seed: int | None = None, rht: bool = False,
             *, backend: str | None = None, check: bool = True, **kwargs) -> ref.NVFP4Tensor:
    """x [M, K] -> NVFP4Tensor under `quant` (a profiles.Quant) or keyword overrides (block=, scale_mode=,
    math=, rounding=). amax: static scale; seed: Philox/Generator seed for rounding="sr"; rht: RHT along K."""
    t, _ = _quantize_impl(x, quant, amax, seed, rht, False, backend, check, kwargs)
    return t


def quantize_dq(x: torch.Tensor, quant: Quant | None = None, amax=None, seed: int | None = None, rht: bool = False,
                *, backend: str | None = None, check: bool = True, **kwargs) -> tuple[ref.NVFP4Tensor, DqOperand]:
    """`quantize` plus the GEMM-ready DqOperand (bf16 e2m1(q)*sf, S_dec) from the same pass."""
    t, dq = _quantize_impl(x, quant, amax, seed, rht, True, backend, check, kwargs)
    return t, DqOperand(dq, t.global_scale)


def as_dq(op) -> DqOperand:
    return op if isinstance(op, DqOperand) else _gemm.dq_operand(op)


def _dequant_fp32(op) -> torch.Tensor:
    if isinstance(op, DqOperand):
        gs = op.global_scale.float()
        if op.values_bf16.ndim == 3 and gs.ndim == 1:  # [E] per-expert tensor scales
            gs = gs.view(-1, 1, 1)
        return op.values_bf16.float() * gs
    return ref.dequantize(op)


def gemm(a, b, out_dtype=torch.bfloat16, *, backend: str | None = None) -> torch.Tensor:
    """y [M, N] = a_hat @ b_hat^T; a, b: NVFP4Tensor or DqOperand ([M, K], [N, K])."""
    name = select_backend(backend)
    if name == "reference":
        return (_dequant_fp32(a) @ _dequant_fp32(b).t()).to(out_dtype)
    if name == "native":
        from minite_core.kernels.native import gemm_native

        if isinstance(a, DqOperand) or isinstance(b, DqOperand):
            raise TypeError("backend 'native' takes NVFP4Tensor operands (packed codes), not DqOperand")
        return gemm_native(a, b, out_dtype)
    a, b = as_dq(a), as_dq(b)
    impl = _gemm.gemm_cublas if HOPPER_GEMM == "cublas" else _gemm.gemm_triton
    return impl(a, b, out_dtype)


def dq_experts(weights: list[ref.NVFP4Tensor]) -> DqOperand:
    """Per-expert NVFP4 weights [N, K] -> one DqOperand [E, N, K] with S_dec [E] or [E, N, 1] (cache it)."""
    ops = [_gemm.dq_operand(w) for w in weights]
    return DqOperand(torch.stack([o.values_bf16 for o in ops]), torch.stack([o.global_scale for o in ops]))


def grouped_gemm(a, b_experts, counts: torch.Tensor, out_dtype=torch.bfloat16, *, backend: str | None = None):
    """MoE expert GEMM: rows of a [T, K] sorted by expert, counts [E]; b_experts: list of E NVFP4Tensor [N, K]
    or a DqOperand [E, N, K]. Returns [T, N] with row t = a_hat[t] @ b_hat[expert(t)]^T."""
    name = select_backend(backend)
    if name == "native":
        raise NotImplementedError("grouped native NVFP4 GEMM is not wired (no torch grouped fp4 op); use 'triton'")
    b = b_experts if isinstance(b_experts, DqOperand) else dq_experts(list(b_experts))
    if name == "reference":
        x, w = _dequant_fp32(a), _dequant_fp32(b)
        outs, start = [], 0
        for e, cnt in enumerate(counts.tolist()):
            outs.append(x[start:start + cnt] @ w[e].t())
            start += cnt
        return torch.cat(outs, 0).to(out_dtype)
    return _gemm.grouped_gemm_triton(as_dq(a), b, counts, out_dtype)  # exact; _grouped_mm has no fp32 out


def decode_gemm(x: torch.Tensor, w: ref.NVFP4Tensor, act: Quant | None = None, amax=None,
                out_dtype=torch.bfloat16, *, backend: str | None = None) -> torch.Tensor:
    """Decode-time y [M<=16, N] = x @ W_hat^T from packed weights. act=None: W4A16 (x bf16 as is);
    act=Quant: W4A4 (x quantized first with that quantizer, amax for a static scale)."""
    name = select_backend(backend)
    if act is not None:
        t, dq = quantize_dq(x, act, amax=amax, backend=name if name != "native" else "triton", check=False)
        x_in, x_scale = dq.values_bf16, dq.global_scale
    else:
        x_in, x_scale = x.to(torch.bfloat16), None
    if name == "reference" or not x.is_cuda:
        from minite_core.kernels.decode import decode_gemm_reference

        return decode_gemm_reference(x_in, w, x_scale=x_scale, out_dtype=out_dtype)
    from minite_core.kernels.decode import decode_gemm_triton

    return decode_gemm_triton(x_in, w, x_scale=x_scale, out_dtype=out_dtype)


def prepare_weight(t: ref.NVFP4Tensor, *, backend: str | None = None):
    """A quantized weight in the form this backend's GEMM reads fastest (cache it once per optimizer step):
    the bf16 `DqOperand` on Hopper (dequantized once instead of per GEMM), the packed NVFP4Tensor elsewhere."""
    return as_dq(t) if t.data.is_cuda and select_backend(backend) == "triton" else t


def gemm_w4a16(x: torch.Tensor, w, *, backend: str | None = None) -> torch.Tensor:
    """Marlin-style W4A16: y [M, N] = x @ ŵᵀ in fp32, x in high precision (bf16 on GPU: the products of bf16 x
    and the exact bf16 e2m1(q)·sf are exact in fp32), S_dec applied after the fp32 accumulation."""
    if select_backend(backend) == "reference" or not x.is_cuda:
        return x.float() @ _dequant_fp32(w).t()
    w = as_dq(w)
    gs = w.global_scale.float()
    gs = gs.reshape(1, -1) if gs.ndim else gs  # per-row weight scales [N, 1] -> columns of y
    return torch.mm(x.to(torch.bfloat16), w.values_bf16.t(), out_dtype=torch.float32) * gs

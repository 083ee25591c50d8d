"""The NVFP4 quantizer entry points of kernels.dispatch, and the operand forms the GEMMs read: the fused Triton
quantizers (kernels/quantize.py along K, kernels/quantize_cols.py along tokens) on the fast path, the plain
reference (kernels/reference.py, `formats`) otherwise — the same codes and scales, bit for bit.

`quantize` returns the reference's `NVFP4Tensor`; `quantize_dq` also returns the GEMM-ready `DqOperand` (bf16
e2m1(q)*sf + S_dec) the Hopper GEMM consumes, emitted by the same kernel for free. Triton kernel files are imported
only on the fast path.
"""
from __future__ import annotations

import torch

from minite_core.formats import nvfp4 as ref
from minite_core.kernels.backend import fast_path, select_backend
from minite_core.kernels.operands import DqOperand
from minite_core.profiles import Quant


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
    if not fast_path(x, backend):
        if select_backend(backend) != "reference":
            raise RuntimeError(f"backend {select_backend(backend)!r} needs a CUDA tensor, got one on {x.device}")
        from minite_core.kernels.reference import quantize_reference

        return quantize_reference(x, amax=amax, seed=seed, rht=rht, emit_dq=emit_dq, check=check, **q)
    from minite_core.kernels.quantize import quantize_triton

    return quantize_triton(x, amax=amax, seed=seed, rht=rht, emit_dq=emit_dq, check=check, **q)

def quantize(x: torch.Tensor, quant: Quant | None = None, amax=None, seed: int | None = None, rht: bool = False,
             *, backend: str | None = None, check: bool = True, **kwargs) -> ref.NVFP4Tensor:
    """x [M, K] -> NVFP4Tensor under `quant` (a profiles.Quant) or keyword overrides (block=, scale_mode=,
    math=, rounding=; Triton only: col_amax=, seg_seed=). amax: static scale; seed: the Philox stream of
    rounding="sr"; rht: RHT along K."""
    t, _ = _quantize_impl(x, quant, amax, seed, rht, False, backend, check, kwargs)
    return t

def quantize_dq(x: torch.Tensor, quant: Quant | None = None, amax=None, seed: int | None = None, rht: bool = False,
                *, backend: str | None = None, check: bool = True, **kwargs) -> tuple[ref.NVFP4Tensor, DqOperand]:
    """`quantize` plus the GEMM-ready DqOperand (bf16 e2m1(q)*sf, S_dec) from the same pass."""
    t, dq = _quantize_impl(x, quant, amax, seed, rht, True, backend, check, kwargs)
    return t, DqOperand(dq, t.global_scale)

def quantize_cols(x: torch.Tensor, quant: Quant | None = None, amax=None, seed: int | None = None,
                  rht: bool = False, *, emit_dq: bool = False, backend: str | None = None, **kwargs):
    """The along-token operand: x [T, C] -> (NVFP4Tensor of xᵀ [C, T] quantized along T, bf16 values or None).
    Per-tensor scale (`amax` static or dynamic), or Triton only: col_amax= [T/16], seg_seed= (MoE experts).
    scale_mode="row" (kwarg): one global scale per row of xᵀ (Profile.wgrad_input_scale_mode), on the plain
    reference on every device: the Triton kernel has per-tensor / per-16-token-block scales only."""
    scale_mode = kwargs.pop("scale_mode", "tensor")
    q = _quant_kwargs(quant, kwargs)
    q.pop("scale_mode")
    if scale_mode != "tensor" or not fast_path(x, backend):
        from minite_core.kernels.reference import quantize_reference

        return quantize_reference(x.t(), scale_mode=scale_mode, amax=amax, seed=seed, rht=rht, emit_dq=emit_dq,
                                  check=False, **q)
    from minite_core.kernels.quantize_cols import quantize_cols_triton

    if tuple(q.pop("block")) != (1, 16):
        raise NotImplementedError("the along-token quantizer takes 1x16 blocks (every profile's wgrad operands)")
    # check=False as on the reference branch: a token shard's all-reduced amax would cost two host syncs a call
    return quantize_cols_triton(x, amax=amax, seed=seed, rht=rht, emit_dq=emit_dq, check=False, **q)

def quantize_rows_cols(x: torch.Tensor, quant: Quant, row_amax: torch.Tensor, *, amax=None, col_amax=None,
                       row_seed: int | None = None, seed: int | None = None, seg_seed=None, row_seeds=None,
                       rht: bool = False, rht_dtype: str = "float32", emit_dq: bool = False,
                       backend: str | None = None):
    """(Benched and checked, not on the learner's path: measured no faster than the two quantizers on the H200,
    kernels/quantize_cols.py.) Both operands a linear makes of one tensor, rounded as `quant` says: x along C (with
    its DqOperand: the forward GEMM's, or dgrad's for a gradient) and xᵀ along T (wgrad's; RHT'd when `rht`, its
    bf16 copy when `emit_dq`) — from one read of x [T, C] (T % 16 == 0) on the Triton path
    (`quantize_rows_cols_triton`), from the two quantizers on the reference. row_amax: x's amax per token [T] or
    one []; amax / col_amax: xᵀ's (default: the max of row_amax, i.e. of |x|; col_amax [T/16] Triton only). SR:
    row_seed / seed, or (Triton only) per row row_seeds and per token seg_seed. Returns (NVFP4Tensor of x,
    DqOperand of x, NVFP4Tensor of xᵀ, bf16 xᵀ values or None)."""
    if not rows_cols_spec(quant):
        raise ValueError(f"quantize_rows_cols takes a dynamic 1x16 spec without 4over6, got {quant}")
    per_row = row_amax.dim() == 1
    if not fast_path(x, backend):
        if col_amax is not None or seg_seed is not None:
            raise NotImplementedError("per-block xᵀ scales and per-row SR streams are Triton only")
        t, dq = quantize_dq(x, quant, amax=row_amax, seed=row_seed, scale_mode="row" if per_row else "tensor",
                            backend=backend, check=False)
        amax = row_amax.amax() if amax is None else amax
        cols, cols_dq = quantize_cols(x, quant, amax=amax, seed=seed, rht=rht, rht_dtype=rht_dtype, emit_dq=emit_dq,
                                      backend=backend)
        return t, dq, cols, cols_dq
    from minite_core.kernels.quantize_cols import quantize_rows_cols_triton

    (t, dq), (cols, cols_dq) = quantize_rows_cols_triton(
        x, row_amax, amax=amax, col_amax=col_amax, math=quant.math, rounding=quant.rounding, row_seed=row_seed,
        seed=seed, seg_seed=seg_seed, row_seeds=row_seeds, rht=rht, rht_dtype=rht_dtype, emit_dq=emit_dq)
    return t, DqOperand(dq, t.global_scale), cols, cols_dq

def rows_cols_spec(quant: Quant | None) -> bool:
    """Whether `quantize_rows_cols` takes this spec: dynamic, 1x16 blocks, no 4over6."""
    return (quant is not None and not quant.static and tuple(quant.block) == (1, 16)
            and quant.four_over_six == "off")

def decode_scale(amax: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """S_dec = 1 / S_enc(amax) per element (`formats.nvfp4.global_decode_scale`): one launch on the fast path."""
    if not fast_path(amax, backend):
        return ref.global_decode_scale(amax)  # upcasts to fp32 itself
    from minite_core.kernels.quantize import decode_scale as triton_decode_scale

    return triton_decode_scale(amax)

def row_amax(x: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """amax of |x| per row, fp32 [M]: one launch on the fast path (any 2D strided view), torch otherwise."""
    if not fast_path(x, backend):
        return x.detach().float().abs().amax(dim=1)
    from minite_core.kernels.quantize import row_amax as row_amax_triton

    return row_amax_triton(x)

def col_block_amax(x: torch.Tensor, *, rht: bool = False, rht_dtype: str = "float32",
                   backend: str | None = None) -> torch.Tensor:
    """amax of |x| x [T, C] (after RHT along T, rounded to `rht_dtype`) per 16-token block over all channels:
    fp32 [T/16]. Fast path only (the reference quantizes each expert's xᵀ whole, nn.experts)."""
    if not fast_path(x, backend):
        raise RuntimeError("col_block_amax is the fast path; the reference runs nn.experts' per-expert loop")
    from minite_core.kernels.quantize_cols import col_block_amax as col_block_amax_triton

    return col_block_amax_triton(x, rht=rht, rht_dtype=rht_dtype)

def as_dq(op) -> DqOperand:
    return op if isinstance(op, DqOperand) else DqOperand(dequantize_bf16(op), op.global_scale)

def dequantize_bf16(t: ref.NVFP4Tensor, *, backend: str | None = None) -> torch.Tensor:
    """e2m1(q)·sf as bf16 (exact; no global scale): the Triton kernel on the fast path, torch otherwise."""
    if fast_path(t.data, backend):
        from minite_core.kernels.grouped import dequantize_triton

        return dequantize_triton(t)
    return ref.dequantize_unscaled(t).to(torch.bfloat16)

def split3(t: torch.Tensor, layout: str, *, backend: str | None = None) -> torch.Tensor:
    """fp32 (R, C) -> its three bf16 pieces (`formats.bf16x3.split3`) smallest first, laid out for the split GEMMs:
    "cat" (R, 3C) = [t3 | t2 | t1] along the columns, "stack" (3, R, C) = (t3, t2, t1). One launch on the fast
    path (kernels/split3.py says why smallest first)."""
    if not fast_path(t, backend):
        from minite_core.formats.bf16x3 import split3 as split3_reference

        if layout not in ("cat", "stack"):
            raise ValueError(f"split3 layout must be 'cat' or 'stack', got {layout!r}")
        parts = split3_reference(t.float())[::-1]
        return torch.cat(parts, dim=1) if layout == "cat" else torch.stack(parts)
    from minite_core.kernels.split3 import split3 as triton_split3

    return triton_split3(t, layout)

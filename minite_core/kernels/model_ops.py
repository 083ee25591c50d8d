"""The model's non-GEMM kernel entry points of kernels.dispatch: batch-invariant attention and RMSNorm, the
learner's fused RMSNorm, RMSNorm's tail, RoPE, SwiGLU, the MoE layout and row moves, the sampler's Philox noise.
Each runs its Triton kernel on the fast path when the kernel takes the inputs, else the caller's plain torch
`reference` (or the package's), with the same bits where the kernel's file says so. Triton kernel files are
imported only on the fast path.
"""
from __future__ import annotations

import torch

from minite_core.formats import philox as ref_philox
from minite_core.kernels.backend import fast_path


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, *,
              kernel: str | None = None, backend: str | None = None) -> torch.Tensor:
    """Batch-invariant attention (kernels/attention.py) -> (B, H, T, Dh) in q's dtype: the Triton kernel `kernel`
    (a profile's `attention_kernel`; None = the default) on the fast path (autograd: recomputed fp32 reference), else the plain reference (SDPA's math) in fp64 rounded to
    q's dtype (CPU SDPA and BLAS block by shape; fp64 leaves the order visible only at a rounding tie). q (B, H, T, Dh), k/v (B, Hkv, S, Dh), mask (B, 1, T, S) bool or None (causal, T == S)."""
    if not fast_path(q, backend):  # in fp64 (exact products; sums whose order only a rounding tie could show)
        from minite_core.kernels.reference import attention_reference

        return attention_reference(q.double(), k.double(), v.double(), mask).to(q.dtype)
    from minite_core.kernels.attention import InvariantAttention

    return InvariantAttention.apply(q, k, v, mask, kernel)

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None, *, reference,
             backend: str | None = None) -> torch.Tensor:
    """Batch-invariant RMSNorm (kernels/rmsnorm.py) of x (..., D) [+ residual]: the one-program-per-row Triton
    kernel on the fast path (autograd: `reference(x, weight, residual)` recomputed), else `reference` itself."""
    if not fast_path(x, backend):
        return reference(x, weight, residual)
    from minite_core.kernels.rmsnorm import InvariantRMSNorm

    return InvariantRMSNorm.apply(x, weight, residual, eps, reference)

def rms_norm_fused(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None, *, reference,
                   backend: str | None = None) -> torch.Tensor:
    """The learner's RMSNorm of x (..., D) [+ residual] (kernels/rmsnorm_grad.py): torch's mean and a one-launch
    tail forward (the reference's bits on the GPU), a one-launch backward, on the fast path for bf16 activations;
    else `reference(x, weight, residual)` (autograd through the torch ops)."""
    if not fast_path(x, backend):
        return reference(x, weight, residual)
    from minite_core.kernels import rmsnorm_grad

    if not rmsnorm_grad.supported(x, weight, residual):
        return reference(x, weight, residual)
    return rmsnorm_grad.FusedRMSNorm.apply(x, weight, residual, eps)

def rms_norm_tail(x_fp32: torch.Tensor, ms: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype,
                  *, backend: str | None = None) -> torch.Tensor | None:
    """RMSNorm after its mean, bf16(w · bf16(x · rsqrt(ms + eps))), in one launch (kernels/rmsnorm_tail.py) on the
    fast path for fp32/bf16/fp16 outputs when no gradient is needed; None otherwise (the caller runs torch's ops)."""
    grad = torch.is_grad_enabled() and (x_fp32.requires_grad or weight.requires_grad)
    if grad or out_dtype not in (torch.float32, torch.bfloat16, torch.float16) or not fast_path(x_fp32, backend):
        return None
    from minite_core.kernels.rmsnorm_tail import rms_norm_tail as tail

    return tail(x_fp32, ms, weight, eps, out_dtype)

def rms_norm_nograd(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None, *,
                    backend: str | None = None) -> torch.Tensor | None:
    """RMSNorm of x (..., D) [+ residual] without a gradient (decode, eval) from its inputs, in three launches
    (kernels/rmsnorm_tail.py `rms_norm_nograd`: torch's mean between two elementwise kernels, the reference's bits),
    on the fast path for fp32/bf16/fp16 x contiguous or a column slice (`rmsnorm_tail.row_groups`; contiguous with
    a residual of its shape) and weight in x's dtype; None otherwise (the caller runs the reference)."""
    tensors = (x, weight) if residual is None else (x, weight, residual)
    if (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) or not fast_path(x, backend):
        return None
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16) or weight.dtype != x.dtype:
        return None
    if residual is not None and not (residual.shape == x.shape and residual.is_contiguous() and x.is_contiguous()):
        return None
    from minite_core.kernels import rmsnorm_tail

    groups = rmsnorm_tail.row_groups(x) if weight.shape == x.shape[-1:] and x.numel() else None
    return None if groups is None else rmsnorm_tail.rms_norm_nograd(x, weight, eps, residual, groups)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype | None, rounding: str, *,
         reference, backend: str | None = None) -> torch.Tensor:
    """RoPE of x (B, H, T, Dh) in one launch (kernels/rope.py), bitwise `reference(x, cos, sin, dtype, rounding)`:
    the kernel on the fast path when no gradient is needed (it is forward-only) and it takes these dtypes, else
    `reference` itself."""
    grad = torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad)
    if grad or not fast_path(x, backend):
        return reference(x, cos, sin, dtype, rounding)
    from minite_core.kernels import rope as _rope

    if not _rope.supported(x, cos, sin, dtype):
        return reference(x, cos, sin, dtype, rounding)
    return _rope.rope_triton(x, cos, sin, dtype, rounding)

def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, reference, backend: str | None = None) -> torch.Tensor:
    """silu(gate) * up (..., I): one launch forward and one backward on the fast path for bf16 (kernels/swiglu.py),
    else `reference(gate, up)`."""
    if not fast_path(gate, backend):
        return reference(gate, up)
    from minite_core.kernels import swiglu

    if not swiglu.supported(gate, up):
        return reference(gate, up)
    return swiglu.SiluMul.apply(gate, up)

def swiglu(gate_up: torch.Tensor, *, reference, backend: str | None = None) -> torch.Tensor:
    """silu(gate) * up of one [gate | up] tensor (..., 2I) -> (..., I), as `silu_mul` (its gradient one [dgate |
    dup] tensor: no cat), else `reference(gate_up)`."""
    if not fast_path(gate_up, backend):
        return reference(gate_up)
    from minite_core.kernels import swiglu as kernel

    if not kernel.supported(*gate_up.chunk(2, dim=-1)):  # an odd width gives unequal halves: not supported
        return reference(gate_up)
    return kernel.SwiGLU.apply(gate_up)

def moe_layout(top_idx: torch.Tensor, num_experts: int, total_rows: int, *, backend: str | None = None):
    """The padded sorted MoE layout's fields of top_idx (N, k) (`nn.moe_layout.MoELayout`) and its live outputs, in
    one launch on the fast path for routings that fit it (kernels/moe_layout.py, equal field by field to the
    reference); None otherwise (the caller runs the torch reference)."""
    if not fast_path(top_idx, backend):
        return None
    from minite_core.kernels import moe_layout as kernel

    if not kernel.fits(top_idx.numel(), num_experts):
        return None
    return kernel.moe_layout_triton(top_idx, num_experts, total_rows)

def moe_permute(x: torch.Tensor, layout, *, reference, backend: str | None = None) -> torch.Tensor:
    """x (N, D) -> (Tp, D) in the padded MoE layout (`layout.src`, `layout.dest`): one launch each way on the fast
    path (kernels/moe_rows.py), bitwise `reference(x, layout)` and its autograd; else `reference` itself."""
    if not fast_path(x, backend):
        return reference(x, layout)
    from minite_core.kernels import moe_rows

    if not moe_rows.supported(x):
        return reference(x, layout)
    return moe_rows.Permute.apply(x, layout.src, layout.dest)

def moe_combine(y_pad: torch.Tensor, top_w: torch.Tensor, layout, *, reference, out_dtype=torch.float32,
                backend: str | None = None) -> torch.Tensor:
    """(Tp, D), (N, k) -> (N, D), a token's k rows weighted and summed in fp32 in rank order, rounded (RNE) to
    out_dtype: one launch each way on the fast path (kernels/moe_rows.py; forward and dy bitwise
    `reference(y_pad, top_w, layout)`, dtop_w within fp32 summation order), else `reference` itself. Without a
    gradient the kernel stores out_dtype itself (decode: no separate cast)."""
    if not fast_path(y_pad, backend):
        return reference(y_pad, top_w, layout).to(out_dtype)
    from minite_core.kernels import moe_rows

    if not moe_rows.supported(y_pad, top_w):
        return reference(y_pad, top_w, layout).to(out_dtype)
    if not (torch.is_grad_enabled() and (y_pad.requires_grad or top_w.requires_grad)):
        return moe_rows.rank_sum(y_pad, layout.dest, top_w, out_dtype)
    return moe_rows.Combine.apply(y_pad, top_w, layout.dest, layout.src).to(out_dtype)

def uniform_rows(seeds: torch.Tensor, step, vocab: int, guard: float, *, backend: str | None = None) -> torch.Tensor:
    """u[b, v] = formats.philox.uniform(seeds[b], v + step * 2^32), u == 0 read as `guard`: (B, vocab) fp32 — one
    Triton launch on the fast path (kernels/noise.py), the plain torch Philox otherwise; the same bits."""
    if not fast_path(seeds, backend):
        offset = torch.arange(vocab, dtype=torch.long, device=seeds.device) + step * (1 << 32)  # (V,)
        u = ref_philox.uniform(seeds[:, None], offset[None, :])
        return torch.where(u == 0, torch.full_like(u, guard), u)
    from minite_core.kernels.noise import uniform_rows as uniform_rows_triton

    step = step if isinstance(step, torch.Tensor) else torch.tensor(step, dtype=torch.long, device=seeds.device)
    return uniform_rows_triton(seeds, step, vocab, guard)

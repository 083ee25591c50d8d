"""Kernel dispatch: one API over three backends — "reference" (plain torch, `formats`), "triton" (Hopper and
newer: fused Triton quantizers + exact bf16-tensor-core W4A4 GEMMs, dense and grouped), "native" (sm_100+:
Triton quantizer + torch._scaled_mm on float4_e2m1fn_x2).

Selection, first match wins: the `backend=` argument, the run's backend (`set_backend`: a command's resolved
execution sets it once, runs.execution), then automatic (native on sm_100+, triton on other CUDA GPUs, reference
on CPU). A backend that cannot run raises with the reason — never
a silent fallback (STYLE.md). "triton" also runs on CPU tensors under TRITON_INTERPRET=1 (tests, the smoke
kernel check). Triton is imported only when a Triton backend is chosen: the CPU reference path imports none.

Operands: `quantize` returns the reference's `NVFP4Tensor`; `quantize_dq` also returns the GEMM-ready
`DqOperand` (bf16 e2m1(q)*sf + S_dec) the Hopper GEMM consumes, emitted by the same kernel for free. `gemm`
takes either form (NVFP4Tensor operands are dequantized on the fly — cache a `DqOperand` for weights, once per
optimizer step). Results: a_hat @ b_hat^T, equal across backends up to fp32 accumulation order.
"""
from __future__ import annotations

import functools
import os
from contextlib import contextmanager

import torch

from minite_core.formats import nvfp4 as ref
from minite_core.formats import philox as ref_philox
from minite_core.kernels.operands import DqOperand, PackedExperts  # noqa: F401  (the operand types nn/ passes)
from minite_core.profiles import Quant

BACKENDS = ("reference", "triton", "native")
_RUN_BACKEND: str | None = None  # set_backend; None = automatic


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def backend_available(name: str) -> tuple[bool, str]:
    if name == "reference":
        return True, ""
    if name == "triton":
        if not torch.cuda.is_available() and not _interpret():
            return False, "backend 'triton' needs a CUDA GPU (none visible) or TRITON_INTERPRET=1 (CPU, tests)"
        try:
            import triton  # noqa: F401
        except ImportError as e:
            return False, f"backend 'triton' needs triton ({e}); install the test extra or use 'reference'"
        return True, ""
    if name == "native":
        from minite_core.kernels.native import native_available

        return native_available()
    return False, f"unknown kernel backend {name!r}; choose one of {list(BACKENDS)}"


def set_backend(name: str | None) -> None:
    """The process's kernel backend (a command's execution sets it, runs.execution; None or "auto" = automatic).
    Checked now, so a bad choice fails before any work."""
    global _RUN_BACKEND
    name = None if name == "auto" else name
    if name is not None:
        ok, reason = backend_available(name)
        if not ok:
            raise ValueError(f"kernel backend {name!r} is not usable here: {reason}")
    _RUN_BACKEND = name


@contextmanager
def using_backend(name: str | None):
    """`set_backend(name)` for a block; the run's backend is restored afterwards (a stage run in-process, e.g. the
    kernels check, must not switch the backend of whatever runs next in the same process)."""
    before = _RUN_BACKEND
    set_backend(name)
    try:
        yield
    finally:
        set_backend(before)


def current_backend() -> str:
    """The backend a call without `backend=` uses now (what results record in their `env`)."""
    return select_backend()


def select_backend(backend: str | None = None) -> str:
    """Argument > the process's backend (set_backend) > auto (native on sm_100+, triton on CUDA, reference on
    CPU)."""
    name = backend or _RUN_BACKEND
    if name is None:
        return auto_backend()
    ok, reason = _checked(name, _interpret())
    if not ok:
        raise RuntimeError(f"kernel backend {name!r} is not usable here: {reason}")
    return name


# Both answers are asked once per process: every kernel call selects a backend (~100 times a layer in a learner
# step), and asking the CUDA driver each time cost ~15 us a call (cProfile on the H200)
@functools.cache
def auto_backend() -> str:
    """The automatic backend: native on sm_100+, triton on other CUDA GPUs, reference without a GPU."""
    if not torch.cuda.is_available():
        return "reference"
    return "native" if torch.cuda.get_device_capability()[0] >= 10 else "triton"


@functools.cache
def _checked(name: str, interpret: bool) -> tuple[bool, str]:
    return backend_available(name)  # keyed on TRITON_INTERPRET too: tests switch it


def fast_path(x: torch.Tensor, backend: str | None = None) -> bool:
    """True when `x` goes through the Triton kernels (a GPU backend on CUDA, or triton under the interpreter)."""
    name = select_backend(backend)
    return name != "reference" and (x.is_cuda or _interpret())


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


def decode_scale(amax: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """S_dec = 1 / S_enc(amax) per element (`formats.nvfp4.global_decode_scale`): one launch on the fast path."""
    if not fast_path(amax, backend):
        return ref.global_decode_scale(amax)  # upcasts to fp32 itself
    from minite_core.kernels.quantize import decode_scale as triton_decode_scale

    return triton_decode_scale(amax)


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


def moe_permute(x: torch.Tensor, layout, *, reference, backend: str | None = None) -> torch.Tensor:
    """x (N, D) -> (Tp, D) in the padded MoE layout (`layout.src`, `layout.dest`): one launch each way on the fast
    path (kernels/moe_rows.py), bitwise `reference(x, layout)` and its autograd; else `reference` itself."""
    if not fast_path(x, backend):
        return reference(x, layout)
    from minite_core.kernels import moe_rows

    if not moe_rows.supported(x):
        return reference(x, layout)
    return moe_rows.Permute.apply(x, layout.src, layout.dest)


def moe_combine(y_pad: torch.Tensor, top_w: torch.Tensor, layout, *, reference,
                backend: str | None = None) -> torch.Tensor:
    """(Tp, D), (N, k) -> (N, D) fp32, a token's k rows weighted and summed in rank order: one launch each way on
    the fast path (kernels/moe_rows.py; forward and dy bitwise `reference(y_pad, top_w, layout)`, dtop_w within
    fp32 summation order), else `reference` itself."""
    if not fast_path(y_pad, backend):
        return reference(y_pad, top_w, layout)
    from minite_core.kernels import moe_rows

    if not moe_rows.supported(y_pad, top_w):
        return reference(y_pad, top_w, layout)
    return moe_rows.Combine.apply(y_pad, top_w, layout.dest, layout.src)


def moe_layout(top_idx: torch.Tensor, num_experts: int, total_rows: int, *, backend: str | None = None):
    """The padded sorted MoE layout's fields of top_idx (N, k) (`nn.moe_layout.MoELayout`) in one launch on the fast
    path for routings that fit it (kernels/moe_layout.py, equal field by field to the reference); None otherwise
    (the caller runs the torch reference)."""
    if not fast_path(top_idx, backend):
        return None
    from minite_core.kernels import moe_layout as kernel

    if not kernel.fits(top_idx.numel(), num_experts):
        return None
    return kernel.moe_layout_triton(top_idx, num_experts, total_rows)


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


def rows_cols_spec(quant: Quant | None) -> bool:
    """Whether `quantize_rows_cols` takes this spec: dynamic, 1x16 blocks, no 4over6."""
    return (quant is not None and not quant.static and tuple(quant.block) == (1, 16)
            and quant.four_over_six == "off")


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


def as_dq(op) -> DqOperand:
    return op if isinstance(op, DqOperand) else DqOperand(dequantize_bf16(op), op.global_scale)


def dequantize_bf16(t: ref.NVFP4Tensor, *, backend: str | None = None) -> torch.Tensor:
    """e2m1(q)·sf as bf16 (exact; no global scale): the Triton kernel on the fast path, torch otherwise."""
    if fast_path(t.data, backend):
        from minite_core.kernels.grouped import dequantize_triton

        return dequantize_triton(t)
    return ref.dequantize_unscaled(t).to(torch.bfloat16)


def _dequant_fp32(op) -> torch.Tensor:
    if isinstance(op, DqOperand):
        gs = op.global_scale.float()
        if op.values_bf16.ndim == 3 and gs.ndim == 1:  # [E] per-expert tensor scales
            gs = gs.view(-1, 1, 1)
        return op.values_bf16.float() * gs
    return ref.dequantize(op)


def gemm(a, b, out_dtype=torch.bfloat16, *, invariant: bool = False, backend: str | None = None) -> torch.Tensor:
    """y [M, N] = a_hat @ b_hat^T; a, b: NVFP4Tensor or DqOperand ([M, K], [N, K]). invariant=True (profile knob
    `batch_invariant`): on the fast path, the Triton GEMM with one fixed tile for every M (gemm.INVARIANT_CONFIG),
    so a row's bits do not depend on how many rows share the call."""
    name = select_backend(backend)
    x = a.values_bf16 if isinstance(a, DqOperand) else a.data
    if not fast_path(x, backend):
        if invariant:  # CPU BLAS picks its blocking by M: fp64 sums, so only a rounding tie could show the order
            return (_dequant_fp32(a).double() @ _dequant_fp32(b).double().t()).to(out_dtype)
        return (_dequant_fp32(a) @ _dequant_fp32(b).t()).to(out_dtype)
    if invariant:
        from minite_core.kernels import gemm as _gemm

        return _gemm.gemm_invariant(as_dq(a), as_dq(b), out_dtype)
    if name == "native":
        from minite_core.kernels.native import gemm_native

        if isinstance(a, DqOperand) or isinstance(b, DqOperand):
            raise TypeError("backend 'native' takes NVFP4Tensor operands (packed codes), not DqOperand")
        return gemm_native(a, b, out_dtype)
    from minite_core.kernels import gemm as _gemm

    a, b = as_dq(a), as_dq(b)
    # cuBLAS fp32-out + scale kernel: 0.832 ms vs the Triton fused GEMM's 0.956 ms at 16384x4096x4096 on the
    # H200 (results/h200/bench); the Triton GEMM is used under the interpreter (no cuBLAS there).
    impl = _gemm.gemm_triton if _interpret() and not x.is_cuda else _gemm.gemm_cublas
    return impl(a, b, out_dtype)


def gemm_te_reference(a: ref.NVFP4Tensor, b: ref.NVFP4Tensor, amax_a: torch.Tensor, amax_b: torch.Tensor,
                      e4m3_bounds: tuple[float, float], out_dtype=torch.float32) -> torch.Tensor:
    """Transformer Engine's reference NVFP4 GEMM (profile knob w4a4_gemm="te-ref"), plain torch on every backend:
    `kernels.reference.gemm_te_reference` (its docstring gives the arithmetic)."""
    from minite_core.kernels.reference import gemm_te_reference as te_reference

    return te_reference(a, b, amax_a, amax_b, e4m3_bounds, out_dtype)


def gemm_vllm_cpu(x_q: ref.NVFP4Tensor, x_encode_scale: torch.Tensor, w_q: ref.NVFP4Tensor,
                  dtype: torch.dtype) -> torch.Tensor:
    """vLLM's CPU emulation W4A4 GEMM (profile knob w4a4_gemm="vllm-cpu"), plain torch on every backend:
    `kernels.vllm_cpu.gemm` (its docstring gives the arithmetic)."""
    from minite_core.kernels import vllm_cpu

    return vllm_cpu.gemm(x_q, x_encode_scale, w_q, dtype)


def grouped_gemm(a: DqOperand, b: DqOperand, offs: torch.Tensor, out_dtype=torch.bfloat16, *, schedule=None,
                 invariant: bool = False, backend: str | None = None) -> torch.Tensor:
    """MoE expert GEMM on the padded sorted layout: rows offs[e]:offs[e+1] of a [Tp, K] times b[e] [N, K]ᵀ.
    Its config is fixed on a GPU (row-independent already); invariant=True also makes the interpreter's dot
    row-local (gemm._dot_rows)."""
    if not fast_path(a.values_bf16, backend):
        x, w = _dequant_fp32(a), _dequant_fp32(b)
        if invariant:  # fp64 sums, as `gemm`'s reference path
            x, w = x.double(), w.double()
        bounds = offs.tolist()  # reference path: host loop over experts
        outs = [x[s:t] @ w[e].t() for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:]))]
        return torch.cat(outs, 0).to(out_dtype)
    from minite_core.kernels.grouped import grouped_gemm as _grouped

    return _grouped(a, b, offs, out_dtype, schedule=schedule, config={"ROW_DOT": True} if invariant else None)


def kgrouped_gemm(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, offs: torch.Tensor,
                  *, backend: str | None = None) -> torch.Tensor:
    """wgrad of the MoE: [E, N, K] fp32, expert e = (a[:, seg_e] @ b[:, seg_e]ᵀ) · sa[e] · sb[e]."""
    if not fast_path(a, backend):
        bounds = offs.tolist()
        return torch.stack([(a[:, s:t].float() @ b[:, s:t].float().t()) * (sa[e] * sb[e])
                            for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:]))])
    from minite_core.kernels.grouped import kgrouped_gemm as _kgrouped

    return _kgrouped(a, sa, b, sb, offs)


def grouped_schedule(offs: torch.Tensor, block_m: int | None, total_rows: int):
    """Tile schedule of the fast grouped GEMM for this layout (None on the reference path); build once per MoE
    layer forward and pass to every grouped_gemm of the layer."""
    if not fast_path(offs):
        return None
    from minite_core.kernels import grouped

    bm = block_m or grouped._config(grouped.GROUPED_CONFIG, grouped.SMALL, None, offs.device)["BLOCK_M"]
    return grouped.grouped_schedule(offs, bm, total_rows)


def decode_gemm(x: torch.Tensor, w: ref.NVFP4Tensor, act: Quant | None = None, amax=None,
                out_dtype=torch.bfloat16, *, backend: str | None = None) -> torch.Tensor:
    """y [M, N] = x @ W_hat^T from packed weights (codes + scales, dequantized in the GEMM's main loop; the
    decode GEMM of profiles' `decode_gemm: "packed"`). act=None: W4A16 (x bf16 as is); act=Quant: W4A4, x
    quantized with that quantizer (amax for a static scale) — fused into the GEMM on the fast path. Reference
    path: the quantizer, then fp32 x̂ @ ŵᵀ — exactly what `gemm` / `gemm_w4a16` compute on CPU."""
    if not fast_path(x, backend):
        from minite_core.kernels.reference import decode_gemm_reference

        if act is None:  # W4A16: x in its own precision, as gemm_w4a16
            return decode_gemm_reference(x, w, out_dtype=out_dtype)
        _, dq = quantize_dq(x, act, amax=amax, backend=backend, check=False)
        return decode_gemm_reference(dq.values_bf16, w, x_scale=dq.global_scale, out_dtype=out_dtype)
    from minite_core.kernels.decode import packed_gemm_triton

    return packed_gemm_triton(x, w, act=act, amax=amax, out_dtype=out_dtype)


def grouped_decode_gemm(x: torch.Tensor, w, offs: torch.Tensor, act: Quant | None = None, amax=None,
                        out_dtype=torch.bfloat16, *, schedule=None, backend: str | None = None) -> torch.Tensor:
    """MoE expert GEMM from packed expert weights (`operands.PackedExperts`) on the padded sorted layout, no
    per-expert loop: rows offs[e]:offs[e+1] of x [Tp, K] times ŵ[e]ᵀ. act=None: W4A16; act=Quant: the fused
    quantizer with `amax` = one amax per row [Tp] (`nn.experts` gives the layout's per-expert / per-token /
    static scales). Fast path only (the reference's expert loop is `nn.experts`' per-expert `linear`)."""
    if not fast_path(x, backend):
        raise RuntimeError("grouped_decode_gemm is the fast path; the reference runs nn.experts' per-expert loop")
    from minite_core.kernels.decode import grouped_packed_gemm_triton

    return grouped_packed_gemm_triton(x, w, offs, act=act, amax=amax, out_dtype=out_dtype, schedule=schedule)


def grouped_decode_schedule(offs: torch.Tensor, total_rows: int):
    """Tile schedule of `grouped_decode_gemm` for this layout (device-side, no host sync); once per MoE layer."""
    from minite_core.kernels.decode import grouped_packed_schedule

    return grouped_packed_schedule(offs, total_rows, offs.numel() - 1)


def prepare_weight(t: ref.NVFP4Tensor, *, backend: str | None = None):
    """A quantized weight in the form this backend's GEMM reads fastest (cache it once per optimizer step):
    the bf16 `DqOperand` on the Triton path (dequantized once instead of per GEMM), the packed NVFP4Tensor
    elsewhere."""
    return as_dq(t) if fast_path(t.data, backend) and select_backend(backend) == "triton" else t


def gemm_w4a16(x: torch.Tensor, w, *, backend: str | None = None) -> torch.Tensor:
    """Marlin-style W4A16: y [M, N] = x @ ŵᵀ in fp32, x in high precision (bf16 on GPU: the products of bf16 x
    and the exact bf16 e2m1(q)·sf are exact in fp32), S_dec applied after the fp32 accumulation."""
    if not fast_path(x, backend) or not x.is_cuda:
        return x.float() @ _dequant_fp32(w).t()
    w = as_dq(w)
    gs = w.global_scale.float()
    gs = gs.reshape(1, -1) if gs.ndim else gs  # per-row weight scales [N, 1] -> columns of y
    return torch.mm(x.to(torch.bfloat16), w.values_bf16.t(), out_dtype=torch.float32) * gs


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


def rms_norm_tail(x_fp32: torch.Tensor, ms: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype,
                  *, backend: str | None = None) -> torch.Tensor | None:
    """RMSNorm after its mean, bf16(w · bf16(x · rsqrt(ms + eps))), in one launch (kernels/rmsnorm_tail.py) on the
    fast path for fp32/bf16/fp16 outputs when no gradient is needed; None otherwise (the caller runs torch's ops)."""
    grad = torch.is_grad_enabled() and (x_fp32.requires_grad or weight.requires_grad)
    if grad or out_dtype not in (torch.float32, torch.bfloat16, torch.float16) or not fast_path(x_fp32, backend):
        return None
    from minite_core.kernels.rmsnorm_tail import rms_norm_tail as tail

    return tail(x_fp32, ms, weight, eps, out_dtype)


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

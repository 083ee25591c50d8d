"""The GEMM entry points of kernels.dispatch: y = â b̂ᵀ with fp32 accumulation on every backend, equal across
backends up to accumulation order — dense (`gemm`; the fixed-tile batch-invariant one with `invariant=True`),
grouped over MoE experts (`grouped_gemm`, the wgrad's `kgrouped_gemm`), each with the activation quantizer fused
into the GEMM's prologue (`gemm_quant`, `grouped_gemm_quant`, and wgrad's along-token `kgrouped_gemm_quant`:
kernels/quant_prologue.py), from packed weights
(`decode_gemm`, `grouped_decode_gemm`: the profile knob decode_gemm="packed"), W4A16 (`gemm_w4a16`), and the two
peer arithmetics a profile can name (`gemm_te_reference`, `gemm_vllm_cpu`: plain torch everywhere).

`gemm` takes NVFP4Tensor or DqOperand operands (NVFP4Tensor operands are dequantized on the fly — cache a
`DqOperand` for weights, once per optimizer step: `prepare_weight`). Triton kernel files are imported only on the
fast path.
"""
from __future__ import annotations

import torch

from minite_core.formats import nvfp4 as ref
from minite_core.kernels.backend import fast_path, interpret, select_backend
from minite_core.kernels.operands import DqOperand
from minite_core.kernels.quantize_ops import as_dq, quantize_dq
from minite_core.profiles import Quant


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
    impl = _gemm.gemm_triton if interpret() and not x.is_cuda else _gemm.gemm_cublas
    return impl(a, b, out_dtype)

def gemm_quant(x: torch.Tensor, act: Quant, amax: torch.Tensor, b, out_dtype=torch.bfloat16, *,
               seed: int | None = None, sr_row0: int = 0, invariant: bool = False,
               backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense y [M, N] = x̂ b̂ᵀ with x quantized by `act` (`fused_quant_spec`) in the Triton GEMM's prologue ->
    (y, S_dec of x̂): bit for bit `quantize_dq(x, act, amax=amax, seed=seed, sr_origin=(sr_row0, 0))` then the
    Triton GEMM (`gemm(..., invariant=True)` with invariant; else `gemm.gemm_triton`, which `gemm` runs under the
    interpreter only: on a GPU it takes cuBLAS, another accumulation order). amax: [] for the tensor (static, or
    the dynamic max) or [M] per token. Fast path only."""
    if not fast_path(x, backend):
        raise RuntimeError("gemm_quant is the fast path (the Triton GEMM); the reference is quantize_dq + gemm")
    if not fused_quant_spec(act):
        raise ValueError(f"gemm_quant fuses 1x16 quantizers without 4over6, got {act}")
    from minite_core.kernels import gemm as _gemm

    return _gemm.gemm_triton_quant(x, amax, as_dq(b), out_dtype, math=act.math, rounding=act.rounding, seed=seed,
                                   sr_row0=sr_row0, config=_gemm.INVARIANT_CONFIG if invariant else None)

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

def grouped_gemm_quant(x: torch.Tensor, act: Quant, amax: torch.Tensor, b: DqOperand, offs: torch.Tensor,
                       out_dtype=torch.bfloat16, *, seg_seed=None, schedule=None, invariant: bool = False,
                       backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`grouped_gemm` of x quantized by `act` along K in the GEMM's prologue (kernels/quant_prologue.py) -> (y,
    S_dec of x̂): bit for bit `quantize_dq(x, act, scale_mode="row", amax=amax, seg_seed=seg_seed)` then
    `grouped_gemm` (`fused_quant_spec` says which specs). amax: [] (one for the tensor) or [Tp] (one per row);
    seg_seed: SR's (seed, expert-local row) per row. Fast path only (the reference's expert loop is nn.experts'
    per-expert `linear`)."""
    if not fast_path(x, backend):
        raise RuntimeError("grouped_gemm_quant is the fast path; the reference runs nn.experts' per-expert loop")
    if not fused_quant_spec(act):
        raise ValueError(f"grouped_gemm_quant fuses 1x16 quantizers without 4over6, got {act}")
    from minite_core.kernels.grouped import grouped_gemm_quant as _grouped_quant

    return _grouped_quant(x, amax, b, offs, out_dtype, math=act.math, rounding=act.rounding, seg_seed=seg_seed,
                          schedule=schedule, config={"ROW_DOT": True} if invariant else None)

def fused_quant_spec(act: Quant | None) -> bool:
    """Whether `gemm_quant` / `grouped_gemm_quant` fuse this activation / gradient spec: 1x16 blocks, no 4over6
    (any math, rounding and global scale)."""
    return act is not None and tuple(act.block) == (1, 16) and act.four_over_six == "off"

def kgrouped_gemm(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, offs: torch.Tensor,
                  *, backend: str | None = None) -> torch.Tensor:
    """wgrad of the MoE: [E, N, K] fp32, expert e = (a[:, seg_e] @ b[:, seg_e]ᵀ) · sa[e] · sb[e]."""
    if not fast_path(a, backend):
        bounds = offs.tolist()
        return torch.stack([(a[:, s:t].float() @ b[:, s:t].float().t()) * (sa[e] * sb[e])
                            for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:]))])
    from minite_core.kernels.grouped import kgrouped_gemm as _kgrouped

    return _kgrouped(a, sa, b, sb, offs)

def kgrouped_gemm_quant(dy: torch.Tensor, grad: Quant, amax: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                        offs: torch.Tensor, *, seg_seed=None, rht: bool = False, rht_dtype: str = "float32",
                        backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`kgrouped_gemm` of a = dyᵀ quantized by `grad` along tokens in the GEMM's prologue, read from dy [Tp, N] in
    place (kernels/quant_prologue.py `t_tile`) -> (dW [E, N, K] fp32, S_dec of dyᵀ [E]): bit for bit
    `quantize_cols(dy, grad, col_amax=amax per 16-token block, seg_seed=seg_seed, rht=rht, emit_dq=True)` then
    `kgrouped_gemm` with sa = `decode_scale(amax)`. amax [E]: each expert's amax of dy (after the RHT); seg_seed:
    SR's (seed, expert-local token) per token. Fast path only (the reference's expert loop is nn.experts')."""
    if not fast_path(dy, backend):
        raise RuntimeError("kgrouped_gemm_quant is the fast path; the reference runs nn.experts' per-expert loop")
    if not fused_quant_spec(grad):
        raise ValueError(f"kgrouped_gemm_quant fuses 1x16 quantizers without 4over6, got {grad}")
    from minite_core.kernels.grouped import kgrouped_gemm_quant as _kgrouped_quant

    return _kgrouped_quant(dy, amax, b, sb, offs, math=grad.math, rounding=grad.rounding, seg_seed=seg_seed,
                           rht=rht, rht_dtype=rht_dtype)

def grouped_schedule(offs: torch.Tensor, block_m: int | None, total_rows: int, live=None, routed: int = 0):
    """Tile schedule of the fast grouped GEMM for this layout (None on the reference path); build once per MoE
    layer forward and pass to every grouped_gemm of the layer. live, routed: `MoELayout.live_rows` and N·k (the
    filler past live gets no tile and zero outputs)."""
    if not fast_path(offs):
        return None
    from minite_core.kernels import grouped

    bm = block_m or grouped._config(grouped.GROUPED_CONFIG, grouped.SMALL, None, offs.device)["BLOCK_M"]
    return grouped.grouped_schedule(offs, bm, total_rows, live, routed)

def decode_gemm(x: torch.Tensor, w: ref.NVFP4Tensor, act: Quant | None = None, amax=None,
                out_dtype=torch.bfloat16, *, backend: str | None = None) -> torch.Tensor:
    """y [M, N] = x @ W_hat^T from packed weights (codes + scales, dequantized in the GEMM's main loop; the
    decode GEMM of profiles' `decode_gemm: "packed"`). act=None: W4A16 (x bf16 as is); act=Quant: W4A4, x
    quantized with that quantizer (amax for a static scale) — fused into the Triton GEMM on the fast path; up to 16
    rows (kernels/decode_mma.py) the quantizer's x̂ feeds the tensor-core kernel. Reference
    path: the quantizer, then fp32 x̂ @ ŵᵀ — exactly what `gemm` / `gemm_w4a16` compute on CPU."""
    if not fast_path(x, backend):
        from minite_core.kernels.reference import decode_gemm_reference

        if act is None:  # W4A16: x in its own precision, as gemm_w4a16
            return decode_gemm_reference(x, w, out_dtype=out_dtype)
        _, dq = quantize_dq(x, act, amax=amax, backend=backend, check=False)
        return decode_gemm_reference(dq.values_bf16, w, x_scale=dq.global_scale, out_dtype=out_dtype)
    from minite_core.kernels import decode_mma

    if decode_mma.supported(x, w, out_dtype):  # <= 16 rows: the tensor-core kernel on the mma layout
        if act is None or x.dtype == torch.bfloat16:  # W4A16, or W4A4 with the quantizer fused
            return decode_mma.packed_gemm_mma(x, w, act=act, amax=amax, out_dtype=out_dtype)
        _, dq = quantize_dq(x, act, amax=amax, backend=backend, check=False)
        return decode_mma.packed_gemm_mma(dq.values_bf16, w, x_scale=dq.global_scale, out_dtype=out_dtype)
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
    from minite_core.kernels import decode_mma

    if decode_mma.grouped_supported(x, w, out_dtype):  # decode: the tensor-core kernel on 16-row tiles
        if schedule is None:
            schedule = grouped_decode_schedule(offs, x.shape[0])
        if act is None or x.dtype == torch.bfloat16:
            return decode_mma.grouped_packed_gemm_mma(x, w, offs, schedule, act=act, amax=amax, out_dtype=out_dtype)
        from minite_core.kernels.decode import act_amax

        rows = act_amax(x, act, amax)  # the fused quantizer's one amax a row, then the quantizer on its own
        _, dq = quantize_dq(x, Quant(scale_mode="row", math=act.math), amax=rows, backend=backend, check=False)
        return decode_mma.grouped_packed_gemm_mma(dq.values_bf16, w, offs, schedule, x_scale=dq.global_scale,
                                                  out_dtype=out_dtype)
    from minite_core.kernels.decode import grouped_packed_gemm_triton

    return grouped_packed_gemm_triton(x, w, offs, act=act, amax=amax, out_dtype=out_dtype, schedule=schedule)

def grouped_decode_schedule(offs: torch.Tensor, total_rows: int, live=None, routed: int = 0):
    """Tile schedule of `grouped_decode_gemm` for this layout (device-side, no host sync); once per MoE layer.
    live, routed: as `grouped_schedule`."""
    from minite_core.kernels.decode import grouped_packed_schedule

    return grouped_packed_schedule(offs, total_rows, offs.numel() - 1, live, routed)

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

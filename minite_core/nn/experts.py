"""GroupedLinear: the MoE expert GEMM on the padded sorted layout (`nn.moe_layout`) under an execution profile.

Numerics (the reference, and the contract of the fast path): each expert's segment is one `nn.linear.linear`
call, so an expert GEMM has exactly the numerics of a dense QuantLinear on its tokens — per-tensor dynamic
activation scales are per expert (as TE's grouped GEMM, one quantizer per split), per-token scales are per token,
a static scale (calibrated) is one amax for the whole grouped GEMM, and each expert draws stochastic rounding
from its own seed (`expert_seed`). Pad rows are zeros and change none of it.

Two implementations:
- reference (CPU, `kernels: reference`): a host loop over experts calling `linear` — plain torch, the spec;
- fast (GPU, or Triton's interpreter): no per-expert loop and no host sync. BF16 goes through
  `torch._grouped_mm` (forward, dgrad, and wgrad as a K-grouped 2D x 2D product), the weight cast to bf16 once
  per weight version — the BF16 MoE as torchtitan/Megatron users run it. NVFP4 goes through the grouped Triton
  kernels (`kernels.grouped`) with the quantizers of `kernels.quantize`: forward = x quantized along K (per-token
  scales, or per-expert amaxes broadcast to rows) x the cached per-expert weight operand; dgrad = dy quantized
  along N with per-expert SR streams x the cached Wᵀ operand — x and dy each quantized by a separate quantize
  pass first, or with `fused_quant=True` inside its grouped GEMM's prologue (kernels/quant_prologue.py: no bf16
  x̂ in memory), the same bits; wgrad = dyᵀ and the saved packed xᵀ (quantized along tokens per expert, RHT first
  under TE's recipe) in a K-grouped GEMM, dyᵀ too quantized by a separate pass or, with `fused_quant`, in that
  GEMM's prologue (`_wgrad`). Codes and scales equal the reference's bit for bit; GEMM outputs agree to fp32
  accumulation order. An expert-parallel rank's slice (`expert_offset`) draws its experts' global SR
  streams, so it computes what the full layer computes for them.
Saved for backward on the NVFP4 path: the packed xᵀ codes + E4M3 scales (4.5 bits / element) and the per-expert
S_dec — the bf16 x is not kept.

`remake_output` (knob, off by default): the GEMM's bf16 output is not kept by the op that reads it either. Without
it, SwiGLU keeps the gate|up output and the MoE combine the down output (model/qwen3_moe.py), 2 bytes an element;
yet each is a deterministic function of the GEMM's quantized input — its packed row codes, E4M3 scales and S_dec —
and the cached weight. With it, `grouped_linear(..., remade=True)` returns y with those codes and a recipe
(`nn.recompute.Remade`), the reading op keeps the codes (`nn.recompute.recompute`, save_for_backward: the
saved-activation count sees them), and backward makes y again with the forward's GEMM on x̂ decoded from them: the
same kernel on the same bf16 operand values, so y, and every gradient after it, bitwise as without the knob
(tests/test_remake_output.py). The fast path's forward quantizer then runs as the separate pass, which writes the
codes (the fused prologue keeps none; the same bits); the expert loop quantizes each expert's rows once more, as
its `linear` does. Only for NVFP4 activations under the plain W4A4 arithmetic (`_remakes`); bf16 and W4A16 are
untouched.

Token rows: the gate|up GEMM's input is `moe_layout.permute(x_flat)` — each of the N tokens copied to its k rows,
pad rows zero. Where a row's codes depend on that row alone (`_row_local`: per-token dynamic scales, 1×16 blocks,
RNE — minite's activations), the codes of x's rows are the N token rows' codes gathered through the layout, so the
recipe keeps those (each token's first row of the forward's codes; the reference loop quantizes those rows once)
and backward gathers them to x's rows before the GEMM (`_from_token_codes`; a pad row gets the quantizer's codes of
a zero row: codes 0, scale 0, S_dec 1). 1/k of the bytes (k = 8 at Qwen3-30B-A3B). TE's per-tensor scales (one per
expert on the grouped GEMM), static scales and 16×16 tiles are not row-local: their Tp rows' codes are kept.
Per MoE layer and padded row (Tp ≈ N·k rows; D = hidden, I = expert width, k = 8, fp32 S_dec a row):
  kept without it        gate|up output 2·2I + down output 2·D bytes  (D 2048, I 768: 3,072 + 4,096 = 7,168 B)
  kept with it, per-row  codes of x: D/2 + D/16 + 4, of h: I/2 + I/16 + 4  (1,156 + 436 = 1,592 B: 0.22x)
  ... per-token scales   codes of x per token: (D/2 + D/16 + 4)/k, of h as above  (144.5 + 436 ≈ 581 B: 0.081x)
The price is the two forward GEMMs again in backward (+ a decode of the codes and the reading op's forward): 2·Tp·D·3I
FLOPs a layer, a third of the experts' 6·Tp·D·3I in a step; with token rows also a gather of the codes.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools

import torch
from torch import nn

from minite_core.formats.nvfp4 import NVFP4Tensor
from minite_core.kernels import dispatch
from minite_core.kernels.dispatch import DqOperand
from minite_core.nn import nonfinite
from minite_core.nn.arithmetic import GemmCall, linear_gemm
from minite_core.nn.expert_weights import expert_weight
from minite_core.nn.linear import linear
from minite_core.nn.operands import cache_context, quantize, torch_dtype
from minite_core.nn.moe_layout import MoELayout
from minite_core.nn.recompute import Remade
from minite_core.nn.shard import current as current_shard
from minite_core.profiles import PROFILES, Profile, Quant
from minite_core.seeds import EXPERT_SEED_STRIDE, dgrad_seed, expert_seed, wgrad_seed


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, layout: MoELayout, profile: Profile, *,
                   input_amax: torch.Tensor | None = None, seed: int = 0, cache: dict | None = None,
                   expert_offset: int = 0, fused_quant: bool = False, remade: bool = False,
                   token_rows: bool = False) -> torch.Tensor | Remade:
    """x: (Tp, K) in the padded sorted layout; weight: (E, N, K) -> (Tp, N) in the compute dtype.
    expert_offset: global index of weight[0] (an expert-parallel rank's slice of the experts): SR seeds and cache
    keys are the global expert's. fused_quant (NVFP4 fast path): quantize x (forward), dy (dgrad) and dyᵀ (wgrad)
    inside the grouped GEMMs (kernels/quant_prologue.py) instead of a separate quantize pass first — the same bits.
    remade: return y as a `Remade` (nn.recompute) holding, where `_remakes` says so, the packed row codes of the
    quantized x and the recipe that makes y again from them (`GroupedLinear.remake_output`); the forward's
    quantizer then runs as the separate pass (it writes the codes), whatever fused_quant says. token_rows: x is
    `moe_layout.permute(x_tokens, layout)` (each token's row copied to its k rows, pad rows zero); with a row-local
    activation spec (`_row_local`) the recipe keeps the codes of the N token rows only (`_from_token_codes`)."""
    if profile.weight is not None and current_shard() is not None:
        raise NotImplementedError("NVFP4 expert GEMMs on a data-parallel token shard: per-expert amaxes and "
                                  "16-token wgrad blocks span ranks (needs expert parallelism); use the bf16 "
                                  "profile or one process for an MoE model")
    remake = remade and _remakes(x, weight, profile)
    per_token = remake and token_rows and _row_local(profile.activation)
    recipe = None  # remake: (the saved tensors, the function that makes y from them)
    # an arithmetic without a grouped kernel (nn.arithmetic: TE's reference GEMM, vLLM's CPU kernel, per-channel xᵀ
    # scales) runs the reference loop
    if dispatch.fast_path(x) and (profile.weight is None or linear_gemm(profile).grouped):
        if profile.weight is None:  # no seeds, the cache holds this module's slice: expert_offset changes nothing
            y = _grouped_bf16(x, weight, layout, profile, cache)
        else:
            if profile.activation is not None and profile.activation.static and input_amax is None:
                raise RuntimeError(f"profile {profile.name!r} uses static activation scales: run "
                                   "minite_core.nn.calibrate(model, batches) first")
            dtype = torch_dtype(profile.dtype)
            wgrad = torch.is_grad_enabled() and weight.requires_grad  # no-grad calls (decode, eval) quantize no xᵀ
            y = _GroupedNVFP4.apply(x.to(dtype), weight, profile, layout, input_amax, seed, cache, expert_offset,
                                    wgrad, fused_quant, remake)
            if remake:  # (Tp, N), then x̂'s row codes: data (Tp, K/2), scale (Tp, K/16), S_dec (Tp, 1)
                y, *codes = y
                make = functools.partial(_remake_grouped, profile, layout, cache, dtype)
                if per_token:  # x̂'s rows of each token's first copy: the forward's codes, (N, ...)
                    codes = [c.index_select(0, layout.dest[:, 0]) for c in codes]
                    make = functools.partial(_from_token_codes, make, profile.activation, layout, dtype)
                recipe = (*codes, weight.detach()), make
    else:
        bounds = layout.bounds()  # reference: host loop over experts (one sync); empty experts are skipped
        outs = [linear(x[s:t], weight[e], profile, input_amax=input_amax, seed=expert_seed(seed, e + expert_offset),
                       cache=cache, key=e + expert_offset)
                for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:])) if t > s]
        y = torch.cat(outs)
        if remake:
            dtype = torch_dtype(profile.dtype)
            make = functools.partial(_remake_loop, profile, bounds, cache, expert_offset, y.dtype)
            if per_token:  # each token's first row quantized once: the codes its expert's `linear` gave every copy
                with torch.no_grad():
                    q = quantize(x.to(dtype).index_select(0, layout.dest[:, 0]), profile.activation)
                codes = q.data, q.scale, q.global_scale
                make = functools.partial(_from_token_codes, make, profile.activation, layout, dtype)
            else:
                codes = _expert_codes(x.to(dtype), profile, bounds, input_amax)
            recipe = (*codes, weight.detach()), make
    if not remade:
        return y
    return Remade(y) if recipe is None else Remade(y, *recipe)


# ---- remake_output: the GEMM's output made again in backward from its input's row codes ---------------------------
def _remakes(x: torch.Tensor, weight: torch.Tensor, profile: Profile) -> bool:
    """Whether `remade` keeps codes: NVFP4 activations under the plain W4A4 arithmetic (nn.arithmetic.Reference, the
    grouped kernels' and the expert loop's; not W4A16, packed weights or a peer's GEMM), in a forward that autograd
    records (else no op keeps y anyway)."""
    gemm = linear_gemm(profile)
    return (profile.weight is not None and profile.activation is not None and gemm.grouped and not gemm.packed
            and torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))


def _row_local(spec: Quant) -> bool:
    """Whether a row's codes, E4M3 scales and S_dec under `spec` depend on that row alone: per-token dynamic scales
    (each row's S_dec from its own amax), 1×16 blocks, RNE (no SR stream indexed by row). minite's activations;
    not TE's per-tensor scales (per expert on the grouped GEMM), a static scale or 16×16 tiles."""
    return (spec.scale_mode == "row" and not spec.static and tuple(spec.block) == (1, 16)
            and spec.rounding == "rne")


def _from_token_codes(make, spec: Quant, layout: MoELayout, dtype, data, scale, s_dec, weight) -> torch.Tensor:
    """`make` on x̂'s row codes gathered from the N token rows' (`token_rows`): data (N, K/2), scale (N, K/16),
    S_dec (N, 1) with a zero row's codes appended (the quantizer's own: it gives a pad row of x the same) -> each
    row of x through `layout.src` (N for a pad row), as `moe_layout.permute` gathers x itself. Under a row-local
    spec (`_row_local`) a row's codes are a function of the row alone, so these are the codes the forward made."""
    with torch.no_grad():
        zero = quantize(data.new_zeros(1, 2 * data.shape[1], dtype=dtype), spec)  # codes 0, scale 0, S_dec 1
    rows = [torch.cat([t, z]).index_select(0, layout.src)
            for t, z in zip((data, scale, s_dec), (zero.data, zero.scale, zero.global_scale))]
    return make(*rows, weight)


def _remake_grouped(profile: Profile, layout: MoELayout, cache, dtype, data, scale, s_dec, weight) -> torch.Tensor:
    """The fast forward's y again: its grouped GEMM kernel, tile schedule and cached weight operand on x̂ decoded from
    the saved codes — e2m1(q)·sf in bf16, exact, the values the quantizer handed the forward's GEMM."""
    x_op = DqOperand(dispatch.dequantize_bf16(NVFP4Tensor(data, scale, s_dec)), s_dec)
    w_op = expert_weight(weight, profile.weight, cache, "n")
    return dispatch.grouped_gemm(x_op, w_op, layout.offs, dtype, schedule=layout.cache["schedule_fwd"],
                                 invariant=profile.batch_invariant)


def _expert_codes(x: torch.Tensor, profile: Profile, bounds: list[int], input_amax) -> tuple:
    """The reference loop's row codes of x (Tp, K): each expert's rows quantized as its `linear` quantizes them
    (nn.arithmetic.Reference.fprop: this call on these rows, so the same codes), its S_dec broadcast to its rows ->
    (data (Tp, K/2), scale (Tp, K/16), S_dec (Tp, 1))."""
    act = profile.activation
    with torch.no_grad():
        parts = [quantize(x[s:t], act, amax=input_amax if act.static else None)
                 for s, t in itertools.pairwise(bounds) if t > s]
    s_dec = [p.global_scale.reshape(-1, 1).expand(p.data.shape[0], 1) for p in parts]
    return torch.cat([p.data for p in parts]), torch.cat([p.scale for p in parts]), torch.cat(s_dec)


def _remake_loop(profile: Profile, bounds: list[int], cache, expert_offset: int, dtype, data, scale, s_dec,
                 weight) -> torch.Tensor:
    """The reference loop's y again: per expert the same arithmetic (`fprop_dq`) on x̂ decoded from the saved codes
    and the same cached weight operand. A per-tensor S_dec comes back per row: x̂ · S_dec is the same fp32 product."""
    gemm, outs = linear_gemm(profile), []
    for e, (s, t) in enumerate(itertools.pairwise(bounds)):
        if t > s:
            x_op = DqOperand(dispatch.dequantize_bf16(NVFP4Tensor(data[s:t], scale[s:t], s_dec[s:t])), s_dec[s:t])
            call = GemmCall(weight[e], profile, cache, e + expert_offset, None, None, 0, dtype)
            outs.append(gemm.fprop_dq(call, x_op))
    return torch.cat(outs)


# ---- BF16: torch._grouped_mm -----------------------------------------------------------------------------------
def _bf16_weight(weight: torch.Tensor, cache: dict | None) -> torch.Tensor:
    """weight (E, N, K) as bf16, cast once per weight version (cleared after optimizer steps, see nn.linear)."""
    version = (weight._version, weight.data_ptr())
    key = ("bf16", torch.is_inference_mode_enabled())  # an inference tensor cannot be saved for backward
    hit = cache.get(key) if cache is not None else None
    if hit is not None and hit[0] == version:
        return hit[1]
    with cache_context():
        w = weight.detach().to(torch.bfloat16)
    if cache is not None:
        cache[key] = (version, w)
    return w


class _GroupedMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, w_bf16, layout: MoELayout):
        # x (Tp, K) bf16; w_bf16 (E, N, K). At decode the segments end at MoELayout.live_rows (group_ends) and the
        # filler past it, not computed, is written as the zeros it is
        ctx.save_for_backward(x, w_bf16)
        ctx.w_dtype, ctx.layout = weight.dtype, layout
        live_ends, filler = group_ends(layout)
        y = torch._grouped_mm(x, w_bf16.transpose(-2, -1), offs=live_ends)  # rows past live_ends[-1]: not written
        return y if filler is None else y.masked_fill_(filler, 0)

    @staticmethod
    def backward(ctx, dy):
        x, w_bf16 = ctx.saved_tensors
        ends = segment_ends(ctx.layout)
        dy = dy.contiguous()
        dx = torch._grouped_mm(dy, w_bf16, offs=ends) if ctx.needs_input_grad[0] else None  # (Tp, K)
        dw = None
        if ctx.needs_input_grad[1]:  # (E, N, K): per group dyᵀ x over the group's rows
            dw = torch._grouped_mm(dy.t(), x, offs=ends).to(ctx.w_dtype)
        return dx, dw, None, None


def segment_ends(layout: MoELayout) -> torch.Tensor:
    """_grouped_mm's `offs` for this layout: the segment ends, int32 (E,). Cached."""
    ends = layout.cache.get("ends")
    if ends is None:
        ends = layout.cache["ends"] = layout.offs[1:].to(torch.int32)
    return ends


def group_ends(layout: MoELayout) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A forward's _grouped_mm `offs` and filler mask: the segment ends with the last one at
    `MoELayout.live_rows` and the rows past it (decode: the filler is skipped, its outputs zeros), or the plain
    ends and None. From the layout kernel's launch where it ran, else derived once (cached)."""
    live = layout.live_rows()
    if live is None:
        return segment_ends(layout), None
    if layout.live_outputs is not None:
        return layout.live_outputs[1], layout.filler()
    live_ends = layout.cache.get("live_ends")
    if live_ends is None:
        live_ends = layout.cache["live_ends"] = torch.cat([segment_ends(layout)[:-1], live.to(torch.int32)])
    return live_ends, layout.filler()


def _grouped_bf16(x, weight, layout, profile, cache):
    dtype = torch_dtype(profile.dtype)
    if dtype != torch.bfloat16:
        raise ValueError(f"profile {profile.name!r}: the fast grouped path runs bf16 only, got dtype {profile.dtype}")
    return _GroupedMM.apply(x.to(dtype), weight, _bf16_weight(weight, cache), layout)


# ---- NVFP4: Triton grouped kernels -------------------------------------------------------------------------------
def segment_amax(values: torch.Tensor, segment: torch.Tensor, num_segments: int) -> torch.Tensor:
    """max of `values` per segment id (zeros for empty segments): (num_segments,) fp32."""
    out = torch.zeros(num_segments, dtype=torch.float32, device=values.device)
    return out.scatter_reduce(0, segment, values.float(), reduce="amax", include_self=True)


def _row_seeds(seeds, layout: MoELayout):
    """Per-expert SR seeds (E,) -> the quantizers' per-row stream (seed of the row's expert, expert-local row), or
    None without SR."""
    return None if seeds is None else (seeds[layout.row_expert], layout.row_local)


def _row_scales(x, spec: Quant, layout: MoELayout, input_amax, fused: bool):
    """(scale_mode, amax) that x (Tp, C)'s rows are quantized with: per-token scales as they are (their amax from
    the quantizer's own pass, or with `fused` from a row-amax pass the fused GEMM reads: the same max); a static
    scale as one amax; per-tensor scales per expert (each expert's amax on its rows, broadcast to its rows)."""
    if spec.scale_mode == "row":
        return "row", dispatch.row_amax(x) if fused else None
    if spec.static:
        return "tensor", input_amax
    seg = segment_amax(dispatch.row_amax(x), layout.row_expert, layout.num_experts)
    return "row", seg[layout.row_expert]


def _quantize_rows(x, spec: Quant, layout: MoELayout, *, input_amax=None, seeds=None):
    """x (Tp, C) along C with `_row_scales`. seeds: per-expert SR seeds (E,) int64. -> (NVFP4Tensor, DqOperand)."""
    seg_seed = _row_seeds(seeds, layout)
    mode, amax = _row_scales(x, spec, layout, input_amax, fused=False)
    return dispatch.quantize_dq(x, spec, scale_mode=mode, amax=amax, check=False, seg_seed=seg_seed)


def _rows_gemm(x, spec: Quant, w_op: DqOperand, layout: MoELayout, schedule, out_dtype, *, fused: bool,
               input_amax=None, seeds=None, invariant: bool = False):
    """Per expert x̂ ŵ[e]ᵀ with x (Tp, C) quantized along C as `_quantize_rows` quantizes it -> (y (Tp, N), S_dec of
    x̂, x̂'s NVFP4Tensor or None). fused: the quantizer runs in the grouped GEMM's prologue
    (`dispatch.grouped_gemm_quant`: no bf16 x̂ and no codes in memory; the same bits); else the separate quantize
    pass, then `dispatch.grouped_gemm`."""
    if not (fused and dispatch.fused_quant_spec(spec)):
        x_q, x_op = _quantize_rows(x, spec, layout, input_amax=input_amax, seeds=seeds)
        y = dispatch.grouped_gemm(x_op, w_op, layout.offs, out_dtype, schedule=schedule, invariant=invariant)
        return y, x_op.global_scale, x_q
    seg_seed = _row_seeds(seeds, layout)
    mode, amax = _row_scales(x, spec, layout, input_amax, fused=True)
    amax = torch.as_tensor(amax, dtype=torch.float32, device=x.device)
    amax = amax.reshape(()) if mode == "tensor" else amax  # a static scale: one for the tensor, as the quantizer's
    y, s_dec = dispatch.grouped_gemm_quant(x, spec, amax, w_op, layout.offs, out_dtype, seg_seed=seg_seed,
                                           schedule=schedule, invariant=invariant)
    return y, s_dec, None


def _packed_forward(x, weight, profile: Profile, layout: MoELayout, input_amax, cache) -> torch.Tensor:
    """decode_gemm="packed" (profiles.py): one grouped launch on the packed expert weights, the activation
    quantizer fused, with the amax per row `_quantize_rows` would use (per-token: computed in the kernel's launcher;
    static: the calibrated amax; per-tensor dynamic: each expert's amax on its rows)."""
    w_p = expert_weight(weight, profile.weight, cache, "n", packed=True)
    schedule = layout.cache.get("packed_schedule")
    if schedule is None:
        schedule = layout.cache["packed_schedule"] = dispatch.grouped_decode_schedule(
            layout.offs, layout.num_rows, layout.live_rows(), layout.dest.numel())
    spec, amax = profile.activation, None
    if spec is not None and spec.static:
        amax = input_amax
    elif spec is not None and spec.scale_mode == "tensor":
        amax = segment_amax(dispatch.row_amax(x), layout.row_expert, layout.num_experts)[layout.row_expert]
    return dispatch.grouped_decode_gemm(x, w_p, layout.offs, spec, amax, x.dtype, schedule=schedule)


def _quantize_cols(x, spec: Quant, layout: MoELayout, *, rht: bool, rht_dtype: str = "float32", seeds=None,
                   emit_dq: bool = False):
    """xᵀ of x (Tp, C) quantized along tokens, per-tensor per expert (RHT first when asked): codes (C, Tp), read
    from x in its natural layout (`kernels.quantize_cols`). Returns (NVFP4Tensor, bf16 values or None, S_dec per
    expert (E,))."""
    seg, block_expert = _col_amax(x, layout, rht, rht_dtype)
    seg_seed = _row_seeds(seeds, layout)
    t, dq = dispatch.quantize_cols(x, spec, rht=rht, rht_dtype=rht_dtype, emit_dq=emit_dq, col_amax=seg[block_expert],
                                   seg_seed=seg_seed)
    s_dec = dispatch.decode_scale(seg)
    return t, dq, s_dec


def _col_amax(x, layout: MoELayout, rht: bool, rht_dtype: str):
    """Each expert's amax of x (Tp, C) (after the RHT along tokens when asked), from the 16-token blocks' amax pass:
    (E,) fp32, and the expert of every 16-token block (T/16,) (cached on the layout)."""
    block_expert = layout.cache.get("block_expert")
    if block_expert is None:
        block_expert = layout.cache["block_expert"] = layout.row_expert[::16].contiguous()
    blocks = dispatch.col_block_amax(x, rht=rht, rht_dtype=rht_dtype)  # (T/16,)
    return segment_amax(blocks, block_expert, layout.num_experts), block_expert


def _wgrad(dy, profile: Profile, layout: MoELayout, x_t_parts, seeds, *, fused: bool):
    """dW (E, N, K) fp32: per expert, dyᵀ quantized along tokens as `_quantize_cols` quantizes it (the grad spec,
    per-expert scales, RHT under TE's recipe, the wgrad SR streams `seeds` (E,)) times the saved packed xᵀ, over
    the expert's tokens -> (dW, S_dec of dyᵀ (E,)). fused: the quantizer runs in the K-grouped GEMM's prologue
    (`dispatch.kgrouped_gemm_quant`: no bf16 dyᵀ copy in memory; the same bits); else the separate pass, then
    `dispatch.kgrouped_gemm`."""
    data, scale, s_xt = x_t_parts
    xt_bf16 = dispatch.dequantize_bf16(NVFP4Tensor(data, scale, s_xt))
    rht, rht_dtype = profile.wgrad_rht, profile.wgrad_rht_dtype
    if fused and dispatch.fused_quant_spec(profile.grad):
        seg, _ = _col_amax(dy, layout, rht, rht_dtype)
        return dispatch.kgrouped_gemm_quant(dy, profile.grad, seg, xt_bf16, s_xt, layout.offs,
                                            seg_seed=_row_seeds(seeds, layout), rht=rht, rht_dtype=rht_dtype)
    _, dyt_bf16, s_dyt = _quantize_cols(dy, profile.grad, layout, rht=rht, rht_dtype=rht_dtype, seeds=seeds,
                                        emit_dq=True)
    return dispatch.kgrouped_gemm(dyt_bf16, s_dyt, xt_bf16, s_xt, layout.offs), s_dyt


class _GroupedNVFP4(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, profile: Profile, layout: MoELayout, input_amax, seed: int, cache, expert_offset,
                wgrad: bool, fused_quant: bool, remake: bool):
        # x (Tp, K) compute dtype; weight (E, N, K) master dtype; wgrad as nn.linear._NVFP4Linear's; fused_quant:
        # the forward's and dgrad's row quantizers run inside their grouped GEMMs (`_rows_gemm`), wgrad's
        # along-token one inside the K-grouped GEMM (`_wgrad`); remake: also return x̂'s row codes (data, scale,
        # S_dec; not differentiable), the forward's quantizer the separate pass
        if linear_gemm(profile).packed:  # the packed-weight grouped GEMM (nn.arithmetic.Packed)
            y = _packed_forward(x, weight, profile, layout, input_amax, cache)
        else:
            w_op = expert_weight(weight, profile.weight, cache, "n")
            schedule = layout.cache.get("schedule_fwd")
            if schedule is None:  # decode: the filler gets no tile (forward only: a backward's dy may reach it)
                live = layout.live_rows()
                schedule = layout.cache["schedule_fwd"] = dispatch.grouped_schedule(
                    layout.offs, None, layout.num_rows, live, layout.dest.numel())
                if live is None:
                    layout.cache["schedule"] = schedule
            if profile.activation is None:  # W4A16 (Marlin): bf16 activations, exact products
                x_op = DqOperand(x.to(torch.bfloat16), torch.ones((), device=x.device))
                y = dispatch.grouped_gemm(x_op, w_op, layout.offs, x.dtype, schedule=schedule,
                                          invariant=profile.batch_invariant)
            else:
                y, s_x, x_q = _rows_gemm(x, profile.activation, w_op, layout, schedule, x.dtype,
                                         fused=fused_quant and not remake, input_amax=input_amax,
                                         invariant=profile.batch_invariant)
                nonfinite.record(weight, s_x, "activation")
        ctx.profile, ctx.layout, ctx.seed, ctx.cache, ctx.x_dtype = profile, layout, seed, cache, x.dtype
        ctx.expert_offset, ctx.fused_quant = expert_offset, fused_quant
        saved = ()
        if profile.grad is not None and wgrad:
            spec = profile.activation or profile.grad
            x_t, _, s_xt = _quantize_cols(x.detach(), dataclasses.replace(spec, rounding="rne"), layout,
                                          rht=profile.wgrad_rht, rht_dtype=profile.wgrad_rht_dtype)
            saved = (x_t.data, x_t.scale, s_xt)
        ctx.save_for_backward(weight, *saved)
        if remake:  # grouped_linear's `_remakes`: NVFP4 activations, so the `_rows_gemm` branch ran
            codes = (x_q.data, x_q.scale, x_q.global_scale)
            ctx.mark_non_differentiable(*codes)
            return y, *codes
        return y

    @staticmethod
    def backward(ctx, dy, *_codes):
        weight, *x_t_parts = ctx.saved_tensors
        profile, layout = ctx.profile, ctx.layout
        if not profile.can_learn:
            raise RuntimeError(f"profile {profile.name!r} has no backward (grad=None); it is a sampler profile")
        experts = torch.arange(layout.num_experts, dtype=torch.int64, device=dy.device) + ctx.expert_offset  # global
        seeds = ctx.seed + experts * EXPERT_SEED_STRIDE  # seeds.expert_seed(seed, e) for every e, on the device
        dy = dy.contiguous()
        dx = dw = None
        if ctx.needs_input_grad[0]:
            w_t = expert_weight(weight, profile.weight, ctx.cache, "t")
            schedule = layout.cache.get("schedule")
            if schedule is None:
                schedule = layout.cache["schedule"] = dispatch.grouped_schedule(layout.offs, None, layout.num_rows)
            dx, s_dy, _ = _rows_gemm(dy, profile.grad, w_t, layout, schedule, ctx.x_dtype, fused=ctx.fused_quant,
                                     seeds=dgrad_seed(seeds))
            nonfinite.record(weight, s_dy, "gradient (dgrad operand)")
        if ctx.needs_input_grad[1]:
            dw, s_dyt = _wgrad(dy, profile, layout, x_t_parts, wgrad_seed(seeds), fused=ctx.fused_quant)
            nonfinite.record(weight, s_dyt, "gradient (wgrad operand)")
            dw = dw.to(weight.dtype)
        return dx, dw, None, None, None, None, None, None, None, None, None


class GroupedLinear(nn.Module):
    """Per-expert y_e = x_e @ W_eᵀ for rows in the padded sorted layout. weight: [E, N, K]."""

    def __init__(self, num_experts: int, in_features: int, out_features: int):
        super().__init__()
        self.num_experts, self.in_features, self.out_features = num_experts, in_features, out_features
        self.weight = nn.Parameter(torch.empty(num_experts, out_features, in_features))
        self.profile: Profile = PROFILES["bf16"]
        self.seed = 0  # stochastic-rounding seed, set per step by the learner
        self.expert_offset = 0  # global index of weight[0]: nonzero on an expert-parallel rank (engines.expert_parallel)
        self.register_buffer("input_amax", None)  # static activation amax (one per grouped GEMM) from calibrate()
        # NVFP4 fast path: x, dy, dyᵀ quantized inside the grouped GEMMs (True) or by separate passes (False):
        # the same bits; the default turns on where bench/kernels.py's `-fused` rows measure it faster on the GPU
        self.fused_quant = False
        # NVFP4 learners: the ops reading this GEMM's output keep its input's packed row codes, not the output, and
        # backward makes it again (module docstring); off by default, on in the learner bench's `+lowmem` rows
        self.remake_output = False
        self.weight_cache: dict = {}  # quantized / bf16 expert weights, see nn.operands.weight_operand

    def forward(self, x: torch.Tensor, layout: MoELayout, remade: bool = False,
                token_rows: bool = False) -> torch.Tensor | Remade:
        """remade: y as a `Remade` (nn.recompute) — with `remake_output` on, holding the row codes of the quantized x
        and the recipe that makes y again (`grouped_linear`), which the op reading y keeps instead of y
        (model/qwen3_moe.py, which asks only with the knob on and in grad mode); off, y alone. token_rows: x is
        the permutation of the token rows (`grouped_linear`): the recipe may keep the tokens' codes only."""
        y = grouped_linear(x, self.weight, layout, self.profile, input_amax=self.input_amax, seed=self.seed,
                           cache=self.weight_cache, expert_offset=self.expert_offset, fused_quant=self.fused_quant,
                           remade=remade and self.remake_output, token_rows=token_rows)
        return Remade(y) if remade and not self.remake_output else y

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, in={self.in_features}, out={self.out_features}, profile={self.profile.name}"

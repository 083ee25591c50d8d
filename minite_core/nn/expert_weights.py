"""The MoE experts' NVFP4 weight operands (nn/experts.py's grouped GEMMs): W (E, N, K) quantized per expert along
K (the forward's operand, "n") or along N (dgrad's Wᵀ, "t"), each expert with its own per-tensor scale from its
amax — what the reference's per-expert `linear` quantizes — as the bf16 copy e2m1(q)·sf the GEMMs read, or packed
(codes + E4M3 scales) for the packed-weight decode GEMM. Cached per weight version (`weight._version` and the
storage), so a step quantizes each weight once per orientation; the caller owns the cache dict.
"""
from __future__ import annotations

import dataclasses

import torch

from minite_core.kernels import dispatch
from minite_core.kernels.dispatch import DqOperand, PackedExperts
from minite_core.nn.operands import cache_context
from minite_core.profiles import Quant


def expert_amax(weight: torch.Tensor, cache: dict | None) -> torch.Tensor:
    """(E,) fp32 max |W_e| of each expert, once per weight version (both orientations quantize with it):
    `vector_norm(ord=inf)` reads W once and makes no |W| temporary — the H200 spent 13.7 ms of a 6-layer minite step
    (16,384 tokens) on `weight.abs()` temporaries of the re-quantized expert weights (bench learner --op-profile)."""
    version = (weight._version, weight.data_ptr())
    hit = cache.get("experts-amax") if cache is not None else None
    if hit is not None and hit[0] == version:
        return hit[1]
    with cache_context():
        amax = torch.linalg.vector_norm(weight.detach().float(), ord=float("inf"), dim=(1, 2))  # exact: a max
    if cache is not None:
        cache["experts-amax"] = (version, amax)
    return amax


def expert_weight(weight: torch.Tensor, spec: Quant, cache: dict | None, orient: str,
                   packed: bool = False) -> DqOperand | PackedExperts:
    """Per-expert NVFP4 weight operand, (E, N, K) along K ("n") or (E, K, N) along N ("t"), each expert with
    its own per-tensor scale (as the reference's per-expert `linear` quantizes it); cached per weight version.
    packed: the codes + scales (PackedExperts, for the packed-weight grouped GEMM) instead of the bf16 copy.
    "t" with 1×16 blocks reads W in place with the along-token quantizer (`weight_t_inplace`); 16×16 tiles (and
    `expert_weight_t_reference`) transpose first."""
    version = (weight._version, weight.data_ptr())
    key = ("experts", orient, spec, packed)
    hit = cache.get(key) if cache is not None else None
    if hit is not None and hit[0] == version:
        return hit[1]
    if orient == "t" and not packed and tuple(spec.block) == (1, 16):
        op = weight_t_inplace(weight, spec, expert_amax(weight, cache))
    else:
        op = _quantize_rows_of(weight, spec, expert_amax(weight, cache), orient, packed)
    if cache is not None:
        cache[key] = (version, op)
    return op


def _quantize_rows_of(weight: torch.Tensor, spec: Quant, amax: torch.Tensor, orient: str, packed: bool):
    """The row quantizer on W (E, N, K) — or on its transposed copy (E, K, N) for orient "t" — every row with its
    expert's amax."""
    E, N, K = weight.shape
    R, C = (N, K) if orient == "n" else (K, N)
    if tuple(spec.block) == (16, 16) and R % 16:
        raise ValueError(f"16x16 weight tiles need expert rows divisible by 16, got weight {tuple(weight.shape)}")
    with cache_context():
        w = weight.detach().float()
        w = w.transpose(1, 2).contiguous() if orient == "t" else w.contiguous()  # (E, R, C)
        quantize = dispatch.quantize if packed else dispatch.quantize_dq
        out = quantize(w.view(E * R, C), spec, scale_mode="row", amax=amax.repeat_interleave(R), check=False)
        t = out if packed else out[0]
        s_dec = t.global_scale.view(E, R)[:, 0].contiguous()
        return (PackedExperts(t.data.view(E, R, C // 2), t.scale.view(E, R, C // 16), s_dec) if packed
                else DqOperand(out[1].values_bf16.view(E, R, C), s_dec))


def weight_t_inplace(weight: torch.Tensor, spec: Quant, amax: torch.Tensor) -> DqOperand:
    """Wᵀ per expert, quantized along N, straight from W (E, N, K) in place: W viewed as [E·N, K] is the
    along-token quantizer's x (its "tokens" = the E·N rows, 16-blocks never straddle experts since N % 16 == 0),
    each 16-block scaled by its expert's amax. The codes of [K, E·N] are the transposed copy's, bit for bit
    (tests/test_fast_learner.py); the GEMM reads them as the strided (E, K, N) view [e, k, n] = [k, e·N + n] —
    no transposed fp32 copy (3.2 GB of traffic per gate|up weight and step at Qwen3-30B-A3B shapes)."""
    E, N, K = weight.shape
    if N % 16:
        raise ValueError(f"expert weights quantized along N need N % 16 == 0, got weight {tuple(weight.shape)}")
    with cache_context():
        w = weight.detach().float().reshape(E * N, K)
        block_amax = amax.repeat_interleave(N // 16)  # (E·N/16,) the expert of each 16-row block
        _, dq = dispatch.quantize_cols(w, dataclasses.replace(spec, rounding="rne"), col_amax=block_amax,
                                       emit_dq=True)  # [K, E·N]
        s_dec = dispatch.decode_scale(amax)
        return DqOperand(dq.view(K, E, N).permute(1, 0, 2), s_dec)


def expert_weight_t_reference(weight: torch.Tensor, spec: Quant) -> DqOperand:
    """The transposing path of orient "t" for any spec (what `weight_t_inplace` equals for 1×16 blocks)."""
    with torch.no_grad():
        return _quantize_rows_of(weight, spec, expert_amax(weight, None), "t", False)

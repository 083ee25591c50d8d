"""Plain-torch references of every kernel in this package (no Triton): what the CPU runs, and what the Triton
kernels are tested against — codes and scales bitwise, GEMM outputs to fp32 accumulation order — plus
`gemm_te_reference`, Transformer Engine's own reference GEMM order (a profile knob, no Triton counterpart)."""
from __future__ import annotations

import torch

from minite_core.formats import nvfp4 as ref
from minite_core.formats.e2m1 import e2m1_decode, unpack_fp4


def quantize_reference(x, *, block=(1, 16), scale_mode="tensor", amax=None, rounding="rne", math="exact",
                       seed=None, rht=False, rht_dtype="float32", emit_dq=False, check=True, four_over_six="off", sr_origin=(0, 0),
                       **_tiles):
    """The plain torch reference behind the same signature (`formats`): RHT pre-pass (its output rounded to
    `rht_dtype`, formats.rht), then `nvfp4.quantize`
    (or `four_over_six.quantize_4over6` when four_over_six is "mae" / "mse")."""
    from minite_core.formats.rht import rht as rht_fn

    if four_over_six != "off":
        from minite_core.formats.four_over_six import quantize_4over6

        if rounding != "rne" or math != "exact" or rht:
            raise ValueError(f"4over6 needs rounding='rne', math='exact' and no RHT, got rounding={rounding!r} "
                             f"math={math!r} rht={rht} (TE 2.20 refuses the same combinations)")
        t = quantize_4over6(x, block=block, scale_mode=scale_mode, amax=amax, err_mode=four_over_six, check=check)
        return t, (ref.dequantize_unscaled(t).to(torch.bfloat16) if emit_dq else None)
    if rounding == "sr" and seed is None:
        raise ValueError("rounding='sr' needs an explicit integer seed (no hidden global RNG)")
    x_in = rht_fn(x, rht_dtype) if rht else x
    t = ref.quantize(x_in, block=block, scale_mode=scale_mode, amax=amax, rounding=rounding, math=math,
                     seed=seed if rounding == "sr" else None, check=check, sr_origin=sr_origin)
    return t, (ref.dequantize_unscaled(t).to(torch.bfloat16) if emit_dq else None)


def gemm_reference(a: ref.NVFP4Tensor, b: ref.NVFP4Tensor, out_dtype=torch.float32) -> torch.Tensor:
    """Plain torch: dequantize both fully in fp32 and multiply in fp32 (float64 when on CPU for a tight check)."""
    return (ref.dequantize(a) @ ref.dequantize(b).t()).to(out_dtype)


def gemm_te_reference(a: ref.NVFP4Tensor, b: ref.NVFP4Tensor, amax_a: torch.Tensor, amax_b: torch.Tensor,
                      e4m3_max=(448.0, 448.0), out_dtype=torch.float32) -> torch.Tensor:
    """a_hat @ b_hat^T [M, N] in the arithmetic of Transformer Engine 2.20's `NVFP4QuantizerRef.qgemm`
    (custom_recipes/reference_nvfp4.py: the GEMM every te.Linear runs under a CustomRecipe, i.e. TE's NVFP4 on
    Hopper), profile knob w4a4_gemm="te-ref". Per 16-element K block: the dot product of the E2M1 code values
    (exact in fp32 in any order: multiples of 1/4 below 2^10), times the two E4M3 block scales (their product and
    that product times the dot are exact); the blocks summed into an fp32 accumulator in ascending K order (the
    only rounding before the epilogue); then times alpha = fp32(amax_a·amax_b) / (36·E_a·E_b), E = the operand's
    E4M3 global bound (448; 256 for 4over6) — TE's global scale comes from the two amaxes, not from the S_dec
    = 1 / (2688 / amax) the operands store — and one rounding to out_dtype. amax_a / amax_b: [] per tensor, or
    one per row ([R] or [R, 1]) of a / b. Plain torch on any device; K / 16 small matmuls."""
    m, k = a.shape
    qa, qb = (e2m1_decode(unpack_fp4(t.data)) for t in (a, b))  # fp32 code values
    sa, sb = a.scale.float(), b.scale.float()  # (M, K/16), (N, K/16)
    y = torch.zeros(m, b.shape[0], dtype=torch.float32, device=qa.device)
    for j in range(k // ref.BLOCK):
        blk = slice(j * ref.BLOCK, (j + 1) * ref.BLOCK)
        y += torch.outer(sa[:, j], sb[:, j]) * (qa[:, blk] @ qb[:, blk].t())
    alpha = torch.div(amax_a.float().reshape(-1, 1) * amax_b.float().reshape(1, -1),
                      36.0 * float(e4m3_max[0]) * float(e4m3_max[1]))
    return (alpha * y).to(out_dtype)


def grouped_gemm_reference(a: ref.NVFP4Tensor, b_experts: list[ref.NVFP4Tensor], offs, out_dtype=torch.float32):
    """Per-expert loop of fp32 dequantized products; rows of `a` in segments offs[e]:offs[e+1]."""
    x = ref.dequantize(a)
    bounds = torch.as_tensor(offs).tolist()
    outs = [x[s:t] @ ref.dequantize(b_experts[e]).t() for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:]))]
    return torch.cat(outs, 0).to(out_dtype)


def kgrouped_gemm_reference(a_experts: list[ref.NVFP4Tensor], b_experts: list[ref.NVFP4Tensor]) -> torch.Tensor:
    """Per-expert fp32 dequantized a_e @ b_eᵀ, stacked: [E, N, K]."""
    return torch.stack([ref.dequantize(a) @ ref.dequantize(b).t() for a, b in zip(a_experts, b_experts)])


def decode_gemm_reference(x: torch.Tensor, w: ref.NVFP4Tensor, *, x_scale=None, out_dtype=torch.float32):
    """Plain torch: fp32 x (times its S_dec when given) @ fully dequantized W^T."""
    xf = x.float() if x_scale is None else x.float() * x_scale.float()
    return (xf @ ref.dequantize(w).t()).to(out_dtype)


def packed_gemm_reference(x: torch.Tensor, w: ref.NVFP4Tensor, *, act=None, amax=None, x_scale=None,
                          block_k: int, split_k: int = 1, out_dtype=torch.float32) -> torch.Tensor:
    """Plain torch in the packed-weight kernel's order (kernels/decode.py): bf16 x̂ = e2m1(q_x)·sf_x (act: the
    quantizer, per-row amaxes as `decode.act_amax` gives them) or x as given, exact bf16 ŵ = e2m1(q_w)·sf_w;
    K cut into `split_k` slices of whole `block_k` chunks; in a slice, chunk by chunk, the even columns' fp32
    product then the odd columns'; the slices' sums added in ascending order; then acc * (S_x * S_w)."""
    if act is not None:
        rows = act_amax_reference(x, act, amax)
        t, xq = quantize_reference(x, scale_mode="row", amax=rows, math=act.math, emit_dq=True, check=False)
        x_scale = t.global_scale  # (M, 1)
    else:
        xq = x.to(torch.bfloat16)
    wq = ref.dequantize_unscaled(w).to(torch.bfloat16)
    k = x.shape[1]
    chunks = -(-k // block_k)
    k_slice = -(-chunks // split_k) * block_k
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
    for s0 in range(0, k, k_slice):
        part = torch.zeros_like(acc)
        for k0 in range(s0, min(s0 + k_slice, k), block_k):
            for parity in (0, 1):
                cols = slice(k0 + parity, k0 + block_k, 2)
                part = part + xq[:, cols].float() @ wq[:, cols].float().t()
        acc = acc + part
    sw = w.global_scale.float()
    sw = sw.reshape(1, -1) if sw.ndim else sw
    sx = torch.ones((), device=x.device) if x_scale is None else x_scale.float()
    return (acc * (sx * sw)).to(out_dtype)


def act_amax_reference(x: torch.Tensor, act, amax=None) -> torch.Tensor:
    """`decode.act_amax` in plain torch: one amax per row (static, per-token, or per-tensor dynamic), fp32 [M]."""
    if amax is not None:
        return amax.float().reshape(-1).expand(x.shape[0])
    rows = x.float().abs().amax(dim=1)
    return rows if act.scale_mode == "row" else rows.amax().expand(x.shape[0])


def attention_reference(q, k, v, mask=None):
    """Plain fp32 (or fp64, for fp64 q) attention (SDPA's math) of `kernels.attention.attention_triton`:
    q (B, H, T, Dh), k/v (B, Hkv, S, Dh), mask (B, 1, T, S) / (B, T, S) bool or None (causal, T == S)."""
    B, H, T, Dh = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    allowed = (torch.ones(T, S, dtype=torch.bool, device=q.device).tril()[None, None] if mask is None
               else mask.reshape(B, 1, T, S))
    dt = torch.promote_types(q.dtype, torch.float32)  # fp32, or fp64 when given fp64
    k, v = (t.to(dt).repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    s = (q.to(dt) @ k.transpose(-1, -2)) / Dh ** 0.5  # (B, H, T, S)
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
    return p @ v

"""Batch-invariant attention (profile knob `batch_invariant`, `minite-onpolicy`): one kernel for the learner's
full-sequence forward, the sampler's prefill and its cached decode, so a query row gets the same bits in all three.

Why: torch SDPA picks flash / memory-efficient / math by mask, shape and length, and each reduces over keys in
its own blocks (flash-decoding also splits KV by length). NVFP4 re-quantization of the next GEMM's input turns
that ulp noise into whole code steps (results/notes/rl_minite_k3.md). Here the reduction order of a query row
depends only on that row's keys:
- one program per (batch row, query head, query) (kernel "row"; the tiled kernels below share a tile of queries
  and argue why that couples no rows): q·k and p·v are fp32 products of bf16 values summed by tl.sum;
- the keys a query may see are the slots [start, end) of its mask row (`key_bounds`: first and last allowed
  slot), walked in blocks of BLOCK_N keys aligned to `start`, in increasing order — so key j of a sequence sits
  in the same lane of the same block whether the sequence starts at slot 0 (learner, right padding) or at slot
  `pad` (sampler, left padding), and whatever the cache length S or the number of queries T;
- online softmax in fp32 (running max m, sum l, accumulator acc); a masked lane has score -inf, so p = 0 and it
  adds exact zeros; m starts at a finite -1e30, so a block before the first real key cannot make NaN.
Output: acc / l rounded once to the input dtype (bf16 RNE). GQA: query head h reads kv head h // (H / Hkv).
Softmax scale 1/sqrt(Dh), as SDPA's default.

Tiled variants (`kernel="tile"`, or "tile-bf16x3", the default; the profile knob `attention_kernel` picks one).
The per-query kernel reloads every key for every query: on the H200 it ran 47x slower than "tile-bf16x3"
(results/notes/h200-tiled-attention-1f4f47b.log) and held the on-policy learner update at 0.25x minite's tokens/s.
Here one program serves BLOCK_M consecutive queries of one (batch row, head) and loads each key block once:
- one compiled binary for every call: the same constexprs (BLOCK_M, BLOCK_N, BLOCK_D, num_warps), T, S, H and
  `has_mask` unspecialized (`do_not_specialize`: T = 1 would otherwise compile its own binary), the mask read at run
  time and an int8 dummy mask pointer without one. So a decode call (one live row, the rest masked) and the learner's
  unmasked call run the code of a masked learner call (q, k, v copied when a view is not 16-byte aligned: Triton
  specializes pointers on it). With the mask a constexpr, the H200 gave a row other fp32 bits in the unmasked
  build than in the masked one, though the PTX looked alike (the log above). Every reduction is per row: scores
  tl.dot(q_tile, kᵀ) (bf16 in, fp32 accumulate: each score is its own q·k dot in a fixed k order — an MMA couples no
  rows; gemm.py's invariant GEMM rests on the same fact), max and sum along the row, p·v tl.dot in fp32 with
  input_precision="ieee" (FMA, no TF32), per element a fixed k-order chain (read in the sm90 PTX: q·kᵀ is a wgmma, p·v
  fma.rn.f32). Under the interpreter both dots are tl.sum of fp32 products: its tl.dot is BLAS, whose rows depend on
  their place in the tile;
- blocks are aligned to `base` = the largest start among the tile's rows with keys — the start of its real
  queries (learner: 0; prefill / decode: the left pad); padded queries (which see only themselves, or start
  earlier) start at or before it, and the walk begins at the first aligned block reaching the lowest start, so
  their keys are visited too (their bits, unlike real rows', may depend on their tile). It ends at the tile's
  largest end;
- a block with none of a row's keys is an exact no-op for it: s = -inf, so max(m, -inf) = m (m is finite: -1e30
  or a real max), alpha is 1 (`where(m_new == m, 1, ...)`, not trusting exp(0)), p = 0, acc·1 + Σ 0·v = acc and
  l·1 + 0 = l — before the row's first key (the state stays the initial one), after its last key, and for a
  fully masked row (start = end = 0: no live keys; 0 / 0 = NaN, as SDPA's math and the per-query kernel). So
  a real row's fp32 state after the walk is what a walk over its own aligned blocks gives, whatever T, S, the
  batch, the tile-mates, or its place in the tile;
- k / v are loaded only for slots some row of the tile may see (others 0), so NaN in unwritten cache slots stays
  out; v of a slot a tile-mate sees must be finite (0·inf = NaN) — the model's values are finite activations.
  Decode (T = 1) computes BLOCK_M rows for its one live row: the price of running the learner's code.
"tile-bf16x3" is the same walk with p·v on the tensor cores (`_pv_rows`): the FMA p·v (fp32 CUDA cores, ~2k FMAs
per thread per key block) is likely "tile"'s bottleneck (not measured yet); three bf16 dots of p's exact split keep
exact products.
The kernels are each invariant but differ from each other (their sums are ordered differently): learner and
sampler must run the same one, so it is a profile knob (`Profile.attention_kernel`; a CUDA graph keeps the one it
captured).

The plain reference (`kernels.reference.attention_reference`) is fp32 masked softmax attention (SDPA's math): the
kernel agrees with it to fp32 rounding, not bitwise (its sums are tl.sum trees). Backward: autograd through the
reference, recomputed (`InvariantAttention`): only the forward must be batch-invariant.

Shape legend: B = batch, H = query heads, Hkv = kv heads, T = queries, S = key slots, Dh = head dim.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minite_core.kernels.gemm import _dot_rows
from minite_core.kernels.interpret import INTERPRET  # its import patches the interpreter
from minite_core.profiles import ATTENTION_KERNELS as KERNELS

BLOCK_N = 32  # keys per block: fixed for every shape (the invariance contract)
BLOCK_M = 64  # queries per program of the tiled kernel: fixed likewise (64 = one Hopper wgmma M; not tuned yet)
DEFAULT_KERNEL = "tile-bf16x3"  # Profile.attention_kernel's default: the fastest; "row" is the plain one


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, mask_ptr, start_ptr, end_ptr,
                      H, T, S, GROUP, scale,
                      HAS_MASK: tl.constexpr, DH: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    # q, o: (B, H, T, Dh); k, v: (B, Hkv, S, Dh) contiguous; mask: (B, T, S) int8; start, end: (B, T) int32
    pid = tl.program_id(0)
    t = pid % T
    h = (pid // T) % H
    b = pid // (T * H)
    hkv = h // GROUP
    Hkv = H // GROUP
    rd = tl.arange(0, BLOCK_D)
    dmask = rd < DH
    row = (b * H + h).to(tl.int64) * T + t
    q = tl.load(q_ptr + row * DH + rd, mask=dmask, other=0.0).to(tl.float32)
    kv_base = (b * Hkv + hkv).to(tl.int64) * S * DH
    bt = b.to(tl.int64) * T + t
    start = tl.load(start_ptr + bt)
    end = tl.load(end_ptr + bt)
    m = tl.full([1], -1.0e30, tl.float32)
    l_sum = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        ok = rn < end
        if HAS_MASK:
            ok = ok & (tl.load(mask_ptr + bt * S + rn, mask=ok, other=0) != 0)
        rn_safe = tl.where(ok, rn, 0).to(tl.int64)
        kvm = ok[:, None] & dmask[None, :]
        k = tl.load(k_ptr + kv_base + rn_safe[:, None] * DH + rd[None, :], mask=kvm, other=0.0).to(tl.float32)
        s = tl.sum(q[None, :] * k, axis=1) * scale  # (BLOCK_N,)
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)  # masked lanes: exp(-inf) = 0
        v = tl.load(v_ptr + kv_base + rn_safe[:, None] * DH + rd[None, :], mask=kvm, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_sum = l_sum * alpha + tl.sum(p, axis=0)
        m = m_new
    out = acc / l_sum
    tl.store(o_ptr + row * DH + rd, out.to(o_ptr.dtype.element_ty), mask=dmask)


@triton.jit
def _pv_rows(p, v_ptrs, kvm, acc, BF16X3: tl.constexpr, INTERPRET: tl.constexpr):
    """acc + p @ v, p (BLOCK_M, BLOCK_N) fp32, v loaded here. Default: fp32 FMA chains in a fixed k order per
    element (input_precision="ieee": no TF32). BF16X3 ("tile-bf16x3"): p = p_hi + p_mid + p_lo, three bf16
    pieces (8 + 8 + 8 of fp32's 24 bits: exact unless p < 2^-110, where p_lo goes subnormal), each through a
    bf16 tensor-core dot with the bf16 v (products exact, fp32 accumulation): per row as invariant as q·kᵀ.
    Under the interpreter tl.dot is BLAS sgemm, whose row result depends on the row's place in the tile
    (kernels/gemm.py `_dot_rows`), so there the products are summed with tl.sum."""
    if BF16X3:
        v = tl.load(v_ptrs, mask=kvm, other=0.0).to(tl.bfloat16)
        p_hi = p.to(tl.bfloat16)
        r = p - p_hi.to(tl.float32)
        p_mid = r.to(tl.bfloat16)
        p_lo = (r - p_mid.to(tl.float32)).to(tl.bfloat16)
        acc = _dot_rows(p_hi, v, acc, INTERPRET)
        acc = _dot_rows(p_mid, v, acc, INTERPRET)
        return _dot_rows(p_lo, v, acc, INTERPRET)
    v = tl.load(v_ptrs, mask=kvm, other=0.0).to(tl.float32)
    if INTERPRET:
        return acc + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
    return tl.dot(p, v, acc, input_precision="ieee")


@triton.jit(do_not_specialize=["H", "T", "S", "GROUP", "has_mask"])  # one binary for every call (docstring)
def _attention_tile_kernel(q_ptr, k_ptr, v_ptr, o_ptr, mask_ptr, start_ptr, end_ptr,
                           H, T, S, GROUP, scale, has_mask,
                           DH: tl.constexpr, BLOCK_D: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BF16X3: tl.constexpr,
                           INTERPRET: tl.constexpr):
    # the tiled variant (module docstring): one program per (b, h, tile of BLOCK_M queries); same layouts as above
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(T, BLOCK_M)
    tile = pid % n_tiles
    h = (pid // n_tiles) % H
    b = pid // (n_tiles * H)
    hkv = h // GROUP
    Hkv = H // GROUP
    rm = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # query index t of each row
    rd = tl.arange(0, BLOCK_D)
    row_ok = rm < T
    dmask = rd < DH
    qo = ((b * H + h).to(tl.int64) * T + rm)[:, None] * DH + rd[None, :]
    qm = row_ok[:, None] & dmask[None, :]
    q = tl.load(q_ptr + qo, mask=qm, other=0.0)  # (BLOCK_M, BLOCK_D) bf16
    kv_base = (b * Hkv + hkv).to(tl.int64) * S * DH
    bt = b.to(tl.int64) * T + rm
    start = tl.load(start_ptr + bt, mask=row_ok, other=0)
    end = tl.load(end_ptr + bt, mask=row_ok, other=0)
    live = row_ok & (end > start)  # rows with at least one key (empty rows have start = end = 0)
    base = tl.max(tl.where(live, start, 0), axis=0)  # the real rows' start: blocks are aligned to it
    lo = tl.min(tl.where(live, start, base), axis=0)
    hi = tl.max(tl.where(live, end, 0), axis=0)
    n_first = base - tl.cdiv(base - lo, BLOCK_N) * BLOCK_N  # earlier rows' keys (padded queries): aligned blocks
    m = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(n_first, hi, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        ok = (rn[None, :] >= start[:, None]) & (rn[None, :] < end[:, None]) & live[:, None]  # (BLOCK_M, BLOCK_N)
        # the mask is read at run time (has_mask 0: no load, `other` keeps ok): one binary (module docstring)
        ok = ok & (tl.load(mask_ptr + bt[:, None] * S + rn[None, :], mask=ok & (has_mask != 0), other=1) != 0)
        used = tl.max(ok.to(tl.int32), axis=0) != 0  # keys some row of the tile may see
        rn_safe = tl.where(used, rn, 0).to(tl.int64)
        kvo = kv_base + rn_safe[:, None] * DH + rd[None, :]
        kvm = used[:, None] & dmask[None, :]
        k = tl.load(k_ptr + kvo, mask=kvm, other=0.0)  # (BLOCK_N, BLOCK_D) bf16
        s = _dot_rows(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), INTERPRET) * scale  # fp32 acc
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.where(m_new == m, 1.0, tl.exp(m - m_new))  # a block with no key of this row: exactly 1
        p = tl.where(ok, tl.exp(s - m_new[:, None]), 0.0)
        acc = _pv_rows(p, v_ptr + kvo, kvm, acc * alpha[:, None], BF16X3, INTERPRET)
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        m = m_new
    out = acc / tl.where(row_ok, l_sum, 1.0)[:, None]  # rows past T: 0 / 1 (not stored); no keys: 0 / 0 = NaN
    tl.store(o_ptr + qo, out.to(o_ptr.dtype.element_ty), mask=qm)


def key_bounds(mask: torch.Tensor | None, B: int, T: int, S: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(start, end) (B, T) int32: the first allowed slot and one past the last of each query's mask row
    (mask (B, T, S) bool); mask None = plain causal over T == S keys (start 0, end t + 1). Device ops only."""
    if mask is None:
        end = torch.arange(1, T + 1, device=device, dtype=torch.int32).expand(B, T).contiguous()
        return torch.zeros(B, T, dtype=torch.int32, device=device), end
    m = mask.to(torch.int8)
    start = m.argmax(-1)  # first True (argmax returns the first maximal index)
    end = torch.where(m.any(-1), S - m.flip(-1).argmax(-1), 0)  # a fully masked row: start = end = 0, no keys
    return start.to(torch.int32).contiguous(), end.to(torch.int32).contiguous()


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """Contiguous and 16-byte aligned: Triton specializes a pointer on 16-byte divisibility, so a view at an odd
    offset (a slice of a fused projection) would compile, and run, another binary."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def attention_kernel(kernel: str | None = None) -> str:
    """kernel (a profile's `attention_kernel`), else DEFAULT_KERNEL; checked."""
    name = kernel or DEFAULT_KERNEL
    if name not in KERNELS:
        raise ValueError(f"unknown attention kernel {name!r}; one of {list(KERNELS)}")
    return name


def attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, *,
                     kernel: str | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(Dh)) v per query row in fixed key blocks. q (B, H, T, Dh), k/v (B, Hkv, S, Dh),
    mask (B, 1, T, S) or (B, T, S) bool (True = may attend) or None (causal, T == S) -> (B, H, T, Dh) q.dtype.
    kernel: one of KERNELS or None (`attention_kernel`); out_dtype: float32 = acc / l before the final rounding
    (tests: bf16 output hides most reduction-order changes; the contract holds for these fp32 bits)."""
    B, H, T, Dh = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    kernel = attention_kernel(kernel)
    if H % Hkv:
        raise ValueError(f"attention: query heads {H} not a multiple of kv heads {Hkv}")
    if mask is None and S != T:
        raise ValueError(f"attention without a mask is causal over T == S keys, got T={T} S={S}")
    dtypes = (torch.bfloat16,) if kernel == "tile-bf16x3" else (torch.bfloat16, torch.float16)
    if kernel != "row" and not (q.dtype == k.dtype == v.dtype and q.dtype in dtypes):
        raise ValueError(f"{kernel} attention takes {'/'.join(map(str, dtypes))} q, k, v (tensor-core q·kᵀ), got "
                         f"{q.dtype}/{k.dtype}/{v.dtype}")
    mask3 = None if mask is None else mask.reshape(B, T, S)
    start, end = key_bounds(mask3, B, T, S, q.device)
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    o = torch.empty(q.shape, dtype=out_dtype or q.dtype, device=q.device)
    # without a mask a dummy int8 pointer (never read): the pointer type is part of the compiled signature
    m8 = mask3.to(torch.int8).contiguous() if mask3 is not None else start.view(torch.int8)
    args = (q, k, v, o, m8, start, end, H, T, S, H // Hkv, 1.0 / math.sqrt(Dh))
    shape = {"DH": Dh, "BLOCK_D": triton.next_power_of_2(Dh), "BLOCK_N": BLOCK_N, "num_warps": 4}
    if kernel != "row":
        grid = (B * H * triton.cdiv(T, BLOCK_M),)
        _attention_tile_kernel[grid](*args, int(mask3 is not None), BLOCK_M=BLOCK_M, BF16X3=kernel == "tile-bf16x3",
                                     INTERPRET=INTERPRET, **shape)
    else:
        _attention_kernel[(B * H * T,)](*args, HAS_MASK=mask3 is not None, **shape)
    return o


class InvariantAttention(torch.autograd.Function):
    """Forward: `attention_triton`; backward: autograd through `attention_reference` (fp32), recomputed."""

    @staticmethod
    def forward(ctx, q, k, v, mask, kernel: str | None = None):
        ctx.save_for_backward(q, k, v)
        ctx.mask = mask
        return attention_triton(q, k, v, mask, kernel=kernel)

    @staticmethod
    def backward(ctx, do):
        from minite_core.kernels.reference import attention_reference

        q, k, v = ctx.saved_tensors
        with torch.enable_grad():
            qf, kf, vf = (t.detach().float().requires_grad_(t.requires_grad) for t in (q, k, v))
            o = attention_reference(qf, kf, vf, ctx.mask)
            inputs = [t for t in (qf, kf, vf) if t.requires_grad]
            grads = iter(torch.autograd.grad(o, inputs, do.float()))
        return tuple(next(grads).to(t.dtype) if t.requires_grad else None for t in (q, k, v)) + (None, None)

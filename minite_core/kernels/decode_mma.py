"""Packed-weight decode GEMM on tensor cores, for up to 16 rows: y [M, N] = x [M, K] @ ŵ [N, K]ᵀ · S_w (· S_x) from
NVFP4 codes + E4M3 scales, the weights dequantized in registers straight into the MMA's operand (CUDA C in
decode_mma.cu, compiled at first use with NVRTC; sm_80 and newer).

Why a second decode kernel: the Triton one (kernels/decode.py) streams packed weights at ~0.2 of the copy
bandwidth however it is tiled, because Triton moves every dequantized tile through a register-layout conversion into
the MMA fragment (results/h200/bench/NOTES.md row 26). Here the codes are stored once in the order the MMA reads them
(`mma_layout`, the idea of Marlin's offline weight permutation): a lane's one 16-byte load is exactly the A fragments
of its 4 MMA k-steps of a 64-column chunk, rows g and g + 8 — so no conversion, no shared memory for weights, and one
E4M3 scale per row a chunk. The k-steps read K in a permuted order inside the chunk (step j of lane t: columns
16t + 4j .. +3), the same for x, so x's fragment is 32 contiguous bytes of one row.

Dequantization (decode_mma.cu `dequant`): a code's magnitude bits shifted onto a bf16's exponent/mantissa give
e2m1 · 2^-126 (0.5 as a subnormal), one bf16x2 multiply by sf · 2^119 gives ŵ · 2^-7 — exact (e2m1 · e4m3 has at
most 5 significant bits, and |ŵ| >= 2^-10) — and the epilogue multiplies 2^7 back, exactly. About 2.5 integer
instructions a weight.

Work split: a block of `warps` warps takes as many 16-row tiles of N and one K slice; x's slice sits in shared memory
for the block. Split-K (grid.y) as in the Triton kernel: fp32 partials, and the last block of a column (an atomic ticket)
adds them in ascending slice order — deterministic, one launch, capturable in a CUDA graph.

Numerics: the values of the reference (bf16 products of exact operands, fp32 accumulation); the accumulation order
is the MMA's within a k-step and ascending k-steps, chunks and slices otherwise — not the Triton kernel's, so the
profiles' `decode_gemm: "packed"` names both (profiles.py). A row's result does not depend on the other rows of the
call (each x row is its own MMA column), nor on M.

Activations: bf16 x as given (W4A16, or W4A4 on an already-quantized x̂ with its S_dec), or W4A4 with x quantized
here — in the kernel while x is staged (one row), or once by `quantize_rows` (from CONFIG's rows_quant_min rows), both
the quantizer's bits.

Where it runs: `supported` / `grouped_supported` (CUDA, sm_80+, M <= 16 or the MoE layout's 16-row tiles, K % 64 == 0,
N % 16 == 0); kernels/gemm_ops.py sends every other call to the Triton kernel.
"""
from __future__ import annotations

import functools
import weakref
from contextlib import contextmanager
from pathlib import Path

import torch

from minite_core.formats import nvfp4 as ref

SOURCE = Path(__file__).with_name("decode_mma.cu")
# warps: 16-row tiles of N a block; unroll: 64-column chunks whose loads a warp has in flight together (512 bytes
# each); max_slice: chunks a K slice at most (x's slice in shared memory <= 33 KB at 16 rows); blocks_per_sm: what
# split-K aims for. `bench kernels --only decode --sweep` times other values.
# rows_quant_min: from this many rows a per-row or static-scale W4A4 quantizes x once (`quantize_rows`, one launch)
# and the kernel reads x̂ — the fused quantizer repeats that work in every block: as fast at one row, faster from 4
# (results/h200/bench/NOTES.md row 28); the MoE's layout rows too (row 33: its per-token W4A4 decode 1.13x faster
# at batch 16-64, 1.19x at 256).
CONFIG = dict(warps=4, unroll=4, max_slice=16, blocks_per_sm=4, rows_quant_min=2)
# the fused quantizer at 9-16 rows: every block quantizes its x slice, so fewer, wider blocks (the sweep's best there)
WIDE_QUANT = dict(warps=8, unroll=8, blocks_per_sm=2)
MAX_ROWS = 16

_OFF = [False]  # `off()`: the Triton kernel for every call (benches time both in one process)
_KERNELS: dict = {}
_LAYOUTS: dict = {}  # id(w.data) -> (weakref to w.data, wq, ws): a packed weight's mma layout, made once


@contextmanager
def off():
    """Within the block, `supported` says no: every packed decode GEMM runs the Triton kernel (A/B benches)."""
    _OFF[0] = True
    try:
        yield
    finally:
        _OFF[0] = False


def supported(x: torch.Tensor, w: ref.NVFP4Tensor, out_dtype=torch.bfloat16) -> bool:
    """Whether this kernel takes the call (else the Triton kernel does): shapes and device only."""
    n, k = w.shape
    return (not _OFF[0] and x.is_cuda and _capability(x.device) >= (8, 0) and 0 < x.shape[0] <= MAX_ROWS
            and k % 64 == 0 and n % 16 == 0 and out_dtype in (torch.bfloat16, torch.float32))


@functools.cache
def _capability(device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def mma_layout(w) -> tuple[torch.Tensor, torch.Tensor]:
    """codes [N, K/2] + scales [N, K/16] -> (wq uint8 [N/16, K/64, 32, 16], ws uint8 [N/16, K/64, 32, 2]).

    Lane (g, t) of tile nt, chunk c: rows nt·16 + g (h = 0) and + 8 (h = 1), columns c·64 + 16t + 4j + 2a + b of
    k-step j; word j's nibble p = 4b + 2a + h — so register r of the step (nibbles r and r + 4) is the MMA's A register
    r: rows g / g + 8 alternating, columns (+0, +1) then (+2, +3). Scales: byte h of lane (g, t) = block 4c + t of
    row g + 8h."""
    data = w.data.reshape(-1, w.data.shape[-1])  # experts [E, N, K/2]: their rows stacked (tiles never straddle)
    n, k = data.shape[0], data.shape[1] * 2
    codes = torch.stack([data & 15, data >> 4], dim=-1).reshape(n // 16, 2, 8, k // 64, 4, 4, 2, 2)
    codes = codes.permute(0, 3, 2, 4, 5, 7, 6, 1).reshape(n // 16, k // 64, 32, 16, 2)  # nt, c, (g t), (j b a h)
    wq = codes[..., 0] | (codes[..., 1] << 4)
    scales = w.scale.view(torch.uint8).reshape(n // 16, 2, 8, k // 64, 4).permute(0, 3, 2, 4, 1)  # nt, c, g, t, h
    return wq.contiguous(), scales.reshape(n // 16, k // 64, 32, 2).contiguous()


def _layout(w):
    """The mma layout of this packed weight, cached while the weight lives (weight caches drop it per version)."""
    key = id(w.data)
    hit = _LAYOUTS.get(key)
    if hit is not None and hit[0]() is w.data:
        return hit[1], hit[2]
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("mma decode GEMM: call it once outside CUDA-graph capture first (the weight's mma layout "
                           "is made then)")
    wq, ws = mma_layout(w)
    _LAYOUTS[key] = (weakref.ref(w.data, lambda _, key=key: _LAYOUTS.pop(key, None)), wq, ws)
    return wq, ws


def _kernel(mt: int, warps: int, unroll: int, out_f32: bool, grouped: bool, quant: int):
    b = {True: "true", False: "false"}
    return _compiled(f"nvfp4_decode_mma<{mt}, {warps}, {unroll}, {b[out_f32]}, {b[grouped]}, {quant}>")


def _compiled(name: str):
    """The kernel `name` (a template instance of decode_mma.cu), built by NVRTC once a process."""
    if name not in _KERNELS:
        try:
            _KERNELS[name] = torch.cuda._compile_kernel(SOURCE.read_text(), name, nvcc_options=["-std=c++17"])
        except Exception as e:  # noqa: BLE001 - one line naming the cause
            raise RuntimeError(f"mma decode GEMM: NVRTC could not build {name}: {str(e).splitlines()[0]}") from e
    return _KERNELS[name]


def split_k(n: int, k: int, device, cfg: dict, tiles: int = 1) -> tuple[int, int]:
    """(slices, chunks a slice): enough blocks for `blocks_per_sm` an SM over `tiles` row tiles, a slice <=
    `max_slice` chunks. Shapes only, never values."""
    from minite_core.kernels.decode import _sms

    chunks, col_blocks = k // 64, tiles * -(-n // (16 * cfg["warps"]))
    want = max(-(-cfg["blocks_per_sm"] * _sms(device) // col_blocks), -(-chunks // cfg["max_slice"]))
    per = -(-chunks // min(want, chunks))
    return -(-chunks // per), per


def packed_gemm_mma(x: torch.Tensor, w: ref.NVFP4Tensor, *, act=None, amax=None, x_scale: torch.Tensor | None = None,
                    out_dtype=torch.bfloat16, config: dict | None = None) -> torch.Tensor:
    """y [M, N] = (x̂ @ ŵᵀ) · S_w (· S_x), M <= 16. act=None: x as given (bf16) times x_scale (None = 1, [] or
    [M, 1]): W4A16, or W4A4 on an already-quantized x; act=Quant: x (bf16) quantized in the kernel (1x16 RNE, the
    quantizer's arithmetic), amax = its static scale or None (dynamic: per row, or their max). config: keys of
    CONFIG to override (bench sweeps)."""
    m, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"x {tuple(x.shape)} and weight {w.shape} disagree on K")
    sw = w.global_scale.float().reshape(-1).contiguous()
    return _launch(x, w, sw, act, amax, x_scale, None, m, n, k, 0, out_dtype, config)


def grouped_supported(x: torch.Tensor, w, out_dtype=torch.bfloat16) -> bool:
    """The MoE experts' packed GEMM at decode: the layout's tiles are 16 rows (decode.grouped_block_m)."""
    from minite_core.kernels.decode import grouped_block_m

    e, n, k = w.data.shape[0], w.data.shape[1], w.data.shape[2] * 2
    return (not _OFF[0] and x.is_cuda and _capability(x.device) >= (8, 0) and k % 64 == 0 and n % 16 == 0
            and grouped_block_m(x.shape[0], e) == MAX_ROWS and out_dtype in (torch.bfloat16, torch.float32))


def grouped_packed_gemm_mma(x: torch.Tensor, w, offs: torch.Tensor, schedule, *, act=None, amax=None,
                            x_scale=None, out_dtype=torch.bfloat16, config: dict | None = None) -> torch.Tensor:
    """MoE expert GEMM from packed expert weights (operands.PackedExperts) on the padded sorted layout: rows
    offs[e]:offs[e+1] of x [Tp, K] times ŵ[e]ᵀ · S_w[e]; act / amax (one per row [Tp], or static) / x_scale as
    `packed_gemm_mma`; schedule = decode's grouped schedule at 16-row tiles (gemm_ops.grouped_decode_schedule)."""
    e, n, k = w.data.shape[0], w.data.shape[1], w.data.shape[2] * 2
    sw = w.s_dec.float().reshape(e, -1).contiguous()  # (E, 1) per expert tensor or (E, N) per row
    return _launch(x, w, sw, act, amax, x_scale, (schedule, offs.to(torch.int64)), x.shape[0], n, k, sw.stride(0),
                   out_dtype, config)


def quantize_rows(x: torch.Tensor, act, amax=None) -> tuple[torch.Tensor, torch.Tensor]:
    """x (bf16, a few rows) -> (x̂ bf16 [M, K], S_dec [M, 1]) in one launch, one block a row: the quantizer's codes
    times their scales, bitwise (tests/test_decode_mma.py). act: 1x16 RNE blocks, per-row dynamic scales or a static
    amax (`amax`); a per-tensor dynamic amax is the fused path's."""
    m, k = x.shape
    mode = 2 if amax is not None and amax.numel() > 1 else 1 if amax is not None else 0
    if mode == 0 and act.scale_mode != "row":
        raise ValueError("quantize_rows: a per-tensor dynamic amax couples the rows; use the fused quantizer")
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.contiguous()
    xq = torch.empty(m, k, dtype=torch.bfloat16, device=x.device)
    s_dec = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    a = s_dec if amax is None else amax.float().reshape(-1).contiguous()
    name = f"nvfp4_quantize_rows<{'true' if act.math == 'fast' else 'false'}, {mode}>"
    _compiled(name)(grid=(m, 1, 1), block=(256, 1, 1), args=[x, a, xq, s_dec, k, x.stride(0)])
    return xq, s_dec


def _launch(x, w, sw, act, amax, x_scale, grouped, m, n, k, stride_swe, out_dtype, config):
    from minite_core.kernels.decode import _tickets, act_amax
    from minite_core.kernels.grouped import grouped_output

    if act is not None and x.dtype != torch.bfloat16:
        raise ValueError(f"the mma kernel's fused quantizer reads bf16 activations, got {x.dtype}")
    cfg = dict(CONFIG, **(config or {}))
    if (act is not None and m >= cfg["rows_quant_min"]
            and (act.scale_mode == "row" or amax is not None)):  # x̂ once, not once a block (CONFIG; MoE: a layout row)
        x, x_scale = quantize_rows(x, act, amax)
        act = amax = None
    x = x.to(torch.bfloat16)
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.contiguous()
    y = torch.empty(m, n, dtype=out_dtype, device=x.device) if not grouped else grouped_output(
        grouped[0], m, n, out_dtype, x.device)
    if m == 0:
        return y
    wq, ws = _layout(w)
    if act is not None:  # one amax a row; the kernel derives S_enc / S_dec from it
        sx, quant = act_amax(x, act, amax), 2 if act.math == "fast" else 1
    else:
        sx, quant = (sw if x_scale is None else x_scale.float().reshape(-1).contiguous()), 0
    flags = int(sw.shape[-1] > 1) | (2 if x_scale is not None else 0) | (4 if sx.numel() > 1 or quant else 0)
    if grouped:  # tiles: the schedule's upper bound (those past its num_tiles exit)
        (tile_expert, tile_row, num_tiles, tiles, _), offs = grouped
        mt, rows = 2, 16 * tiles
    else:
        mt, tiles, rows = (1 if m <= 8 else 2), 1, m
        tile_expert = tile_row = offs = num_tiles = sw
    if quant and mt == 2 and not grouped and "warps" not in (config or {}):  # 9-16 rows fused: fewer, wider blocks
        cfg.update(WIDE_QUANT)
    col_blocks = -(-n // (16 * cfg["warps"]))
    slices, per = split_k(n, k, x.device, cfg, tiles)
    part = torch.empty(slices * rows * n if slices > 1 else 1, dtype=torch.float32, device=x.device)
    tickets = _tickets(x.device, col_blocks * tiles)
    smem = mt * 8 * (per * 8 + 1) * 16
    _kernel(mt, cfg["warps"], cfg["unroll"], out_dtype == torch.float32, grouped is not None, quant)(
        grid=(col_blocks, slices, tiles), block=(32 * cfg["warps"], 1, 1), shared_mem=smem,
        args=[wq, ws, x, sw, sx, y, part, tickets, tile_expert, tile_row, offs, num_tiles, m, n, k // 64, per,
              x.stride(0), y.stride(0), stride_swe, flags])
    return y

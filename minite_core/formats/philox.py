"""Counter-based random numbers: Philox4x32-10 in plain torch, bit-identical to Triton's `tl.rand`.

Why: a random draw that is a pure function of (seed, element index) gives the same bits on CPU and GPU, in the
plain reference and in a fused kernel, whatever the batch or launch shape — so stochastic rounding and the
sampler's noise are specified to the bit like the rest of the numerics (DESIGN.md), and a row's draws never
depend on its batch-mates. A `torch.Generator` is none of these: its stream depends on how many numbers were
drawn before, and its CPU and CUDA streams differ.

Definition (Triton 3.6, `triton/language/random.py`; Salmon et al., SC'11): key (k0, k1) = the low / high 32 bits
of a 64-bit seed; counter (c0, c1, c2, c3) = (low 32 bits of the offset, high 32 bits, 0, 0); 10 rounds of
    c0' = hi(B * c2) ^ c1 ^ k0,  c2' = hi(A * c0) ^ c3 ^ k1,  c1' = lo(B * c2),  c3' = lo(A * c0),
    k0 += 0x9E3779B9, k1 += 0xBB67AE85          (A = 0xD2511F53, B = 0xCD9E8D57, all mod 2^32)
`rand` keeps c0, reads it as int32 x, folds negatives (x < 0 -> -x - 1) and returns fp32(x) * fp32(4.6566127342e-10),
a float in [0, 1). The 32x32 -> 64-bit products are taken in int64, whose two's-complement wrap-around keeps the
low 64 bits exact; `hi`/`lo` are then a shift and a mask.

`uniform_grid` is the stream the NVFP4 quantizers draw for stochastic rounding: element (r, c) of a matrix takes
output c % 4 of one Philox call at counter (r << 32) + c // 4 (`tl.randint4x`), so a kernel pays one Philox
evaluation per 4 elements instead of one per element.
"""
from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_UNIFORM_SCALE_FP32 = torch.tensor(4.6566127342e-10, dtype=torch.float32).item()  # Triton's scale, rounded to fp32
N_ROUNDS = 10


def philox4(seed: int | torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                      torch.Tensor]:
    """The four 32-bit outputs (c0, c1, c2, c3) of Philox4x32-10 for `seed` at counters `offset` (int64 tensor,
    >= 0), as `tl.randint4x`. seed: an int in [0, 2^64), or an int64 tensor of seeds in [0, 2^63) broadcastable
    against `offset` (one key per row: a batch of independent streams in one call; its values are not
    range-checked, which would need a host sync). Each output is int64 holding the uint32 value, of the
    broadcast shape."""
    if offset.dtype != torch.int64:
        raise ValueError(f"philox offsets must be int64, got {offset.dtype}")
    if isinstance(seed, torch.Tensor):
        if seed.dtype != torch.int64:
            raise ValueError(f"philox seed tensors must be int64, got {seed.dtype}")
        seed, offset = torch.broadcast_tensors(seed, offset)
        k0, k1 = seed & _M32, (seed >> 32) & _M32
    else:
        seed = int(seed)
        if not 0 <= seed < 1 << 64:
            raise ValueError(f"philox seed must be in [0, 2^64), got {seed}")
        k0, k1 = seed & _M32, seed >> 32
    c0, c1 = offset & _M32, (offset >> 32) & _M32
    c2 = c3 = torch.zeros_like(offset)
    for _ in range(N_ROUNDS):
        prod_b, prod_a = c2 * _ROUND_B, c0 * _ROUND_A  # < 2^64: wraps in int64, low 64 bits exact
        c0, c2 = ((prod_b >> 32) & _M32) ^ c1 ^ k0, ((prod_a >> 32) & _M32) ^ c3 ^ k1
        c1, c3 = prod_b & _M32, prod_a & _M32
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    return c0, c1, c2, c3


def to_uniform(x: torch.Tensor) -> torch.Tensor:
    """A uint32 (held in int64) -> fp32 in [0, 1), as Triton's `uint_to_uniform_float`."""
    x = torch.where(x >= 1 << 31, x - (1 << 32), x)  # the uint32 read as int32
    x = torch.where(x < 0, -x - 1, x)
    # the fp32 constant as a Python float: an fp32 tensor times a Python scalar multiplies by fp32(scalar), the
    # same bits as the fp32 tensor constant, with no host-to-device copy (which a CUDA-graph capture forbids)
    return x.to(torch.float32) * _UNIFORM_SCALE_FP32


def uniform(seed: int | torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """`tl.rand(seed, offset)`: fp32 uniforms in [0, 1), one per offset (int64 tensor); seed as in `philox4`."""
    return to_uniform(philox4(seed, offset)[0])


def uniform_grid(seed: int, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Uniforms u[r, c] for int64 row indices `rows` (R, 1) and column indices `cols` (1, C) (or any broadcastable
    pair): output c % 4 of Philox at counter (r << 32) + c // 4. Returns fp32 of the broadcast shape."""
    outs = philox4(seed, (rows << 32) + (cols >> 2))
    lane = (cols & 3).expand_as(outs[0])
    pick = torch.where(lane == 0, outs[0], torch.where(lane == 1, outs[1], torch.where(lane == 2, outs[2], outs[3])))
    return to_uniform(pick)

"""The swizzled 128×4 block-scale layout of Blackwell's block-scaled GEMM (cuBLAS / `torch._scaled_mm`).

The scale matrix [rows, K/16] is padded to a multiple of 128 rows and 4 columns (padding = 0) and cut into
128×4 tiles, stored tile-major (row tiles outer, column tiles inner). Within a tile, row r = 32·i + j and
column c land at byte offset 16·j + 4·i + c: the 32 "j" rows are outermost, so one 16-byte line holds the
4 scales of rows j, j+32, j+64, j+96 — the layout the tensor core reads per thread group (NVIDIA cuBLAS docs,
"1D block scaling factors layout").
"""
from __future__ import annotations

import torch

TILE_ROWS, TILE_COLS = 128, 4


def _ceil_to(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def swizzle_scales(scale: torch.Tensor) -> torch.Tensor:
    """[rows, cols] scales (any 1-byte dtype) -> flat swizzled tensor of padded size."""
    rows, cols = scale.shape
    rows_p, cols_p = _ceil_to(rows, TILE_ROWS), _ceil_to(cols, TILE_COLS)
    raw = scale.view(torch.uint8)
    padded = raw.new_zeros(rows_p, cols_p)
    padded[:rows, :cols] = raw
    # (row_tile, i, j, col_tile, c) -> (row_tile, col_tile, j, i, c)
    tiles = padded.view(rows_p // TILE_ROWS, 4, 32, cols_p // TILE_COLS, TILE_COLS)
    out = tiles.permute(0, 3, 2, 1, 4).contiguous().flatten()
    return out.view(scale.dtype)


def unswizzle_scales(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of `swizzle_scales`: flat swizzled -> [rows, cols]."""
    rows_p, cols_p = _ceil_to(rows, TILE_ROWS), _ceil_to(cols, TILE_COLS)
    if swizzled.numel() != rows_p * cols_p:
        raise ValueError(f"swizzled scales hold {swizzled.numel()} bytes, expected {rows_p * cols_p} for [{rows}, {cols}]")
    raw = swizzled.view(torch.uint8)
    tiles = raw.view(rows_p // TILE_ROWS, cols_p // TILE_COLS, 32, 4, TILE_COLS)
    padded = tiles.permute(0, 3, 2, 1, 4).reshape(rows_p, cols_p)
    return padded[:rows, :cols].contiguous().view(swizzled.dtype)

"""Two fixes to Triton 3.6's interpreter (TRITON_INTERPRET=1, the CPU test and smoke path); compiled kernels on
a GPU are untouched, and importing this module is a no-op unless TRITON_INTERPRET=1.

1. numpy >= 2.4: the interpreter holds every scalar as a 1-element numpy array and implements
   `tensor.__index__` as `int(array)`, which numpy >= 2.4 refuses for ndim > 0 ("only 0-dimensional arrays can be
   converted to Python scalars"), so any kernel whose loop bound is a runtime argument (`for k0 in range(0, K,
   BLOCK_K)`) fails under the interpreter only. `__index__` now reads the single element.
2. fp32 -> bf16 casts: the interpreter truncates the mantissa (`_convert_float` with no rounding mode), while the
   GPU's `cvt.rn.bf16.f32` rounds to nearest even — so every bf16 kernel output differed from torch's `.to(bf16)`
   (measured: 503 of 1024 random values). The cast now rounds to nearest even on the fp32 bits, as the GPU does.
"""
from __future__ import annotations

import os

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _patch() -> None:
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_minite_index_fix", False):
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor._minite_index_fix = True
    interpreter._patch_lang_tensor = patch_lang_tensor

    import numpy as np
    import triton.language as tl

    builder = interpreter.InterpreterBuilder
    cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32).astype(np.uint64)
            rne = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # finite inputs: round to nearest, ties to even
            return interpreter.TensorHandle(rne.astype(np.uint16), tl.bfloat16)
        return cast(self, src, dst_type)

    builder.cast_impl = cast_impl


if INTERPRET:
    _patch()

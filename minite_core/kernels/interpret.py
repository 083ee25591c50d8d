"""Two fixes to Triton 3.6's interpreter (TRITON_INTERPRET=1, the CPU test and smoke path); compiled kernels on
a GPU are untouched, and importing this module is a no-op unless TRITON_INTERPRET=1.

1. numpy >= 2.4: the interpreter holds every scalar as a 1-element numpy array and implements
   `tensor.__index__` as `int(array)`, which numpy >= 2.4 refuses for ndim > 0 ("only 0-dimensional arrays can be
   converted to Python scalars"), so any kernel whose loop bound is a runtime argument (`for k0 in range(0, K,
   BLOCK_K)`) fails under the interpreter only. `__index__` now reads the single element.
2. fp32 -> bf16 casts: the interpreter truncates the mantissa (`_convert_float` with no rounding mode), while the
   GPU's `cvt.rn.bf16.f32` rounds to nearest even — so every bf16 kernel output differed from torch's `.to(bf16)`
   (measured: 503 of 1024 random values). The cast now rounds to nearest even on the fp32 bits, as the GPU does.
3. tl.dot of bf16 operands: the interpreter holds bf16 as raw uint16 bits and matmuls those integers (measured:
   |error| 2e10 on a 16x16 product of N(0,1) values). bf16 operands are now widened to fp32 first (exact; the
   products of bf16 values are exact in fp32, as on the tensor cores).
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

    dot = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def widen(x):  # bf16 bits -> the same values in fp32 (exact)
            f32 = (np.ascontiguousarray(x.data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            return interpreter.TensorHandle(f32, tl.float32)

        if a.dtype.scalar == tl.bfloat16:
            a, b = widen(a), widen(b)
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder.create_dot = create_dot


if INTERPRET:
    _patch()

"""Recompute cheap elementwise regions in backward: the autograd graph keeps a region's inputs, not its insides.

What: `recompute(fn, *inputs)` returns `fn(*inputs)`. In grad mode the graph saves only `inputs` for the region;
backward re-runs `fn` on them under `enable_grad` and differentiates that fresh graph (`torch.autograd.grad`). The
model wraps its elementwise regions in it (model/qwen3_moe.py) under the profile knob `recompute_elementwise` (the
NVFP4 learners): every RMSNorm (fp32 upcast, x², mean, rsqrt, scale, downcast, weight multiply) and SwiGLU
(silu(gate) * up).

Why: at Qwen3-30B-A3B layer shapes (H200, 4 layers, 16,384 tokens) the norms' fp32 upcast and normalised copies
were the largest saved producer (ToCopyBackward0 3.62 GB of 11.06 GB under minite, `bench.saved_activations`) and
SwiGLU's silu(gate) the next elementwise one (0.82 GB); a region saves its bf16 input instead (an RMSNorm: 2 bytes
an element for 6 plus the rsqrt; SwiGLU: the gate|up GEMM output, which it saved anyway). The price is one more
pass of memory-bound elementwise ops in backward.

Bitwise: the forward runs the same torch ops on the same inputs (under no_grad, which picks the same kernels),
and backward builds the same graph from the same inputs and runs autograd's own derivative formulas on it, so
outputs and gradients are the plain path's bits (tests/test_recompute.py compares against the knob off, which
runs `fn` directly, the plain path).

How it differs from `torch.utils.checkpoint`: the same idea, narrower. The forward builds no graph (no_grad), no
RNG state is stashed (the regions draw no random numbers: a region that did would need checkpoint's
`preserve_rng_state`), and the inputs are saved with `save_for_backward`, so outer `saved_tensors_hooks`
(bench.saved_activations counts with one) and FSDP2 see them as ordinary saved tensors. No double backward.
The batch-invariant RMSNorm kernel's backward (kernels/rmsnorm.py, `InvariantRMSNorm`) already works this way.
On the GPU fast path the RMSNorms do not come here: kernels/rmsnorm_grad.py saves the same inputs and runs the
backward in one launch instead of this module's second forward and autograd's ~15 kernels.

Remade inputs: a region may also keep less than an input. An input given as `Remade(value, saved, make)` is read
as `value` in the forward and kept as `saved`; backward first makes it again as `make(*saved)`, then runs the
region. The MoE experts use it under `GroupedLinear.remake_output` (nn/experts.py): SwiGLU and the combine read a
grouped NVFP4 GEMM's bf16 output (2 bytes an element), whose value is the GEMM of its quantized input's packed row
codes (0.5625 bytes an input element) and the cached weight; they keep the codes, and backward runs the same GEMM
kernel on the same operand values again (bitwise the forward's output, so bitwise the plain path's gradients).
`make` must hold no tensor of its own beyond parameters and layout metadata: what it reads comes through `saved`,
so the saved-activation count (bench.saved_activations) sees it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Remade:
    """A region input that backward can make again: `value` is the tensor the forward computed, `make(*saved)` makes
    it again bit for bit (e.g. an NVFP4 GEMM's output from the packed codes of its quantized input: the same kernel
    on the same operand values). `recompute` keeps `saved` for it instead of `value`. make=None: nothing to make
    again, `value` is kept as any input."""

    value: torch.Tensor
    saved: tuple = ()
    make: Callable | None = None


class _Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, makes, *tensors):
        # tensors: the region's inputs, then the saved tensors of each remade input; makes: per input, None (kept)
        # or (make, how many saved tensors it takes)
        inputs, recipes = tensors[:len(makes)], iter(tensors[len(makes):])
        kept = []
        for t, m in zip(inputs, makes):
            kept += [t] if m is None else [next(recipes) for _ in range(m[1])]
        ctx.fn, ctx.makes = fn, makes  # no tensors on ctx: everything kept goes through save_for_backward
        ctx.save_for_backward(*kept)
        return fn(*inputs)  # grad mode is off inside an autograd Function's forward

    @staticmethod
    def backward(ctx, grad_out):
        saved = iter(ctx.saved_tensors)
        made = [next(saved) if m is None else m[0](*[next(saved) for _ in range(m[1])]) for m in ctx.makes]
        inputs = [t.detach().requires_grad_(needs) for t, needs in zip(made, ctx.needs_input_grad[2:])]
        wanted = [t for t in inputs if t.requires_grad]
        with torch.enable_grad():
            out = ctx.fn(*inputs)
        grads = iter(torch.autograd.grad(out, wanted, grad_out))
        recipe_grads = [None] * (len(ctx.needs_input_grad) - 2 - len(inputs))
        return None, None, *(next(grads) if t.requires_grad else None for t in inputs), *recipe_grads


def recompute(fn, *inputs: torch.Tensor | Remade) -> torch.Tensor:
    """fn(*inputs) -> one tensor, fn a deterministic function of the tensors `inputs` only (elementwise, cheap).
    In grad mode, with some input requiring grad: only `inputs` are saved (a `Remade` input: its recipe's tensors)
    and fn runs again in backward. Otherwise a plain call."""
    remade = [t if isinstance(t, Remade) else Remade(t) for t in inputs]
    values = [r.value for r in remade]
    if torch.is_grad_enabled() and any(t.requires_grad for t in values):
        makes = tuple(None if r.make is None else (r.make, len(r.saved)) for r in remade)
        recipes = [t for r in remade if r.make is not None for t in r.saved]
        return _Recompute.apply(fn, makes, *values, *recipes)
    return fn(*values)

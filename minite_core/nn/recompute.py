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
"""
from __future__ import annotations

import torch


class _Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, *inputs):
        ctx.fn = fn
        ctx.save_for_backward(*inputs)
        return fn(*inputs)  # grad mode is off inside an autograd Function's forward

    @staticmethod
    def backward(ctx, grad_out):
        inputs = [t.detach().requires_grad_(needs) for t, needs in zip(ctx.saved_tensors, ctx.needs_input_grad[1:])]
        wanted = [t for t in inputs if t.requires_grad]
        with torch.enable_grad():
            out = ctx.fn(*inputs)
        grads = iter(torch.autograd.grad(out, wanted, grad_out))
        return None, *(next(grads) if t.requires_grad else None for t in inputs)


def recompute(fn, *inputs: torch.Tensor) -> torch.Tensor:
    """fn(*inputs) -> one tensor, fn a deterministic function of the tensors `inputs` only (elementwise, cheap).
    In grad mode, with some input requiring grad: only `inputs` are saved and fn runs again in backward.
    Otherwise a plain call."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        return _Recompute.apply(fn, *inputs)
    return fn(*inputs)

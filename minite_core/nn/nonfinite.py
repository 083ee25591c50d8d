"""Non-finite activations and gradients stop the learner's step, naming the layer — read from a flag the quantizers
compute anyway, once per step.

On the hot path the quantizers run with check=False (the reference's finiteness check is a host sync per call).
What keeps that safe: an Inf or NaN in an NVFP4 operand makes its amax non-finite, and a non-finite amax makes its
global decode scale S_dec NaN (formats/nvfp4.py; kernels/quantize.py bit for bit), so the operand decodes to NaN
instead of finite values. S_dec is that operand's flag, already on the device.

`Watch` collects, for one learner step, every quantized activation and gradient operand's S_dec (a reference to the
tensor the GEMM uses: no copy, no launch) with its layer (by weight) and role, as nn's quantized GEMMs `record` it.
`check` then reads them all at once: one `torch._foreach_max` over the list, one stack, and a single host sync —
placed by the caller where the step syncs anyway (the RL and SFT loops: right after the gradient norm is read).
On a NaN it raises NonFinite naming the first operand in execution order: forward activations layer by layer, then
the backward's gradients from the last layer down — where the non-finite value appeared first.

What it does not see: unquantized (bf16) layers have no S_dec, and a static (calibrated) activation scale stays
finite whatever the input (its block scales turn NaN instead, so the layer's output is NaN and the next quantized
operand names the next layer). The loss check behind it catches both.
"""
from __future__ import annotations

import torch

_ACTIVE: "Watch | None" = None


class NonFinite(ValueError):
    """An activation or gradient held Inf/NaN; the message names the layer and the operand."""


def record(weight: torch.Tensor, s_dec: torch.Tensor, operand: str) -> None:
    """The S_dec of an operand that a quantized GEMM of `weight` just quantized (no-op outside a Watch)."""
    if _ACTIVE is not None and s_dec.numel():
        _ACTIVE.seen.append((id(weight), operand, s_dec))


class Watch:
    """`with Watch(model) as w: <forward + backward>`, then `w.check(where)` (module docstring)."""

    def __init__(self, model: torch.nn.Module):
        self.names = {id(p): name for name, p in model.named_parameters()}
        self.seen: list[tuple[int, str, torch.Tensor]] = []

    def __enter__(self) -> "Watch":
        global _ACTIVE
        self.seen = []
        _ACTIVE = self
        return self

    def __exit__(self, *exc) -> bool:
        global _ACTIVE
        _ACTIVE = None
        return False

    def check(self, where: str) -> None:
        """Raise NonFinite naming the first operand whose S_dec is not finite. One host sync (the caller's step
        syncs there anyway)."""
        if not self.seen:
            return
        finite = torch.stack(torch._foreach_max([s for _, _, s in self.seen])).isfinite()
        if bool(finite.all()):  # deliberate sync: once per step, beside the step's own
            return
        first = int((~finite).nonzero()[0, 0])
        weight, operand, _ = self.seen[first]
        raise NonFinite(f"{where}: non-finite {operand} (inf/NaN) at {self.names.get(weight, '<unnamed weight>')}; "
                        "the step stopped before the optimizer update (lower the lr, or check the inputs and the "
                        "checkpoint)")

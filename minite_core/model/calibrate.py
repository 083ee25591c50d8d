"""Static activation scales: record per-GEMM input amax the way a calibrated NVFP4 checkpoint stores
`input_global_scale` (compressed-tensors / ModelOpt run the high-precision model over calibration data and keep
the max |x| seen at each Linear's input; vLLM then quantizes activations with that fixed scale).

`calibrate` runs the model with every GEMM in high precision (bf16 numerics in the model's compute dtype),
stores `input_amax` on each QuantLinear / GroupedLinear (role "linear"), and restores the profiles it found.
Data above the calibrated amax saturates at run time — part of the execution gap this project measures.

The pad rule: pads never enter an amax. A batch is `{"input_ids", "attention_mask"}` (1 = real token); each GEMM's
amax is taken over the rows of real tokens only. For the dense GEMMs a row is a token; for the expert GEMMs
(tokens sorted by expert) the rows are routed (token, expert) slots, which the router's top-k of this very
forward maps back to tokens (checked against the expert counts the experts receive: a routing that differs from
the model's raises rather than mis-masks). Right padding plus causal attention means a real token never attends
to a pad, so the scales do not depend on which sequences share a batch — up to the bf16 GEMM's batch
(in)variance, which is why every stage builds its batches with `calibration_batches` (one batch size, one
order): the same checkpoint and the same sequences give bit-identical scales in RL, eval, diagnostics, export and
the vLLM comparison (tests/test_calibration.py).
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from minite_core.nn import GroupedLinear
from minite_core.nn.walk import gemm_modules
from minite_core.profiles import PROFILES

CALIB_BATCH = 16  # sequences per calibration forward, the same in every stage (see the module docstring)


def calibration_batches(sequences: list[list[int]], *, batch_size: int = CALIB_BATCH, pad_id: int = 0,
                        device=None) -> list[dict[str, torch.Tensor]]:
    """Token sequences -> right-padded batches {"input_ids" (B, L) long, "attention_mask" (B, L) long}, in order."""
    if not sequences:
        raise ValueError("calibration needs at least one sequence (got none)")
    if any(len(s) == 0 for s in sequences):
        raise ValueError("calibration sequences must not be empty")
    out = []
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start:start + batch_size]
        L = max(map(len, chunk))
        ids = torch.full((len(chunk), L), pad_id, dtype=torch.long)
        attn = torch.zeros(len(chunk), L, dtype=torch.long)
        for b, seq in enumerate(chunk):
            ids[b, :len(seq)] = torch.tensor(seq, dtype=torch.long)
            attn[b, :len(seq)] = 1
        out.append({"input_ids": ids.to(device), "attention_mask": attn.to(device)})
    return out


class _Recorder:
    """Forward pre-hooks keeping max |x| over real-token rows per GEMM (the pad rule)."""

    def __init__(self, model):
        self.amax: dict[str, torch.Tensor] = {}
        self.real: torch.Tensor | None = None  # (B*T,) bool of the current batch
        self.handles = []
        for name, m in gemm_modules(model, linear_only=True):
            self.handles.append(m.register_forward_pre_hook(self._gemm_hook(name, m)))

    def _gemm_hook(self, name: str, module):
        def hook(mod, args):
            x = args[0].detach()
            rows = x.reshape(-1, x.shape[-1])  # (rows, K)
            if isinstance(mod, GroupedLinear):  # rows of the padded sorted layout: pad rows read no token
                src, n = args[1].src, self.real.numel()
                keep = (src < n) & self.real[src.clamp(max=n - 1)]
            else:
                keep = self.real
            if keep.numel() != rows.shape[0]:
                raise RuntimeError(f"calibrate: {name} saw {rows.shape[0]} rows for {keep.numel()} token slots")
            if bool(keep.any()):  # sync point: once per GEMM per calibration batch (not a hot path)
                a = rows[keep].abs().amax().float()
                self.amax[name] = torch.maximum(self.amax[name], a) if name in self.amax else a
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def calibrate(model: torch.nn.Module, batches: Iterable) -> dict[str, float]:
    """batches: dicts {"input_ids" (B, T), "attention_mask" (B, T)} (from `calibration_batches`), or input_ids
    tensors / dicts without a mask (every token real). Pads (mask 0) never enter an amax.
    Returns {module name: amax}; also sets `module.input_amax` (fp32 scalar buffer)."""
    modules = gemm_modules(model, linear_only=True)
    if not modules:
        raise ValueError("calibrate: the model has no QuantLinear / GroupedLinear layers")
    saved = {name: m.profile for name, m in modules}
    hp = PROFILES["bf16"].replace(dtype=getattr(model, "profile", PROFILES["bf16"]).dtype)
    rec = _Recorder(model)
    n_batches = 0
    try:
        for _, m in modules:
            m.profile = hp
        for batch in batches:
            batch = batch if isinstance(batch, dict) else {"input_ids": batch}
            ids = batch["input_ids"]
            mask = batch.get("attention_mask")
            rec.real = (torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()).reshape(-1)
            model(ids, attention_mask=mask)
            n_batches += 1
    finally:
        rec.remove()
        for name, m in modules:
            m.profile = saved[name]
    if n_batches == 0:
        raise ValueError("calibrate: got no calibration batches")
    if not rec.amax:
        raise ValueError("calibrate: the batches hold no real token (every attention_mask entry is 0)")
    values = torch.stack(list(rec.amax.values()))
    if not bool(torch.isfinite(values).all()):  # one check per calibration: non-finite weights or inputs
        bad = [n for n, v in rec.amax.items() if not torch.isfinite(v)]
        raise ValueError(f"calibrate: non-finite activation amax at {bad[:4]} (non-finite weights in the model?)")
    for name, m in modules:
        m.input_amax = rec.amax[name].clone() if name in rec.amax else torch.zeros((), device=m.weight.device)
    return {name: float(v) for name, v in rec.amax.items()}

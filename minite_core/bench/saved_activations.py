"""Saved-activation bytes of one forward: what the autograd graph keeps for backward, parameters excluded.

Counted under `torch.autograd.graph.saved_tensors_hooks`: the unique storages the graph keeps, deduplicated by
storage pointer (a tensor saved by q, k and v projections counts once; a saved view counts its whole storage,
which is what stays alive), EXCLUDING
  (1) storages of parameters (a weight or a view of it such as `weight[e]`, saved by an autograd Function),
  (2) tensors whose autograd history is only view/cast ops back to a parameter (the bf16 copy `weight.to(bf16)`
      F.linear saves for dgrad), and
  (3) the modules' weight caches (`module.weight_cache`: the bf16 cast or the quantized operand of a weight,
      made once per optimizer step — weights, not activations).
Everything else counts. Reported as the total and the decoder-layer part, with per-dtype and per-producer
breakdowns (uint8/float8 = packed NVFP4 codes and scales; `_RecomputeBackward` = the output of a region that
backward recomputes, `nn.recompute` — a norm's or SwiGLU's output, kept by the GEMM it feeds).
"""
from __future__ import annotations

import torch

from minite_core.model.qwen3_moe import DecoderLayer


def _cache_ptrs(model) -> set[int]:
    """Storage pointers of every tensor held in a module's weight cache."""
    ptrs: set[int] = set()

    def visit(obj):
        if isinstance(obj, torch.Tensor):
            ptrs.add(obj.untyped_storage().data_ptr())
        elif isinstance(obj, (tuple, list)):
            for o in obj:
                visit(o)
        elif hasattr(obj, "__dataclass_fields__"):
            for f in obj.__dataclass_fields__:
                visit(getattr(obj, f))

    for module in model.modules():
        for entry in getattr(module, "weight_cache", {}).values():
            visit(entry)
    return ptrs


_VIEW_OR_CAST = ("ToCopyBackward", "TBackward", "ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward",
                 "ExpandBackward", "SelectBackward", "SliceBackward", "TransposeBackward", "PermuteBackward",
                 "UnsqueezeBackward", "SqueezeBackward", "AliasBackward", "CloneBackward", "SplitBackward",
                 "SplitWithSizesBackward", "UnbindBackward", "NarrowBackward", "AsStridedBackward")


def _is_param_derived(t: torch.Tensor, param_ids: set[int]) -> bool:
    """Rule (2): the autograd history is a chain of view/cast ops ending at a parameter's AccumulateGrad."""
    node = t.grad_fn
    while node is not None:
        if type(node).__name__ == "AccumulateGrad" or node.name() == "torch::autograd::AccumulateGrad":
            return id(node.variable) in param_ids
        if not node.name().rstrip("0123456789").endswith(_VIEW_OR_CAST):
            return False
        inputs = [fn for fn, _ in node.next_functions if fn is not None]
        if len(inputs) != 1:
            return False
        node = inputs[0]
    return False


def saved_activation_bytes(model, input_ids) -> dict:
    """Bytes the autograd graph of one `model(input_ids)` keeps for backward, parameters excluded (rules in the
    module docstring). Returns {"total", "decoder", "by_dtype": {dtype: bytes}, "by_producer": {grad_fn: bytes}}
    (producer = the autograd node that made the saved tensor, a hint at where the bytes come from)."""
    with torch.no_grad():  # fills the weight caches (idempotent), so rule (3) sees every cached operand
        model(input_ids)
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()} | _cache_ptrs(model)
    param_ids = {id(p) for p in model.parameters()}
    seen: dict[int, tuple[int, str, bool, str]] = {}  # storage ptr -> (bytes, dtype, in a decoder layer, producer)
    region = {"decoder": False}

    def pack(t: torch.Tensor):
        # the graph keeps what pack returns; a saved op OUTPUT returned as itself would hold its own grad_fn: a
        # reference cycle through the C++ graph that Python's GC cannot free (the H200 bench kept every counted
        # graph alive: ~10 GB per layer and profile on top of each timed step's peak). A detached alias keeps the
        # storage (and its version counter) without the cycle.
        ptr = t.untyped_storage().data_ptr()
        if ptr in param_ptrs or ptr in seen or _is_param_derived(t, param_ids):
            return t.detach()
        producer = type(t.grad_fn).__name__ if t.grad_fn is not None else "no-grad (inside an autograd Function)"
        seen[ptr] = (t.untyped_storage().nbytes(), str(t.dtype).removeprefix("torch."), region["decoder"], producer)
        return t.detach()  # keeps the storage alive: not recycled (so pointers stay unique) during the count

    def enter(*_):
        region["decoder"] = True

    def leave(*_):
        region["decoder"] = False

    handles = []
    for module in model.modules():
        if isinstance(module, DecoderLayer):
            handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = model(input_ids)
    finally:
        for h in handles:
            h.remove()
    del logits  # frees the graph without a backward
    by_dtype: dict[str, int] = {}
    by_producer: dict[str, int] = {}
    for nbytes, dtype, _, producer in seen.values():
        by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
        by_producer[producer] = by_producer.get(producer, 0) + nbytes
    return {"total": sum(v[0] for v in seen.values()), "decoder": sum(v[0] for v in seen.values() if v[2]),
            "by_dtype": by_dtype, "by_producer": by_producer}

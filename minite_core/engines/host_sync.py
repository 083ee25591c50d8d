"""Host-sync detector: which torch calls of a function would block the host on a GPU (and break a CUDA graph).

Why: a decode step captured in a CUDA graph must not read a device value on the host nor make a shape depend
on data (STYLE.md: no `.item()`, `.tolist()`, `int(t)` in a hot path). On CUDA, `torch.cuda.set_sync_debug_mode
("error")` catches such syncs (engines.fast_sampler runs its warm-up step under it); on CPU nothing ever waits,
so this tracer records — through a `TorchFunctionMode`, which sees every torch call made from Python, inside
autograd Functions too — each call that would sync on a GPU:
- a value read to the host: `.item()`, `.tolist()`, `bool/int/float/index(t)`, `.numpy()`, `.cpu()`;
- a data-dependent output shape: `nonzero`, `argwhere`, `bincount`, `unique`, `masked_select`, boolean-mask
  indexing, `repeat_interleave` without `output_size`;
- a host-to-device copy of Python data: `torch.tensor` / `torch.as_tensor` of a non-tensor (not with a literal
  `device="cpu"`, which stays on the host on a GPU machine too).
It does not see syncs inside a C++ op; the CUDA check does.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"}
_DYNAMIC_SHAPE = {"nonzero", "argwhere", "bincount", "unique", "unique_consecutive", "masked_select"}
_INDEXING = {"__getitem__", "__setitem__", "index_put", "index_put_"}
_FROM_HOST = {"tensor", "as_tensor"}
_PACKAGE = str(Path(__file__).resolve().parents[1])  # minite_core/
_THIS = str(Path(__file__).resolve())


@dataclass(frozen=True)
class HostSync:
    op: str  # torch function / Tensor method name, e.g. "bincount", "tolist", "__bool__"
    where: str  # innermost minite_core frame that called it: "model/qwen3_moe.py:159 forward"


def _has_bool_index(args) -> bool:
    index = args[1] if len(args) > 1 else None
    items = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in items)


def _syncs(name: str, args, kwargs) -> bool:
    if name in _READS or name in _DYNAMIC_SHAPE:
        return True
    if name in _INDEXING:
        return _has_bool_index(args)
    if name == "repeat_interleave":
        return "output_size" not in kwargs
    if name in _FROM_HOST:  # a tensor placed on the host by a literal device="cpu" stays there on any machine (e.g.
        # foreach AdamW's CPU step increment, once per parameter group on CUDA): no copy, no sync
        return bool(args) and not isinstance(args[0], torch.Tensor) and kwargs.get("device") != "cpu"
    return False


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith(_PACKAGE) and frame.filename != _THIS:
            return f"{Path(frame.filename).relative_to(_PACKAGE)}:{frame.lineno} {frame.name}"
    return "outside minite_core"


class HostSyncDetector(TorchFunctionMode):
    """`with HostSyncDetector() as d: ...` -> d.syncs, in call order (the calls still run normally)."""

    def __init__(self):
        super().__init__()
        self.syncs: list[HostSync] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if _syncs(name, args, kwargs):
            self.syncs.append(HostSync(name, _caller()))
        return func(*args, **kwargs)


def find_host_syncs(fn, *args, **kwargs) -> list[HostSync]:
    """Run fn(*args, **kwargs) and return the host syncs it would perform on a GPU (deduplicated, in order)."""
    with HostSyncDetector() as detector:
        fn(*args, **kwargs)
    return list(dict.fromkeys(detector.syncs))

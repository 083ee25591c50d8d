"""bench/op_profile.kernel_table from made-up profiler events: device kernels only, annotation ranges left out,
per-step totals, the top kernels by device time and by launches."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from minite_core.bench.op_profile import kernel_table

CUDA, CPU = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU


def _event(name, us, device=CUDA, annotation=False):
    return SimpleNamespace(name=name, device_type=device, is_user_annotation=annotation,
                           time_range=SimpleNamespace(elapsed_us=lambda: us))


def test_kernel_table_ranks_by_time_and_by_launches():
    events = ([_event("gemm", 900.0)] * 2 + [_event("copy", 10.0)] * 6 + [_event("amax", 50.0)] * 4
              + [_event("aten::mm", 5000.0, device=CPU), _event("Optimizer.step#AdamW.step", 3000.0, annotation=True)])
    table = kernel_table(SimpleNamespace(events=lambda: events), steps=2, top=2)
    assert table["kernels_per_step"] == 6 and abs(table["kernel_ms_per_step"] - 1.03) < 1e-12
    assert [r["kernel"] for r in table["top"]] == ["gemm", "amax"]
    assert [(r["kernel"], r["calls_per_step"]) for r in table["most_launched"]] == [("copy", 3.0), ("amax", 2.0)]
    assert abs(table["most_launched"][0]["ms_per_step"] - 0.03) < 1e-12


def test_kernel_table_groups_count_every_kernel_not_only_the_top():
    """`groups`: the milliseconds of all kernels whose names hold a group's substrings, the ones outside `top` too."""
    events = ([_event("gemm", 900.0)] * 2 + [_event("_quantize_kernel", 40.0)] * 2 + [_event("_row_amax_kernel", 5.0)]
              + [_event("_quantize_cols_kernel", 20.0)])
    table = kernel_table(SimpleNamespace(events=lambda: events), top=1,
                         groups={"quantize": ("_quantize", "amax"), "none": ("nothing",)})
    assert [r["kernel"] for r in table["top"]] == ["gemm"]
    assert abs(table["group_ms_per_step"]["quantize"] - 0.105) < 1e-12 and table["group_ms_per_step"]["none"] == 0
    assert "group_ms_per_step" not in kernel_table(SimpleNamespace(events=lambda: events))

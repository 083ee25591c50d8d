"""Kernel tables from torch.profiler: what a step spends its device time on (`--op-profile` of the benches).

Only device kernels are counted (CUDA activity events; memcpy/memset are included under their names), so nothing
is counted twice the way `key_averages()` mixes CPU ops and the kernels under them. Untimed: the profiler's
overhead is in the wall clock, not in the kernel durations.
"""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def profiled(device: torch.device):
    """torch.profiler over the block (CPU + CUDA activity where `device` is CUDA); yields the profile."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        yield prof
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def kernel_table(prof, steps: int = 1, top: int = 25, groups: dict[str, tuple[str, ...]] | None = None) -> dict:
    """Per step: kernel launches, summed kernel milliseconds, the `top` kernels by device time and the `top` by
    launches (where a step is launch-bound, the second list names what to fuse). GPU ranges of user annotations
    (`Optimizer.step#AdamW.step`) span kernels counted on their own: left out. `groups` {name: substrings}: also
    the milliseconds of every kernel whose name holds one of a group's substrings (all kernels, not only the top)."""
    by_name: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
            by_name.setdefault(e.name[:120], []).append(e.time_range.elapsed_us() / 1e3)

    def rows(key):
        return [{"kernel": k, "calls_per_step": len(v) / steps, "ms_per_step": sum(v) / steps}
                for k, v in sorted(by_name.items(), key=key)[:top]]

    grouped = {g: sum(sum(v) for k, v in by_name.items() if any(part in k for part in parts)) / steps
               for g, parts in (groups or {}).items()}
    return {"steps": steps, "kernels_per_step": sum(map(len, by_name.values())) / steps,
            "kernel_ms_per_step": sum(map(sum, by_name.values())) / steps,
            "top": rows(lambda kv: -sum(kv[1])), "most_launched": rows(lambda kv: -len(kv[1])),
            **({"group_ms_per_step": grouped} if groups else {})}


def summary(table: dict, n: int = 8) -> str:
    """One log line of a kernel_table."""
    return (f"{table['kernels_per_step']:.0f} kernels, {table['kernel_ms_per_step']:.3f} ms of kernels per step; "
            + "; ".join(f"{r['kernel'][:50]} {r['ms_per_step']:.3f} ms x{r['calls_per_step']:g}"
                        for r in table["top"][:n]))

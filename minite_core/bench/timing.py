"""Timing helpers shared by the benchmarks: one clock per device, warm-up, median and 20/80 percentiles.

On CUDA a `Timer` brackets the work with a pair of CUDA events on the current stream and reads them after one
synchronisation per sample (the work itself stays asynchronous, so launch latency is measured the way a training
step pays it). On CPU it uses `time.perf_counter`. Percentiles are the nearest-rank value on the sorted samples
(`p20`/`p80`, as Liger's and Triton's `do_bench` report them); with few samples the median is the robust number
and p20/p80 show the spread.

`bench(fn, warmup, reps)` is the one-op form; `Timer` is the building block for callers that interleave several
variants round-robin and need one clock per sample; `round_robin` is one such round (the learner benches:
bench.learner, bench.learner_dist), `timed_rounds` their budget rule.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch


def percentile(samples: list[float], p: float) -> float:
    """Nearest-rank p-th percentile (0..100) of `samples` (non-empty)."""
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, int(round(p / 100 * (len(ordered) - 1)))))]


@dataclass(frozen=True)
class Stats:
    """Summary of timing samples in milliseconds."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    n: int

    @classmethod
    def of(cls, samples_ms: list[float]) -> "Stats":
        return cls(statistics.median(samples_ms), percentile(samples_ms, 20), percentile(samples_ms, 80),
                   len(samples_ms))

    def as_dict(self) -> dict:
        return {"median_ms": self.median_ms, "p20_ms": self.p20_ms, "p80_ms": self.p80_ms, "n": self.n}


class Timer:
    """Context manager measuring one sample in ms: CUDA events on `device` if it is a CUDA device, else
    perf_counter. `elapsed_ms` is valid after exit (CUDA: exit synchronises on the end event — a sync point)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.cuda = torch.device(device).type == "cuda"
        self.elapsed_ms: float | None = None

    def __enter__(self) -> "Timer":
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self._end.record()
            self._end.synchronize()  # sync point: one per sample, after the whole timed region was enqueued
            self.elapsed_ms = self._start.elapsed_time(self._end)
        else:
            self.elapsed_ms = (time.perf_counter() - self._t0) * 1e3


def bench(fn: Callable[[], object], *, warmup: int = 3, reps: int = 10, device: torch.device | str = "cpu") -> Stats:
    """Call fn() `warmup` times untimed, then `reps` times timed one by one; return the summary."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    for _ in range(warmup):
        fn()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    samples = []
    for _ in range(reps):
        with Timer(device) as t:
            fn()
        samples.append(t.elapsed_ms)
    return Stats.of(samples)


def round_robin(names, r: int, prepare: Callable[[str], Callable[[], object]], device: torch.device | str,
                samples: dict | None, peaks: dict, scope: Callable[[str], object] | None = None) -> None:
    """One round: every name's step once, the starting name rotated by the round index r (names[r % n] first), so
    drift and allocator growth hit every name alike. `prepare(name)` does the untimed set-up and returns the step
    to time; `scope(name)`, a context manager entered and left outside the timed region around the step (e.g. the
    row's profile on the model). A timed round (samples given) appends each step's ms to samples[name] and, on
    CUDA, maxes the step's peak allocated bytes (reset after prepare) into peaks[name]."""
    cuda = torch.device(device).type == "cuda"
    k = r % len(names)
    for name in names[k:] + names[:k]:
        step = prepare(name)
        with scope(name) if scope is not None else contextlib.nullcontext():
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            with Timer(device) as t:
                step()
        if samples is not None:
            samples[name].append(t.elapsed_ms)
            if cuda:
                peaks[name] = max(peaks.get(name, 0), torch.cuda.max_memory_allocated(device))


def timed_rounds(iters: int, left_s: float, round_s: float) -> int:
    """How many of `iters` timed rounds of round_s seconds fit in the left_s of the budget: at least 3 (or iters,
    if fewer); all of them when no round was measured (round_s 0)."""
    if round_s <= 0:
        return iters
    return max(min(3, iters), min(iters, int(left_s / round_s)))


def copy_bandwidth(device: torch.device | str, nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s, bytes read + written (METHOD.md's ceiling), measured now: the
    median of `reps` copies of an `nbytes` buffer (many times any L2)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    s = bench(lambda: dst.copy_(src), warmup=3, reps=reps, device=device)
    return 2 * nbytes / (s.median_ms / 1e3) / 1e9

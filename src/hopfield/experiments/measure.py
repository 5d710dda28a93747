"""Time and memory of a piece of work, for the experiments that measure cost (``efficiency``,
``outlier-cost``) and the benchmarks.

This module registers no experiment.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["peak_bytes", "timings"]


def timings(fn: Callable[[], object], repeats: int, warmup: int) -> tuple[list[float], list[float]]:
    """Wall and CPU times (seconds) of ``repeats`` calls of ``fn()`` after ``warmup`` calls.

    The CPU time is :func:`time.process_time` (all threads of this process): on a machine shared
    with other jobs it leaves out the time the process waited for a core, which wall time does
    not. Work queued on a GPU is timed only if ``fn`` waits for it (``torch.cuda.synchronize``).
    """
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    return wall, cpu


@contextlib.contextmanager
def _silent_fd2() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null (the profiler's C++ start/stop lines)."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(null)
        os.close(saved)


def peak_bytes(fn: Callable[[], object], device: torch.device | None = None) -> int:
    """Largest sum of live allocations made during ``fn()``, in bytes: what ``fn`` allocates on
    top of what was allocated before it (tensors that exist when it starts are not counted).

    On the CPU (``device`` ``None`` or a CPU device) from the PyTorch profiler's memory events;
    on a CUDA device from the caching allocator's peak statistics (reset before ``fn``), less
    the memory allocated when ``fn`` starts.
    """
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _silent_fd2():
        prof.__enter__()
    try:
        fn()
    finally:
        with _silent_fd2():
            prof.__exit__(None, None, None)
    recorded: Any = prof.profiler
    events = [e for e in recorded.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += int(event.nbytes())
        peak = max(peak, live)
    return peak

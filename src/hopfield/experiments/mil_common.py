"""Shared parts of the MIL experiments: worker processes, checkpoints of finished runs, plots.

Not an experiment itself (it registers nothing).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, TypeVar

import torch

from hopfield.experiments.results import RunContext, mean_std
from hopfield.training import process_layout

T = TypeVar("T")
R = TypeVar("R")

CHECKPOINT = "runs.json"


def available_cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def resolve_workers(workers: int, tasks: int) -> int:
    """Worker processes to use: ``workers``, or (``0``) one per available core; at most ``tasks``.

    One worker means running in this process; so does every process of a multi-process
    (``torchrun``) run, whose processes train each model together.
    """
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    if process_layout()[1] > 1:
        return 1
    wanted = workers if workers > 0 else available_cores()
    return max(1, min(wanted, tasks))


def _init_worker() -> None:
    torch.set_num_threads(1)


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run with ``threads`` torch threads (``0``: leave the setting alone), restored afterwards.

    Small models on a busy machine run many times faster on one thread than on several.
    """
    if threads < 0:
        raise ValueError(f"threads must be >= 0, got {threads}")
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_tasks(fn: Callable[[T], R], tasks: Sequence[T], workers: int) -> Iterator[tuple[T, R]]:
    """``(task, fn(task))`` for every task, in order of completion.

    With more than one worker the tasks run in a pool of spawned processes (one torch thread
    each, so the workers share the cores instead of fighting over them); ``fn`` must be a
    module-level function and tasks picklable.
    """
    count = resolve_workers(workers, len(tasks))
    if count <= 1:
        for task in tasks:
            yield task, fn(task)
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(count, mp_context=context, initializer=_init_worker) as pool:
        futures = {pool.submit(fn, task): task for task in tasks}
        for future in as_completed(futures):
            yield futures[future], future.result()


class RunStore:
    """Results of finished runs, saved after each one so that a stopped experiment resumes.

    The file remembers the configuration; a different configuration starts afresh.
    """

    def __init__(self, ctx: RunContext, config: Any) -> None:
        self.ctx = ctx
        self.config = _jsonable(asdict(config))
        saved = ctx.load_json(CHECKPOINT)
        self.runs: dict[str, Any] = {}
        if saved is not None and saved.get("config") == self.config:
            self.runs = dict(saved["runs"])

    def __contains__(self, key: str) -> bool:
        return key in self.runs

    def __getitem__(self, key: str) -> Any:
        return self.runs[key]

    def add(self, key: str, value: Any) -> None:
        self.runs[key] = value
        self.ctx.save_json(CHECKPOINT, {"config": self.config, "runs": self.runs})


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def mean_pm_std(values: Sequence[float], digits: int = 3) -> str:
    """``"mean ± std"`` of ``values`` (just the value for one, ``"–"`` when empty)."""
    if not values:
        return "–"
    mean, std = mean_std(list(values))
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if len(values) > 1 else "")

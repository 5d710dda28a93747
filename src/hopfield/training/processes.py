"""The process layout of a run: rank and world size, the collective timeout, the end of a
process group, reductions over the processes."""

from __future__ import annotations

import functools
import logging
import math
import os
import random
import sys
import warnings
from datetime import timedelta

import numpy as np
import torch
from torch import Tensor


def process_layout() -> tuple[int, int]:
    """``(rank, processes)`` of this process: from ``torch.distributed`` when it is initialised,
    else from the ``RANK``/``WORLD_SIZE`` variables that ``torchrun`` and ``accelerate launch``
    set, else ``(0, 1)``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


#: The environment variable that sets how long a collective (all-reduce, barrier) waits for the
#: slowest process before the job fails with torch's timeout error, in seconds.
COLLECTIVE_TIMEOUT_VARIABLE = "HOPFIELD_COLLECTIVE_TIMEOUT"
#: torch's own default (30 minutes).
DEFAULT_COLLECTIVE_TIMEOUT_S = 1800.0


def collective_timeout() -> timedelta:
    """How long a collective waits for every process: ``$HOPFIELD_COLLECTIVE_TIMEOUT`` seconds
    (``hopfield run --collective-timeout``), else torch's 30 minutes. A hung process then ends
    the job with torch's timeout error after that long instead of blocking it. ``ValueError``
    naming the variable for anything but a positive number."""
    text = os.environ.get(COLLECTIVE_TIMEOUT_VARIABLE)
    if text is None:
        return timedelta(seconds=DEFAULT_COLLECTIVE_TIMEOUT_S)
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(
            f"${COLLECTIVE_TIMEOUT_VARIABLE} must be a positive number of seconds, got {text!r}"
        )
    return timedelta(seconds=seconds)


@functools.cache
def warn_if_processes_were_lost() -> bool:
    """Warn (once) when ``accelerate launch`` was asked for several processes but started one:
    without ``--multi_gpu`` (GPUs) or ``--multi_cpu`` it runs a single process and says nothing.
    The sign: accelerate's launcher set ``MASTER_ADDR`` (it does so for more than one process or
    machine) and no ``WORLD_SIZE`` above 1. Returns whether it warned."""
    launched_by_accelerate = "ACCELERATE_MIXED_PRECISION" in os.environ
    asked_for_several = "MASTER_ADDR" in os.environ
    if not (launched_by_accelerate and asked_for_several and process_layout()[1] == 1):
        return False
    warnings.warn(
        "accelerate launch was asked for several processes but this job has one: add "
        "--multi_gpu (GPUs) or --multi_cpu (CPUs), or launch with torchrun --nproc_per_node N",
        RuntimeWarning,
        stacklevel=2,
    )
    return True


def leave_process_group(*, exit_status: int | None = None) -> None:
    """End a multi-process run: wait for every process, destroy the default process group and,
    when ``exit_status`` is given, end this process at once with that status. Does nothing in a
    single process.

    Ending at once (``os._exit`` after flushing stdout, stderr and logging) skips the
    interpreter's finalisation, which a gloo group can abort (torch 2.13): once a
    ``DistributedDataParallel`` wrapper has been built, its reducer keeps the group and its
    worker threads alive after ``destroy_process_group``, and a worker that frees a finished
    collective while the interpreter finalises cannot take the GIL and calls ``std::terminate``
    ("terminate called without an active exception", about one run in 100). Call it last, after
    every file of the run is written and closed.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.barrier()
    dist.destroy_process_group()
    if exit_status is None:
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(exit_status)


def decorrelate_processes(rank: int) -> None:
    """Give process ``rank > 0`` random streams of its own, derived from the torch seed every
    process was given, so that dropout and masking differ between the processes' micro-batches
    (with one seed everywhere, every process would draw the same masks). Process 0 keeps its
    streams: a 1-process run is unchanged."""
    if rank == 0:
        return
    seed = (torch.initial_seed() + 1_000_003 * rank) % 2**63
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def all_reduce(values: Tensor, op: str) -> Tensor:
    """``values`` reduced over the processes (``"mean"`` or ``"max"``), on every process."""
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    out = values.to(device)
    dist.all_reduce(out, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    if op == "mean":
        out /= dist.get_world_size()
    return out.cpu()

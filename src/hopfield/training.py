"""A reusable training loop on ``accelerate`` with exact checkpoint/resume.

:class:`Trainer` trains any :class:`torch.nn.Module` with a user loss ``loss_fn(model, batch) ->
scalar``:

* **devices**: one CPU, one or several GPUs, several nodes (``accelerate launch script.py``): the
  :class:`accelerate.Accelerator` picks the setup from the environment;
* **mixed precision** (``"fp16"`` on GPUs, ``"bf16"``), **gradient accumulation**, gradient-norm
  clipping;
* **AdamW** with a warm-up followed by a linear, cosine or constant schedule (:func:`lr_factor`);
  weight decay skips biases and normalisation weights unless ``decay_norm_weights`` (OPT's
  ``--wd_LN_gamma``);
* **batches that do not depend on the process count**: ``batch_size`` is the *global* batch of
  one optimiser step; each process runs micro-batches of ``micro_batch_size`` examples and
  accumulates ``batch_size / (micro_batch_size × processes)`` of them. A preset therefore trains
  the same recipe on a laptop and on 8 GPUs; only the micro-batch changes with the memory;
* **data order** as a pure function of ``(seed, epoch)``: every epoch is a permutation drawn from
  its own generator, cut into global batches (the incomplete last batch is dropped). Optimiser
  step ``s`` always trains on the same examples, whatever the process layout, so a 2-process run
  follows the loss curve of a 1-process run with the same global batch, and a resumed run sees
  the data a continuous run sees;
* **epochs, evaluation and early stopping**: ``epochs`` instead of ``max_steps``; evaluation,
  logging and checkpoints every N steps or every ``"epoch"``; the best evaluation (by
  ``select_metric``) is tracked, its weights restored at the end (``restore_best``) and training
  stops after ``patience`` evaluations without a strict improvement;
* **several processes**: the logged loss, metrics and ``max |x|`` are reduced over the processes
  (mean, mean, max), so the log is the log of the whole run; evaluation runs on every process on
  the same weights (identical numbers, no communication), so early-stopping decisions agree;
* **checkpoints** every ``checkpoint_every`` steps into ``out_dir/checkpoints/step-<N>/``: model,
  optimiser, schedule, loss scaler, the running log sums and every process's RNG states
  (Python, NumPy, torch, CUDA). :meth:`Trainer.fit` resumes from the newest one: a run stopped
  after a checkpoint and resumed ends with **bitwise** the weights and the log of an uninterrupted
  run (on the same hardware and process count; the tests check this on CPU). A checkpoint is
  written to a temporary folder and renamed when complete; the two newest are kept (by default),
  and one that cannot be read back is removed with a warning naming its file and the run resumes
  from the one before (or starts over when none is left). A full disk raises
  :class:`DiskFullError` (one line naming the file; no temporary file is left behind);
* **preemption**: SIGUSR1 or SIGTERM (a scheduler's warning before it ends the job) during
  :meth:`Trainer.fit` asks the run to stop at the next optimiser-step boundary: every process
  learns of the request there (a flag reduced over the processes), a checkpoint of that step is
  written and :class:`Preempted` is raised; the same command resumes from it exactly. Outside the
  step loop of a fit, under :func:`preemptible`, the signal raises :class:`Preempted` at once;
* **experiment trackers** through accelerate (``log_with=("tensorboard",)``, or tracker objects
  given to :class:`Trainer`): every log record's loss, training metrics, learning rate,
  gradient norm, ``max |x|`` of each monitored module and the throughput (examples/s, and
  tokens/s with ``tokens_per_example``) at its step, in ``out_dir/trackers``;
* a **progress bar** (tqdm) and a **JSON-lines log** ``out_dir/log.jsonl``, one record every
  ``log_every`` steps: ``step``, ``epoch``, mean training ``loss`` since the previous record,
  ``lr``, ``grad_norm`` (before clipping), ``max_abs`` (``{module name: max |x|}`` of the outputs
  of the monitored modules on that step's training batches, the OutEffHop Figure 2–4 curves) and,
  every ``eval_every`` steps, the metrics returned by ``evaluate(model)``.

Example::

    from hopfield.training import Trainer, TrainingConfig

    def loss_fn(model, batch):
        return model(**batch).loss

    trainer = Trainer(model, dataset, loss_fn, TrainingConfig(max_steps=1000, lr=1e-3,
                      warmup_steps=100, batch_size=256, micro_batch_size=32,
                      checkpoint_every=200, log_every=50),
                      out_dir="runs/bert", monitor=[r"bert\\.encoder\\.layer\\.\\d+\\.output\\.dense"])
    result = trainer.fit()          # resumes from runs/bert/checkpoints when present
    result.log[-1]["loss"]

The batches given to ``loss_fn`` are ``collate_fn([dataset[i] for i in indices])`` moved to the
accelerator's device. ``loss_fn`` may also return ``(loss, {name: scalar})``: the named training
metrics are averaged like the loss and logged beside it. Randomness inside ``loss_fn`` (masking, dropout) must use the global torch
RNG (or NumPy/Python's), whose states are checkpointed; evaluation runs under
:func:`torch.random.fork_rng`, so it never changes the training randomness. At a fresh start
every process other than the first reseeds these RNGs from its rank, so the processes draw
different dropout and masks (process 0, and so a 1-process run, keeps the caller's seed).
"""

from __future__ import annotations

import copy
import errno
import functools
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Sampler, default_collate
from torch.utils.hooks import RemovableHandle

__all__ = [
    "COLLECTIVE_TIMEOUT_VARIABLE",
    "FULL_DISK_ERRORS",
    "OPTIMIZERS",
    "PREEMPTION_SIGNALS",
    "SCHEDULES",
    "BatchOrder",
    "DiskFullError",
    "MaxAbsMonitor",
    "MicroBatchSampler",
    "Preempted",
    "TrainResult",
    "Trainer",
    "TrainingConfig",
    "check_tracker_names",
    "collective_timeout",
    "latest_checkpoint",
    "leave_process_group",
    "lr_factor",
    "micro_batch_layout",
    "parameter_groups",
    "preemptible",
    "preemption_requested",
    "process_layout",
    "read_log",
    "steps_per_epoch",
    "warn_if_processes_were_lost",
    "writing",
]

SCHEDULES = ("linear", "cosine", "constant")
OPTIMIZERS = ("adamw", "adam", "sgd")
LOG_FILE = "log.jsonl"
CHECKPOINT_DIR = "checkpoints"
_STEP_DIR = re.compile(r"step-(\d+)")


Period = int | str  # a number of optimiser steps, or "epoch"


@dataclass
class TrainingConfig:
    """Optimiser, schedule and loop settings of :class:`Trainer`.

    Attributes:
        max_steps: optimiser steps to train (``None`` when ``epochs`` is given).
        epochs: passes over the dataset instead of ``max_steps`` (``epochs × steps per epoch``
            steps; a step per full global batch of an epoch).
        batch_size: examples per optimiser step, over all processes and accumulated
            micro-batches (the global batch).
        micro_batch_size: examples per forward/backward pass on one process (``None``:
            ``batch_size / processes``, no accumulation); the quotient ``batch_size /
            (micro_batch_size × processes)`` is the gradient accumulation. Where it is no
            integer the micro-batch becomes the largest divisor of the per-process share below
            it (:func:`micro_batch_layout`); the number of processes must divide
            ``batch_size``.
        optimizer: ``"adamw"`` (decoupled weight decay), ``"adam"`` (L2 penalty in the
            gradient, as ``torch.optim.Adam``) or ``"sgd"`` (``torch.optim.SGD`` with
            ``momentum``, L2 weight decay; ``betas`` and ``eps`` unused).
        lr: peak learning rate.
        weight_decay: weight decay (see ``optimizer``).
        betas, eps: Adam moments and epsilon.
        momentum: SGD momentum (``optimizer="sgd"`` only).
        schedule: ``"linear"`` (decay to ``min_lr_ratio · lr`` at the last step), ``"cosine"``
            (half cosine to ``min_lr_ratio · lr``) or ``"constant"``, each after the warm-up; a
            ``schedule`` callable given to :class:`Trainer` replaces it.
        warmup_steps: linear warm-up from ``warmup_start_ratio · lr`` to ``lr``.
        warmup_start_ratio: learning-rate factor at step 0 (timm's ``warmup_lr / lr``).
        min_lr_ratio: final learning-rate factor (timm's ``min_lr / lr``).
        grad_clip: maximum global gradient norm (``None`` or ``0`` = no clipping).
        decay_norm_weights: also decay normalisation weights (LayerNorm γ); biases never decay.
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``.
        tf32: let float32 matrix products run on the tensor cores in TF32 (10-bit mantissa) on
            CUDA (``torch.backends.cuda.matmul.allow_tf32``, a setting of the process that the
            trainer sets from this field): an A100's float32 peak goes from 19.5 to 156 TFLOP/s,
            an H100's from 67 to 495. Off (PyTorch's default since 1.12, and what the fp32
            paper presets keep); cuDNN's convolutions use TF32 either way (PyTorch's default).
        seed: seed of the data order (the global RNGs are seeded by the caller).
        checkpoint_every: checkpoint period (steps or ``"epoch"``; ``0`` = only at the end).
        keep_checkpoints: how many of the newest checkpoints to keep (default 2: when the newest
            is found damaged, the run resumes from the one before).
        log_every: log-record period (steps or ``"epoch"``); evaluation steps are logged too.
        eval_every: period of ``evaluate`` (steps or ``"epoch"``; ``0`` = only after the last
            step); its metrics go into that step's log record (``"eval"``).
        select_metric: evaluation metric that decides the best step (``None``: no selection).
        select_mode: ``"min"`` or ``"max"``: whether a smaller or a larger value is better.
        patience: stop after this many evaluations without a strict improvement of
            ``select_metric`` (``0``: never stop early).
        restore_best: load the weights of the best evaluation at the end (with
            ``select_metric``).
        stop_after: end the run after this many steps although the schedule is that of the full
            run (smoke runs of paper presets; ``None``: no limit). The result says it did not
            finish.
        find_unused_parameters: let DDP handle parameters that get no gradient in a step.
        cpu: force the CPU even where a GPU is present.
        num_workers: worker processes that read and collate each process's micro-batches ahead
            of the step (``torch.utils.data.DataLoader``; ``0``: read in the training process,
            in the step). The examples of every step are the same either way; a dataset that
            draws random numbers in ``__getitem__`` (augmentation) draws them from the workers'
            generators, seeded from ``seed``, the step a sitting starts at and the rank.
        pin_memory: page-locked batches for faster copies to a GPU (``None``: on CUDA only).
        prefetch_factor: micro-batches each worker reads ahead (with ``num_workers > 0``).
        log_with: accelerate trackers that receive every log record (e.g. ``("tensorboard",)``,
            which needs the ``tensorboard`` package), written below ``out_dir/trackers``.
        tokens_per_example: tokens (sequence positions, patches) of one example, for the
            trackers' tokens/s (``None``: examples/s only).
    """

    max_steps: int | None = None
    epochs: int | None = None
    batch_size: int = 32
    micro_batch_size: int | None = None
    optimizer: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.0
    schedule: str = "linear"
    warmup_steps: int = 0
    warmup_start_ratio: float = 0.0
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0
    decay_norm_weights: bool = False
    mixed_precision: str = "no"
    tf32: bool = False
    seed: int = 0
    checkpoint_every: Period = 0
    keep_checkpoints: int = 2
    log_every: Period = 100
    eval_every: Period = 0
    select_metric: str | None = None
    select_mode: str = "min"
    patience: int = 0
    restore_best: bool = True
    stop_after: int | None = None
    find_unused_parameters: bool = False
    cpu: bool = False
    num_workers: int = 0
    pin_memory: bool | None = None
    prefetch_factor: int = 2
    log_with: tuple[str, ...] = ()
    tokens_per_example: int | None = None

    def __post_init__(self) -> None:
        if (self.max_steps is None) == (self.epochs is None):
            raise ValueError(
                f"give exactly one of max_steps and epochs, got max_steps={self.max_steps!r}, "
                f"epochs={self.epochs!r}"
            )
        positive: dict[str, Any] = {
            "batch_size": self.batch_size,
            "keep_checkpoints": self.keep_checkpoints,
        }
        optional = {
            "max_steps": self.max_steps,
            "epochs": self.epochs,
            "micro_batch_size": self.micro_batch_size,
            "stop_after": self.stop_after,
            "tokens_per_example": self.tokens_per_example,
        }
        positive.update({k: v for k, v in optional.items() if v is not None})
        for name, value in positive.items():
            _check_int(name, value, minimum=1)
        _check_int("warmup_steps", self.warmup_steps, minimum=0)
        _check_int("patience", self.patience, minimum=0)
        _check_int("num_workers", self.num_workers, minimum=0)
        _check_int("prefetch_factor", self.prefetch_factor, minimum=1)
        for name in ("checkpoint_every", "log_every", "eval_every"):
            value = getattr(self, name)
            if value != "epoch":
                _check_int(name, value, minimum=1 if name == "log_every" else 0, epoch=True)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.mixed_precision not in ("no", "fp16", "bf16"):
            raise ValueError(
                f"mixed_precision must be 'no', 'fp16' or 'bf16', got {self.mixed_precision!r}"
            )
        if isinstance(self.log_with, str):
            self.log_with = (self.log_with,)
        if not all(isinstance(name, str) for name in self.log_with):
            raise TypeError(f"log_with must be tracker names (str), got {self.log_with!r}")
        self.log_with = tuple(self.log_with)
        if not isinstance(self.tf32, bool):
            raise TypeError(f"tf32 must be a bool, got {self.tf32!r}")
        if self.select_mode not in ("min", "max"):
            raise ValueError(f"select_mode must be 'min' or 'max', got {self.select_mode!r}")
        if self.patience and self.select_metric is None:
            raise ValueError("patience needs select_metric (the metric whose improvement counts)")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must lie in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        for name, ratio in {
            "warmup_start_ratio": self.warmup_start_ratio,
            "min_lr_ratio": self.min_lr_ratio,
        }.items():
            if not 0.0 <= ratio <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {ratio}")
        self.betas = _check_betas(self.betas)
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps}")


def _check_betas(betas: Any) -> tuple[float, float]:
    """``betas`` as two floats in ``[0, 1)`` (Adam's moment decays), else a ``ValueError``."""
    try:
        first, second = (float(b) for b in betas)
    except (TypeError, ValueError):
        raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}") from None
    if not (0.0 <= first < 1.0 and 0.0 <= second < 1.0):
        raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
    return first, second


def _check_int(name: str, value: Any, minimum: int, epoch: bool = False) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        expected = f"an int >= {minimum}" + (' or "epoch"' if epoch else "")
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def steps_per_epoch(size: int, batch_size: int) -> int:
    """Optimiser steps in one epoch of ``size`` examples at global batch ``batch_size``."""
    return size // batch_size


def lr_factor(step: int, config: TrainingConfig, total_steps: int | None = None) -> float:
    """The learning-rate multiplier used for optimiser step ``step`` (0-based).

    Warm-up: ``w0 + (1 - w0) · step / warmup_steps`` for ``step < warmup_steps`` (``w0`` =
    ``warmup_start_ratio``). Then, with ``progress = (step - warmup) / (total - warmup)``
    clamped to ``[0, 1]`` and ``m = min_lr_ratio``: linear ``m + (1 - m)(1 - progress)``, cosine
    ``m + (1 - m) · (1 + cos(π · progress)) / 2``, constant ``1``. ``total`` is
    ``total_steps`` or ``config.max_steps`` (an epoch-based config needs ``total_steps``).
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    total = total_steps if total_steps is not None else config.max_steps
    if total is None:
        raise ValueError("total_steps is needed when the config counts epochs")
    warmup = config.warmup_steps
    if step < warmup:
        start = config.warmup_start_ratio
        return start + (1.0 - start) * step / warmup
    if config.schedule == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    low = config.min_lr_ratio
    if config.schedule == "linear":
        return low + (1.0 - low) * (1.0 - progress)
    return low + (1.0 - low) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm | nn.GroupNorm | nn.modules.batchnorm._BatchNorm) or (
        "Norm" in type(module).__name__
    )


def parameter_groups(
    model: nn.Module, weight_decay: float, decay_norm_weights: bool = False
) -> list[dict[str, Any]]:
    """AdamW parameter groups: biases (and normalisation weights unless ``decay_norm_weights``)
    without weight decay, everything else with ``weight_decay``. Frozen parameters are left out."""
    no_decay: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if name == "bias" or (_is_norm(module) and not decay_norm_weights):
                no_decay.add(id(param))
    decay: list[nn.Parameter] = []
    plain: list[nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (plain if id(param) in no_decay else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if plain:
        groups.append({"params": plain, "weight_decay": 0.0})
    return groups


def micro_batch_layout(batch_size: int, micro_batch_size: int | None, processes: int) -> int:
    """The micro-batch each of ``processes`` processes runs so that the global batch stays
    ``batch_size`` exactly: ``micro_batch_size`` (``None``: ``batch_size / processes``) when
    ``micro_batch_size × processes`` divides the batch, else the largest divisor of the
    per-process share ``batch_size / processes`` below it (a layout with more processes than the
    preset was written for: the accumulation grows, the optimisation is the same).

    A ``ValueError`` naming the process counts that work when ``processes`` does not divide the
    batch (the global batch is never changed)."""
    _check_int("batch_size", batch_size, minimum=1)
    if micro_batch_size is not None:
        _check_int("micro_batch_size", micro_batch_size, minimum=1)
    if batch_size % processes:
        counts = [n for n in range(1, min(batch_size, 64) + 1) if batch_size % n == 0]
        raise ValueError(
            f"batch_size ({batch_size}, the global batch) cannot be split evenly over "
            f"{processes} processes; process counts that can: {', '.join(map(str, counts))}"
        )
    share = batch_size // processes
    wanted = share if micro_batch_size is None else min(micro_batch_size, share)
    return max(m for m in range(1, wanted + 1) if share % m == 0)


class BatchOrder:
    """The examples of every micro-batch: a pure function of ``(seed, epoch)``.

    Epoch ``e`` is ``torch.randperm(size)`` from a generator seeded with ``seed`` and ``e``, cut
    into global batches of ``batch_size`` examples (the incomplete rest is dropped). Optimiser
    step ``s`` trains on global batch ``s``; its ``accumulation = batch_size / (micro_batch_size
    × processes)`` micro-steps take consecutive slices of ``micro_batch_size × processes``
    examples, of which process ``rank`` takes slice ``rank``. The examples of a step therefore do
    not depend on the process layout.

    Args:
        size: number of examples.
        batch_size: global examples per optimiser step.
        micro_batch_size: examples per micro-batch on one process (``None``:
            ``batch_size / processes``).
        seed: data-order seed.
        processes, rank: the process layout.
        shuffle: permute each epoch (else the natural order every epoch).
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        micro_batch_size: int | None = None,
        seed: int = 0,
        processes: int = 1,
        rank: int = 0,
        shuffle: bool = True,
    ) -> None:
        if processes < 1 or not 0 <= rank < processes:
            raise ValueError(
                f"need processes >= 1 and 0 <= rank < processes, got {processes}, {rank}"
            )
        micro = micro_batch_layout(batch_size, micro_batch_size, processes)
        if size < batch_size:
            raise ValueError(
                f"dataset: {size} examples are fewer than one global batch ({batch_size})"
            )
        self.size, self.batch_size, self.micro_batch_size = size, batch_size, micro
        self.accumulation = batch_size // (micro * processes)
        self.seed, self.processes, self.rank, self.shuffle = seed, processes, rank, shuffle
        self.per_epoch = size // batch_size
        self._epoch = -1
        self._perm = torch.arange(size)

    def epoch_of(self, step: int) -> int:
        """The epoch optimiser step ``step`` (0-based over the whole run) belongs to."""
        return step // self.per_epoch

    def indices(self, step: int, micro: int = 0) -> list[int]:
        """Example indices of micro-step ``micro`` of optimiser step ``step`` on this process."""
        if not 0 <= micro < self.accumulation:
            raise ValueError(f"micro must lie in [0, {self.accumulation}), got {micro}")
        epoch, offset = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            if self.shuffle:
                generator = torch.Generator().manual_seed(
                    (self.seed * 1_000_003 + epoch) % (2**63 - 1)
                )
                self._perm = torch.randperm(self.size, generator=generator)
            self._epoch = epoch
        width = self.micro_batch_size
        start = offset * self.batch_size + (micro * self.processes + self.rank) * width
        return self._perm[start : start + width].tolist()


class MicroBatchSampler(Sampler[list[int]]):
    """The example indices of this process's micro-batches from optimiser step ``start`` to
    ``end`` (exclusive), in training order (:meth:`BatchOrder.indices`): the ``batch_sampler``
    of the :class:`~torch.utils.data.DataLoader` that feeds :class:`Trainer`."""

    def __init__(self, order: BatchOrder, start: int, end: int) -> None:
        if not 0 <= start <= end:
            raise ValueError(f"need 0 <= start <= end, got start={start}, end={end}")
        self.order, self.start, self.end = order, start, end

    def __len__(self) -> int:
        return (self.end - self.start) * self.order.accumulation

    def __iter__(self) -> Iterator[list[int]]:
        # a copy, so the permutation cache of a worker-side order never races the trainer's
        order = copy.copy(self.order)
        for step in range(self.start, self.end):
            for micro in range(order.accumulation):
                yield order.indices(step, micro)


class MaxAbsMonitor:
    """Forward hooks recording ``max |x|`` of module outputs while active.

    Args:
        model: the model.
        patterns: regular expressions, full-matched against ``named_modules()`` names.

    Tuple outputs use their first element. :meth:`collect` returns ``{name: max |x|}`` over the
    forward passes since :meth:`start` and stops recording.
    """

    def __init__(self, model: nn.Module, patterns: Sequence[str]) -> None:
        if isinstance(patterns, str):
            raise TypeError("patterns must be a sequence of regular expressions, not a str")
        compiled = [re.compile(p) for p in patterns]
        self.names: list[str] = [
            n for n, _ in model.named_modules() if n and any(p.fullmatch(n) for p in compiled)
        ]
        if patterns and not self.names:
            raise ValueError(f"patterns: no module of the model matches {list(patterns)}")
        modules = dict(model.named_modules())
        self.active = False
        self._values: dict[str, Tensor] = {}
        self._handles: list[RemovableHandle] = [
            modules[n].register_forward_hook(self._hook(n)) for n in self.names
        ]

    def _hook(self, name: str) -> Callable[[nn.Module, Any, Any], None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not self.active:
                return
            x = output[0] if isinstance(output, tuple | list) and output else output
            if isinstance(x, Tensor) and x.is_floating_point() and x.numel():
                value = x.detach().abs().amax().float()
                old = self._values.get(name)
                self._values[name] = value if old is None else torch.maximum(old, value)

        return hook

    def start(self) -> None:
        """Record from the next forward pass on."""
        self._values = {}
        self.active = True

    def collect(self) -> dict[str, float]:
        """``{name: max |x|}`` since :meth:`start` (modules not run are left out); stops."""
        self.active = False
        values, self._values = self._values, {}
        return {n: float(values[n]) for n in self.names if n in values}

    def remove(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` returns.

    Attributes:
        step: optimiser steps done.
        log: every log record (also in ``out_dir/log.jsonl``).
        resumed_from: the step of the checkpoint the run resumed from, or ``None``.
        finished: whether the run reached its last step (or stopped early by ``patience``).
        stopped_early: whether ``patience`` ended the run.
        best_step: the step of the best evaluation by ``select_metric`` (``None`` without one).
        best: that evaluation's metrics (empty without ``select_metric``).
        processes: how many processes trained the run.
    """

    step: int
    log: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: int | None = None
    finished: bool = True
    stopped_early: bool = False
    best_step: int | None = None
    best: dict[str, float] = field(default_factory=dict)
    processes: int = 1


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


#: Signals that preempt a run (:func:`preemptible`): SLURM's ``--signal=USR1@T`` warning and the
#: SIGTERM a scheduler sends before it kills a job.
PREEMPTION_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGUSR1, signal.SIGTERM)


class Preempted(KeyboardInterrupt):
    """A preemption signal stopped the run (:func:`preemptible`).

    Attributes:
        signal_name: the signal this process received (``None``: another process received it).
        step: the optimiser step the run stopped after (``None``: outside a training loop).
        checkpoint: the checkpoint written at that step (``None``: outside a training loop).
    """

    def __init__(
        self, signal_name: str | None, step: int | None = None, checkpoint: Path | None = None
    ) -> None:
        where = "" if step is None else f" after step {step} (checkpoint {checkpoint})"
        super().__init__(f"preempted by {signal_name or 'a signal to another process'}{where}")
        self.signal_name = signal_name
        self.step = step
        self.checkpoint = checkpoint


class _Preemption:
    """The state of :func:`preemptible` in this process: the signal received (if any), how many
    blocks installed the handlers and how many defer the stop to a step boundary."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.installed = 0
        self.deferred = 0


_PREEMPTION = _Preemption()


def _on_preemption_signal(signum: int, frame: Any) -> None:
    _PREEMPTION.signal_name = signal.Signals(signum).name
    if not _PREEMPTION.deferred:
        raise Preempted(_PREEMPTION.signal_name)


@contextmanager
def preemptible(*, defer: bool = False) -> Iterator[None]:
    """While the block runs, a signal of :data:`PREEMPTION_SIGNALS` preempts it.

    With ``defer=False`` the signal raises :class:`Preempted` (a ``KeyboardInterrupt``) at once;
    with ``defer=True`` (:meth:`Trainer.fit`'s step loop) it is only noted, and the code asks
    :func:`preemption_requested` at its next safe point (a step boundary, where the trainer
    writes a checkpoint and raises :class:`Preempted` itself); a signal noted but not acted on
    when the last deferring block ends raises :class:`Preempted` there. Blocks nest (the runner
    wraps the whole experiment, each fit its loop); the handlers are installed by the outermost
    block and the previous ones restored when it ends. Outside the main thread (where Python
    cannot install handlers) the block runs without them.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    state = _PREEMPTION
    previous = {}
    if state.installed == 0:
        state.signal_name = None
        previous = {s: signal.signal(s, _on_preemption_signal) for s in PREEMPTION_SIGNALS}
    state.installed += 1
    state.deferred += int(defer)
    try:
        yield
    finally:
        state.deferred -= int(defer)
        state.installed -= 1
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if defer and state.deferred == 0 and state.signal_name is not None:
        raise Preempted(state.signal_name)


def _ignore_preemption(worker: int) -> None:
    """A data worker ignores the preemption signals (a scheduler signals every process of the
    job): the training process stops at its step boundary and ends the workers then, instead
    of a worker's death failing the step."""
    for signum in PREEMPTION_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def preemption_requested() -> str | None:
    """The name of the preemption signal this process received under :func:`preemptible`
    (``None``: none)."""
    return _PREEMPTION.signal_name


class DiskFullError(OSError):
    """No space was left on the device to write a file of a run; the message names the file
    (one line), and the temporary file of the write is removed."""

    def __str__(self) -> str:
        return str(self.strerror)


#: The ``errno`` values of a full disk (no space left, disk quota exceeded).
FULL_DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT)


@contextmanager
def writing(target: Path, *temporaries: Path) -> Iterator[None]:
    """Guard the write of ``target`` through ``temporaries`` (files or folders renamed into
    place when complete): when the block raises, the temporaries are removed, and a full disk
    (``ENOSPC``, ``EDQUOT``) becomes a :class:`DiskFullError` naming ``target``."""
    try:
        yield
    except BaseException as error:
        for temporary in temporaries:
            if temporary.is_dir():
                shutil.rmtree(temporary, ignore_errors=True)
            else:
                temporary.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno in FULL_DISK_ERRORS:
            raise DiskFullError(
                error.errno,
                f"no space left on the device to write {target}; free some space and run "
                "again (what the run wrote before is kept)",
            ) from error
        raise


def _save(obj: Any, path: Path) -> None:
    """``torch.save`` through a Python file, so that a failed write raises ``OSError`` with its
    ``errno`` (a path given to ``torch.save`` fails with a bare ``RuntimeError``)."""
    with open(path, "wb") as file:
        torch.save(obj, file)


def _checkpoint_folders(out_dir: str | os.PathLike[str]) -> list[Path]:
    """The checkpoint folders under ``out_dir/checkpoints`` that hold a ``trainer.pt``, newest
    first."""
    root = Path(out_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.fullmatch(child.name)
        if match and (child / "trainer.pt").is_file():
            found.append((int(match[1]), child))
    return [path for _, path in sorted(found, reverse=True)]


def latest_checkpoint(out_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint folder under ``out_dir/checkpoints`` (or ``None``)."""
    folders = _checkpoint_folders(out_dir)
    return folders[0] if folders else None


class _DamagedCheckpoint(Exception):
    """A checkpoint file that cannot be read back or does not hold what a checkpoint holds."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path


_TRAINER_KEYS = frozenset(
    {"step", "model", "optimizer", "scheduler", "scaler", "sums", "log", "config", "processes"}
)
_RNG_KEYS = frozenset({"python", "numpy", "torch"})


def _load_part(path: Path, keys: frozenset[str]) -> dict[str, Any]:
    """The dictionary saved in checkpoint file ``path``; :class:`_DamagedCheckpoint` when it
    cannot be read (cut short, empty, not a checkpoint) or lacks one of ``keys``."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as error:  # a damaged file fails in many ways (zip, pickle, EOF, OS)
        raise _DamagedCheckpoint(path, f"{type(error).__name__}: {error}") from error
    if not isinstance(state, dict):
        raise _DamagedCheckpoint(path, f"holds a {type(state).__name__}, not a checkpoint")
    missing = sorted(keys - set(state))
    if missing:
        raise _DamagedCheckpoint(path, f"lacks {', '.join(missing)}")
    return state


def read_log(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of ``out_dir/log.jsonl`` (empty when there is none)."""
    path = Path(out_dir) / LOG_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _decorrelate_processes(rank: int) -> None:
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


def _set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Trainer:
    """Trains ``model`` on ``dataset`` with ``loss_fn`` (see the module docstring).

    Args:
        model: the model (moved to the accelerator's device).
        dataset: a sized, indexable collection of examples.
        loss_fn: ``loss_fn(model, batch)`` returning the mean loss of the micro-batch (a scalar
            Tensor), or ``(loss, {name: scalar})`` with training metrics to log beside it.
        config: :class:`TrainingConfig`.
        out_dir: folder of the log and checkpoints.
        collate_fn: ``list of examples -> batch`` (default: :func:`torch.utils.data.default_collate`).
        monitor: module-name patterns whose output ``max |x|`` is logged (names of the model as
            given, before any wrapping).
        evaluate: ``evaluate(model) -> {metric: value}``, called in eval mode without gradients
            at every evaluation step and at the end; the model is put back in training mode.
            It runs on every process with the same weights and must give the same numbers there
            (evaluate a fixed set; randomness from the global RNGs is forked and identical).
        schedule: ``schedule(step) -> learning-rate factor`` for 0-based optimiser steps,
            replacing ``config.schedule`` (e.g. a per-epoch schedule of a paper).
        accelerator: an existing :class:`accelerate.Accelerator` (default: a new one from
            ``config.mixed_precision``, ``config.cpu`` and ``config.log_with``).
        trackers: ``accelerate.tracking.GeneralTracker`` objects that receive the log records
            beside ``config.log_with`` (only with a new accelerator).
        progress: draw a progress bar on the main process.
    """

    def __init__(
        self,
        model: nn.Module,
        dataset: Any,
        loss_fn: Callable[[nn.Module, Any], Any],
        config: TrainingConfig,
        out_dir: str | os.PathLike[str],
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        monitor: Sequence[str] = (),
        evaluate: Callable[[nn.Module], Mapping[str, float]] | None = None,
        schedule: Callable[[int], float] | None = None,
        accelerator: Any = None,
        progress: bool = True,
        trackers: Sequence[Any] = (),
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(config, TrainingConfig):
            raise TypeError(f"config must be a TrainingConfig, got {type(config).__name__}")
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise TypeError("dataset must be sized and indexable (len(dataset), dataset[i])")
        if accelerator is not None and (config.log_with or trackers):
            raise ValueError("log_with and trackers configure a new accelerator: give neither")
        if accelerator is None:
            from accelerate import Accelerator
            from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

            ddp = DistributedDataParallelKwargs(
                find_unused_parameters=config.find_unused_parameters
            )
            warn_if_processes_were_lost()
            # several processes without a GPU form a gloo group only with accelerate's CPU flag
            several_cpus = process_layout()[1] > 1 and not torch.cuda.is_available()
            accelerator = Accelerator(
                mixed_precision=config.mixed_precision,
                cpu=config.cpu or several_cpus,
                kwargs_handlers=[ddp, InitProcessGroupKwargs(timeout=collective_timeout())],
                log_with=_trackers(config.log_with, trackers) or None,
                project_dir=out_dir,
            )
        self.accelerator = accelerator
        if accelerator.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = config.tf32
        self.config = config
        self.dataset = dataset
        self.loss_fn = loss_fn
        self.collate_fn = collate_fn or default_collate
        self.evaluate = evaluate
        self.progress = progress
        self.out_dir = Path(out_dir)
        self.monitor = MaxAbsMonitor(model, monitor)
        self.order = BatchOrder(
            len(dataset),
            config.batch_size,
            config.micro_batch_size,
            config.seed,
            accelerator.num_processes,
            accelerator.process_index,
        )
        self.steps_per_epoch = self.order.per_epoch
        self.total_steps = (
            config.max_steps
            if config.max_steps is not None
            else int(config.epochs or 0) * self.steps_per_epoch
        )
        if self.total_steps < 1:
            raise ValueError("config: the run has no optimiser step (epochs × steps per epoch = 0)")
        self.checkpoint_every = self._period(config.checkpoint_every)
        self.log_every = self._period(config.log_every)
        self.eval_every = self._period(config.eval_every)
        optimizer = self._optimizer(model)
        factor = schedule or (lambda step: lr_factor(step, config, self.total_steps))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        self.step = 0
        self._feed: Iterator[Any] = iter(())  # the micro-batches of a fit (_batches)
        self._sums: dict[str, float] = {"steps": 0}
        self._selection: dict[str, Any] = {"best": None, "step": None, "metrics": {}, "bad": 0}
        self._best_state: dict[str, Tensor] | None = None
        self.log: list[dict[str, Any]] = []
        self._clock = (time.perf_counter(), 0)  # (time, step) of the last log record

    def _period(self, value: Period) -> int:
        return self.steps_per_epoch if value == "epoch" else int(value)

    def _optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        cfg = self.config
        groups = parameter_groups(model, cfg.weight_decay, cfg.decay_norm_weights)
        if cfg.optimizer == "sgd":
            return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)
        kind = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
        return kind(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)

    @property
    def unwrapped(self) -> nn.Module:
        """The model without distributed/precision wrappers."""
        return self.accelerator.unwrap_model(self.model)

    # --- checkpoints ------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """Write the checkpoint of the current step (all processes must call it)."""
        acc = self.accelerator
        root = self.out_dir / CHECKPOINT_DIR
        final = root / f"step-{self.step}"
        tmp = root / f"tmp-step-{self.step}"
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            with writing(final, tmp):
                tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        # each process keeps its own random streams and its own running sums since the last
        # log record (every process logs their mean over the processes)
        with writing(final / f"rng-{acc.process_index}.pt", tmp):
            _save({**_rng_state(), "sums": dict(self._sums)}, tmp / f"rng-{acc.process_index}.pt")
        acc.wait_for_everyone()
        if acc.is_main_process:
            scaler = getattr(acc, "scaler", None)
            state = {
                "step": self.step,
                "model": self.unwrapped.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "sums": dict(self._sums),
                "selection": dict(self._selection),
                "best_state": self._best_state,
                "log": self.log,
                "config": asdict(self.config),
                "processes": acc.num_processes,
            }
            with writing(final / "trainer.pt", tmp):
                _save(state, tmp / "trainer.pt")
                shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
            kept = sorted(
                (int(m[1]), p)
                for p in root.iterdir()
                if (m := _STEP_DIR.fullmatch(p.name)) is not None
            )
            for _, old in kept[: -self.config.keep_checkpoints]:
                shutil.rmtree(old, ignore_errors=True)
        acc.wait_for_everyone()
        return final

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore the state saved in checkpoint folder ``path``.

        Raises ``ValueError`` naming the file when one of its files cannot be read back or is
        no checkpoint of this trainer's, or when it was written by another process count or
        precision; nothing is restored then."""
        try:
            state, rng = self._read_checkpoint(Path(path))
        except _DamagedCheckpoint as damaged:
            raise ValueError(f"damaged checkpoint {damaged}") from damaged
        self._restore(state, rng)

    def _read_checkpoint(self, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        """The trainer state and this process's RNG states in checkpoint folder ``path``
        (:class:`_DamagedCheckpoint` when a file is unreadable or not a checkpoint's)."""
        state = _load_part(path / "trainer.pt", _TRAINER_KEYS)
        match = _STEP_DIR.fullmatch(path.name)
        if match is not None and state["step"] != int(match[1]):
            raise _DamagedCheckpoint(
                path / "trainer.pt", f"holds step {state['step']!r}, not {match[1]}"
            )
        rng = _load_part(path / f"rng-{self.accelerator.process_index}.pt", _RNG_KEYS)
        return state, rng

    def _restore(self, state: dict[str, Any], rng: dict[str, Any]) -> None:
        if state["processes"] != self.accelerator.num_processes:
            raise ValueError(
                f"path: checkpoint was written by {state['processes']} processes, this run has "
                f"{self.accelerator.num_processes}; the random states per process would differ"
            )
        precision = state["config"].get("mixed_precision", "no")
        if precision != self.config.mixed_precision:
            raise ValueError(
                f"path: checkpoint was trained with mixed_precision={precision!r}, this run has "
                f"{self.config.mixed_precision!r}; resume with the same precision"
            )
        self.unwrapped.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None and state["scaler"] is not None:
            scaler.load_state_dict(state["scaler"])
        self.step = int(state["step"])
        # this process's own sums (checkpoints before 27 Nov 2026 kept only the main process's)
        self._sums = dict(rng.get("sums", state["sums"]))
        self._selection = dict(state.get("selection", self._selection))  # 0.1.0: none saved
        self._best_state = state.get("best_state")
        self.log = list(state["log"])
        _set_rng_state(rng)

    def _resume(self) -> int | None:
        """Restore the newest checkpoint that reads back whole (every process agrees on which)
        and return its step; ``None`` when there is none. A damaged one is removed with a
        warning naming its file, and the one before it is tried."""
        acc = self.accelerator
        for path in _checkpoint_folders(self.out_dir):
            try:
                state, rng = self._read_checkpoint(path)
                damaged = None
            except _DamagedCheckpoint as error:
                damaged = error
            failed = torch.tensor([float(damaged is not None)], dtype=torch.float64)
            if acc.num_processes > 1:
                failed = _all_reduce(failed, "max")  # also the barrier before the removal
            if not failed.item():
                self._restore(state, rng)
                return self.step
            if damaged is not None:
                warnings.warn(
                    f"damaged checkpoint {damaged}; removing {path} and resuming from the one "
                    "before (or from the start when none is left)",
                    stacklevel=3,
                )
            if acc.is_main_process:
                shutil.rmtree(path, ignore_errors=True)
        return None

    # --- the loop ---------------------------------------------------------------------------

    def _batches(self, end: int) -> Iterator[Any]:
        """This process's micro-batches from the current step to ``end``, collated (by
        ``num_workers`` worker processes ahead of the step, or here when it is 0)."""
        cfg = self.config
        pin = torch.cuda.is_available() if cfg.pin_memory is None else cfg.pin_memory
        seed = (cfg.seed * 1_000_003 + self.step) * 1_009 + self.accelerator.process_index
        loader = DataLoader(
            self.dataset,
            batch_sampler=MicroBatchSampler(self.order, self.step, end),
            collate_fn=self.collate_fn,
            num_workers=cfg.num_workers,
            pin_memory=pin and self.accelerator.device.type == "cuda",
            generator=torch.Generator().manual_seed(seed % 2**63),  # not the global RNG
            prefetch_factor=cfg.prefetch_factor if cfg.num_workers else None,
            worker_init_fn=_ignore_preemption if cfg.num_workers else None,
        )
        return iter(loader)

    def _batch(self, micro: int) -> Any:
        from accelerate.utils import send_to_device

        return send_to_device(next(self._feed), self.accelerator.device, non_blocking=True)

    def _write_log(self) -> None:
        if self.accelerator.is_main_process:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            text = "".join(json.dumps(r) + "\n" for r in self.log)
            tmp = self.out_dir / (LOG_FILE + ".tmp")
            with writing(self.out_dir / LOG_FILE, tmp):
                tmp.write_text(text)
                os.replace(tmp, self.out_dir / LOG_FILE)

    def _evaluate(self) -> dict[str, float]:
        if self.evaluate is None:
            return {}
        self.model.eval()
        devices = [self.accelerator.device] if self.accelerator.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            metrics = {k: float(v) for k, v in self.evaluate(self.unwrapped).items()}
        self.model.train()
        return metrics

    def _micro_step(self, micro: int, last: bool) -> dict[str, float]:
        acc = self.accelerator
        batch = self._batch(micro)
        context = acc.no_sync(self.model) if not last else nullcontext()
        with context, acc.autocast():
            out = self.loss_fn(self.model, batch)
            loss, metrics = out if isinstance(out, tuple) else (out, {})
            if not isinstance(loss, Tensor) or loss.dim() != 0:
                raise TypeError("loss_fn must return a scalar Tensor or (scalar Tensor, dict)")
            acc.backward(loss / self.order.accumulation)
        values = {"loss": float(loss.detach())}
        values.update({k: float(torch.as_tensor(v).detach()) for k, v in metrics.items()})
        return values

    def _train_step(self) -> float:
        acc, cfg = self.accelerator, self.config
        accumulation = self.order.accumulation
        for k in range(accumulation):
            for name, value in self._micro_step(k, k == accumulation - 1).items():
                self._sums[name] = self._sums.get(name, 0.0) + value / accumulation
        self._sums["steps"] += 1
        if cfg.grad_clip:
            norm = acc.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        else:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
        self.optimizer.step()
        if not acc.optimizer_step_was_skipped:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def _reduced_sums(self) -> dict[str, float]:
        """The running means since the last record, averaged over the processes."""
        steps = max(self._sums["steps"], 1)
        names = sorted(k for k in self._sums if k != "steps")
        local = torch.tensor([self._sums[k] / steps for k in names], dtype=torch.float64)
        if self.accelerator.num_processes > 1:
            local = _all_reduce(local, "mean")
        self._sums = {"steps": 0}
        return dict(zip(names, local.tolist(), strict=True))

    def _reduced_max_abs(self) -> dict[str, float]:
        values = self.monitor.collect()
        if self.accelerator.num_processes == 1 or not self.monitor.names:
            return values
        local = torch.tensor(
            [values.get(n, -math.inf) for n in self.monitor.names], dtype=torch.float64
        )
        merged = _all_reduce(local, "max").tolist()
        return {n: v for n, v in zip(self.monitor.names, merged, strict=True) if v > -math.inf}

    def _select(self, metrics: Mapping[str, float]) -> bool:
        """Track the best evaluation; whether ``patience`` says to stop."""
        cfg = self.config
        if cfg.select_metric is None:
            return False
        if cfg.select_metric not in metrics:
            raise KeyError(
                f"select_metric {cfg.select_metric!r} is not among the evaluation metrics "
                f"{sorted(metrics)}"
            )
        value = metrics[cfg.select_metric]
        best = self._selection["best"]
        better = not math.isnan(value) and (
            best is None or (value < best if cfg.select_mode == "min" else value > best)
        )
        if better:
            self._selection.update(best=value, step=self.step, metrics=dict(metrics), bad=0)
            if cfg.restore_best:
                self._best_state = {
                    k: v.detach().cpu().clone() for k, v in self.unwrapped.state_dict().items()
                }
        else:
            self._selection["bad"] += 1
        return bool(cfg.patience) and self._selection["bad"] >= cfg.patience

    def _due(self, period: int, step: int) -> bool:
        return bool(period) and step % period == 0

    def fit(self, *, resume: bool = True, until_step: int | None = None) -> TrainResult:
        """Train to the last step (or stop after ``until_step``), resuming if possible.

        Args:
            resume: continue from the newest checkpoint in ``out_dir`` that reads back whole
                (a damaged one is removed with a warning naming its file; none: start over);
                ``False`` deletes the log and checkpoints of an earlier run in ``out_dir`` and
                starts over.
            until_step: stop after this step (a checkpoint is written there), e.g. to split a
                long run into several jobs.

        Returns:
            :class:`TrainResult`; ``result.log`` holds every record since step 0. With
            ``select_metric`` and ``restore_best`` the model holds the best weights afterwards.

        Raises:
            Preempted: SIGUSR1 or SIGTERM arrived during the loop (:func:`preemptible`); every
                process stopped after the same step and its checkpoint is written.
        """
        cfg, acc = self.config, self.accelerator
        limits = [self.total_steps, until_step, cfg.stop_after]
        end = min(x for x in limits if x is not None)
        resumed_from = self._resume() if resume else None
        if resumed_from is not None:
            self._write_log()
        else:
            _decorrelate_processes(acc.process_index)
            if acc.is_main_process:  # a fresh start: no stale log or checkpoints of an older run
                (self.out_dir / LOG_FILE).unlink(missing_ok=True)
                shutil.rmtree(self.out_dir / CHECKPOINT_DIR, ignore_errors=True)
        acc.wait_for_everyone()
        self.model.train()
        stopped = bool(self.log and self.log[-1].get("stopped_early"))
        bar = None
        if self.progress and acc.is_main_process:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.total_steps, initial=self.step, desc="train", dynamic_ncols=True)
        self._feed = self._batches(end)
        self._start_trackers()
        try:
            with preemptible(defer=True):
                while self.step < end and not stopped:
                    stopped = self._one_step(bar)
                    last = stopped or self.step in (end, self.total_steps)
                    if self._preempted():
                        raise Preempted(preemption_requested(), self.step, self.save_checkpoint())
                    if last or self._due(self.checkpoint_every, self.step):
                        self.save_checkpoint()
        finally:
            self.monitor.active = False
            self._feed = iter(())  # ends the data workers
            self._finish_trackers()
            if bar is not None:
                bar.close()
        if cfg.select_metric is not None and cfg.restore_best and self._best_state is not None:
            self.unwrapped.load_state_dict(self._best_state)
        selection = self._selection if cfg.select_metric is not None else {}
        return TrainResult(
            step=self.step,
            log=list(self.log),
            resumed_from=resumed_from,
            finished=stopped or self.step >= self.total_steps,
            stopped_early=stopped,
            best_step=selection.get("step"),
            best=dict(selection.get("metrics", {})),
            processes=acc.num_processes,
        )

    def _preempted(self) -> bool:
        """Whether a process received a preemption signal (:func:`preemptible`); under several
        processes the flags are reduced at every step boundary, so all of them stop there."""
        flag = torch.tensor([float(preemption_requested() is not None)], dtype=torch.float64)
        if self.accelerator.num_processes > 1:
            flag = _all_reduce(flag, "max")
        return bool(flag.item())

    def _start_trackers(self) -> None:
        """Start the accelerator's trackers (main process) in ``out_dir/trackers``, with the
        training configuration as their hyperparameters."""
        acc = self.accelerator
        self._clock = (time.perf_counter(), self.step)
        if getattr(acc, "log_with", None) and not acc.trackers:
            config = {
                k: v if v is None or isinstance(v, bool | int | float | str) else str(v)
                for k, v in asdict(self.config).items()
            }
            acc.init_trackers("trackers", config=config)

    def _finish_trackers(self) -> None:
        for tracker in self.accelerator.trackers:
            tracker.finish()
        self.accelerator.trackers.clear()

    def _track(self, record: Mapping[str, Any]) -> None:
        """Give the trackers a log record: loss, metrics, lr, grad norm, ``max_abs/<module>``,
        ``eval/<metric>`` and the throughput since the previous record."""
        if not self.accelerator.trackers:
            return
        now, step = time.perf_counter(), self.step
        examples = (
            (step - self._clock[1]) * self.config.batch_size / max(now - self._clock[0], 1e-9)
        )
        self._clock = (now, step)
        values = {k: v for k, v in record.items() if isinstance(v, int | float) and k != "step"}
        values.update({f"max_abs/{k}": v for k, v in record["max_abs"].items()})
        values.update({f"eval/{k}": v for k, v in record.get("eval", {}).items()})
        values["examples_per_s"] = examples
        if self.config.tokens_per_example is not None:
            values["tokens_per_s"] = examples * self.config.tokens_per_example
        self.accelerator.log(values, step=step)

    def _one_step(self, bar: Any) -> bool:
        """Train one optimiser step, log and evaluate when due; whether to stop early."""
        upcoming = self.step + 1
        evaluate_now = upcoming == self.total_steps or self._due(self.eval_every, upcoming)
        log_now = evaluate_now or self._due(self.log_every, upcoming)
        lr = self.scheduler.get_last_lr()[0]
        if log_now:
            self.monitor.start()
        norm = self._train_step()
        self.step += 1
        stop = False
        if log_now:
            record: dict[str, Any] = {
                "step": self.step,
                "epoch": self.order.epoch_of(self.step - 1),
                **self._reduced_sums(),
                "lr": lr,
                "grad_norm": norm,
                "max_abs": self._reduced_max_abs(),
            }
            if evaluate_now:
                record["eval"] = self._evaluate()
                stop = self._select(record["eval"])
                if stop:
                    record["stopped_early"] = True
            self.log.append(record)
            self._write_log()
            self._track(record)
            if bar is not None:
                bar.set_postfix(loss=f"{record['loss']:.4g}")
        if bar is not None:
            bar.update(1)
        return stop

    def close(self) -> None:
        """Remove the monitoring hooks from the model."""
        self.monitor.remove()


def check_tracker_names(names: Sequence[str]) -> None:
    """``ValueError`` for a name that is no accelerate tracker, ``ImportError`` naming the
    package of one that is not installed (accelerate would drop it without a word)."""
    if not names:  # nothing to check: accelerate need not be installed
        return
    from accelerate.tracking import get_available_trackers
    from accelerate.utils import LoggerType

    known = [str(t) for t in LoggerType if str(t) != "all"]
    available = {str(t) for t in get_available_trackers()}
    for name in names:
        if name not in known:
            raise ValueError(f"unknown tracker {name!r}; accelerate knows {known}")
        if name not in available:
            raise ImportError(
                f"tracker {name!r} needs the {name} package, which is not installed "
                f"(pip install {name})",
                name=name,
            )


def _trackers(names: Sequence[str], trackers: Sequence[Any]) -> list[Any]:
    """What ``Accelerator(log_with=...)`` gets: the tracker ``names`` (checked) and objects."""
    from accelerate.tracking import GeneralTracker

    check_tracker_names(names)
    for tracker in trackers:
        if not isinstance(tracker, GeneralTracker):
            raise TypeError(
                f"trackers must be accelerate GeneralTracker objects, got {type(tracker).__name__}"
            )
    return [*names, *trackers]


def _all_reduce(values: Tensor, op: str) -> Tensor:
    """``values`` reduced over the processes (``"mean"`` or ``"max"``), on every process."""
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    out = values.to(device)
    dist.all_reduce(out, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    if op == "mean":
        out /= dist.get_world_size()
    return out.cpu()

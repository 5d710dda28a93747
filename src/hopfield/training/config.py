"""The settings of a training run: :class:`TrainingConfig`, the learning-rate schedule, the
optimiser's parameter groups and the split of the global batch over processes and micro-batches."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

SCHEDULES = ("linear", "cosine", "constant")
OPTIMIZERS = ("adamw", "adam", "sgd")


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


def build_optimizer(model: nn.Module, config: TrainingConfig) -> torch.optim.Optimizer:
    """The optimiser ``config`` chooses for ``model`` (:func:`parameter_groups`, learning rate
    ``config.lr``; the schedule is applied by the caller)."""
    groups = parameter_groups(model, config.weight_decay, config.decay_norm_weights)
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)
    kind = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
    return kind(groups, lr=config.lr, betas=config.betas, eps=config.eps)


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

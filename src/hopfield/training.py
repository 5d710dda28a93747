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
* **data order** as a pure function of ``(seed, epoch)``: every epoch is a permutation drawn from
  its own generator and cut into global batches (``batch_size × processes``; each process takes
  its slice; the incomplete last batch is dropped). Micro-batch ``m`` of the run is always the
  same examples, so a resumed run sees the data a continuous run sees;
* **checkpoints** every ``checkpoint_every`` steps into ``out_dir/checkpoints/step-<N>/``: model,
  optimiser, schedule, loss scaler, the running log sums and every process's RNG states
  (Python, NumPy, torch, CUDA). :meth:`Trainer.fit` resumes from the newest one: a run stopped
  after a checkpoint and resumed ends with **bitwise** the weights and the log of an uninterrupted
  run (on the same hardware and process count; the tests check this on CPU);
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
                      warmup_steps=100, batch_size=32, checkpoint_every=200, log_every=50),
                      out_dir="runs/bert", monitor=[r"bert\\.encoder\\.layer\\.\\d+\\.output\\.dense"])
    result = trainer.fit()          # resumes from runs/bert/checkpoints when present
    result.log[-1]["loss"]

The batches given to ``loss_fn`` are ``collate_fn([dataset[i] for i in indices])`` moved to the
accelerator's device. Randomness inside ``loss_fn`` (masking, dropout) must use the global torch
RNG (or NumPy/Python's), whose states are checkpointed; evaluation runs under
:func:`torch.random.fork_rng`, so it never changes the training randomness.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import default_collate
from torch.utils.hooks import RemovableHandle

__all__ = [
    "SCHEDULES",
    "BatchOrder",
    "MaxAbsMonitor",
    "TrainResult",
    "Trainer",
    "TrainingConfig",
    "latest_checkpoint",
    "lr_factor",
    "parameter_groups",
    "read_log",
]

SCHEDULES = ("linear", "cosine", "constant")
LOG_FILE = "log.jsonl"
CHECKPOINT_DIR = "checkpoints"
_STEP_DIR = re.compile(r"step-(\d+)")


@dataclass
class TrainingConfig:
    """Optimiser, schedule and loop settings of :class:`Trainer`.

    Attributes:
        max_steps: optimiser steps to train.
        batch_size: examples per micro-batch **per process**.
        grad_accum: micro-batches per optimiser step (the effective batch is
            ``batch_size × grad_accum × processes``).
        lr: peak learning rate.
        weight_decay: AdamW decoupled weight decay.
        betas, eps: AdamW moments and epsilon.
        schedule: ``"linear"`` (decay to ``min_lr_ratio · lr`` at ``max_steps``), ``"cosine"``
            (half cosine to ``min_lr_ratio · lr``) or ``"constant"``, each after the warm-up.
        warmup_steps: linear warm-up from ``warmup_start_ratio · lr`` to ``lr``.
        warmup_start_ratio: learning-rate factor at step 0 (timm's ``warmup_lr / lr``).
        min_lr_ratio: final learning-rate factor (timm's ``min_lr / lr``).
        grad_clip: maximum global gradient norm (``None`` or ``0`` = no clipping).
        decay_norm_weights: also decay normalisation weights (LayerNorm γ); biases never decay.
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``.
        seed: seed of the data order (the global RNGs are seeded by the caller).
        checkpoint_every: checkpoint every this many steps (``0`` = only at the end).
        keep_checkpoints: how many of the newest checkpoints to keep.
        log_every: write a log record every this many steps (and at evaluation steps).
        eval_every: call ``evaluate`` every this many steps (``0`` = never during training;
            always after the last step); its metrics go into that step's log record (``"eval"``).
        cpu: force the CPU even where a GPU is present.
    """

    max_steps: int
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    schedule: str = "linear"
    warmup_steps: int = 0
    warmup_start_ratio: float = 0.0
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0
    decay_norm_weights: bool = False
    mixed_precision: str = "no"
    seed: int = 0
    checkpoint_every: int = 0
    keep_checkpoints: int = 1
    log_every: int = 100
    eval_every: int = 0
    cpu: bool = False

    def __post_init__(self) -> None:
        positive: dict[str, Any] = {
            "max_steps": self.max_steps,
            "batch_size": self.batch_size,
            "grad_accum": self.grad_accum,
            "log_every": self.log_every,
            "keep_checkpoints": self.keep_checkpoints,
        }
        for name, value in positive.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name, value in {
            "warmup_steps": self.warmup_steps,
            "checkpoint_every": self.checkpoint_every,
            "eval_every": self.eval_every,
        }.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.mixed_precision not in ("no", "fp16", "bf16"):
            raise ValueError(
                f"mixed_precision must be 'no', 'fp16' or 'bf16', got {self.mixed_precision!r}"
            )
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        for name, value in {
            "warmup_start_ratio": self.warmup_start_ratio,
            "min_lr_ratio": self.min_lr_ratio,
        }.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {value}")
        self.betas = (float(self.betas[0]), float(self.betas[1]))


def lr_factor(step: int, config: TrainingConfig) -> float:
    """The learning-rate multiplier used for optimiser step ``step`` (0-based).

    Warm-up: ``w0 + (1 - w0) · step / warmup_steps`` for ``step < warmup_steps`` (``w0`` =
    ``warmup_start_ratio``). Then, with ``progress = (step - warmup) / (max_steps - warmup)``
    clamped to ``[0, 1]`` and ``m = min_lr_ratio``: linear ``m + (1 - m)(1 - progress)``, cosine
    ``m + (1 - m) · (1 + cos(π · progress)) / 2``, constant ``1``.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    warmup = config.warmup_steps
    if step < warmup:
        start = config.warmup_start_ratio
        return start + (1.0 - start) * step / warmup
    if config.schedule == "constant":
        return 1.0
    span = max(1, config.max_steps - warmup)
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


class BatchOrder:
    """The examples of every micro-batch: a pure function of ``(seed, epoch)``.

    Epoch ``e`` is ``torch.randperm(size)`` from a generator seeded with ``seed`` and ``e``, cut
    into global batches of ``batch_size × processes`` examples (the incomplete rest is dropped);
    process ``rank`` takes slice ``rank`` of each global batch.

    Args:
        size: number of examples.
        batch_size: examples per micro-batch per process.
        seed: data-order seed.
        processes, rank: the process layout.
        shuffle: permute each epoch (else the natural order every epoch).
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        seed: int = 0,
        processes: int = 1,
        rank: int = 0,
        shuffle: bool = True,
    ) -> None:
        if batch_size < 1 or processes < 1 or not 0 <= rank < processes:
            raise ValueError(
                f"batch_size, processes must be >= 1 and 0 <= rank < processes, got "
                f"{batch_size}, {processes}, {rank}"
            )
        self.global_batch = batch_size * processes
        if size < self.global_batch:
            raise ValueError(
                f"dataset: {size} examples are fewer than one global batch ({self.global_batch})"
            )
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.rank, self.shuffle = rank, shuffle
        self.per_epoch = size // self.global_batch
        self._epoch = -1
        self._perm = torch.arange(size)

    def epoch_of(self, micro: int) -> int:
        """The epoch micro-batch ``micro`` (0-based over the whole run) belongs to."""
        return micro // self.per_epoch

    def indices(self, micro: int) -> list[int]:
        """Example indices of micro-batch ``micro`` for this process."""
        epoch, offset = divmod(micro, self.per_epoch)
        if epoch != self._epoch:
            if self.shuffle:
                generator = torch.Generator().manual_seed(
                    (self.seed * 1_000_003 + epoch) % (2**63 - 1)
                )
                self._perm = torch.randperm(self.size, generator=generator)
            self._epoch = epoch
        start = offset * self.global_batch + self.rank * self.batch_size
        return self._perm[start : start + self.batch_size].tolist()


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
        finished: whether ``max_steps`` was reached.
    """

    step: int
    log: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: int | None = None
    finished: bool = True


def latest_checkpoint(out_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint folder under ``out_dir/checkpoints`` (or ``None``)."""
    root = Path(out_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return None
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.fullmatch(child.name)
        if match and (child / "trainer.pt").is_file():
            found.append((int(match[1]), child))
    return max(found)[1] if found else None


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
        loss_fn: ``loss_fn(model, batch) -> scalar Tensor`` (the mean loss of the micro-batch).
        config: :class:`TrainingConfig`.
        out_dir: folder of the log and checkpoints.
        collate_fn: ``list of examples -> batch`` (default: :func:`torch.utils.data.default_collate`).
        monitor: module-name patterns whose output ``max |x|`` is logged (names of the model as
            given, before any wrapping).
        evaluate: ``evaluate(model) -> {metric: value}``, called in eval mode without gradients
            every ``eval_every`` steps and at the end; the model is put back in training mode.
        accelerator: an existing :class:`accelerate.Accelerator` (default: a new one from
            ``config.mixed_precision`` and ``config.cpu``).
        progress: draw a progress bar on the main process.
    """

    def __init__(
        self,
        model: nn.Module,
        dataset: Any,
        loss_fn: Callable[[nn.Module, Any], Tensor],
        config: TrainingConfig,
        out_dir: str | os.PathLike[str],
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        monitor: Sequence[str] = (),
        evaluate: Callable[[nn.Module], Mapping[str, float]] | None = None,
        accelerator: Any = None,
        progress: bool = True,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(config, TrainingConfig):
            raise TypeError(f"config must be a TrainingConfig, got {type(config).__name__}")
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise TypeError("dataset must be sized and indexable (len(dataset), dataset[i])")
        if accelerator is None:
            from accelerate import Accelerator

            accelerator = Accelerator(mixed_precision=config.mixed_precision, cpu=config.cpu)
        self.accelerator = accelerator
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
            config.seed,
            accelerator.num_processes,
            accelerator.process_index,
        )
        optimizer = torch.optim.AdamW(
            parameter_groups(model, config.weight_decay, config.decay_norm_weights),
            lr=config.lr,
            betas=config.betas,
            eps=config.eps,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_factor(step, config)
        )
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        self.step = 0
        self._sums = {"loss": 0.0, "steps": 0}
        self.log: list[dict[str, Any]] = []

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
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        torch.save(_rng_state(), tmp / f"rng-{acc.process_index}.pt")
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
                "log": self.log,
                "config": asdict(self.config),
                "processes": acc.num_processes,
            }
            torch.save(state, tmp / "trainer.pt")
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
        """Restore the state saved in checkpoint folder ``path``."""
        path = Path(path)
        state = torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)
        if state["processes"] != self.accelerator.num_processes:
            raise ValueError(
                f"path: checkpoint was written by {state['processes']} processes, this run has "
                f"{self.accelerator.num_processes}; the data order would differ"
            )
        self.unwrapped.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None and state["scaler"] is not None:
            scaler.load_state_dict(state["scaler"])
        self.step = int(state["step"])
        self._sums = dict(state["sums"])
        self.log = list(state["log"])
        rng = torch.load(
            path / f"rng-{self.accelerator.process_index}.pt",
            map_location="cpu",
            weights_only=False,
        )
        _set_rng_state(rng)

    # --- the loop ---------------------------------------------------------------------------

    def _batch(self, micro: int) -> Any:
        from accelerate.utils import send_to_device

        examples = [self.dataset[i] for i in self.order.indices(micro)]
        return send_to_device(self.collate_fn(examples), self.accelerator.device)

    def _write_log(self) -> None:
        if self.accelerator.is_main_process:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            text = "".join(json.dumps(r) + "\n" for r in self.log)
            tmp = self.out_dir / (LOG_FILE + ".tmp")
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

    def _train_step(self) -> tuple[float, float]:
        acc, cfg = self.accelerator, self.config
        total = 0.0
        for k in range(cfg.grad_accum):
            batch = self._batch(self.step * cfg.grad_accum + k)
            last = k == cfg.grad_accum - 1
            context = acc.no_sync(self.model) if not last else nullcontext()
            with context, acc.autocast():
                loss = self.loss_fn(self.model, batch)
                if not isinstance(loss, Tensor) or loss.dim() != 0:
                    raise TypeError("loss_fn must return a scalar Tensor")
                acc.backward(loss / cfg.grad_accum)
            total += float(loss.detach()) / cfg.grad_accum
        if cfg.grad_clip:
            norm = acc.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        else:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
        self.optimizer.step()
        if not acc.optimizer_step_was_skipped:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total, float(norm)

    def fit(self, *, resume: bool = True, until_step: int | None = None) -> TrainResult:
        """Train to ``config.max_steps`` (or stop after ``until_step``), resuming if possible.

        Args:
            resume: continue from the newest checkpoint in ``out_dir`` (if any); ``False``
                deletes the log and checkpoints of an earlier run in ``out_dir`` and starts over.
            until_step: stop after this step (a checkpoint is written there), e.g. to split a
                long run into several jobs.

        Returns:
            :class:`TrainResult`; ``result.log`` holds every record since step 0.
        """
        cfg, acc = self.config, self.accelerator
        end = cfg.max_steps if until_step is None else min(until_step, cfg.max_steps)
        resumed_from = None
        checkpoint = latest_checkpoint(self.out_dir) if resume else None
        if checkpoint is not None:
            self.load_checkpoint(checkpoint)
            resumed_from = self.step
            self._write_log()
        elif acc.is_main_process:  # a fresh start: no stale log or checkpoints of an older run
            (self.out_dir / LOG_FILE).unlink(missing_ok=True)
            shutil.rmtree(self.out_dir / CHECKPOINT_DIR, ignore_errors=True)
        acc.wait_for_everyone()
        self.model.train()
        bar = None
        if self.progress and acc.is_main_process:
            from tqdm.auto import tqdm

            bar = tqdm(total=cfg.max_steps, initial=self.step, desc="train", dynamic_ncols=True)
        try:
            while self.step < end:
                upcoming = self.step + 1
                evaluate_now = upcoming == cfg.max_steps or bool(
                    cfg.eval_every and upcoming % cfg.eval_every == 0
                )
                log_now = evaluate_now or upcoming % cfg.log_every == 0
                lr = self.scheduler.get_last_lr()[0]
                if log_now:
                    self.monitor.start()
                loss, norm = self._train_step()
                self.step += 1
                self._sums["loss"] += loss
                self._sums["steps"] += 1
                if log_now:
                    record: dict[str, Any] = {
                        "step": self.step,
                        "epoch": self.order.epoch_of(self.step * cfg.grad_accum - 1),
                        "loss": self._sums["loss"] / self._sums["steps"],
                        "lr": lr,
                        "grad_norm": norm,
                        "max_abs": self.monitor.collect(),
                    }
                    self._sums = {"loss": 0.0, "steps": 0}
                    if evaluate_now:
                        record["eval"] = self._evaluate()
                    self.log.append(record)
                    self._write_log()
                    if bar is not None:
                        bar.set_postfix(loss=f"{record['loss']:.4g}")
                if bar is not None:
                    bar.update(1)
                at_checkpoint = cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0
                if at_checkpoint or self.step in (end, cfg.max_steps):
                    self.save_checkpoint()
        finally:
            self.monitor.active = False
            if bar is not None:
                bar.close()
        return TrainResult(
            step=self.step,
            log=list(self.log),
            resumed_from=resumed_from,
            finished=self.step >= cfg.max_steps,
        )

    def close(self) -> None:
        """Remove the monitoring hooks from the model."""
        self.monitor.remove()

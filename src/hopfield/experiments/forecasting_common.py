"""Training and evaluation of the forecasters of ``timeseries-hopfield`` and ``stanhop-outliers``.

Both experiments train a model ``(B, T, C_in) -> (B, τ, C_out)`` with the MSE loss through
:class:`hopfield.training.Trainer` (:func:`train_forecaster`), with the recipe of the papers'
code (:class:`ForecastRecipe`):

* Adam or AdamW; gradient-norm clipping;
* a per-*epoch* learning-rate schedule (:func:`epoch_lr_factor`: ``type1`` halves after epochs
  2, 4, 6, 8 and 10, ``cosine``, ``constant``), given to the Trainer as a ``schedule`` callable
  of the optimiser step;
* evaluation at the end of every epoch on the validation windows (:func:`evaluate`, the exact
  element-wise MSE and MAE over the unshuffled windows); early stopping after ``patience``
  epochs without a strict decrease of the validation MSE; the best epoch's weights are restored.

An **epoch** is ``epoch_steps`` optimiser steps (:func:`epoch_steps`): every full global batch of
the training windows, or ``max_train_batches`` of them (the small presets). The Trainer draws one
permutation of all windows per pass over the data; capped epochs take consecutive runs of
``max_train_batches`` batches of it, so each capped epoch sees new windows, as the loop it
replaces did (it took the first batches of a fresh permutation each epoch).

Differences from that loop (``hopfield.models.forecasting.fit``, removed): the last incomplete
batch of a pass is dropped (the Trainer's global batches are all full), and AdamW's weight decay
skips the biases (:func:`hopfield.training.parameter_groups`; LayerNorm weights do decay, as
before). Everything else, including the learning rate of each epoch, is unchanged.

**Training time per epoch** (the time-per-epoch figure) is measured by an :class:`EpochClock`:
from the first loss computation of an epoch to the start of its validation, so neither the
evaluation nor the checkpoint written after it counts. Under several processes the epoch's wall
time is the slowest process's and its CPU time the sum over the processes. The times are part of
each epoch's evaluation record in the Trainer's log, so they survive a resume.

**Activation curves** (OutEffHop Figure 2, ``monitor=``): a :class:`TrainingCurve` records
``max |x|`` of the outputs of the monitored modules on the training batch of every
``max(1, epoch_steps // points_per_epoch)``-th optimiser step, through forward hooks that only
read the outputs (no randomness drawn, no gradient), so training is unchanged (tested). The points
are kept in the Trainer's log (in each epoch's evaluation record) and, when ``--max-steps`` cuts
a run inside an epoch, in ``curve-pending.json`` of its folder, so a resumed run ends with the
curve of an uninterrupted one (tested).

Bookkeeping of a run (:func:`reusable`, :func:`save_run`): each (setting, model, seed) trains in
its own folder below ``out_dir/runs/``, whose ``run.json`` records what defines the run (the
checkpoints there are resumed only for the same run); its record in ``runs.json`` is reused only
for the same run under the same step limit (``hopfield run --max-steps``). Once a run finished
and its record is saved, its checkpoints are deleted (a paper grid has hundreds of runs of a
35M-parameter model).

This module registers no experiment.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from hopfield._validation import check_int
from hopfield.data.files import DataNotFoundError
from hopfield.data.timeseries import ForecastSplits, WindowDataset, load_forecasting
from hopfield.experiments.outliers_tasks import same_run
from hopfield.experiments.registry import ConfigError
from hopfield.experiments.results import RunContext
from hopfield.training import MaxAbsMonitor, Trainer, latest_checkpoint, steps_per_epoch

__all__ = [
    "SCHEDULES",
    "EpochClock",
    "ForecastFit",
    "ForecastRecipe",
    "TrainingCurve",
    "curve_points",
    "epoch_lr_factor",
    "epoch_steps",
    "evaluate",
    "load_splits",
    "reusable",
    "save_run",
    "train_forecaster",
]

#: Per-epoch learning-rate schedules.
SCHEDULES = ("type1", "cosine", "constant")


def epoch_lr_factor(schedule: str, epoch: int, epochs: int) -> float:
    """The learning-rate factor of (1-based) ``epoch`` of ``epochs``.

    ``type1`` (STanHop/Crossformer): ``0.5 ** min((epoch - 1) // 2, 5)``, halving after epochs
    2, 4, 6, 8 and 10; ``cosine``: ``(1 + cos(π (epoch - 1) / epochs)) / 2``; ``constant``: 1.
    """
    if epoch < 1:
        raise ValueError(f"epoch must be >= 1, got {epoch}")
    if schedule == "type1":
        return 0.5 ** min((epoch - 1) // 2, 5)
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * (epoch - 1) / max(epochs, 1)))
    if schedule == "constant":
        return 1.0
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")


@dataclass
class ForecastRecipe:
    """How a forecaster is trained (see the module docstring).

    Attributes:
        epochs: maximum number of epochs.
        batch_size: global training batch (windows per optimiser step over all processes).
        lr: base learning rate.
        optimizer: ``"adam"`` or ``"adamw"``.
        weight_decay: of the optimiser (biases excepted).
        schedule: one of :data:`SCHEDULES`.
        patience: stop after this many epochs without a strict validation improvement.
        grad_clip: maximum gradient norm (``0``: no clipping).
        max_train_batches: optimiser steps per epoch at most (``None``: every full batch).
        max_eval_batches: batches per evaluation at most (``None``: all windows).
        eval_batch_size: windows per evaluation batch (``None``: ``batch_size``).
    """

    epochs: int = 10
    batch_size: int = 128
    lr: float = 1e-3
    optimizer: str = "adam"
    weight_decay: float = 0.0
    schedule: str = "type1"
    patience: int = 3
    grad_clip: float = 5.0
    max_train_batches: int | None = None
    max_eval_batches: int | None = None
    eval_batch_size: int | None = None

    def __post_init__(self) -> None:
        """:class:`ConfigError` naming the first field the recipe cannot train with (the
        experiments' config fields of the same names)."""
        if self.optimizer not in ("adam", "adamw"):
            raise ConfigError(f"optimizer must be 'adam' or 'adamw', got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        counts = {
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "patience": self.patience,
            "max_train_batches": self.max_train_batches,
            "max_eval_batches": self.max_eval_batches,
            "eval_batch_size": self.eval_batch_size,
        }
        for name, value in counts.items():
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        if not self.lr > 0:
            raise ConfigError(f"lr must be positive, got {self.lr}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ConfigError(
                f"weight_decay and grad_clip must be >= 0, got {self.weight_decay}, "
                f"{self.grad_clip}"
            )

    def optimiser_settings(self) -> dict[str, Any]:
        """The :class:`~hopfield.training.TrainingConfig` fields of the recipe's optimiser step
        (batch, optimiser, learning rate, weight decay of every weight as the papers' code,
        gradient clipping); the schedule is per epoch (:func:`epoch_lr_factor`)."""
        return dict(
            batch_size=self.batch_size,
            optimizer=self.optimizer,
            lr=self.lr,
            weight_decay=self.weight_decay,
            grad_clip=self.grad_clip,
            decay_norm_weights=True,  # the papers' code decays every weight
        )

    @property
    def eval_batch(self) -> int:
        """Windows per evaluation batch."""
        return self.batch_size if self.eval_batch_size is None else self.eval_batch_size


def epoch_steps(windows: int, recipe: ForecastRecipe) -> int:
    """Optimiser steps per epoch: the full global batches of ``windows`` training windows, at
    most ``recipe.max_train_batches``."""
    steps = steps_per_epoch(windows, recipe.batch_size)
    if steps < 1:
        raise ConfigError(
            f"batch_size: the {windows} training windows are fewer than one batch "
            f"({recipe.batch_size}); lower batch_size, or use more rows or shorter windows"
        )
    return steps if recipe.max_train_batches is None else min(steps, recipe.max_train_batches)


def _device(model: nn.Module) -> torch.device:
    """Where the model's parameters live (batches are moved there)."""
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: WindowDataset,
    batch_size: int = 256,
    max_batches: int | None = None,
) -> dict[str, float]:
    """Element-wise mean MSE and MAE of ``model`` over the first ``max_batches`` batches of
    ``dataset`` (unshuffled, eval mode; ``None``: all windows). The model's mode is restored."""
    if max_batches is not None and max_batches < 1:
        raise ValueError(f"max_batches must be >= 1 or None, got {max_batches}")
    was_training = model.training
    device = _device(model)
    model.eval()
    sq = ab = 0.0
    count = 0
    try:
        for i, (x_cpu, y_cpu) in enumerate(dataset.batches(batch_size)):
            if max_batches is not None and i >= max_batches:
                break
            diff = (model(x_cpu.to(device)).float() - y_cpu.to(device).float()).double()
            sq += float(diff.square().sum())
            ab += float(diff.abs().sum())
            count += diff.numel()
    finally:
        model.train(was_training)
    return {"mse": sq / count, "mae": ab / count}


class EpochClock:
    """Wall and CPU time of the training part of each epoch.

    :meth:`start` is called before every loss computation and starts the clock if it is not
    running; :meth:`lap` (at the epoch's evaluation) returns the time since then and stops it.
    """

    def __init__(self) -> None:
        self._started: tuple[float, float] | None = None

    def start(self) -> None:
        """Start the clock unless it runs."""
        if self._started is None:
            self._started = (time.perf_counter(), time.process_time())

    def lap(self) -> tuple[float, float]:
        """``(wall seconds, CPU seconds)`` since :meth:`start`, and stop. Under several
        processes: the largest wall time and the summed CPU time (the same on every process;
        every process must call it)."""
        if self._started is None:
            raise RuntimeError("lap() before start(): no training step was timed")
        wall = time.perf_counter() - self._started[0]
        cpu = time.process_time() - self._started[1]
        self._started = None
        return _over_processes(wall, cpu)


def _gathered(values: Sequence[float]) -> Tensor:
    """``values`` of every process of a distributed run, ``(processes, len(values))`` float64 on
    the CPU (one row without a process group; every process must call it)."""
    import torch.distributed as dist

    local = torch.tensor(list(values), dtype=torch.float64)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local[None]
    local = local.to("cuda" if dist.get_backend() == "nccl" else "cpu")
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return torch.stack(gathered).cpu()


def _over_processes(wall: float, cpu: float) -> tuple[float, float]:
    """``(max wall, sum cpu)`` over the processes of a distributed run."""
    times = _gathered([wall, cpu])
    return float(times[:, 0].max()), float(times[:, 1].sum())


#: Key prefix of the curve points in the Trainer's evaluation records: ``max_abs/<step>/<module>``.
CURVE_KEY = "max_abs"
#: The file of a run folder that keeps the points a ``--max-steps`` cut left after the last
#: evaluation, with the name of the checkpoint they belong to.
PENDING_CURVE = "curve-pending.json"


class TrainingCurve:
    """``max |x|`` of module outputs on the training batch of every ``every``-th optimiser step
    (the OutEffHop Figure 2 curves; see the module docstring).

    Args:
        model: the model whose modules are hooked (:class:`hopfield.training.MaxAbsMonitor`:
            tuple outputs use their first element).
        patterns: regular expressions, full-matched against the module names.
        every: step ``s`` (1-based) is recorded when ``s % every == 0``, over all its
            micro-batches.

    :meth:`before_batch` is called before every training forward pass; :meth:`flush` returns the
    points recorded since the last flush.
    """

    def __init__(self, model: nn.Module, patterns: Sequence[str], every: int) -> None:
        self.every = check_int("every", every)
        self.monitor = MaxAbsMonitor(model, patterns)
        self._open: int | None = None
        self._points: dict[str, float] = {}

    def before_batch(self, step: int) -> None:
        """Called before a training forward pass of the 0-based optimiser step ``step``."""
        if self._open == step + 1:
            return
        self._close()
        if (step + 1) % self.every == 0:
            self.monitor.start()
            self._open = step + 1

    def _close(self) -> None:
        if self._open is not None:
            for name, value in self.monitor.collect().items():
                self._points[f"{CURVE_KEY}/{self._open}/{name}"] = value
            self._open = None

    def preload(self, points: dict[str, float]) -> None:
        """Points of earlier steps (a cut run's :data:`PENDING_CURVE`), returned by the next
        :meth:`flush`."""
        self._points.update(points)

    def flush(self) -> dict[str, float]:
        """``{"max_abs/<step>/<module>": max |x|}`` since the last flush, the maximum over the
        processes (every process must call it)."""
        self._close()
        points, self._points = self._points, {}
        if not points:
            return {}
        merged = _gathered(list(points.values())).amax(dim=0).tolist()
        return dict(zip(points, merged, strict=True))

    def remove(self) -> None:
        """Remove the hooks."""
        self.monitor.remove()


def curve_points(entries: dict[str, float]) -> list[dict[str, Any]]:
    """``[{"step": s, "max_abs": {module: value}}]`` in step order from ``max_abs/<step>/<module>``
    entries (other entries are ignored)."""
    points: dict[int, dict[str, float]] = {}
    for key, value in entries.items():
        if key.startswith(CURVE_KEY + "/"):
            _, step, name = key.split("/", 2)
            points.setdefault(int(step), {})[name] = value
    return [{"step": s, "max_abs": points[s]} for s in sorted(points)]


@dataclass
class ForecastFit:
    """What :func:`train_forecaster` returns (the model holds the best epoch's weights).

    Attributes:
        best_epoch: the epoch (1-based) whose weights were restored (``0``: no epoch ended).
        epochs_run: epochs trained to their end.
        epoch_steps: optimiser steps per epoch.
        steps: optimiser steps trained.
        finished: whether the run ended (all epochs or early stopping), not cut by ``--max-steps``.
        stopped_early: whether early stopping ended it.
        resumed_from: the step of the checkpoint it resumed from, or ``None``.
        processes: processes that trained it.
        history: per epoch ``{"epoch", "lr", "train_mse", "val_mse", "val_mae", "seconds",
            "cpu_seconds"}`` (training wall and CPU time of the epoch, see :class:`EpochClock`).
        curve: the :class:`TrainingCurve` points ``{"step", "max_abs": {module: value}}`` of a
            run with ``monitor`` (empty without).
    """

    best_epoch: int
    epochs_run: int
    epoch_steps: int
    steps: int
    finished: bool
    stopped_early: bool
    resumed_from: int | None
    processes: int
    history: list[dict[str, float]] = field(default_factory=list)
    curve: list[dict[str, Any]] = field(default_factory=list)

    @property
    def seconds_per_epoch(self) -> float:
        """Mean training wall time per epoch (NaN when no epoch ended)."""
        return _mean([h["seconds"] for h in self.history])

    @property
    def cpu_seconds_per_epoch(self) -> float:
        """Mean training CPU time per epoch (NaN when no epoch ended)."""
        return _mean([h["cpu_seconds"] for h in self.history])

    def to_dict(self) -> dict[str, Any]:
        """The fields (``curve`` only when one was recorded) and the per-epoch means, for JSON."""
        fields = asdict(self)
        if not self.curve:
            del fields["curve"]
        return {
            **fields,
            "seconds_per_epoch": self.seconds_per_epoch,
            "cpu_seconds_per_epoch": self.cpu_seconds_per_epoch,
        }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _mse_loss(
    clock: EpochClock, before_batch: Callable[[], None]
) -> Callable[[nn.Module, Any], Tensor]:
    def loss_fn(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        clock.start()
        before_batch()
        x, y = batch
        return nn.functional.mse_loss(model(x), y)

    return loss_fn


def _validation(
    clock: EpochClock,
    dataset: WindowDataset,
    recipe: ForecastRecipe,
    curve: TrainingCurve | None,
) -> Callable[[nn.Module], dict[str, float]]:
    def validate(model: nn.Module) -> dict[str, float]:
        seconds, cpu_seconds = clock.lap()
        points = curve.flush() if curve is not None else {}  # before the validation passes
        metrics = evaluate(model, dataset, recipe.eval_batch, recipe.max_eval_batches)
        return {
            "val_mse": metrics["mse"],
            "val_mae": metrics["mae"],
            "train_seconds": seconds,
            "train_cpu_seconds": cpu_seconds,
            **points,
        }

    return validate


def _history(log: list[dict[str, Any]], per_epoch: int) -> list[dict[str, float]]:
    """One entry per evaluated epoch of the Trainer's log."""
    return [
        {
            "epoch": record["step"] // per_epoch,
            "lr": record["lr"],
            "train_mse": record["loss"],
            "val_mse": record["eval"]["val_mse"],
            "val_mae": record["eval"]["val_mae"],
            "seconds": record["eval"]["train_seconds"],
            "cpu_seconds": record["eval"]["train_cpu_seconds"],
        }
        for record in log
        if "eval" in record
    ]


def train_forecaster(
    model: nn.Module,
    splits: ForecastSplits,
    recipe: ForecastRecipe,
    ctx: RunContext,
    folder: str,
    *,
    seed: int,
    identity: Any,
    cpu: bool = False,
    monitor: Sequence[str] = (),
    points_per_epoch: int = 10,
) -> ForecastFit:
    """Train ``model`` on ``splits.train`` with early stopping on ``splits.val``.

    Args:
        model: ``(B, T, C_in) -> (B, τ, C_out)``, initialised (seed the global RNG before).
        splits: the window datasets (``test`` is not touched).
        recipe: the training recipe.
        ctx: the experiment's context (run limits, progress, files).
        folder: the run's folder below ``ctx.out_dir`` (log, checkpoints, ``run.json``).
        seed: the data-order seed.
        identity: what defines the run (JSON-serialisable); the folder's checkpoints are resumed
            only when its ``run.json`` holds the same.
        cpu: train on the CPU even where a GPU is present (without CUDA always the CPU).
        monitor: module name patterns whose ``max |x|`` on the training batches is recorded
            (:class:`TrainingCurve`; empty: no curve).
        points_per_epoch: curve points per epoch at most: every
            ``max(1, epoch_steps // points_per_epoch)``-th step is recorded.

    Returns:
        :class:`ForecastFit`; ``model`` holds the weights of the best validation epoch (or the
        last weights when no epoch ended, under ``--max-steps``).
    """
    per_epoch = epoch_steps(len(splits.train), recipe)
    check_int("points_per_epoch", points_per_epoch)
    clock = EpochClock()
    curve = (
        TrainingCurve(model, monitor, max(1, per_epoch // points_per_epoch)) if monitor else None
    )
    training = ctx.training_config(
        max_steps=recipe.epochs * per_epoch,
        **recipe.optimiser_settings(),
        seed=seed,
        checkpoint_every=per_epoch,
        log_every=per_epoch,
        eval_every=per_epoch,
        select_metric="val_mse",
        select_mode="min",
        patience=recipe.patience,
        restore_best=True,
        cpu=cpu or not torch.cuda.is_available(),  # accelerate's CPU processes need cpu=True
    )
    resume = same_run(ctx, f"{folder}/run.json", identity) == "same"
    if curve is not None and resume:
        curve.preload(_pending_curve(ctx, folder))

    def before_batch() -> None:
        if curve is not None:
            curve.before_batch(trainer.step)

    trainer = Trainer(
        model,
        splits.train,
        _mse_loss(clock, before_batch),
        training,
        ctx.path(folder),
        evaluate=_validation(clock, splits.val, recipe, curve),
        schedule=lambda step: epoch_lr_factor(
            recipe.schedule, step // per_epoch + 1, recipe.epochs
        ),
        progress=ctx.progress,
    )
    result = trainer.fit(resume=resume)
    trainer.close()
    leftover: dict[str, float] = {}
    if curve is not None:
        curve.remove()
        leftover = curve.flush()  # points after the last evaluation: a --max-steps cut
        _keep_pending_curve(ctx, folder, leftover)
    evaluated = {k: v for r in result.log if "eval" in r for k, v in r["eval"].items()}
    return ForecastFit(
        best_epoch=(result.best_step or 0) // per_epoch,
        epochs_run=result.step // per_epoch,
        epoch_steps=per_epoch,
        steps=result.step,
        finished=result.finished,
        stopped_early=result.stopped_early,
        resumed_from=result.resumed_from,
        processes=result.processes,
        history=_history(result.log, per_epoch),
        curve=curve_points({**evaluated, **leftover}),
    )


def _pending_curve(ctx: RunContext, folder: str) -> dict[str, float]:
    """The curve points a ``--max-steps`` cut left in ``folder`` after its last evaluation, if
    they belong to the checkpoint the run resumes from (else none)."""
    saved = ctx.load_json(f"{folder}/{PENDING_CURVE}")
    checkpoint = latest_checkpoint(ctx.path(folder))
    if saved is None or checkpoint is None or saved["checkpoint"] != checkpoint.name:
        return {}
    return {str(k): float(v) for k, v in saved["points"].items()}


def _keep_pending_curve(ctx: RunContext, folder: str, points: dict[str, float]) -> None:
    """Save ``points`` (not yet in the log) with the name of the run's newest checkpoint; without
    points, delete an earlier file (its points are in the log now)."""
    checkpoint = latest_checkpoint(ctx.path(folder))
    if not points:
        if ctx.is_main_process:
            ctx.path(f"{folder}/{PENDING_CURVE}").unlink(missing_ok=True)
    elif checkpoint is not None:
        ctx.save_json(
            f"{folder}/{PENDING_CURVE}", {"checkpoint": checkpoint.name, "points": points}
        )


def load_splits(
    ctx: RunContext, name: str, in_len: int, out_len: int, **options: Any
) -> tuple[ForecastSplits, str]:
    """The windows of dataset ``name`` (:func:`hopfield.data.timeseries.load_forecasting` with
    ``options``) and where they come from: the dataset's name, or, when its file is absent and
    ``ctx.stand_in_data`` is set, a description starting with ``"STAND-IN"`` of random values of
    its shape (without the flag the :class:`~hopfield.data.DataNotFoundError` propagates)."""
    try:
        return load_forecasting(name, in_len, out_len, data_dir=ctx.data_dir, **options), name
    except DataNotFoundError as missing:
        if not ctx.stand_in_data:
            raise
        splits = load_forecasting(name, in_len, out_len, stand_in=True, **options)
        return splits, f"STAND-IN random series of {name}'s shape ({missing})"


def _normalised(identity: Any) -> Any:
    return json.loads(json.dumps(identity))


def reusable(record: dict[str, Any] | None, identity: Any, ctx: RunContext) -> bool:
    """Whether ``record`` (from ``runs.json``) is the result of the run ``identity`` made under
    this invocation's step limit (``--max-steps``), so that it need not be trained again."""
    return (
        record is not None
        and record.get("identity") == _normalised(identity)
        and record.get("stop_after") == ctx.stop_after
    )


def save_run(
    ctx: RunContext,
    runs: dict[str, Any],
    key: str,
    record: dict[str, Any],
    *,
    identity: Any,
    folder: str,
    finished: bool,
) -> None:
    """Store ``record`` as ``runs[key]`` with its identity and step limit, write ``runs.json``
    (main process) and delete the run folder's checkpoints if the run ``finished``."""
    runs[key] = {**record, "identity": _normalised(identity), "stop_after": ctx.stop_after}
    ctx.save_json("runs.json", runs)
    if finished and ctx.is_main_process:
        shutil.rmtree(ctx.path(folder) / "checkpoints", ignore_errors=True)

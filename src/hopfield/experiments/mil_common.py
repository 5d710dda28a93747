"""Shared parts of the MIL experiments: training one model, worker processes, finished runs.

:func:`train_mil_model` is the recipe of the nonparametric Hopfield paper's official MIL code on
:class:`hopfield.training.Trainer`: AdamW, cosine decay per step over all epochs, BCE with
logits, gradient clipping, an evaluation after every epoch and the best validation epoch's
weights restored at the end. The experiments train many small models (data sets × methods ×
folds × trials × seeds), so each run keeps the engine's overhead small: no progress bar, one log
record per epoch, a checkpoint only at the end (or every ``checkpoint_every``).

Bookkeeping (:class:`RunStore`): every run trains in a work folder of its own (Trainer log and
checkpoints); its result goes to ``runs.json`` with the processes that trained it, whether it
finished and the step limit (``--max-steps``) it ran under. A finished run is not trained again
and its work folder is deleted; a run cut by ``--max-steps`` keeps its checkpoint, so a later
invocation without the limit resumes it (the same limit reuses its record). Work folders belong
to one configuration and one process count (the checkpoints hold every process's random
state): another one clears them.

Several processes (``torchrun``): every process trains the same runs in the same order, each
model with all processes together (global batches split over them); worker pools are off
(:func:`resolve_workers`); the evaluation runs on every process on the same weights, so every
process selects the same epoch; only the main process writes.

Not an experiment itself (it registers nothing).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hopfield.data.mil import BagBatches, Batch
from hopfield.experiments.checks import config_errors
from hopfield.experiments.outliers_tasks import barrier
from hopfield.experiments.registry import ConfigError
from hopfield.experiments.results import RunContext, mean_std
from hopfield.models.mil import POOLING_METHODS, evaluate, pooling_method
from hopfield.training import Period, Trainer, TrainingConfig, TrainResult, process_layout

T = TypeVar("T")
R = TypeVar("R")

CHECKPOINT = "runs.json"
WORK_DIR = "work"
"""Folder (below the experiment's) of the unfinished runs' Trainer logs and checkpoints."""

SELECT_MODES = {"auc": "max", "accuracy": "max", "loss": "min"}
"""``select_by`` -> whether a larger (``"max"``) or a smaller value is better."""


# --- one model -------------------------------------------------------------------------------


@dataclass
class MILRun:
    """What :func:`train_mil_model` returns.

    Attributes:
        best: the evaluations at the best validation epoch, flat: ``{set}_{metric}``
            (``valid_auc``, ``test_accuracy``, ...). Without a validation value that is not NaN
            it is the last epoch's; a run cut by ``--max-steps`` before its first epoch ended
            evaluates its final weights.
        best_epoch: that epoch (1-based), ``None`` when no epoch ended.
        curves: per finished epoch: the training ``train_loss`` and ``train_accuracy`` (means
            over the epoch's steps) and every ``{set}_{metric}`` of the evaluation sets.
        steps: optimiser steps trained.
        finished: whether the run trained all its epochs.
        resumed_from: the step of the Trainer checkpoint the run resumed from, or ``None``.
        processes: how many processes trained it.
        parameters: the model's parameter count.
    """

    best: dict[str, float]
    best_epoch: int | None
    curves: dict[str, list[float]] = field(default_factory=dict)
    steps: int = 0
    finished: bool = True
    resumed_from: int | None = None
    processes: int = 1
    parameters: int = 0

    def record(self) -> dict[str, Any]:
        """What a run's record in ``runs.json`` says about its training: ``best_epoch``,
        ``steps``, ``finished``, ``resumed_from`` and ``parameters`` (:meth:`RunStore.add`
        adds the processes)."""
        names = ("best_epoch", "steps", "finished", "resumed_from", "parameters")
        return {name: getattr(self, name) for name in names}


def bag_loss(model: nn.Module, batch: Batch) -> tuple[Tensor, dict[str, Tensor]]:
    """BCE with logits of a padded batch ``(x (b, S, F), padding_mask (b, S) or None, labels
    (b,))``, and the batch's accuracy (logit > 0) as a training metric."""
    x, mask, labels = batch
    logits = model(x, mask)
    labels = labels.to(logits.dtype)
    loss = F.binary_cross_entropy_with_logits(logits, labels)
    accuracy = ((logits.detach() > 0).to(labels.dtype) == labels).to(logits.dtype).mean()
    return loss, {"accuracy": accuracy}


def bag_evaluator(sets: Mapping[str, BagBatches]) -> Callable[[nn.Module], dict[str, float]]:
    """``evaluate(model) -> {"{set}_{metric}": value}`` with loss, accuracy and AUC (see
    :func:`hopfield.models.mil.evaluate`) of every set; the same on every process."""

    def evaluate_sets(model: nn.Module) -> dict[str, float]:
        return {
            f"{name}_{metric}": value
            for name, data in sets.items()
            for metric, value in evaluate(model, data).items()
        }

    return evaluate_sets


def mil_training_config(
    ctx: RunContext,
    *,
    epochs: int,
    batch_size: int,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    select_by: str = "auc",
    grad_clip: float | None = 1.0,
    seed: int = 0,
    checkpoint_every: Period = 0,
) -> TrainingConfig:
    """The training settings of the MIL experiments, built through ``ctx.training_config`` (so
    the run limits ``--max-steps`` and ``--micro-batch-size`` apply): AdamW with ``lr`` and
    ``weight_decay`` (LayerNorm γ decayed too, as the official code's AdamW over all parameters;
    biases not), a cosine decay per step to 0 over ``epochs`` (no warm-up), gradient clipping at
    ``grad_clip``, one log record and one evaluation per epoch, the best validation ``select_by``
    (``"auc"``, ``"accuracy"``: larger is better; ``"loss"``: smaller) restored at the end, a
    checkpoint at the end and every ``checkpoint_every`` steps (or ``"epoch"``; ``0``: only at
    the end)."""
    if select_by not in SELECT_MODES:
        raise ValueError(f"select_by must be 'auc', 'accuracy' or 'loss', got {select_by!r}")
    config: TrainingConfig = ctx.training_config(
        epochs=epochs,
        batch_size=batch_size,
        optimizer="adamw",
        lr=lr,
        weight_decay=weight_decay,
        decay_norm_weights=True,
        schedule="cosine",
        min_lr_ratio=0.0,
        grad_clip=grad_clip,
        seed=seed,
        checkpoint_every=checkpoint_every,
        log_every="epoch",
        eval_every="epoch",
        select_metric=f"valid_{select_by}",
        select_mode=SELECT_MODES[select_by],
        restore_best=True,
        cpu=not torch.cuda.is_available(),  # accelerate's CPU processes need cpu=True
    )
    return config


def check_methods(methods: Sequence[str]) -> None:
    """:class:`ConfigError` naming the config field ``methods`` unless it names one or more
    pooling methods of :class:`~hopfield.models.mil.MILNet`."""
    if not methods:
        raise ConfigError(f"methods must name at least one of {', '.join(POOLING_METHODS)}")
    for name in methods:
        try:
            pooling_method(name, seed=0)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"methods: {name!r} is not a pooling method ({error})") from None


def check_training(epochs: int, batch_sizes: Sequence[int], lr: float, weight_decay: float) -> None:
    """:class:`ConfigError` naming the config field of a training setting
    :func:`mil_training_config` cannot use (``batch_sizes``: every batch size the runs use)."""
    with config_errors():
        for batch_size in batch_sizes:
            TrainingConfig(epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay)


def train_mil_model(
    model: nn.Module,
    train: BagBatches,
    sets: Mapping[str, BagBatches],
    out_dir: str | os.PathLike[str],
    config: TrainingConfig,
) -> MILRun:
    """Train a bag classifier with :class:`~hopfield.training.Trainer`: the official code's
    recipe when ``config`` comes from :func:`mil_training_config`.

    That is AdamW (weight decay on every weight, LayerNorm γ included, biases excluded), the
    learning rate decayed per step along a half cosine to 0 over all epochs, BCE with logits,
    gradient-norm clipping. After every epoch the model is evaluated on every set of ``sets``
    (``"valid"`` is required; the others, e.g. ``"test"``, give learning curves; every process
    evaluates, on the same weights, so they agree on the best epoch); the weights of
    the best validation epoch by ``select_by`` (a strict improvement, so ties go to the earlier
    epoch) are in ``model`` at the end. Each epoch is a permutation of the training bags drawn
    from the config's ``seed``, cut into global batches of ``batch_size`` bags padded per
    micro-batch; the incomplete last batch is dropped. The run's log and checkpoints go to
    ``out_dir``; a run found there resumes from its newest checkpoint (``--max-steps`` cuts it
    after ``config.stop_after`` steps, with the schedule of the full run).

    Args:
        model: the bag classifier, ``model(x (b, S, F), padding_mask) -> (b,)`` logits.
        train: the training bags (at least ``batch_size``).
        sets: evaluation sets by name.
        out_dir: the run's folder.
        config: the training settings (:func:`mil_training_config`).
    """
    if "valid" not in sets:
        raise ValueError(f"sets must contain 'valid' (the selection set), got {sorted(sets)}")
    evaluate_sets = bag_evaluator(sets)
    trainer = Trainer(
        model,
        range(len(train)),
        bag_loss,
        config,
        out_dir,
        collate_fn=lambda indices: train.batch(torch.as_tensor(indices, dtype=torch.long)),
        evaluate=evaluate_sets,
        progress=False,
    )
    try:
        result = trainer.fit()
    finally:
        trainer.close()
    run = _summary(result, trainer.steps_per_epoch, lambda: evaluate_sets(trainer.unwrapped))
    run.parameters = sum(p.numel() for p in model.parameters())
    return run


def _summary(
    result: TrainResult, steps_per_epoch: int, evaluate_final: Callable[[], dict[str, float]]
) -> MILRun:
    """The :class:`MILRun` of a Trainer result (``evaluate_final``, on every process, when no
    epoch ended)."""
    records = [r for r in result.log if "eval" in r]
    curves: dict[str, list[float]] = {
        "train_loss": [r["loss"] for r in records],
        "train_accuracy": [r["accuracy"] for r in records],
    }
    for name in records[0]["eval"] if records else ():
        curves[name] = [r["eval"][name] for r in records]
    best_epoch: int | None
    if result.best_step is not None:
        best, best_epoch = result.best, result.best_step // steps_per_epoch
    elif records:  # no validation value but NaN: the last epoch, whose weights the model has
        best, best_epoch = records[-1]["eval"], len(records)
    else:  # cut by --max-steps inside the first epoch
        best, best_epoch = evaluate_final(), None
    return MILRun(
        best=dict(best),
        best_epoch=best_epoch,
        curves=curves,
        steps=result.step,
        finished=result.finished,
        resumed_from=result.resumed_from,
        processes=result.processes,
    )


# --- many models -----------------------------------------------------------------------------


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
    """The records of the runs of an experiment (``runs.json``) and their work folders.

    ``runs.json`` holds the configuration, ``--stand-in-data``, the process count of the work
    folders' checkpoints and, per run key, the run's record (``add``) with ``processes``,
    ``finished`` and ``stop_after`` (the ``--max-steps`` it ran under). Another configuration
    starts afresh; the work folders are cleared as well when the process count changed. Every
    process reads the file before the main process rewrites it, so all processes agree on what
    to train.

    Args:
        ctx: the experiment's context.
        config: the experiment's configuration (a dataclass).
    """

    def __init__(self, ctx: RunContext, config: Any) -> None:
        self.ctx = ctx
        self.identity = {"config": _jsonable(asdict(config)), "stand_in_data": ctx.stand_in_data}
        saved: dict[str, Any] = ctx.load_json(CHECKPOINT) or {}
        barrier()  # every process has read the file before the main process rewrites it
        same = saved.get("identity") == self.identity
        self.runs: dict[str, Any] = dict(saved["runs"]) if same else {}
        if not same or saved.get("processes") != ctx.processes:
            remove_dir(ctx, ctx.path(WORK_DIR))  # checkpoints of another run or process count
        self._save()
        barrier()  # nobody looks for checkpoints before stale ones are gone

    def __contains__(self, key: str) -> bool:
        """Whether run ``key`` need not train: it finished, or ran under this step limit."""
        record = self.runs.get(key)
        return record is not None and (
            record["finished"] or record["stop_after"] == self.ctx.stop_after
        )

    def __getitem__(self, key: str) -> Any:
        return self.runs[key]

    def work_dir(self, key: str) -> Path:
        """The folder run ``key`` trains in (``/`` in the key become ``_``)."""
        return self.ctx.path(WORK_DIR) / key.replace("/", "_")

    def add(self, key: str, record: dict[str, Any]) -> None:
        """Save run ``key``'s ``record`` (JSON; its bool ``finished`` says whether the run ended
        or was cut by ``--max-steps``) with this invocation's process count and step limit. A
        finished run's work folder is deleted (and the work root once it is empty); a cut run's
        is kept for a later resume."""
        finished = record.get("finished")
        if not isinstance(finished, bool):
            raise TypeError(f"record['finished'] must be a bool, got {finished!r}")
        self.runs[key] = {
            **record,
            "processes": self.ctx.processes,
            "stop_after": self.ctx.stop_after,
        }
        self._save()
        if finished:
            remove_dir(self.ctx, self.work_dir(key))
            if self.ctx.is_main_process:
                with suppress(OSError):  # not empty: other runs are under way
                    self.ctx.path(WORK_DIR).rmdir()

    def _save(self) -> None:
        record = {"identity": self.identity, "processes": self.ctx.processes, "runs": self.runs}
        self.ctx.save_json(CHECKPOINT, record)


def remove_dir(ctx: RunContext, path: str | os.PathLike[str]) -> None:
    """Delete folder ``path`` (on the main process; every process must be done with it)."""
    if ctx.is_main_process:
        shutil.rmtree(path, ignore_errors=True)


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

"""The training loop: :class:`Trainer` (see :mod:`hopfield.training`)."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, default_collate

from hopfield.training.config import Period, TrainingConfig, build_optimizer, lr_factor
from hopfield.training.files import (
    _STEP_DIR,
    CHECKPOINT_DIR,
    LOG_FILE,
    MANIFEST,
    DamagedCheckpoint,
    checkpoint_folders,
    prune_checkpoints,
    verify_checkpoint,
    write_manifest,
    writing,
)
from hopfield.training.monitor import MaxAbsMonitor
from hopfield.training.order import BatchOrder, MicroBatchSampler
from hopfield.training.preemption import (
    Preempted,
    ignore_preemption,
    preemptible,
    preemption_requested,
)
from hopfield.training.processes import (
    all_reduce,
    collective_timeout,
    decorrelate_processes,
    process_layout,
    warn_if_processes_were_lost,
)


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
        count_fn: ``count_fn(batch) -> number`` of the terms ``loss_fn`` averages over in a
            micro-batch (unmasked cells or tokens) when that number varies between
            micro-batches: each micro-batch's loss (and logged metrics) is then weighted by its
            share of the step's terms over every micro-batch and process, so that the step
            minimises the mean over all terms of the global batch whatever the process layout,
            as one process without accumulation does (``None``: every micro-batch counts the
            same, the mean of the micro-batch means).
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
        count_fn: Callable[[Any], float | int | Tensor] | None = None,
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
        self.count_fn = count_fn
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
        optimizer = build_optimizer(model, self.config)
        factor = schedule or (lambda step: lr_factor(step, config, self.total_steps))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        # the schedule steps once per optimiser step whatever the process count, so it is not
        # prepared (accelerate's wrapper steps it once per process); it is checkpointed as is
        accelerator.register_for_checkpointing(self.scheduler, self)
        self.step = 0
        self._feed: Iterator[Any] = iter(())  # the micro-batches of a fit (_batches)
        self._sums: dict[str, float] = {"steps": 0}
        # the running sums since the last read, float64 on the loss's device: a step reads
        # nothing back (on a GPU every read waits for the queued work); _settled() folds them in
        self._unread: dict[str, Tensor] = {}
        self._selection: dict[str, Any] = {"best": None, "step": None, "metrics": {}, "bad": 0}
        self._best_state: dict[str, Tensor] | None = None
        self.log: list[dict[str, Any]] = []
        self._clock = (time.perf_counter(), 0)  # (time, step) of the last log record

    def _period(self, value: Period) -> int:
        return self.steps_per_epoch if value == "epoch" else int(value)

    @property
    def unwrapped(self) -> nn.Module:
        """The model without distributed/precision wrappers."""
        return self.accelerator.unwrap_model(self.model)

    # --- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the loop beside accelerate's own state (model, optimiser,
        loss scaler, every process's RNG streams): the step, the running log sums, the best
        evaluation and its weights, the log."""
        return {
            "step": self.step,
            "sums": dict(self._settled()),
            "selection": dict(self._selection),
            "best_state": self._best_state,
            "log": self.log,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.step = int(state["step"])
        self._sums, self._unread = dict(state["sums"]), {}
        self._selection = dict(state["selection"])
        self._best_state = state["best_state"]
        self.log = list(state["log"])

    def _facts(self) -> dict[str, Any]:
        """What a checkpoint's manifest records of the run that wrote it."""
        return {
            "step": self.step,
            "processes": self.accelerator.num_processes,
            "mixed_precision": self.config.mixed_precision,
            "config": _plain(asdict(self.config)),
        }

    def save_checkpoint(self) -> Path:
        """Write the checkpoint of the current step (all processes must call it).

        ``accelerator.save_state`` writes into ``checkpoints/tmp-step-<N>``; the main process
        then writes the manifest (sizes and SHA-256 of the files) and renames the folder to
        ``step-<N>``, deleting all but the ``keep_checkpoints`` newest. The running log sums are
        first replaced by their mean over the processes (the same on every process, so the main
        process's copy is the run's; a record averages them over the processes either way)."""
        acc = self.accelerator
        root = self.out_dir / CHECKPOINT_DIR
        final, tmp = root / f"step-{self.step}", root / f"tmp-step-{self.step}"
        self._sums = self._process_mean(self._settled())
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        acc.wait_for_everyone()
        with writing(final, tmp):
            acc.save_state(str(tmp))
        acc.wait_for_everyone()
        if acc.is_main_process:
            with writing(final, tmp):
                write_manifest(tmp, self._facts())
                shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
            prune_checkpoints(self.out_dir, self.config.keep_checkpoints)
        acc.wait_for_everyone()
        return final

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore the state saved in checkpoint folder ``path``.

        Raises ``ValueError`` naming the file when one of its files does not match the
        manifest, or when it was written by another process count or precision; nothing is
        restored then."""
        try:
            facts = self._verified(Path(path))
        except DamagedCheckpoint as damaged:
            raise ValueError(f"damaged checkpoint {damaged}") from damaged
        self._restore(Path(path), facts)

    def _verified(self, path: Path) -> dict[str, Any]:
        """The facts of checkpoint ``path`` once its files match its manifest and its step
        matches its name (:class:`DamagedCheckpoint` otherwise)."""
        facts = verify_checkpoint(path)
        match = _STEP_DIR.fullmatch(path.name)
        if match is not None and facts.get("step") != int(match[1]):
            raise DamagedCheckpoint(
                path / MANIFEST, f"holds step {facts.get('step')!r}, not {match[1]}"
            )
        return facts

    def _restore(self, path: Path, facts: Mapping[str, Any]) -> None:
        if facts["processes"] != self.accelerator.num_processes:
            raise ValueError(
                f"{path}: checkpoint was written by {facts['processes']} processes, this run has "
                f"{self.accelerator.num_processes}; the random states per process would differ"
            )
        if facts["mixed_precision"] != self.config.mixed_precision:
            raise ValueError(
                f"{path}: checkpoint was trained with mixed_precision={facts['mixed_precision']!r}, "
                f"this run has {self.config.mixed_precision!r}; resume with the same precision"
            )
        self.accelerator.load_state(str(path))
        _moments_shaped_as_parameters(getattr(self.optimizer, "optimizer", self.optimizer))

    def _resume(self) -> int | None:
        """Restore the newest checkpoint whose files match its manifest (every process agrees
        on which) and return its step; ``None`` when there is none. A damaged one is removed
        with a warning naming its file, and the one before it is tried."""
        acc = self.accelerator
        for path in checkpoint_folders(self.out_dir):
            try:
                facts = self._verified(path)
                damaged = None
            except DamagedCheckpoint as error:
                damaged = error
            failed = torch.tensor([float(damaged is not None)], dtype=torch.float64)
            if acc.num_processes > 1:
                failed = all_reduce(failed, "max")  # also the barrier before the removal
            if not failed.item():
                self._restore(path, facts)
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
            worker_init_fn=ignore_preemption if cfg.num_workers else None,
        )
        return iter(loader)

    def _batch(self) -> Any:
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

    def _weighted_batches(self) -> Iterator[tuple[Any, float]]:
        """The step's micro-batches on this process, each with the weight of its loss: 1, or
        with ``count_fn`` its share of the step's terms over every micro-batch and process
        times ``accumulation × processes`` (the micro-batches are read first to count them)."""
        accumulation = self.order.accumulation
        if self.count_fn is None:
            for _ in range(accumulation):
                yield self._batch(), 1.0
            return
        batches = [self._batch() for _ in range(accumulation)]
        counts = [float(self.count_fn(batch)) for batch in batches]
        mean = torch.tensor([sum(counts)], dtype=torch.float64)  # terms per process
        if self.accelerator.num_processes > 1:
            mean = all_reduce(mean, "mean")
        per_process = float(mean.item())
        for batch, count in zip(batches, counts, strict=True):
            yield batch, (count * accumulation / per_process if per_process > 0 else 1.0)

    def _micro_step(self, batch: Any, weight: float) -> dict[str, Tensor]:
        """Forward and backward one micro-batch under ``accelerator.accumulate`` (no gradient
        all-reduce but on the last micro-batch of a step; the loss is divided by the
        accumulation) with its loss times ``weight``; its weighted loss and metrics."""
        acc = self.accelerator
        with acc.accumulate(self.model), acc.autocast():
            out = self.loss_fn(self.model, batch)
            loss, metrics = out if isinstance(out, tuple) else (out, {})
            if not isinstance(loss, Tensor) or loss.dim() != 0:
                raise TypeError("loss_fn must return a scalar Tensor or (scalar Tensor, dict)")
            acc.backward(loss if weight == 1.0 else loss * weight)
        values = {"loss": loss.detach().double()}
        values.update({k: _float64_on(loss.device, v) for k, v in metrics.items()})
        return {k: v if weight == 1.0 else v * weight for k, v in values.items()}

    def _train_step(self) -> Tensor:
        """One optimiser step over ``accumulation`` micro-batches; the gradient norm (on the
        device: read at a log record only)."""
        acc, cfg = self.accelerator, self.config
        accumulation = self.order.accumulation
        for batch, weight in self._weighted_batches():
            for name, value in self._micro_step(batch, weight).items():
                self._accumulate(name, value / accumulation)
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
        return torch.as_tensor(norm)

    def _accumulate(self, name: str, value: Tensor) -> None:
        """Add ``value`` (float64, on the device) to the running sum ``name`` on the device,
        starting from its settled float: the additions of the floats they replace, in their
        order, so the log is bitwise what it was when each value was read at once."""
        unread = self._unread.get(name)
        if unread is None:
            unread = torch.full(
                (), self._sums.get(name, 0.0), dtype=torch.float64, device=value.device
            )
        self._unread[name] = unread + value

    def _settled(self) -> dict[str, float]:
        """The running sums as floats (one read of everything accumulated on the device)."""
        if self._unread:
            names = list(self._unread)
            read = torch.stack([self._unread[n] for n in names]).tolist()
            self._sums.update(zip(names, read, strict=True))
            self._unread = {}
        return self._sums

    def _process_mean(self, sums: Mapping[str, float]) -> dict[str, float]:
        """``sums`` (with their ``steps`` count) averaged over the processes."""
        names = sorted(k for k in sums if k != "steps")
        local = torch.tensor([sums[k] for k in names], dtype=torch.float64)
        if self.accelerator.num_processes > 1:
            local = all_reduce(local, "mean")
        return {"steps": sums["steps"], **dict(zip(names, local.tolist(), strict=True))}

    def _reduced_sums(self) -> dict[str, float]:
        """The running means since the last record, averaged over the processes."""
        sums, self._sums = self._process_mean(self._settled()), {"steps": 0}
        steps = max(sums.pop("steps"), 1)
        return {k: v / steps for k, v in sums.items()}

    def _reduced_max_abs(self) -> dict[str, float]:
        values = self.monitor.collect()
        if self.accelerator.num_processes == 1 or not self.monitor.names:
            return values
        local = torch.tensor(
            [values.get(n, -math.inf) for n in self.monitor.names], dtype=torch.float64
        )
        merged = all_reduce(local, "max").tolist()
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
        acc.gradient_accumulation_steps = self.order.accumulation  # a setting of the process
        limits = [self.total_steps, until_step, cfg.stop_after]
        end = min(x for x in limits if x is not None)
        resumed_from = self._resume() if resume else None
        if resumed_from is not None:
            self._write_log()
        else:
            decorrelate_processes(acc.process_index)
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
            flag = all_reduce(flag, "max")
        return bool(flag.item())

    def _start_trackers(self) -> None:
        """Start the accelerator's trackers (main process) in ``out_dir/trackers``, with the
        training configuration as their hyperparameters."""
        acc = self.accelerator
        self._clock = (time.perf_counter(), self.step)
        if getattr(acc, "log_with", None) and not acc.trackers:
            acc.init_trackers("trackers", config=_plain(asdict(self.config)))

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
                "grad_norm": float(norm),
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


def _float64_on(device: torch.device, value: Any) -> Tensor:
    """A metric (a tensor or a number) as a float64 tensor on ``device``, a number filled there
    (not copied from the host, which on a GPU waits for its queue)."""
    if isinstance(value, Tensor):
        return value.detach().to(device=device, dtype=torch.float64)
    return torch.full((), float(value), dtype=torch.float64, device=device)


def _moments_shaped_as_parameters(optimizer: torch.optim.Optimizer) -> None:
    """Give the loaded per-parameter state of ``optimizer`` (Adam's moments, a momentum buffer)
    the shape ``(1,)`` of its parameter where the checkpoint holds it 0-d: learnable scalars of
    this package became one-element vectors on 29 Nov 2026 (:mod:`hopfield._scalars`), and a
    checkpoint written before keeps their moments as scalars, which the first step could not
    update in place ("output with shape [] doesn't match the broadcast shape [1]"). The step
    count, a scalar by design, stays."""
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            state = optimizer.state.get(parameter)
            if not state or parameter.shape != (1,):
                continue
            for key, value in state.items():
                if key != "step" and isinstance(value, Tensor) and value.dim() == 0:
                    state[key] = value.reshape(1)


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


def _plain(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with everything but ``None``, bools, numbers and strings as strings (what
    JSON files and trackers' hyperparameters hold)."""
    return {
        k: v if v is None or isinstance(v, bool | int | float | str) else str(v)
        for k, v in values.items()
    }

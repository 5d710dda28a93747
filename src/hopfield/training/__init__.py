"""A reusable training loop on ``accelerate`` with exact checkpoint/resume.

The package, in reading order: :mod:`~hopfield.training.config` (:class:`TrainingConfig`, the
schedule, the batch layout), :mod:`~hopfield.training.order` (which examples each step trains
on), :mod:`~hopfield.training.trainer` (the loop), and beside it
:mod:`~hopfield.training.files` (guarded writes, checkpoint manifests),
:mod:`~hopfield.training.monitor` (``max |x|``), :mod:`~hopfield.training.processes` and
:mod:`~hopfield.training.preemption`.

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
  the data a continuous run sees; accumulation runs under ``accelerator.accumulate``;
* **epochs, evaluation and early stopping**: ``epochs`` instead of ``max_steps``; evaluation,
  logging and checkpoints every N steps or every ``"epoch"``; the best evaluation (by
  ``select_metric``) is tracked, its weights restored at the end (``restore_best``) and training
  stops after ``patience`` evaluations without a strict improvement;
* **several processes**: the logged loss, metrics and ``max |x|`` are reduced over the processes
  (mean, mean, max), so the log is the log of the whole run; evaluation runs on every process on
  the same weights (identical numbers, no communication), so early-stopping decisions agree;
* **checkpoints** every ``checkpoint_every`` steps into ``out_dir/checkpoints/step-<N>/``:
  ``accelerate.Accelerator.save_state`` (model, optimiser, loss scaler, every process's RNG
  states) with the schedule and the trainer's own state (:meth:`Trainer.state_dict`: step,
  running log sums, best evaluation, log) registered for checkpointing, and a
  ``manifest.json`` with the size and SHA-256 of every file, checked before anything is
  loaded. :meth:`Trainer.fit` resumes from the newest one: a run stopped
  after a checkpoint and resumed ends with **bitwise** the weights and the log of an uninterrupted
  run (on the same hardware and process count, one or two processes; from three on within float
  rounding, as the order in which a collective adds three gradients can change; the tests check
  both on CPU). A checkpoint is
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

from hopfield.training.config import (
    OPTIMIZERS,
    SCHEDULES,
    Period,
    TrainingConfig,
    build_optimizer,
    lr_factor,
    micro_batch_layout,
    parameter_groups,
    steps_per_epoch,
)
from hopfield.training.files import (
    CHECKPOINT_DIR,
    FULL_DISK_ERRORS,
    LOG_FILE,
    DiskFullError,
    latest_checkpoint,
    read_log,
    writing,
)
from hopfield.training.monitor import MaxAbsMonitor
from hopfield.training.order import BatchOrder, MicroBatchSampler
from hopfield.training.preemption import (
    PREEMPTION_SIGNALS,
    Preempted,
    preemptible,
    preemption_requested,
)
from hopfield.training.processes import (
    COLLECTIVE_TIMEOUT_VARIABLE,
    collective_timeout,
    leave_process_group,
    process_layout,
    warn_if_processes_were_lost,
)
from hopfield.training.trainer import Trainer, TrainResult, check_tracker_names

__all__ = [
    "CHECKPOINT_DIR",
    "COLLECTIVE_TIMEOUT_VARIABLE",
    "FULL_DISK_ERRORS",
    "LOG_FILE",
    "OPTIMIZERS",
    "PREEMPTION_SIGNALS",
    "SCHEDULES",
    "BatchOrder",
    "DiskFullError",
    "MaxAbsMonitor",
    "MicroBatchSampler",
    "Period",
    "Preempted",
    "TrainResult",
    "Trainer",
    "TrainingConfig",
    "build_optimizer",
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

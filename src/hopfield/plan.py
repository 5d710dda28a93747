"""Price a preset without training it: parameters, FLOPs, memory and GPU-hours per training job.

``plan("outliers-bert", "paper")`` asks :mod:`hopfield.experiments.plans` for the preset's
:class:`TrainingJob` objects (one per model architecture and training recipe the preset trains),
builds every model on PyTorch's **meta device** (shapes only, no memory, no data) with the
experiment's own builders, runs one forward and backward pass of a meta micro-batch and reports:

* **parameters**: all trainable parameters, and the count in the paper's convention (BERT:
  encoder and embeddings; STanHop-Net: without the position tables) beside the exact count the
  paper's rounded number stands for, where the paper states one;
* **examples and tokens per optimiser step**: the global batch, times the sequence length or
  the number of patches where that is meaningful;
* **training FLOPs**: counted by :class:`torch.utils.flop_counter.FlopCounterMode` over the
  forward and backward pass of one micro-batch (matrix products, convolutions and attention
  kernels: ``2·m·n·k`` per ``(m×k)·(k×n)`` product forward and twice that backward; element-wise
  work, normalisations, sorts and the optimiser are not counted, as in the usual model-FLOPs
  convention), scaled to the global batch, and in total over the optimiser steps of every run;
* **activation memory per device** at the micro-batch: the bytes of the distinct storages saved
  for the backward pass (:func:`torch.autograd.graph.saved_tensors_hooks`), parameters and
  buffers excluded, measured in float32. The peak also holds transient buffers of the backward
  pass, so this is a lower bound of the activation peak; 16-bit autocast stores most saved
  tensors in half the bytes;
* **parameter, gradient and Adam(W) state memory**: 16 bytes per parameter (float32 weights,
  gradients and two moments), per device under data parallelism;
* **wall time and GPU-hours** on 8 × A100 (312 TFLOP/s dense bf16) and 8 × H100 SXM
  (989 TFLOP/s) at a stated model-FLOPs utilisation (MFU): ``GPU-hours = FLOPs / (peak · MFU) /
  3600``, wall time = GPU-hours / 8 (independent runs spread over the GPUs, or one run data
  parallel on all eight);
* which dataset files the preset needs and whether each is present (:func:`hopfield.data.files.locate`
  with ``data_dir`` or ``$HOPFIELD_DATA``).

Data-dependent checks inside a model (``if bool((x < 0).any()): raise``) cannot be evaluated on
meta tensors; while measuring, a boolean read from a meta tensor is answered ``False`` (the plan
assumes valid inputs) and a floating-point number NaN (no special case is taken); an integer (a
data-dependent shape) raises.

Example::

    from hopfield.plan import plan, render_markdown

    result = plan("outliers-bert", "paper", mfu=0.4)
    result.jobs[0].parameters_counted          # 108_891_648 (BERT-base, the paper's 108.9m)
    print(render_markdown([result]))
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import chain
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from hopfield.data.files import ChecksumError, DataFile, DataNotFoundError, data_root, locate

__all__ = [
    "DEFAULT_MFU",
    "GPUS",
    "GPUS_PER_NODE",
    "STATE_BYTES_PER_PARAMETER",
    "DataNeed",
    "ExperimentPlan",
    "GpuEstimate",
    "JobEstimate",
    "StepMeasurement",
    "TrainingJob",
    "estimate",
    "gpu_hours",
    "measure_step",
    "micro_batch_of",
    "plan",
    "plan_to_dict",
    "render_markdown",
]

#: Dense bf16/fp16 tensor-core peak per GPU, FLOP/s (NVIDIA data sheets, no sparsity).
GPUS: dict[str, float] = {"A100": 312e12, "H100 SXM": 989e12}
#: GPUs per node of the estimate (one 8-GPU node).
GPUS_PER_NODE = 8
#: Default model-FLOPs utilisation.
DEFAULT_MFU = 0.4
#: float32 weights + gradients + Adam's two moments.
STATE_BYTES_PER_PARAMETER = 16


def _check_mfu(mfu: Any) -> float:
    if isinstance(mfu, bool) or not isinstance(mfu, int | float) or not 0.0 < mfu <= 1.0:
        raise ValueError(f"mfu must be a number in (0, 1], got {mfu!r}")
    return float(mfu)


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


# --- data ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataNeed:
    """A dataset a preset reads.

    Exactly one of ``file`` (a :class:`~hopfield.data.files.DataFile`, located with
    :func:`~hopfield.data.files.locate`), ``folder`` (a folder below the data root, e.g. an
    ImageNet tree) or neither (``note`` says where the data come from, e.g. a Hugging Face Hub
    corpus, which is not checked) describes it.

    Attributes:
        label: what is needed, e.g. ``"timeseries/ETTh1.csv"``.
        file: the file, if it is one.
        folder: a folder below the data root, if it is one.
        note: where the data come from when they are neither (or a remark).
    """

    label: str
    file: DataFile | None = None
    folder: str | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if self.file is not None and self.folder is not None:
            raise ValueError("give at most one of file and folder")

    @classmethod
    def of(cls, file: DataFile, note: str = "") -> DataNeed:
        """The need of one :class:`DataFile`, labelled by its relative path."""
        return cls(file.relative_path, file=file, note=note)

    def status(self, data_dir: str | os.PathLike[str] | None = None) -> str:
        """``"present"``, ``"absent"``, ``"checksum differs"`` or ``"not checked"``."""
        if self.file is not None:
            try:
                locate(self.file, data_dir)
            except DataNotFoundError:
                return "absent"
            except ChecksumError:
                return "checksum differs"
            return "present"
        if self.folder is not None:
            root = data_root(data_dir)
            return "present" if root is not None and (root / self.folder).is_dir() else "absent"
        return "not checked"


# --- jobs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingJob:
    """One model architecture with its training recipe, trained ``runs`` times by a preset.

    Attributes:
        name: e.g. ``"bert softmax"``.
        build_model: ``build_model(device) -> nn.Module``, the experiment's model, built on
            ``device`` (the plan uses ``torch.device("meta")``), in training mode.
        make_batch: ``make_batch(n, device)``: a micro-batch of ``n`` examples as the training
            loop gives it to the loss (e.g. token ids ``(n, T)`` int64, images ``(n, C, H, W)``).
        loss: ``loss(model, batch) -> scalar`` the training loss of that batch.
        global_batch: examples per optimiser step over all processes.
        optimizer_steps: optimiser steps of one run (the longest run where they differ).
        runs: how many times the preset trains this model (seeds × variants × datasets ...).
        tokens_per_example: sequence length, patches (+ class token), ... (``None``: not
            meaningful, e.g. one bag or one time-series window).
        micro_batch_size: the preset's micro-batch per process (``None``: ``global_batch / 8``,
            one 8-GPU node, at least 1).
        total_steps: optimiser steps over all runs when the runs differ in length (default
            ``optimizer_steps × runs``).
        data: datasets the job reads.
        paper_parameters: the exact parameter count the paper's (rounded) number stands for,
            where the paper states one (checked against ``count_parameters``).
        paper_label: the paper's number as printed, e.g. ``"108.9m"``.
        count_parameters: the paper's counting convention (default: every parameter).
        group: rows with the same group are summarised together.
        precision: the training precision of the preset (``"fp32"``, ``"fp16 autocast"``).
        notes: assumptions behind the numbers (dataset sizes, upper bounds).
        cache_key: jobs with equal keys (and micro-batch) share one measurement.
        measure_on: the device of the measurement: ``"meta"`` (no memory), or ``"cpu"`` with
            real tensors for a small model whose forward pass needs data-dependent integers
            (e.g. how many keys a random mask keeps).
    """

    name: str
    build_model: Callable[[torch.device], nn.Module]
    make_batch: Callable[[int, torch.device], Any]
    loss: Callable[[nn.Module, Any], Tensor]
    global_batch: int
    optimizer_steps: int
    runs: int = 1
    tokens_per_example: int | None = None
    micro_batch_size: int | None = None
    total_steps: int | None = None
    data: tuple[DataNeed, ...] = ()
    paper_parameters: int | None = None
    paper_label: str = ""
    count_parameters: Callable[[nn.Module], int] | None = None
    group: str = ""
    precision: str = "fp32"
    notes: tuple[str, ...] = ()
    cache_key: Hashable | None = None
    measure_on: str = "meta"

    def __post_init__(self) -> None:
        if self.measure_on not in ("meta", "cpu"):
            raise ValueError(f"measure_on must be 'meta' or 'cpu', got {self.measure_on!r}")
        _check_positive("global_batch", self.global_batch)
        _check_positive("optimizer_steps", self.optimizer_steps)
        _check_positive("runs", self.runs)
        for name in ("tokens_per_example", "micro_batch_size", "total_steps"):
            value = getattr(self, name)
            if value is not None:
                _check_positive(name, value)
        if self.micro_batch_size is not None and self.micro_batch_size > self.global_batch:
            raise ValueError(
                f"micro_batch_size ({self.micro_batch_size}) exceeds global_batch "
                f"({self.global_batch})"
            )


def micro_batch_of(job: TrainingJob) -> tuple[int, str]:
    """``(micro-batch, where it comes from)``: the preset's ``micro_batch_size``, else the
    global batch split over one 8-GPU node (at least 1 example)."""
    if job.micro_batch_size is not None:
        return job.micro_batch_size, "preset micro_batch_size"
    return max(1, job.global_batch // GPUS_PER_NODE), f"global batch / {GPUS_PER_NODE}"


# --- measuring ----------------------------------------------------------------------------------


class _AssumeValidInputs(TorchDispatchMode):
    """Answers scalar reads of meta tensors: a boolean is ``False`` (validity checks such as
    ``if bool((x < 0).any()): raise`` pass), a floating-point number NaN (every comparison with
    it is false, so no special case is taken); an integer (a data-dependent shape) raises."""

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default):
            tensor = args[0]
            if isinstance(tensor, Tensor) and tensor.is_meta:
                if tensor.dtype == torch.bool:
                    return False
                if tensor.is_floating_point():
                    return math.nan
                raise RuntimeError(
                    f"the model reads a {tensor.dtype} value from a meta tensor (a shape or an "
                    "index that depends on the data); the plan cannot measure it on meta"
                )
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class StepMeasurement:
    """One forward and backward pass of a micro-batch.

    Attributes:
        flops: forward + backward FLOPs (:class:`~torch.utils.flop_counter.FlopCounterMode`).
        activation_bytes: bytes of the distinct non-parameter storages saved for backward.
    """

    flops: int
    activation_bytes: int


def measure_step(
    model: nn.Module, batch: Any, loss: Callable[[nn.Module, Any], Tensor]
) -> StepMeasurement:
    """Count the FLOPs and saved activations of ``loss(model, batch).backward()``.

    Works on any device; on the meta device nothing is computed or allocated. A storage saved
    several times (a tensor and its views, or one output saved by two consumers) is counted
    once; storages of parameters and buffers are not counted.

    Args:
        model: the model (its training/evaluation mode is used as is).
        batch: the micro-batch ``loss`` takes.
        loss: ``loss(model, batch) -> scalar``.
    """
    owned = {t.untyped_storage()._cdata for t in chain(model.parameters(), model.buffers())}
    saved: dict[int, Any] = {}

    def pack(tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in owned:
            saved.setdefault(storage._cdata, storage)  # keeps it alive: addresses stay unique
        return tensor

    with FlopCounterMode(display=False) as counter, _AssumeValidInputs():
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            value = loss(model, batch)
        if value.dim() != 0:
            raise ValueError(f"loss must return a scalar, got shape {tuple(value.shape)}")
        value.backward()
    return StepMeasurement(
        flops=int(counter.get_total_flops()),
        activation_bytes=int(sum(s.nbytes() for s in saved.values())),
    )


# --- estimates ----------------------------------------------------------------------------------


def gpu_hours(flops: float, peak_flops: float, mfu: float = DEFAULT_MFU) -> float:
    """GPU-hours to execute ``flops`` on GPUs of ``peak_flops`` FLOP/s at utilisation ``mfu``:
    ``flops / (peak_flops · mfu) / 3600``."""
    mfu = _check_mfu(mfu)
    if not peak_flops > 0:
        raise ValueError(f"peak_flops must be positive, got {peak_flops!r}")
    if flops < 0:
        raise ValueError(f"flops must be non-negative, got {flops!r}")
    return flops / (peak_flops * mfu) / 3600.0


@dataclass(frozen=True)
class GpuEstimate:
    """Time of some FLOPs on ``gpus`` GPUs of one kind at a given MFU."""

    gpu: str
    peak_flops: float
    gpus: int
    gpu_hours: float
    wall_hours: float


def _gpu_estimates(flops: float, mfu: float) -> tuple[GpuEstimate, ...]:
    out = []
    for name, peak in GPUS.items():
        hours = gpu_hours(flops, peak, mfu)
        out.append(GpuEstimate(name, peak, GPUS_PER_NODE, hours, hours / GPUS_PER_NODE))
    return tuple(out)


@dataclass(frozen=True)
class JobEstimate:
    """The priced :class:`TrainingJob` (see the module docstring for each quantity)."""

    name: str
    group: str
    runs: int
    optimizer_steps: int
    total_steps: int
    global_batch: int
    micro_batch: int
    micro_batch_source: str
    tokens_per_example: int | None
    examples_per_step: int
    tokens_per_step: int | None
    parameters: int
    parameters_counted: int
    paper_parameters: int | None
    paper_label: str
    parameters_match: bool | None
    flops_per_micro_batch: int
    flops_per_step: int
    flops_total: float
    activation_bytes: int
    state_bytes: int
    precision: str
    gpus: tuple[GpuEstimate, ...]
    notes: tuple[str, ...] = ()


def estimate(
    job: TrainingJob,
    *,
    mfu: float = DEFAULT_MFU,
    measured: StepMeasurement | None = None,
) -> JobEstimate:
    """Price one job: build its model on ``job.measure_on`` (the meta device unless the job
    says otherwise), measure one micro-batch, scale to the global batch and the whole schedule.

    Args:
        job: the job.
        mfu: model-FLOPs utilisation in ``(0, 1]``.
        measured: a measurement of an identical job to reuse (see ``TrainingJob.cache_key``).
    """
    mfu = _check_mfu(mfu)
    device = torch.device(job.measure_on)
    micro, source = micro_batch_of(job)
    with torch.random.fork_rng(devices=[]):  # real (CPU) measurements draw random numbers
        model = job.build_model(device)
        model.train()
        parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
        counted = job.count_parameters(model) if job.count_parameters else parameters
        if measured is None:
            with device:  # tensors a model creates while running land on the device too
                measured = measure_step(model, job.make_batch(micro, device), job.loss)
        del model
    flops_step = round(measured.flops * job.global_batch / micro)
    total_steps = job.total_steps if job.total_steps is not None else job.optimizer_steps * job.runs
    flops_total = float(flops_step) * total_steps
    return JobEstimate(
        name=job.name,
        group=job.group or job.name,
        runs=job.runs,
        optimizer_steps=job.optimizer_steps,
        total_steps=total_steps,
        global_batch=job.global_batch,
        micro_batch=micro,
        micro_batch_source=source,
        tokens_per_example=job.tokens_per_example,
        examples_per_step=job.global_batch,
        tokens_per_step=(
            job.global_batch * job.tokens_per_example if job.tokens_per_example else None
        ),
        parameters=parameters,
        parameters_counted=counted,
        paper_parameters=job.paper_parameters,
        paper_label=job.paper_label,
        parameters_match=(
            None if job.paper_parameters is None else counted == job.paper_parameters
        ),
        flops_per_micro_batch=measured.flops,
        flops_per_step=flops_step,
        flops_total=flops_total,
        activation_bytes=measured.activation_bytes,
        state_bytes=STATE_BYTES_PER_PARAMETER * parameters,
        precision=job.precision,
        gpus=_gpu_estimates(flops_total, mfu),
        notes=job.notes,
    )


@dataclass(frozen=True)
class ExperimentPlan:
    """The priced preset of one experiment.

    Attributes:
        experiment, preset, mfu: what was priced and at which utilisation.
        trains: whether the preset trains anything by gradient descent.
        summary: the experiment's one-line summary (what a non-training experiment computes).
        jobs: the priced training jobs.
        data: ``(label, status, note)`` of every dataset the preset reads.
        notes: assumptions (deduplicated from the jobs) and remarks.
    """

    experiment: str
    preset: str
    mfu: float
    trains: bool
    summary: str
    jobs: tuple[JobEstimate, ...] = ()
    data: tuple[tuple[str, str, str], ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def runs(self) -> int:
        """Training runs over all jobs."""
        return sum(j.runs for j in self.jobs)

    @property
    def flops_total(self) -> float:
        """Training FLOPs of the whole preset."""
        return sum(j.flops_total for j in self.jobs)

    def gpu_hours(self) -> dict[str, float]:
        """GPU-hours of the whole preset per GPU kind."""
        return {name: gpu_hours(self.flops_total, peak, self.mfu) for name, peak in GPUS.items()}


def _data_rows(
    needs: Iterable[DataNeed], data_dir: str | os.PathLike[str] | None
) -> tuple[tuple[str, str, str], ...]:
    rows: dict[str, tuple[str, str, str]] = {}
    for need in needs:
        if need.label not in rows:
            rows[need.label] = (need.label, need.status(data_dir), need.note)
    return tuple(rows.values())


def plan(
    name: str,
    preset: str = "paper",
    *,
    mfu: float = DEFAULT_MFU,
    data_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ExperimentPlan:
    """Price preset ``preset`` of experiment ``name`` without training it.

    Args:
        name: a registered experiment.
        preset: one of its presets.
        mfu: model-FLOPs utilisation in ``(0, 1]`` of the time estimates.
        data_dir: data root for the presence of the dataset files (else ``$HOPFIELD_DATA``).
        progress: called with ``"<experiment>: <job>"`` before each job is priced.

    Raises:
        ValueError: an unknown experiment or preset, or ``mfu`` outside ``(0, 1]``.
    """
    from hopfield.experiments.plans import NOT_TRAINED, jobs_of, untrained_data
    from hopfield.experiments.registry import get

    mfu = _check_mfu(mfu)
    experiment = get(name)
    config = experiment.config(preset)
    if name in NOT_TRAINED:
        return ExperimentPlan(
            name,
            preset,
            mfu,
            trains=False,
            summary=NOT_TRAINED[name],
            data=_data_rows(untrained_data(name, config), data_dir),
        )
    jobs = jobs_of(name, config)
    cache: dict[tuple[Hashable, int], StepMeasurement] = {}
    estimates = []
    for job in jobs:
        if progress is not None:
            progress(f"{name}: {job.name}")
        key = None if job.cache_key is None else (job.cache_key, micro_batch_of(job)[0])
        found = cache.get(key) if key is not None else None
        priced = estimate(job, mfu=mfu, measured=found)
        if key is not None and found is None:
            cache[key] = StepMeasurement(priced.flops_per_micro_batch, priced.activation_bytes)
        estimates.append(priced)
    notes = tuple(dict.fromkeys(n for job in jobs for n in job.notes))
    return ExperimentPlan(
        name,
        preset,
        mfu,
        trains=True,
        summary=experiment.summary,
        jobs=tuple(estimates),
        data=_data_rows((need for job in jobs for need in job.data), data_dir),
        notes=notes,
    )


# --- output -------------------------------------------------------------------------------------


def plan_to_dict(result: ExperimentPlan) -> dict[str, Any]:
    """A JSON-ready dictionary of ``result`` (with totals)."""
    out = asdict(result)
    out["data"] = [{"file": f, "status": s, "note": n} for f, s, n in result.data]
    out["runs"] = result.runs
    out["flops_total"] = result.flops_total
    out["gpu_hours"] = result.gpu_hours()
    out["wall_hours_on_8_gpus"] = {k: v / GPUS_PER_NODE for k, v in result.gpu_hours().items()}
    return out


def _si(value: float) -> str:
    if value == 0:
        return "0"
    exponent = math.floor(math.log10(abs(value)))
    return f"{value / 10**exponent:.2f}e{exponent}"


def _bytes(value: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            scaled = value / size
            return f"{scaled:.3g} {unit}" if scaled < 1000 else f"{scaled:.0f} {unit}"
    return f"{int(value)} B"


def _hours(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.2g}"


def _sentence(text: str) -> str:
    return text if text.endswith((".", "?", "!")) else text + "."


def _span(values: Sequence[Any], fmt: Callable[[Any], str] = str) -> str:
    low, high = fmt(min(values)), fmt(max(values))
    return low if low == high else f"{low}–{high}"


@dataclass
class _Group:
    name: str
    jobs: list[JobEstimate] = field(default_factory=list)


def _groups(result: ExperimentPlan, per_job: bool) -> list[_Group]:
    groups: dict[str, _Group] = {}
    for job in result.jobs:
        key = job.name if per_job else job.group
        groups.setdefault(key, _Group(key)).jobs.append(job)
    return list(groups.values())


def _paper_cell(jobs: Sequence[JobEstimate]) -> str:
    stated = [j for j in jobs if j.paper_parameters is not None]
    if not stated:
        return ""
    labels = "/".join(dict.fromkeys(j.paper_label or f"{j.paper_parameters:,}" for j in stated))
    ok = all(j.parameters_match for j in stated)
    return f"{labels} {'✓' if ok else '✗ ' + _span([j.paper_parameters for j in stated], '{:,}'.format)}"


_JOB_COLUMNS: tuple[str, ...] = (
    "job",
    "runs",
    "steps/run",
    "batch (micro)",
    "tokens/step",
    "parameters",
    "paper",
    "FLOPs/step",
    "FLOPs total",
    "activations/device",
    "params+grads+Adam",
    *(f"{g} GPU-h" for g in GPUS),
)


def _job_row(group: _Group) -> list[str]:
    jobs = group.jobs
    tokens = [j.tokens_per_step for j in jobs if j.tokens_per_step is not None]
    return [
        group.name,
        f"{sum(j.runs for j in jobs):,}",
        _span([j.optimizer_steps for j in jobs], "{:,}".format),
        _span([j.global_batch for j in jobs], "{:,}".format)
        + f" ({_span([j.micro_batch for j in jobs])})",
        _span(tokens, "{:,}".format) if tokens else "–",
        _span([j.parameters_counted for j in jobs], "{:,}".format),
        _paper_cell(jobs),
        _span([j.flops_per_step for j in jobs], _si),
        _si(sum(j.flops_total for j in jobs)),
        _bytes(max(j.activation_bytes for j in jobs)),
        _bytes(max(j.state_bytes for j in jobs)),
        *(_hours(sum(j.gpus[i].gpu_hours for j in jobs)) for i in range(len(GPUS))),
    ]


def _table(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _data_cell(result: ExperimentPlan) -> str:
    if not result.data:
        return "none (generated)"
    counts: dict[str, int] = {}
    for _, status, _ in result.data:
        counts[status] = counts.get(status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def render_markdown(
    results: Sequence[ExperimentPlan], *, per_job: bool = False, command: str = ""
) -> str:
    """Markdown: a summary table (one row per experiment) when there are several, then per
    experiment its notes, a table of its jobs (grouped unless ``per_job``) and its data."""
    if not results:
        raise ValueError("results must not be empty")
    mfu = results[0].mfu
    peaks = ", ".join(f"{name} {peak / 1e12:g} TFLOP/s" for name, peak in GPUS.items())
    lines = []
    if command:
        lines += [f"Generated by `{command}`; do not edit by hand.", ""]
    lines += [
        f"Model-FLOPs utilisation {mfu:g}; dense bf16 peaks {peaks}; wall time on "
        f"{GPUS_PER_NODE} GPUs = GPU-hours / {GPUS_PER_NODE}. FLOPs: forward + backward "
        "(FlopCounterMode on the meta device, one micro-batch scaled to the global batch). "
        "Tokens: sequence positions, image patches (+ class token), bag instances or time "
        "steps. Activations: bytes saved for backward per device at the micro-batch, float32. "
        "Parameters in the paper's convention where it has one (BERT without its MLM head, "
        "STanHop-Net without its position tables); params+grads+Adam: "
        f"{STATE_BYTES_PER_PARAMETER} bytes per trainable parameter.",
        "",
    ]
    if len(results) > 1:
        columns = ["experiment", "trains", "runs", "largest model", "FLOPs total"]
        columns += [f"{g} GPU-h" for g in GPUS]
        columns += [f"{GPUS_PER_NODE}×{g} wall h" for g in GPUS]
        columns += ["largest activations/device", "data"]
        rows = []
        for r in results:
            if not r.trains:
                rows.append(
                    [f"`{r.experiment}`", "no", "–", "–", "–"] + ["–"] * 4 + ["–", _data_cell(r)]
                )
                continue
            hours = r.gpu_hours()
            rows.append(
                [
                    f"`{r.experiment}`",
                    "yes",
                    f"{r.runs:,}",
                    f"{max(j.parameters_counted for j in r.jobs):,}",
                    _si(r.flops_total),
                    *(_hours(hours[g]) for g in GPUS),
                    *(_hours(hours[g] / GPUS_PER_NODE) for g in GPUS),
                    _bytes(max(j.activation_bytes for j in r.jobs)),
                    _data_cell(r),
                ]
            )
        lines += ["## Summary", "", *_table(columns, rows), ""]
    for r in results:
        lines += [f"## `{r.experiment}` (preset `{r.preset}`)", ""]
        if not r.trains:
            lines += [f"No gradient training: {_sentence(r.summary)}", ""]
        else:
            micro = sorted({(j.micro_batch_source, j.precision) for j in r.jobs})
            lines += [
                f"{_sentence(r.summary)} {r.runs:,} training runs, {_si(r.flops_total)} FLOPs; "
                + "; ".join(
                    f"{g}: {_hours(h)} GPU-h, {_hours(h / GPUS_PER_NODE)} h on {GPUS_PER_NODE} GPUs"
                    for g, h in r.gpu_hours().items()
                )
                + ". Micro-batch: "
                + "; ".join(f"{s} (preset precision {p})" for s, p in micro)
                + ".",
                "",
            ]
            lines += _table(_JOB_COLUMNS, (_job_row(g) for g in _groups(r, per_job)))
            lines.append("")
            if r.notes:
                lines += [f"- {note}" for note in r.notes] + [""]
        if r.data:
            lines += [
                "Data: "
                + "; ".join(
                    f"`{label}` {status}" + (f" ({note})" if note else "")
                    for label, status, note in r.data
                )
                + ".",
                "",
            ]
    return "\n".join(lines).rstrip() + "\n"

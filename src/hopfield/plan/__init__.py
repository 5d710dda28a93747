"""Price a preset without training it: parameters, FLOPs, memory and GPU-hours per training job.

``plan("outliers-bert", "paper")`` asks :mod:`hopfield.plan.jobs` for the preset's
:class:`TrainingJob` objects (one per model architecture and training recipe the preset trains),
builds every model on PyTorch's **meta device** (shapes only, no memory, no data) with the
experiment's own builders, runs one forward and backward pass of a meta micro-batch and reports:

* **parameters**: all trainable parameters, and the count in the paper's convention (BERT:
  encoder and embeddings; STanHop-Net: without the position tables) beside the exact count the
  paper's rounded number stands for, where the paper states one;
* **examples and tokens per optimiser step**: the global batch, times the sequence length or
  the number of patches where that is meaningful;
* **training FLOPs**: what :class:`torch.utils.flop_counter.FlopCounterMode` counts (its
  formulas, applied by :class:`_MeasuringMode`) over the forward and backward pass of one
  micro-batch (matrix products, convolutions and attention
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
* **wall time and GPU-hours** on 8 × A100 and 8 × H100 SXM at the dense peak of the precision
  the job trains in (:data:`GPUS`: float32 without tensor cores, PyTorch's default for float32
  matrix products, A100 19.5 and H100 67 TFLOP/s; TF32, ``TrainingConfig(tf32=True)``, 156 and
  494.7; fp16/bf16 autocast 312 and 989) at a stated model-FLOPs utilisation (MFU), and at
  least :data:`STEP_FLOOR_S` of GPU time per micro-batch step (kernel launches and the Python
  of an eager step, which no FLOP count sees; it decides the time of small models):
  ``GPU-hours = max(FLOPs / (peak · MFU), micro-batch steps · floor) / 3600``, micro-batch
  steps = optimiser steps × ⌈global batch / micro-batch⌉; wall time = GPU-hours / 8
  (independent runs spread over the GPUs, or one run data parallel on all eight);
* which dataset files the preset needs and whether each is present (:func:`hopfield.data.files.locate`
  with ``data_dir`` or ``$HOPFIELD_DATA``).

Data-dependent checks inside a model (``if bool((x < 0).any()): raise``) cannot be evaluated on
meta tensors; while measuring, a boolean read from a meta tensor is answered as if the inputs were
valid and every iterative solver had converged (``True`` for the result of an ``all`` reduction,
else ``False``), so a loop that runs until its data settle (the blockwise Sparsemax attention,
Newton thresholds) is priced with one pass: a lower bound of its FLOPs. A floating-point number
read is NaN (no special case is taken); an integer (a data-dependent shape) raises.

Speed: most of a measurement is spent in the Python meta kernels of PyTorch operators, so the
jobs of a plan share a :class:`PlanCache`: a functional operator seen again with the same input
layouts (the next layer of a stack, the next variant of a model) gets outputs of the recorded
layouts without running its kernel (:class:`LayoutCache`, which changes no number), random
initialisation of meta parameters is skipped, and jobs with equal ``cache_key`` (one model
trained on several datasets, or priced by two experiments) are built and measured once.
``hopfield plan --all --preset paper`` takes a few CPU-minutes.

``write_plan_record`` keeps a plan as JSON (``hopfield plan --out DIR``: ``DIR/plan/<preset>.json``);
the committed ``results/plan/paper.json`` is what docs/plan-table.md renders and what the claims
ledger reads the paper's parameter counts from.

Example::

    from hopfield.plan import plan, render_markdown

    result = plan("outliers-bert", "paper", mfu=0.4)
    result.jobs[0].parameters_counted          # 108_891_648 (BERT-base, the paper's 108.9m)
    print(render_markdown([result]))
"""

from __future__ import annotations

import json
import math
import os
import re
import weakref
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from itertools import chain
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from hopfield.data.files import ChecksumError, DataFile, DataNotFoundError, data_root, locate

__all__ = [
    "DEFAULT_MFU",
    "GPUS",
    "GPUS_PER_NODE",
    "JOB_COLUMNS",
    "PLAN_FOLDER",
    "PRECISIONS",
    "STATE_BYTES_PER_PARAMETER",
    "STEP_FLOOR_S",
    "DataNeed",
    "ExperimentPlan",
    "GpuEstimate",
    "JobEstimate",
    "LayoutCache",
    "ModelMeasurement",
    "PlanCache",
    "StepMeasurement",
    "TrainingJob",
    "estimate",
    "gpu_hours",
    "measure_model",
    "measure_step",
    "micro_batch_of",
    "micro_steps_of",
    "peak_flops",
    "plan",
    "plan_record_path",
    "plan_to_dict",
    "printed_count",
    "read_plan_record",
    "render_markdown",
    "summary_table",
    "write_plan_record",
]

#: Dense peak FLOP/s per GPU by the arithmetic of the matrix products (NVIDIA data sheets, no
#: sparsity; H100 SXM5): ``"fp32"`` on the CUDA cores (PyTorch's float32 matrix products since
#: 1.12, unless TF32 is allowed), ``"tf32"`` float32 on the tensor cores
#: (``TrainingConfig(tf32=True)``), ``"16-bit"`` fp16/bf16 on the tensor cores (autocast).
GPUS: dict[str, dict[str, float]] = {
    "A100": {"fp32": 19.5e12, "tf32": 156e12, "16-bit": 312e12},
    "H100 SXM": {"fp32": 67e12, "tf32": 494.7e12, "16-bit": 989e12},
}
#: The precisions a :class:`TrainingJob` trains in, and the arithmetic of :data:`GPUS` each is
#: priced at.
PRECISIONS: dict[str, str] = {
    "fp32": "fp32",
    "tf32": "tf32",
    "fp16 autocast": "16-bit",
    "bf16 autocast": "16-bit",
}
#: GPU seconds per micro-batch step (forward and backward of one micro-batch on one GPU) at
#: least: PyTorch eager launches each of a step's few hundred kernels from Python (about 10 µs
#: each) and runs the optimiser, whatever the FLOPs. Measured steps of the small models here are
#: longer (the Hopfield layers' iterations, the MIL poolings); the floor is a lower bound.
STEP_FLOOR_S = 0.005
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
        paper_label: the paper's parameter count exactly as printed, e.g. ``"108.9m"`` or
            ``"5.20 M"`` (empty where the paper prints none); ``count_parameters`` is checked
            against it at its printed precision (:func:`printed_count`), never against a count
            of ours.
        count_parameters: the paper's counting convention (default: every parameter).
        group: rows with the same group are summarised together.
        precision: the training precision of the preset, a key of :data:`PRECISIONS`
            (``"fp32"``, ``"tf32"``, ``"fp16 autocast"``, ``"bf16 autocast"``); it decides the
            peak the job is priced at.
        notes: assumptions behind the numbers (dataset sizes, upper bounds).
        cache_key: jobs with equal keys (and micro-batches) share one model measurement
            (parameters, FLOPs and activations): the key must determine the model, the batch
            and the loss, e.g. hold every configuration field the builder reads.
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
    paper_label: str = ""
    count_parameters: Callable[[nn.Module], int] | None = None
    group: str = ""
    precision: str = "fp32"
    notes: tuple[str, ...] = ()
    cache_key: Hashable | None = None
    measure_on: str = "meta"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {self.precision!r}")
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


#: Metadata queries that :class:`~torch.utils.flop_counter.FlopCounterMode` leaves to the next
#: mode (``NotImplemented``), as :class:`_MeasuringMode` does.
_METADATA_OPS = frozenset(
    getattr(torch.ops.aten, name).default
    for name in (
        "sym_is_contiguous", "is_contiguous", "is_strides_like_format",
        "is_non_overlapping_and_dense", "size", "sym_size", "stride", "sym_stride",
        "storage_offset", "sym_storage_offset", "numel", "sym_numel", "dim",
    )
) | {torch.ops.aten.is_contiguous.memory_format, torch.ops.prim.layout.default}  # fmt: skip
_SCALAR_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default)
_EXCLUDED_TAGS = (
    torch.Tag.nondeterministic_seeded,
    torch.Tag.data_dependent_output,
    torch.Tag.dynamic_output_shape,
)


class LayoutCache:
    """The output layouts of functional operators on meta tensors, shared by measurements.

    On the meta device an operator's output is a function of the operator, the layouts (dtype,
    shape, strides) of its tensor arguments and its other arguments; many operators run their
    meta kernels in Python, which dominates a measurement. A *functional* operator (it mutates
    nothing, its outputs alias no input, are tensors and do not depend on data or random
    numbers) seen again with equal arguments gets fresh meta outputs of the recorded layouts
    (dtype, shape, strides, storage offset and storage size) without running its kernel, so the
    FLOPs and saved bytes measured are the same. One cache may serve every job of a plan.
    """

    def __init__(self) -> None:
        self._outputs: dict[Hashable, tuple[_Layout, ...]] = {}
        self._functional: dict[Any, bool] = {}
        self.hits = 0

    def __len__(self) -> int:
        return len(self._outputs)

    def functional(self, func: Any) -> bool:
        """Whether ``func`` (an ``OpOverload``) qualifies (see the class docstring)."""
        known = self._functional.get(func)
        if known is None:
            schema = func._schema
            known = bool(
                schema.returns
                and not schema.is_mutable
                and all(r.alias_info is None and str(r.type) == "Tensor" for r in schema.returns)
                and not any(tag in func.tags for tag in _EXCLUDED_TAGS)
            )
            self._functional[func] = known
        return known

    def lookup(self, key: Hashable) -> Any:
        """Fresh outputs of the layouts recorded under ``key``, else ``None``."""
        layouts = self._outputs.get(key)
        if layouts is None:
            return None
        self.hits += 1
        outputs = tuple(_empty(layout) for layout in layouts)
        return outputs[0] if len(outputs) == 1 else outputs

    def record(self, key: Hashable, out: Any) -> None:
        """Record the layouts of ``out`` (a tensor or a tuple of tensors) under ``key``; outputs
        that share a storage, and undefined (``None``) outputs, are not recorded."""
        outputs = (out,) if isinstance(out, Tensor) else tuple(out)
        if not all(isinstance(o, Tensor) and o.is_meta for o in outputs):
            return
        if len({o.untyped_storage()._cdata for o in outputs}) == len(outputs):
            self._outputs[key] = tuple(_layout_of(o) for o in outputs)


_Layout = tuple[torch.dtype, tuple[int, ...], tuple[int, ...], int, int]


def _layout_of(tensor: Tensor) -> _Layout:
    return (
        tensor.dtype,
        tuple(tensor.shape),
        tuple(tensor.stride()),
        int(tensor.storage_offset()),
        tensor.untyped_storage().nbytes(),
    )


def _empty(layout: _Layout) -> Tensor:
    dtype, shape, stride, offset, nbytes = layout
    out = torch.empty(0, dtype=dtype, device="meta")
    return out.set_(torch.UntypedStorage(nbytes, device="meta"), offset, shape, stride)


class _Uncacheable(Exception):
    """An argument without a layout key (a CPU tensor, a generator, ...)."""


_PLAIN_TYPES = (
    int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
    torch.memory_format,
)  # fmt: skip


def _key_of(value: Any) -> Hashable:
    """A hashable description of an operator argument as far as output layouts go."""
    if isinstance(value, Tensor):
        if not value.is_meta or value.layout is not torch.strided:
            raise _Uncacheable
        return (value.dtype, tuple(value.shape), value.stride())
    if isinstance(value, list | tuple):
        return tuple(_key_of(v) for v in value)
    if isinstance(value, _PLAIN_TYPES):
        return (type(value), value)
    raise _Uncacheable


def _random_fill_of_meta(func: Any, args: tuple[Any, ...]) -> bool:
    """``func`` fills its first argument, a meta tensor, in place with random numbers
    (``uniform_``, ``normal_``, ``bernoulli_``): a no-op without data."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    first = func._schema.arguments[0].alias_info if func._schema.arguments else None
    return (
        first is not None
        and first.is_write
        and bool(args)
        and isinstance(args[0], Tensor)
        and args[0].is_meta
    )


class _MeasuringMode(TorchDispatchMode):
    """Runs a model on meta tensors as cheaply as the measurement allows.

    * counts FLOPs with the formulas of :mod:`torch.utils.flop_counter` exactly as
      :class:`~torch.utils.flop_counter.FlopCounterMode` does (an operator with a
      ``CompositeImplicitAutograd`` kernel is decomposed and its parts are counted), without
      its per-module table;
    * answers scalar reads of meta tensors as if the data were valid and every iteration had
      converged: a boolean is ``True`` if an ``all`` reduction gave it (``if not
      bool(ok.all()): raise`` passes, ``while not bool(done.all())`` stops after one pass),
      else ``False`` (``if bool((x < 0).any()): raise`` passes, ``if not bool((step >
      tol).any()): break`` stops); a floating-point number is NaN (every comparison with it is
      false, so no special case is taken); an integer (a data-dependent shape) raises;
    * skips random in-place fills of meta tensors (parameter initialisation, dropout masks);
    * reuses output layouts from ``layouts`` (:class:`LayoutCache`).

    Args:
        layouts: the cache of output layouts (``None``: no reuse).
        count: whether to count FLOPs (``False`` while a model is built).
    """

    def __init__(self, layouts: LayoutCache | None = None, *, count: bool = True) -> None:
        super().__init__()
        self.layouts = layouts
        self.count = count
        self.flops = 0
        self._all_results: dict[int, weakref.ref[Tensor]] = {}  # outputs of `all` by id

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _SCALAR_READS:
            return _read_scalar(func, args, kwargs, self._of_all(args[0]))
        if func in _METADATA_OPS:
            return NotImplemented
        if _random_fill_of_meta(func, args):
            return args[0]
        if self.count and func is not torch.ops.prim.device.default:
            with self:  # as FlopCounterMode: count the parts of a decomposable operator
                parts = func.decompose(*args, **kwargs)
            if parts is not NotImplemented:
                return parts
        out = self._run(func, args, kwargs)
        if func._overloadpacket is torch.ops.aten.all and isinstance(out, Tensor) and out.is_meta:
            self._all_results[id(out)] = weakref.ref(out)
        formula = flop_registry.get(func._overloadpacket) if self.count else None
        if formula is not None:
            self.flops += formula(*args, **kwargs, out_val=out)
        return out

    def _of_all(self, value: Any) -> bool:
        """Whether ``value`` is (still) a tensor an ``all`` reduction gave."""
        found = self._all_results.get(id(value))
        return found is not None and found() is value

    def _run(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.layouts is None or not self.layouts.functional(func):
            return func(*args, **kwargs)
        try:
            key = (func, _key_of(args), _key_of(tuple(sorted(kwargs.items()))))
        except _Uncacheable:
            return func(*args, **kwargs)
        out = self.layouts.lookup(key)
        if out is None:
            out = func(*args, **kwargs)
            self.layouts.record(key, out)
        return out


def _read_scalar(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], of_all: bool) -> Any:
    """The answer to ``bool(tensor)`` or ``tensor.item()`` (see :class:`_MeasuringMode`)."""
    tensor = args[0]
    if isinstance(tensor, Tensor) and tensor.is_meta:
        if tensor.dtype == torch.bool:
            return of_all
        if tensor.is_floating_point():
            return math.nan
        raise RuntimeError(
            f"the model reads a {tensor.dtype} value from a meta tensor (a shape or an "
            "index that depends on the data); the plan cannot measure it on meta"
        )
    return func(*args, **kwargs)


@dataclass(frozen=True)
class StepMeasurement:
    """One forward and backward pass of a micro-batch.

    Attributes:
        flops: forward + backward FLOPs (the formulas of :mod:`torch.utils.flop_counter`).
        activation_bytes: bytes of the distinct non-parameter storages saved for backward.
    """

    flops: int
    activation_bytes: int


def measure_step(
    model: nn.Module,
    batch: Any,
    loss: Callable[[nn.Module, Any], Tensor],
    *,
    layouts: LayoutCache | None = None,
) -> StepMeasurement:
    """Count the FLOPs and saved activations of ``loss(model, batch).backward()``.

    Works on any device; on the meta device nothing is computed or allocated. A storage saved
    several times (a tensor and its views, or one output saved by two consumers) is counted
    once; storages of parameters and buffers are not counted. FLOPs are those
    :class:`~torch.utils.flop_counter.FlopCounterMode` counts.

    Args:
        model: the model (its training/evaluation mode is used as is).
        batch: the micro-batch ``loss`` takes.
        loss: ``loss(model, batch) -> scalar``.
        layouts: output layouts of meta operators to reuse and extend (:class:`LayoutCache`).
    """
    owned = {t.untyped_storage()._cdata for t in chain(model.parameters(), model.buffers())}
    saved: dict[int, Any] = {}

    def pack(tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in owned:
            saved.setdefault(storage._cdata, storage)  # keeps it alive: addresses stay unique
        return tensor

    with _MeasuringMode(layouts) as mode:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            value = loss(model, batch)
        if value.dim() != 0:
            raise ValueError(f"loss must return a scalar, got shape {tuple(value.shape)}")
        value.backward()
    return StepMeasurement(
        flops=int(mode.flops),
        activation_bytes=int(sum(s.nbytes() for s in saved.values())),
    )


# --- estimates ----------------------------------------------------------------------------------


def peak_flops(gpu: str, precision: str) -> float:
    """The dense peak FLOP/s of ``gpu`` (a key of :data:`GPUS`) for a job trained in
    ``precision`` (a key of :data:`PRECISIONS`)."""
    if gpu not in GPUS:
        raise ValueError(f"gpu must be one of {list(GPUS)}, got {gpu!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    return GPUS[gpu][PRECISIONS[precision]]


def gpu_hours(
    flops: float,
    peak_flops: float,
    mfu: float = DEFAULT_MFU,
    *,
    micro_steps: int = 0,
    floor_s: float = STEP_FLOOR_S,
) -> float:
    """GPU-hours to execute ``flops`` in ``micro_steps`` micro-batch steps on GPUs of
    ``peak_flops`` FLOP/s at utilisation ``mfu``, each step taking at least ``floor_s`` seconds:
    ``max(flops / (peak_flops · mfu), micro_steps · floor_s) / 3600``."""
    mfu = _check_mfu(mfu)
    if not peak_flops > 0:
        raise ValueError(f"peak_flops must be positive, got {peak_flops!r}")
    if flops < 0:
        raise ValueError(f"flops must be non-negative, got {flops!r}")
    if isinstance(micro_steps, bool) or not isinstance(micro_steps, int) or micro_steps < 0:
        raise ValueError(f"micro_steps must be a non-negative int, got {micro_steps!r}")
    if not floor_s >= 0:
        raise ValueError(f"floor_s must be non-negative, got {floor_s!r}")
    return max(flops / (peak_flops * mfu), micro_steps * floor_s) / 3600.0


@dataclass(frozen=True)
class GpuEstimate:
    """Time of some FLOPs on ``gpus`` GPUs of one kind at a given MFU.

    Attributes:
        gpu: a key of :data:`GPUS`.
        peak_flops: the peak of the job's precision on it.
        gpus: GPUs of the wall time.
        gpu_hours, wall_hours: the estimate (:func:`gpu_hours`).
        floor_bound: whether :data:`STEP_FLOOR_S` decided it, not the FLOPs.
    """

    gpu: str
    peak_flops: float
    gpus: int
    gpu_hours: float
    wall_hours: float
    floor_bound: bool = False


def micro_steps_of(total_steps: int, global_batch: int, micro_batch: int) -> int:
    """Micro-batch steps of ``total_steps`` optimiser steps: ⌈global batch / micro-batch⌉ each."""
    return total_steps * -(-global_batch // micro_batch)


def _gpu_estimates(
    flops: float, mfu: float, precision: str, micro_steps: int
) -> tuple[GpuEstimate, ...]:
    out = []
    for name in GPUS:
        peak = peak_flops(name, precision)
        hours = gpu_hours(flops, peak, mfu, micro_steps=micro_steps)
        bound = hours > gpu_hours(flops, peak, mfu)
        out.append(GpuEstimate(name, peak, GPUS_PER_NODE, hours, hours / GPUS_PER_NODE, bound))
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
    paper_parameters: float | None
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


@dataclass(frozen=True)
class ModelMeasurement:
    """What a job's model gives: its trainable parameters, their count in the paper's convention
    and one micro-batch step."""

    parameters: int
    parameters_counted: int
    step: StepMeasurement


class PlanCache:
    """What pricing several jobs shares: the output layouts of meta operators
    (:class:`LayoutCache`) and the :class:`ModelMeasurement` of every job with a ``cache_key``
    (jobs with equal keys and micro-batches are built and measured once). One cache may serve
    the plans of several experiments at one preset (``hopfield plan --all``)."""

    def __init__(self) -> None:
        self.layouts = LayoutCache()
        self.models: dict[Hashable, ModelMeasurement] = {}


_PRINTED_COUNT = re.compile(r"\s*(\d+)(?:\.(\d+))?\s*([mMkK]?)\s*")


def printed_count(label: str) -> tuple[float, float]:
    """``(value, half a unit of the last printed digit)`` of a parameter count as a paper prints
    it: ``"108.9m"`` → ``(108.9e6, 0.05e6)``, ``"5.20 M"`` → ``(5.2e6, 0.005e6)``, ``"962k"``;
    a count rounds to the label when it lies within the half unit. ``ValueError`` for any other
    text."""
    match = _PRINTED_COUNT.fullmatch(label)
    if match is None:
        raise ValueError(
            f"paper_label must be a printed count like '108.9m' or '5.20 M', got {label!r}"
        )
    whole, decimals, unit = match.groups()
    scale = {"m": 1e6, "k": 1e3, "": 1.0}[unit.lower()]
    digits = len(decimals or "")
    value = float(f"{whole}.{decimals or 0}") * scale
    return value, 0.5 * 10.0**-digits * scale


def measure_model(job: TrainingJob, layouts: LayoutCache | None = None) -> ModelMeasurement:
    """Build ``job``'s model on ``job.measure_on`` (the meta device unless the job says
    otherwise), count its parameters and measure one micro-batch (:func:`measure_step`)."""
    device = torch.device(job.measure_on)
    micro, _ = micro_batch_of(job)
    with torch.random.fork_rng(devices=[]):  # real (CPU) measurements draw random numbers
        with _MeasuringMode(layouts, count=False):  # no random initialisation on meta
            model = job.build_model(device)
        model.train()
        parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
        counted = job.count_parameters(model) if job.count_parameters else parameters
        with device:  # tensors a model creates while running land on the device too
            step = measure_step(model, job.make_batch(micro, device), job.loss, layouts=layouts)
    return ModelMeasurement(parameters, counted, step)


def estimate(
    job: TrainingJob,
    *,
    mfu: float = DEFAULT_MFU,
    cache: PlanCache | None = None,
) -> JobEstimate:
    """Price one job: measure its model (:func:`measure_model`, or the cached measurement of a
    job with the same ``cache_key`` and micro-batch), scale to the global batch and the whole
    schedule.

    Args:
        job: the job.
        mfu: model-FLOPs utilisation in ``(0, 1]``.
        cache: measurements and layouts to reuse and extend (``None``: measure afresh).
    """
    mfu = _check_mfu(mfu)
    micro, source = micro_batch_of(job)
    key = None if cache is None or job.cache_key is None else (job.cache_key, micro)
    model = cache.models.get(key) if cache is not None and key is not None else None
    if model is None:
        model = measure_model(job, cache.layouts if cache is not None else None)
        if cache is not None and key is not None:
            cache.models[key] = model
    parameters, counted, measured = model.parameters, model.parameters_counted, model.step
    flops_step = round(measured.flops * job.global_batch / micro)
    total_steps = job.total_steps if job.total_steps is not None else job.optimizer_steps * job.runs
    flops_total = float(flops_step) * total_steps
    printed = printed_count(job.paper_label) if job.paper_label else None
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
        paper_parameters=printed[0] if printed else None,
        paper_label=job.paper_label,
        parameters_match=abs(counted - printed[0]) <= printed[1] if printed else None,
        flops_per_micro_batch=measured.flops,
        flops_per_step=flops_step,
        flops_total=flops_total,
        activation_bytes=measured.activation_bytes,
        state_bytes=STATE_BYTES_PER_PARAMETER * parameters,
        precision=job.precision,
        gpus=_gpu_estimates(
            flops_total, mfu, job.precision, micro_steps_of(total_steps, job.global_batch, micro)
        ),
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
        """GPU-hours of the whole preset per GPU kind (the sum of its jobs')."""
        return {
            name: sum(g.gpu_hours for j in self.jobs for g in j.gpus if g.gpu == name)
            for name in GPUS
        }


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
    cache: PlanCache | None = None,
) -> ExperimentPlan:
    """Price preset ``preset`` of experiment ``name`` without training it.

    Args:
        name: a registered experiment.
        preset: one of its presets.
        mfu: model-FLOPs utilisation in ``(0, 1]`` of the time estimates.
        data_dir: data root for the presence of the dataset files (else ``$HOPFIELD_DATA``).
        progress: called with ``"<experiment>: <job>"`` before each job is priced.
        cache: measurements to share with other plans of the same preset (:class:`PlanCache`;
            ``None``: a cache for this plan alone).

    Raises:
        ValueError: an unknown experiment or preset, or ``mfu`` outside ``(0, 1]``.
    """
    from hopfield.experiments.registry import get
    from hopfield.plan.jobs import NOT_TRAINED, jobs_of, untrained_data

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
    cache = cache if cache is not None else PlanCache()
    estimates = []
    for job in jobs:
        if progress is not None:
            progress(f"{name}: {job.name}")
        estimates.append(estimate(job, mfu=mfu, cache=cache))
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


#: The folder of plan records in a results folder: ``DIR/plan/<preset>.json``.
PLAN_FOLDER = "plan"

#: The columns of a plan record's job rows: every :class:`JobEstimate` field but the GPU
#: estimates (recomputed from ``flops_total`` and the MFU); ``notes`` holds indices into the
#: experiment's notes.
JOB_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(JobEstimate) if f.name != "gpus")


def plan_record_path(directory: str | os.PathLike[str], preset: str) -> Path:
    """Where :func:`write_plan_record` puts the plan of ``preset``: ``directory/plan/<preset>.json``."""
    return Path(directory) / PLAN_FOLDER / f"{preset}.json"


def _record_row(job: JobEstimate, notes: Sequence[str]) -> list[Any]:
    missing = [n for n in job.notes if n not in notes]
    if missing:
        raise ValueError(f"job {job.name!r}: note {missing[0]!r} is not among the plan's notes")
    values = {**asdict(job), "notes": [notes.index(n) for n in job.notes]}
    return [values[c] for c in JOB_COLUMNS]


def _entry_text(result: ExperimentPlan) -> str:
    """One experiment of a plan record as JSON, one line per job."""
    head = {
        "experiment": result.experiment,
        "preset": result.preset,
        "mfu": result.mfu,
        "trains": result.trains,
        "summary": result.summary,
        "notes": list(result.notes),
        "data": [{"file": f, "status": s, "note": n} for f, s, n in result.data],
    }
    rows = [json.dumps(_record_row(job, result.notes), ensure_ascii=False) for job in result.jobs]
    jobs = "[]" if not rows else "[\n   " + ",\n   ".join(rows) + "\n  ]"
    fields_text = [
        f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in head.items()
    ]
    return " {\n" + ",\n".join([*fields_text, f'  "jobs": {jobs}']) + "\n }"


def write_plan_record(
    results: Sequence[ExperimentPlan], directory: str | os.PathLike[str], *, command: str
) -> Path:
    """Write ``results`` (plans of one preset and MFU) as ``directory/plan/<preset>.json``.

    The record: ``command``, ``preset``, ``mfu``, ``versions`` (hopfield, torch),
    ``job_columns`` (:data:`JOB_COLUMNS`) and ``experiments``, each with the fields of its
    :class:`ExperimentPlan` and its jobs as rows of ``job_columns``, one line each.

    Args:
        results: the plans, in the order to keep.
        directory: a results folder (``results``, ``runs``).
        command: the command that priced them (rendered as the Markdown's first line).

    Raises:
        ValueError: ``results`` is empty or mixes presets or MFUs.
    """
    import hopfield

    if not results:
        raise ValueError("results must not be empty")
    presets = {r.preset for r in results}
    mfus = {r.mfu for r in results}
    if len(presets) != 1 or len(mfus) != 1:
        raise ValueError(f"a plan record holds one preset and MFU, got {presets} and {mfus}")
    head = {
        "command": command,
        "preset": results[0].preset,
        "mfu": results[0].mfu,
        "versions": {"hopfield": hopfield.__version__, "torch": torch.__version__},
        "job_columns": list(JOB_COLUMNS),
    }
    lines = [f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in head.items()]
    entries = ",\n".join(_entry_text(r) for r in results)
    path = plan_record_path(directory, results[0].preset)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{\n" + "\n".join(lines) + '\n "experiments": [\n' + entries + "\n ]\n}\n")
    return path


def _plan_of(entry: dict[str, Any], columns: Sequence[str]) -> ExperimentPlan:
    notes = tuple(entry["notes"])
    jobs = []
    for row in entry["jobs"]:
        values = dict(zip(columns, row, strict=True))
        values["notes"] = tuple(notes[i] for i in values["notes"])
        steps = micro_steps_of(values["total_steps"], values["global_batch"], values["micro_batch"])
        gpus = _gpu_estimates(values["flops_total"], entry["mfu"], values["precision"], steps)
        jobs.append(JobEstimate(**values, gpus=gpus))
    return ExperimentPlan(
        experiment=entry["experiment"],
        preset=entry["preset"],
        mfu=entry["mfu"],
        trains=entry["trains"],
        summary=entry["summary"],
        jobs=tuple(jobs),
        data=tuple((d["file"], d["status"], d["note"]) for d in entry["data"]),
        notes=notes,
    )


def read_plan_record(path: str | os.PathLike[str]) -> tuple[list[ExperimentPlan], str]:
    """The plans of a record of :func:`write_plan_record` and the command that priced them.

    Raises:
        ValueError: the file is not such a record.
    """
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not {"command", "job_columns", "experiments"} <= set(data):
        raise ValueError(f"{path} is not a plan record (hopfield plan --out)")
    try:
        plans = [_plan_of(entry, data["job_columns"]) for entry in data["experiments"]]
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise ValueError(f"{path} is not a plan record (hopfield plan --out): {error!r}") from None
    return plans, str(data["command"])


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
    labels = "/".join(dict.fromkeys(j.paper_label for j in stated))
    if all(j.parameters_match for j in stated):
        return f"{labels} ✓"
    return f"{labels} ✗ ours {_span([j.parameters_counted for j in stated], '{:,}'.format)}"


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
        *(_gpu_cell(jobs, i) for i in range(len(GPUS))),
    ]


def _gpu_cell(jobs: Sequence[JobEstimate], index: int) -> str:
    """The GPU-hours of ``jobs`` on ``GPUS``'s ``index``-th kind, ``†`` when the step floor
    decided one of them."""
    floor = any(j.gpus[index].floor_bound for j in jobs)
    return _hours(sum(j.gpus[index].gpu_hours for j in jobs)) + (" †" if floor else "")


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


def summary_table(results: Sequence[ExperimentPlan]) -> list[str]:
    """The lines of a Markdown table with one row per experiment: runs, the largest model,
    FLOPs, GPU-hours and wall hours, the largest activations and the data status."""
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
                *(_gpu_cell(r.jobs, i) for i in range(len(GPUS))),
                *(_hours(hours[g] / GPUS_PER_NODE) for g in GPUS),
                _bytes(max(j.activation_bytes for j in r.jobs)),
                _data_cell(r),
            ]
        )
    return _table(columns, rows)


def render_markdown(
    results: Sequence[ExperimentPlan], *, per_job: bool = False, command: str = ""
) -> str:
    """Markdown: a summary table (one row per experiment) when there are several, then per
    experiment its notes, a table of its jobs (grouped unless ``per_job``) and its data."""
    if not results:
        raise ValueError("results must not be empty")
    mfu = results[0].mfu
    peaks = "; ".join(
        f"{name} " + ", ".join(f"{kind} {peak / 1e12:g}" for kind, peak in kinds.items())
        for name, kinds in GPUS.items()
    )
    lines = []
    if command:
        lines += [f"Generated by `{command}`; do not edit by hand.", ""]
    lines += [
        f"Model-FLOPs utilisation {mfu:g}; each job is priced at the dense peak of the precision "
        f"it trains in (TFLOP/s: {peaks}; fp32 is float32 without TF32, PyTorch's default for "
        "matrix products), and at no less than "
        f"{STEP_FLOOR_S * 1e3:g} ms of GPU time per micro-batch step (launch overhead; † marks "
        "GPU-hours this floor decided): GPU-hours = max(FLOPs / (peak · MFU), micro-batch steps "
        f"· floor) / 3600; wall time on {GPUS_PER_NODE} GPUs = GPU-hours / {GPUS_PER_NODE}. "
        "An fp32 job run with `hopfield run --tf32` (TF32 matrix products, off in every fp32 "
        "preset as in its paper) needs 1/8 (A100) or 1/7.4 (H100) of the GPU-hours its FLOPs "
        "decide; cuDNN's convolutions use TF32 in PyTorch by default either way. "
        "FLOPs: forward + backward "
        "(what torch's FlopCounterMode counts, on the meta device, one micro-batch scaled to "
        "the global batch). "
        "Tokens: sequence positions, image patches (+ class token), bag instances or time "
        "steps. Activations: bytes saved for backward per device at the micro-batch, float32. "
        "Parameters in the paper's convention where it has one (BERT without its MLM head, "
        "STanHop-Net without its position tables); params+grads+Adam: "
        f"{STATE_BYTES_PER_PARAMETER} bytes per trainable parameter.",
        "",
    ]
    if len(results) > 1:
        lines += ["## Summary", "", *summary_table(results), ""]
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
                + "; ".join(f"{s} (preset precision {p}, priced at its peak)" for s, p in micro)
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

"""Results as data (tables, metrics, figures) and the context an experiment runs in."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hopfield.tables import Table

T = TypeVar("T")


@dataclass
class Results:
    """What ``run(config, context)`` returns: tables, scalar metrics, figure files, notes."""

    tables: list[Table] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Results:
        return cls(
            tables=[Table(**t) for t in data.get("tables", [])],
            metrics=dict(data.get("metrics", {})),
            figures=list(data.get("figures", [])),
            notes=list(data.get("notes", [])),
        )


class OutputFolderError(ValueError):
    """The run folder cannot be made: a path through a file, a read-only place, a missing
    mount."""


@dataclass
class RunContext:
    """Where an experiment writes, where it finds data, how it reports progress, and in which
    process of a multi-process run it is.

    Attributes:
        out_dir: directory for this experiment's files (figures, checkpoints, results.json).
        data_dir: root of the datasets (``--data-dir`` or ``$HOPFIELD_DATA``), or ``None``.
        preset: the preset name the run was started with.
        progress: whether to draw progress bars (only the main process draws them).
        stop_after: end every training run after this many optimiser steps, with the schedule
            of the full run (``hopfield run --max-steps``: smoke runs of paper presets).
        micro_batch_size: examples per forward/backward pass and process for every training run
            (``hopfield run --micro-batch-size``; the global batch and so the recipe stay).
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"`` for every training run in place of
            the experiment's own setting (``hopfield run --mixed-precision``), ``None`` to keep
            it.
        stand_in_data: where a dataset file is absent, train on random data of the real data's
            shapes instead of stopping (``hopfield run --stand-in-data``: proves a paper preset
            runs on a machine without its corpus; the numbers mean nothing). An experiment that
            uses stand-in data says so in a note.
        data_workers: DataLoader worker processes per training process that read the
            micro-batches ahead of the step (``hopfield run --data-workers``; ``0``: read in
            the step). The examples of every step, and so the results, stay the same.

    Every process of a ``torchrun``/``accelerate launch`` job runs the experiment; only the main
    process writes files (:meth:`save_json`, :meth:`save_figure`), and :attr:`rank` and
    :attr:`processes` say where this one stands.
    """

    out_dir: Path
    data_dir: Path | None = None
    preset: str = "tiny"
    progress: bool = True
    stop_after: int | None = None
    micro_batch_size: int | None = None
    mixed_precision: str | None = None
    stand_in_data: bool = False
    data_workers: int = 0
    tf32: bool = False
    log_with: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        from hopfield.training import process_layout

        self.rank, self.processes = process_layout()
        self.out_dir = Path(self.out_dir)
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except (FileNotFoundError, NotADirectoryError, FileExistsError, PermissionError) as error:
            raise OutputFolderError(
                f"the run folder {self.out_dir} cannot be made ({error.strerror}): give --out "
                "a folder that can be written (it is made if missing)"
            ) from error
        if self.data_dir is not None:
            self.data_dir = Path(self.data_dir)
        if not self.is_main_process:
            self.progress = False

    @property
    def is_main_process(self) -> bool:
        """Whether this process writes the files (rank 0)."""
        return self.rank == 0

    def training_config(self, **settings: Any) -> Any:
        """A :class:`hopfield.training.TrainingConfig` of ``settings`` with this run's limits
        (``stop_after``, ``micro_batch_size``, ``mixed_precision``), its ``data_workers``
        (``num_workers``), ``tf32`` and ``log_with`` (when set) applied; experiments build
        theirs with it."""
        from hopfield.training import TrainingConfig

        settings.setdefault("num_workers", self.data_workers)
        if self.tf32:
            settings["tf32"] = True
        if self.log_with:
            settings["log_with"] = self.log_with
        if self.stop_after is not None:
            settings["stop_after"] = self.stop_after
        if self.micro_batch_size is not None:
            settings["micro_batch_size"] = self.micro_batch_size
        if self.mixed_precision is not None:
            settings["mixed_precision"] = self.mixed_precision
        return TrainingConfig(**settings)

    def track(self, iterable: Iterable[T], total: int | None = None, desc: str = "") -> Iterator[T]:
        """Iterate with a progress bar (tqdm, if installed and progress is on)."""
        if not self.progress:
            yield from iterable
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:  # pragma: no cover - tqdm is in the experiments extra
            yield from iterable
            return
        yield from tqdm(iterable, total=total, desc=desc, leave=False, dynamic_ncols=True)

    def path(self, name: str) -> Path:
        """A file path inside ``out_dir``."""
        return self.out_dir / name

    def save_json(self, name: str, data: Any) -> Path:
        """Write ``data`` as JSON atomically (a stopped run never leaves half a file); only the
        main process writes. Returns the path."""
        from hopfield.training import writing

        target = self.path(name)
        if self.is_main_process:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(f"{target.suffix}.{os.getpid()}.tmp")
            text = json.dumps(data, indent=2, default=_json_default)
            with writing(target, tmp):  # a full disk: DiskFullError, and no temporary left
                tmp.write_text(text)
                os.replace(tmp, target)
        return target

    def save_figure(self, figure: Any, name: str, dpi: int = 120) -> str:
        """Save a matplotlib ``figure`` as ``name`` in ``out_dir`` (main process only) and close
        it. Returns ``name``."""
        import matplotlib.pyplot as plt

        if self.is_main_process:
            figure.savefig(self.path(name), dpi=dpi)
        plt.close(figure)
        return name

    def load_json(self, name: str) -> Any | None:
        """The JSON saved under ``name``, or ``None`` when there is none."""
        target = self.path(name)
        return json.loads(target.read_text()) if target.exists() else None


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON")


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    n = len(values)
    if n == 0:
        raise ValueError("values must not be empty")
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var)


def with_threads(threads: int | None, fn: Callable[[], T]) -> T:
    """``fn()`` with ``threads`` torch CPU threads, restored afterwards (``None`` or ``0``: the
    current setting)."""
    import torch

    if threads is None or threads == 0:
        return fn()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(f"threads must be an int >= 0 or None, got {threads!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)

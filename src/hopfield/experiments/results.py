"""Results as data (tables, metrics, figures) and the context an experiment runs in."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class Table:
    """A table of results. ``paper`` columns hold the paper's numbers beside ours."""

    name: str
    columns: list[str]
    rows: list[list[Any]]
    caption: str = ""

    def __post_init__(self) -> None:
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(
                    f"table {self.name!r}: row {i} has {len(row)} cells, expected {len(self.columns)}"
                )

    def to_markdown(self) -> str:
        """The table as GitHub-flavoured Markdown."""
        head = "| " + " | ".join(self.columns) + " |"
        rule = "|" + "|".join("---" for _ in self.columns) + "|"
        body = ["| " + " | ".join(format_cell(c) for c in row) + " |" for row in self.rows]
        caption = [f"*{self.caption}*", ""] if self.caption else []
        return "\n".join([f"### {self.name}", "", *caption, head, rule, *body])


def format_cell(value: Any) -> str:
    """Numbers with four significant digits, ``None`` as an en dash, the rest as text."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.4g}"
    return str(value)


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


@dataclass
class RunContext:
    """Where an experiment writes, where it finds data, and how it reports progress.

    Attributes:
        out_dir: directory for this experiment's files (figures, checkpoints, results.json).
        data_dir: root of the datasets (``--data-dir`` or ``$HOPFIELD_DATA``), or ``None``.
        preset: the preset name the run was started with.
        progress: whether to draw progress bars.
    """

    out_dir: Path
    data_dir: Path | None = None
    preset: str = "tiny"
    progress: bool = True

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.data_dir is not None:
            self.data_dir = Path(self.data_dir)

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
        """Write ``data`` as JSON atomically (a stopped run never leaves half a file)."""
        target = self.path(name)
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=_json_default))
        os.replace(tmp, target)
        return target

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

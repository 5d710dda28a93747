"""Tables of results as data: what experiments return, reports render and the outlier metrics
produce. A leaf module: it imports nothing of ours."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Table", "format_cell"]


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
        """The table as GitHub-flavoured Markdown under a ``###`` heading of its name."""
        return "\n".join([f"### {self.name}", "", self.body_markdown()])

    def body_markdown(self) -> str:
        """The caption (if any) and the Markdown table, without the heading (what the docs'
        generated blocks hold)."""
        head = "| " + " | ".join(self.columns) + " |"
        rule = "|" + "|".join("---" for _ in self.columns) + "|"
        body = ["| " + " | ".join(format_cell(c) for c in row) + " |" for row in self.rows]
        caption = [f"*{self.caption}*", ""] if self.caption else []
        return "\n".join([*caption, head, rule, *body])


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

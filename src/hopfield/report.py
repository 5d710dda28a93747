"""Render results folders into a Markdown report: tables (ours beside the paper's) and figures."""

from __future__ import annotations

import os
from pathlib import Path

from hopfield.experiments.results import Results, format_cell
from hopfield.experiments.runner import RESULTS_FILE, load_record

REPORT_FILE = "REPORT.md"


def find_records(root: Path) -> list[Path]:
    """Every ``results.json`` below ``root``, sorted."""
    return sorted(root.rglob(RESULTS_FILE))


def render_record(path: Path, report_dir: Path) -> str:
    """One experiment's section of the report."""
    record = load_record(path)
    results = Results.from_dict(record["results"])
    lines = [
        f"## {record['experiment']} (preset `{record['preset']}`)",
        "",
        f"Reproduces: {record.get('paper') or '–'}. Seed {record.get('seed')}, "
        f"wall time {record['wall_time_s']:.1f} s, torch {record['versions']['torch']}, "
        f"hopfield {record['versions']['hopfield']}.",
        "",
    ]
    if results.metrics:
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {k} | {format_cell(v)} |" for k, v in sorted(results.metrics.items())]
        lines.append("")
    for table in results.tables:
        lines += [table.to_markdown(), ""]
    for figure in results.figures:
        figure_path = path.parent / figure
        rel = Path(os.path.relpath(figure_path, report_dir)).as_posix()
        lines += [f"![{figure}]({rel})", ""]
    lines += [f"- {note}" for note in results.notes]
    return "\n".join(lines).rstrip() + "\n"


def build_report(root: Path | str, output: Path | str | None = None) -> Path:
    """Write a Markdown report of every result below ``root``; returns the report's path."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"results directory {root} does not exist")
    records = find_records(root)
    if not records:
        raise ValueError(f"no {RESULTS_FILE} found below {root}; run `hopfield run` first")
    target = Path(output) if output is not None else root / REPORT_FILE
    sections = [render_record(p, target.parent) for p in records]
    header = (
        "# hopfield results\n\n"
        "Our numbers beside the papers' where the experiment reproduces a table; "
        "every number below comes from the JSON next to it.\n"
    )
    target.write_text(header + "\n" + "\n".join(sections))
    return target

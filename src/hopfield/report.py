"""Render results folders into a Markdown report: tables (ours beside the paper's) and figures.

Documentation quotes report tables between generated-block markers::

    <!-- generated: memory-capacity/Stated trends, checked -->
    ...
    <!-- /generated -->

:func:`render_doc_blocks` fills each block with that table of the experiment's record, in the
report's Markdown (caption and table, without the report's heading), and :func:`update_docs`
rewrites documentation files so (``hopfield report DIR --docs FILE...``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from hopfield.experiments.results import Results
from hopfield.experiments.runner import RESULTS_FILE, load_record, settings_parts
from hopfield.tables import Table, format_cell

REPORT_FILE = "REPORT.md"

#: A generated block of a documentation file: its experiment, table name and current content.
#: The block ``<!-- generated: claims/ledger -->``: the claims ledger of the results folder.
LEDGER_BLOCK = ("claims", "ledger")

GENERATED_BLOCK = re.compile(
    r"<!-- generated: (?P<experiment>[^/\n]+?)/(?P<table>[^\n]+?) -->\n"
    r"(?P<body>.*?)<!-- /generated -->",
    flags=re.DOTALL,
)


def find_records(root: Path) -> list[Path]:
    """Every ``results.json`` below ``root``, sorted."""
    return sorted(root.rglob(RESULTS_FILE))


def render_record(path: Path, report_dir: Path) -> str:
    """One experiment's section of the report."""
    record = load_record(path)
    results = Results.from_dict(record["results"])
    changed = "".join(f", {part}" for part in settings_parts(record, code=True))
    lines = [
        f"## {record['experiment']} (preset `{record['preset']}`{changed})",
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


def find_table(results_dir: Path | str, experiment: str, name: str) -> Table:
    """The table ``name`` (exact) of ``results_dir/experiment/results.json``; ``ValueError`` if
    the record or the table is missing."""
    path = Path(results_dir) / experiment / RESULTS_FILE
    if not path.is_file():
        raise ValueError(f"no record {path} for the generated block {experiment}/{name}")
    results = Results.from_dict(load_record(path)["results"])
    for table in results.tables:
        if table.name == name:
            return table
    names = ", ".join(repr(t.name) for t in results.tables)
    raise ValueError(f"{path} has no table {name!r} (tables: {names})")


def render_doc_blocks(doc_text: str, results_dir: Path | str) -> str:
    """``doc_text`` with every generated block (``<!-- generated: EXPERIMENT/TABLE NAME -->`` …
    ``<!-- /generated -->``) filled with that table of the record in ``results_dir``, rendered
    by :meth:`~hopfield.tables.Table.body_markdown` between blank lines; the block ``claims/ledger``
    (:data:`LEDGER_BLOCK`) holds the claims ledger of ``results_dir``
    (:func:`hopfield.claims.report.ledger_section`). Text outside the blocks is unchanged."""

    def fill(match: re.Match[str]) -> str:
        experiment, name = match["experiment"].strip(), match["table"].strip()
        if (experiment, name) == LEDGER_BLOCK:
            from hopfield.claims.report import ledger_section

            body = ledger_section(results_dir)
        else:
            body = find_table(results_dir, experiment, name).body_markdown()
        return f"<!-- generated: {experiment}/{name} -->\n\n{body}\n\n<!-- /generated -->"

    return GENERATED_BLOCK.sub(fill, doc_text)


def doc_blocks(doc_text: str) -> list[tuple[str, str]]:
    """``(experiment, table name)`` of every generated block of ``doc_text``, in order."""
    return [
        (m["experiment"].strip(), m["table"].strip()) for m in GENERATED_BLOCK.finditer(doc_text)
    ]


def update_docs(paths: Iterable[Path | str], results_dir: Path | str) -> list[Path]:
    """Rewrite the generated blocks of the documentation files ``paths`` from the records in
    ``results_dir`` (:func:`render_doc_blocks`); returns the files whose text changed. Every
    file is rendered before any is written, so a missing record or table changes nothing."""
    rendered = []
    for path in map(Path, paths):
        text = path.read_text()
        new = render_doc_blocks(text, results_dir)
        if new != text:
            rendered.append((path, new))
    for path, new in rendered:
        path.write_text(new)
    return [path for path, _ in rendered]

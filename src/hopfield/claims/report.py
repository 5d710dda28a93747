"""``claims.json`` and ``CLAIMS.md``: the ledger of a results folder as data and as one table."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hopfield.claims.claim import PAPERS
from hopfield.claims.ledger import evaluate
from hopfield.claims.verdict import VERDICTS

__all__ = ["JSON_FILE", "MARKDOWN_FILE", "ledger_section", "render_markdown", "write_ledger"]

JSON_FILE = "claims.json"
MARKDOWN_FILE = "CLAIMS.md"

TITLES = {
    "outeffhop": "OutEffHop (Hu et al., ICML 2024)",
    "nonparametric": "Nonparametric modern Hopfield models (Hu et al., ICML 2025)",
    "hyperset": "Hyper-SET (Hu, Zou & Xu)",
}


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_ledger(directory: Path | str) -> tuple[Path, Path]:
    """Judge every claim from the records in ``directory`` and write ``directory/claims.json``
    and ``directory/CLAIMS.md``; returns both paths."""
    directory = Path(directory)
    records = evaluate(directory)
    json_path, md_path = directory / JSON_FILE, directory / MARKDOWN_FILE
    _atomic_write(json_path, json.dumps(records, indent=1, ensure_ascii=False) + "\n")
    _atomic_write(md_path, render_markdown(records, source=str(directory)))
    return json_path, md_path


def _cell(value: Any) -> str:
    """A table cell: numbers with four significant digits (millions as ``M`` with six), ``None``
    as –."""
    if value is None:
        return "–"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value / 1e6:.6g} M" if abs(value) >= 1e5 else f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _interval(record: dict[str, Any]) -> str:
    interval = record["interval"]
    if not interval or interval[0] is None:
        return "–"
    return f"[{interval[0]:+.3g}, {interval[1]:+.3g}]"


def _p(record: dict[str, Any]) -> str:
    test = record["test"]
    if not test or test["p_decision"] is None:
        return "–"
    text = f"{test['p_decision']:.2g}"
    if isinstance(test["p_wilcoxon"], float):
        text += f"; W {test['p_wilcoxon']:.2g}"
    return text


def _ours(record: dict[str, Any]) -> str:
    if record["ours"] is None:
        return "–"
    if record["kind"] == "exact":
        return f"{_cell(record['ours'])} {record['metric']}"
    model = f"{record['model']} " if record["model"] else ""
    vs = f" vs {record['rival']} {_cell(record['rival_value'])}" if record["rival"] else ""
    others = [c for c in record.get("comparisons") or [] if c["rival"] != record["rival"]]
    if others:  # every rival, the deciding one first, each with its own verdict
        vs += f" ({_comparison_verdict(record, record['rival'])})"
        vs += "".join(
            f"; vs {c['rival']} {_cell(c['rival_value'])} ({c['verdict']})" for c in others
        )
    return f"{model}{_cell(record['ours'])}{vs}"


def _comparison_verdict(record: dict[str, Any], rival: str) -> str:
    return next(c["verdict"] for c in record["comparisons"] if c["rival"] == rival)


def _paper(record: dict[str, Any]) -> str:
    value = _cell(record["paper_value"])
    if record["kind"] == "exact" and isinstance(record["paper_value"], (int, float)):
        scale = 1e6 if abs(record["paper_value"]) >= 1e5 else 1.0
        tolerance = record["tolerance"] / scale
        tolerance = f" ± {tolerance:g}{' M' if scale > 1 else ''}" if tolerance else ""
        return f"{value}{tolerance} {record['metric']}"
    return value


def _totals(records: Sequence[dict[str, Any]]) -> str:
    counts = Counter(r["verdict"] for r in records)
    return ", ".join(f"{v}: {counts[v]}" for v in VERDICTS if counts[v])


def render_markdown(records: Sequence[dict[str, Any]], *, source: str) -> str:
    """The ledger as Markdown: totals per verdict, then one table grouped by paper."""
    lines = [
        "# Claims ledger",
        "",
        f"Every checkable claim of the three papers, judged from the experiment records in "
        f"`{source}` (regenerate with `hopfield claims {source}`). Empirical verdicts come from "
        "paired independent runs: a claim holds (or does not) when the two-sided p-value of "
        "the test it is decided by is below 0.05 (the paired t-test of the mean difference "
        "against the claim's margin, two one-sided tests for 'equal' claims, the exact "
        "sign-flip test when the differences have no spread); fewer than 3 runs is "
        "`inconclusive`, and a strict claim whose pairs all tie does not hold. The p column "
        "is that decision's p-value (W: the Wilcoxon signed-rank p-value from 6 pairs). "
        "Exact claims hold within their tolerance. An untested claim is `premise absent at this "
        "scale` (the phenomenon it is about did not form; the note shows the measured premise), "
        "`toy stand-in` (the record runs a toy for the paper's setting) or `not run` (no record "
        "tests it: run it). `ours` is the mean over the runs against the "
        "deciding rival's; `n` counts the pairs; the interval is of the difference, positive "
        "favouring the claim (for 'equal' claims it must lie inside the margin, for 'at least' "
        "claims above minus the margin).",
        "",
        f"**Totals ({len(records)} claims):** {_totals(records)}.",
        "",
        "| paper | " + " | ".join(VERDICTS) + " |",
        "|---|" + "---|" * len(VERDICTS),
    ]
    for paper in PAPERS:
        counts = Counter(r["verdict"] for r in records if r["paper"] == paper)
        lines.append(f"| {paper} | " + " | ".join(str(counts[v]) for v in VERDICTS) + " |")
    lines += [
        "",
        "| id | where | claim | paper | ours | n | 95 % interval | p (decision; W: Wilcoxon) "
        "| verdict | scale |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for paper in PAPERS:
        lines.append(f"| **{TITLES[paper]}** | | | | | | | | | |")
        for r in (r for r in records if r["paper"] == paper):
            cells = [
                f"`{r['id']}`",
                _cell(r["location"]),
                _cell(r["claim"]),
                _paper(r),
                _ours(r),
                _cell(r["seeds"]),
                _interval(r),
                _p(r),
                f"**{r['verdict']}**",
                _cell(r["scale"]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    notes = [r for r in records if r["note"]]
    if notes:
        lines += ["", "## Notes", ""]
        lines += [f"* `{r['id']}`: {_cell(r['note'])}" for r in notes]
    return "\n".join(lines) + "\n"


def ledger_section(directory: Path | str) -> str:
    """The ledger of ``directory`` as a section of another document (``docs/claims.md``): the
    text of ``CLAIMS.md`` without its title, its headings one level down. The folder is named by
    its last component, as a path relative to the repository."""
    directory = Path(directory)
    text = render_markdown(evaluate(directory), source=directory.name)
    body = text.split("\n", 2)[2]  # drop "# Claims ledger" and the blank line after it
    return body.replace("\n## ", "\n### ").rstrip("\n")

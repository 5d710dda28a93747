"""The committed evidence in ``results/``: small files only, and the ledger, the report and the
docs' generated tables regenerate from it byte for byte (docs/claims.md, "Committed evidence")."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hopfield.cli import main
from hopfield.report import doc_blocks, render_doc_blocks, update_docs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

ALLOWED_SUFFIXES = {".json", ".jsonl", ".md", ".png"}  # .jsonl: a run's training log
MAX_FILE_BYTES = 1 << 20  # 1 MiB
MAX_TOTAL_BYTES = 20 << 20  # 20 MiB
CHECKPOINT_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt", ".safetensors"}

needs_results = pytest.mark.skipif(
    not RESULTS.is_dir(), reason="no results/ folder (the committed evidence) in this checkout"
)


def committed_files() -> list[Path]:
    """The files of ``results/`` that git tracks (or, outside a git checkout, all of them)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", "results"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return sorted(p for p in RESULTS.rglob("*") if p.is_file())
    return sorted(ROOT / name for name in listed.split("\0") if name)


def copy_results(tmp_path: Path) -> Path:
    """A copy of ``results/`` as ``tmp_path/results`` (the ledger names the folder as given)."""
    target = tmp_path / "results"
    shutil.copytree(RESULTS, target)
    return target


@needs_results
def test_evidence_is_small_json_markdown_and_figures() -> None:
    files = committed_files()
    assert files, "results/ holds no committed files"
    total = 0
    for path in files:
        parts = path.relative_to(ROOT).parts
        relative = "/".join(parts)
        if path.name == ".gitignore":
            continue
        assert path.suffix in ALLOWED_SUFFIXES, (
            f"{relative}: only JSON, JSON lines, Markdown and PNG"
        )
        assert path.suffix not in CHECKPOINT_SUFFIXES, f"{relative} is a checkpoint"
        assert not {"checkpoints", "work"} & set(parts), f"{relative} is in a work folder"
        size = path.stat().st_size
        assert size <= MAX_FILE_BYTES, f"{relative} has {size} bytes (over 1 MiB)"
        total += size
    assert total <= MAX_TOTAL_BYTES, f"results/ holds {total} bytes (over 20 MiB)"


@needs_results
def test_claims_regenerate_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = copy_results(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["claims", "results"]) == 0
    for name in ("claims.json", "CLAIMS.md"):
        expected = (RESULTS / name).read_bytes()
        assert (copy / name).read_bytes() == expected, (
            f"results/{name} is stale: regenerate with `hopfield claims results`"
        )


@needs_results
def test_report_regenerates_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = copy_results(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["report", "results"]) == 0
    assert (copy / "REPORT.md").read_bytes() == (RESULTS / "REPORT.md").read_bytes(), (
        "results/REPORT.md is stale: regenerate with `hopfield report results`"
    )


@needs_results
def test_docs_generated_blocks_match_the_records() -> None:
    blocks = 0
    for path in DOCS:
        text = path.read_text()
        blocks += len(doc_blocks(text))
        assert render_doc_blocks(text, RESULTS) == text, (
            f"{path.relative_to(ROOT)}: a generated block differs from results/; regenerate "
            "with `hopfield report results --docs README.md docs/*.md`"
        )
    assert blocks > 0, "no generated blocks in README.md or docs/*.md"


# ------------------------------------------------------------ the mechanism, on a toy record


def _toy_results(root: Path) -> Path:
    """``root/toy/results.json`` with one table."""
    import json

    record = {
        "experiment": "toy",
        "paper": None,
        "preset": "tiny",
        "seed": 0,
        "wall_time_s": 1.0,
        "versions": {"torch": "x", "hopfield": "y"},
        "results": {
            "tables": [
                {
                    "name": "Scores",
                    "columns": ["model", "score"],
                    "rows": [["a", 0.123456], ["b", None]],
                    "caption": "toy caption",
                }
            ],
            "metrics": {},
            "figures": [],
            "notes": [],
        },
    }
    (root / "toy").mkdir(parents=True)
    (root / "toy" / "results.json").write_text(json.dumps(record))
    return root


def test_render_doc_blocks_fills_blocks_and_keeps_the_rest(tmp_path: Path) -> None:
    results = _toy_results(tmp_path / "res")
    doc = "intro\n\n<!-- generated: toy/Scores -->\nold text\n<!-- /generated -->\n\nend\n"
    rendered = render_doc_blocks(doc, results)
    assert rendered == (
        "intro\n\n<!-- generated: toy/Scores -->\n\n*toy caption*\n\n| model | score |\n"
        "|---|---|\n| a | 0.1235 |\n| b | – |\n\n<!-- /generated -->\n\nend\n"
    )
    assert render_doc_blocks(rendered, results) == rendered  # idempotent
    assert doc_blocks(doc) == [("toy", "Scores")]
    assert render_doc_blocks("no blocks here\n", results) == "no blocks here\n"


def test_render_doc_blocks_names_a_missing_record_or_table(tmp_path: Path) -> None:
    results = _toy_results(tmp_path / "res")
    with pytest.raises(ValueError, match="no table 'Nope'"):
        render_doc_blocks("<!-- generated: toy/Nope -->\n<!-- /generated -->", results)
    with pytest.raises(ValueError, match="no record"):
        render_doc_blocks("<!-- generated: other/Scores -->\n<!-- /generated -->", results)


def test_report_docs_option_rewrites_only_stale_files(tmp_path: Path) -> None:
    results = _toy_results(tmp_path / "res")
    stale = tmp_path / "stale.md"
    stale.write_text("<!-- generated: toy/Scores -->\n<!-- /generated -->\n")
    plain = tmp_path / "plain.md"
    plain.write_text("nothing generated\n")
    assert main(["report", str(results), "--docs", str(stale), str(plain)]) == 0
    assert "| a | 0.1235 |" in stale.read_text()
    assert plain.read_text() == "nothing generated\n"
    assert update_docs([stale, plain], results) == []  # now current
    broken = tmp_path / "broken.md"
    broken.write_text("<!-- generated: toy/Nope -->\n<!-- /generated -->\n")
    before = stale.read_text()
    with pytest.raises(SystemExit, match="no table"):
        main(["report", str(results), "--docs", str(stale), str(broken)])
    assert stale.read_text() == before


def test_runs_write_to_runs_by_default() -> None:
    """Only an explicit ``--out results`` touches the committed evidence."""
    from hopfield.cli import build_parser

    for command in (["run", "retrieval-demo"], ["reproduce"]):
        assert build_parser().parse_args(command).out == Path("runs")

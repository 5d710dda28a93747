"""Every Python block of README.md and docs/*.md runs as written.

Each example runs in a fresh namespace, in a folder of its own (``tmp_path/work``) beside
``tmp_path/shared/data``, a link to the datasets (``$HOPFIELD_DATA`` or ``../shared/data`` of the
checkout), so that the docs' ``data_dir="../shared/data"`` (the layout of a clone beside the
project's ``shared`` folder) finds them. An HTML comment on the line before a block's fence
says how the test treats it, ``<!-- docs-test: continues -->`` (it runs after the block before
it, in its namespace: the text goes on with the same objects) or ``<!-- docs-test: slow -->``
(marked ``slow``; it still runs); a comment of another kind fails collection. Where the datasets
are absent, an example that needs one is skipped with the reason shown, never silently.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import ROOT, SHARED_DATA
from hopfield.data import DataNotFoundError

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(
    r"(?:^<!-- docs-test: (?P<marks>[^>]*?) -->\n)?^```python\n(?P<code>.*?)^```$",
    flags=re.DOTALL | re.MULTILINE,
)
MARKS = {"continues", "slow"}


@dataclass
class Example:
    """One or more blocks (a block and those that continue it) of one Markdown file."""

    name: str
    blocks: list[str] = field(default_factory=list)
    slow: bool = False


def examples(path: Path, root: Path = ROOT) -> list[Example]:
    """The examples of the Markdown file ``path``, named ``FILE[INDEX]`` (``FILE`` relative to
    ``root``) after their first block, counted from 0; ``ValueError`` for a ``docs-test``
    comment of an unknown kind."""
    found: list[Example] = []
    for index, match in enumerate(FENCE.finditer(path.read_text())):
        marks = {m.strip() for m in (match["marks"] or "").split(",") if m.strip()}
        if marks - MARKS:
            raise ValueError(f"{path.name}: docs-test comment {sorted(marks - MARKS)} unknown")
        if "continues" in marks and not found:
            raise ValueError(f"{path.name}[{index}] continues no block")
        if "continues" not in marks:
            found.append(Example(f"{path.relative_to(root)}[{index}]"))
        found[-1].blocks.append(match["code"])
        found[-1].slow |= "slow" in marks
    return found


ALL = [example for path in DOCS for example in examples(path)]


def test_every_python_block_is_collected() -> None:
    """No block escapes the pattern (a fence the regex misses would go untested)."""
    fences = sum(path.read_text().count("```python\n") for path in DOCS)
    assert sum(len(example.blocks) for example in ALL) == fences
    assert fences >= 28


def test_a_continued_block_runs_after_the_one_before(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```python\nx = 1\n```\n\ntext\n<!-- docs-test: continues -->\n```python\nx += 1\n```\n"
        "<!-- docs-test: slow -->\n```python\ny = 2\n```\n"
    )
    first, second = examples(doc, tmp_path)
    assert first == Example("doc.md[0]", ["x = 1\n", "x += 1\n"], slow=False)
    assert second == Example("doc.md[2]", ["y = 2\n"], slow=True)
    doc.write_text("<!-- docs-test: fast -->\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match=r"docs-test comment \['fast'\] unknown"):
        examples(doc, tmp_path)


@pytest.mark.parametrize(
    "example",
    [pytest.param(e, id=e.name, marks=[pytest.mark.slow] if e.slow else []) for e in ALL],
)
def test_example_runs(example: Example, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = Path(os.environ.get("HOPFIELD_DATA", SHARED_DATA))
    (tmp_path / "shared").mkdir()
    if data.is_dir():
        (tmp_path / "shared" / "data").symlink_to(data.resolve(), target_is_directory=True)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    namespace: dict[str, object] = {"__name__": "__main__"}
    try:
        for block in example.blocks:
            exec(compile(block, example.name, "exec"), namespace)
    except DataNotFoundError as missing:
        if data.is_dir():
            raise
        pytest.skip(f"{example.name} needs a dataset absent here ({data}): {missing}")

"""The docs' outcome statements agree with the ledger (issue 15): the checker itself on small
texts, and every document of the repository against the committed ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hopfield.claims.docs import check_text, ledger_verdicts, tags

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "results" / "claims.json"
VERDICTS = {"A-1": "holds", "A-2": "does not hold", "A-3": "inconclusive"}


def reasons(text: str) -> list[str]:
    return [p.reason for p in check_text(text, VERDICTS)]


def test_tags_are_read_with_either_arrow() -> None:
    text = "x [ledger: A-1 → holds] and [ledger: A-3 -> inconclusive]."
    assert tags(text) == [("A-1", "holds"), ("A-3", "inconclusive")]


def test_a_supported_statement_passes() -> None:
    assert reasons("The trend holds [ledger: A-1 → holds].") == []
    assert reasons("Neither confirmed nor refuted [ledger: A-3 → inconclusive].") == []
    assert reasons("The claim does not hold\nhere [ledger: A-2 → does not hold].") == []


def test_a_tag_must_match_the_ledger() -> None:
    assert reasons("It holds [ledger: A-2 → holds].") == [
        "A-2 is 'does not hold', the text says 'holds'"
    ]
    assert reasons("[ledger: B-9 → holds]") == ["no claim 'B-9' in the ledger"]
    assert reasons("[ledger: A-1 → works]") == ["'works' is not a verdict"]


def test_verdict_language_needs_a_tag_of_its_verdict() -> None:
    assert len(reasons("At this scale the paper's trend holds (+0.14).")) == 1
    assert len(reasons("Softmax_1 is inconclusive.")) == 1
    assert len(reasons("The claim is not reproduced here.")) == 1
    # the direction must be the tag's: "does not hold" is not supported by a "holds" tag
    assert len(reasons("It does not hold [ledger: A-1 → holds].")) == 1
    # "does not hold" is not also read as "holds"
    assert len(reasons("It does not hold [ledger: A-2 → does not hold].")) == 0


def test_possession_code_and_generated_blocks_are_not_verdicts() -> None:
    assert reasons("The shared folder holds the 10k test images.") == []
    fenced = "```\nassert claim holds.\n```\n"
    generated = "<!-- generated: x/y -->\n| a | holds |\n<!-- /generated -->\n"
    assert reasons(fenced + generated) == []


def test_each_table_row_is_its_own_paragraph() -> None:
    table = (
        "| claim | verdict |\n|---|---|\n| one | holds [ledger: A-1 → holds] |\n| two | holds |\n"
    )
    problems = check_text(table, VERDICTS)
    assert [p.line for p in problems] == [4]


def test_ledger_verdicts_reads_claims_json(tmp_path: Path) -> None:
    path = tmp_path / "claims.json"
    path.write_text(json.dumps([{"id": "A-1", "verdict": "holds"}]))
    assert ledger_verdicts(path) == {"A-1": "holds"}
    path.write_text("{}")
    with pytest.raises(ValueError, match="claims_json"):
        ledger_verdicts(path)


DOCUMENTS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


@pytest.mark.skipif(not LEDGER.is_file(), reason="no committed ledger (results/claims.json)")
@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_documents_state_only_the_committed_verdicts(document: Path) -> None:
    # docs/claims.md defines the vocabulary: only its tags are checked there
    text = document.read_text()
    problems = check_text(text, ledger_verdicts(LEDGER))
    if document.name == "claims.md":
        problems = [p for p in problems if "needs a tag" not in p.reason]
    assert not problems, "\n".join(map(str, problems))

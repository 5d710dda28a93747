"""Outcome sentences in the docs, checked against the ledger's verdicts.

A document states the outcome of a paper claim with a *ledger tag*, visible to the reader::

    Softmax_1 left the residual outliers as they were [ledger: OEH-T1-infnorm-opt → inconclusive].

:func:`check_text` finds two kinds of problems in a Markdown text:

* a tag whose claim is not declared, whose verdict is not in the vocabulary, or whose verdict
  differs from the ledger's (``claims.json`` of the committed results);
* a paragraph (or table row) that uses verdict language — *holds*, *does not hold*,
  *confirmed*, *refuted*, *reproduced*, *inconclusive* — without a tag of the verdict that
  language states: "holds"/"confirmed"/"reproduced" need a tag saying ``holds``; "does not
  hold"/"refuted"/"not reproduced" one saying ``does not hold``; "inconclusive"/"not
  confirmed"/"neither confirmed nor refuted" one saying ``inconclusive`` or ``not tested at
  this scale``.

Fenced code blocks and generated blocks (``<!-- generated: … -->`` … ``<!-- /generated -->``,
checked against their records elsewhere) are skipped. Measurements can always be stated without
verdict words (a mean, an interval, a p-value): what the checker guards is the verdict.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from hopfield.claims.verdict import UNTESTED, VERDICTS

__all__ = ["TAG", "Problem", "check_text", "ledger_verdicts", "tags"]

#: ``[ledger: ID → verdict]`` (``->`` is accepted for the arrow).
TAG = re.compile(r"\[ledger:\s*([A-Za-z0-9.\-]+)\s*(?:→|->)\s*([a-z ]+?)\s*\]")

_FENCE = re.compile(r"^\s*(```|~~~)")
_GENERATED_OPEN = re.compile(r"^\s*<!--\s*generated:")
_GENERATED_CLOSE = re.compile(r"^\s*<!--\s*/generated\s*-->")

_NEGATED = r"(?<!not )(?<!neither )(?<!nor )"
#: Verdict language -> the verdicts a tag in the same paragraph may carry to support it. Checked
#: in this order; a match is blanked out before the next pattern runs, so "does not hold" is not
#: also read as "holds".
_LANGUAGE: tuple[tuple[re.Pattern[str], frozenset[str]], ...] = (
    (
        re.compile(
            r"\bneither confirmed nor refuted\b|\bnot confirmed\b(,? (?:and )?not refuted)?"
        ),
        frozenset({"inconclusive", *UNTESTED}),
    ),
    (re.compile(r"\binconclusive\b"), frozenset({"inconclusive", *UNTESTED})),
    (
        re.compile(r"\b(?:does|do|did) not hold\b|\bnot reproduced\b|\brefuted\b"),
        frozenset({"does not hold"}),
    ),
    # "holds" as a verdict ends its clause ("the trend holds.", "holds at this scale"); "holds
    # the images" is possession, not a verdict.
    (
        re.compile(_NEGATED + r"\bholds?\b(?=\s*(?:$|[.,;:()*|]|at\b|here\b|in every\b|over\b))"),
        frozenset({"holds"}),
    ),
    (re.compile(_NEGATED + r"\b(?:confirmed|reproduced)\b"), frozenset({"holds"})),
)


@dataclass(frozen=True)
class Problem:
    """One unsupported or wrong outcome statement: where it is and why."""

    line: int
    text: str
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}: {self.text.strip()[:160]}"


def tags(text: str) -> list[tuple[str, str]]:
    """Every ``(claim id, verdict)`` tag in ``text``, in order."""
    return [(m[1], m[2]) for m in TAG.finditer(text)]


def ledger_verdicts(claims_json: Path | str) -> dict[str, str]:
    """``{claim id: verdict}`` from a ``claims.json`` written by ``hopfield claims``."""
    records = json.loads(Path(claims_json).read_text())
    if not isinstance(records, list):
        raise ValueError(f"claims_json: {claims_json} is not a list of claim records")
    return {str(r["id"]): str(r["verdict"]) for r in records}


def _paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """``(first line number, text)`` of every paragraph outside code and generated blocks; each
    table row is a paragraph of its own."""
    block: list[str] = []
    start = 0
    closing: re.Pattern[str] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if closing is not None:
            if closing.match(line):
                closing = None
            continue
        fence = _FENCE.match(line)
        ends_block = fence or _GENERATED_OPEN.match(line) or not line.strip()
        if ends_block or line.lstrip().startswith("|"):
            if block:
                yield start, " ".join(block)
                block = []
            if fence:
                closing = re.compile(rf"^\s*{re.escape(fence[1])}")
            elif ends_block and line.strip():
                closing = _GENERATED_CLOSE
            elif not ends_block:
                yield number, line
            continue
        if not block:
            start = number
        block.append(line.strip())
    if block:
        yield start, " ".join(block)


def _stated(paragraph: str) -> list[tuple[str, frozenset[str]]]:
    """The verdict phrases of ``paragraph`` (tags removed) and the verdicts each needs."""
    rest = TAG.sub(" ", paragraph).lower().replace("**", "")
    found = []
    for pattern, needs in _LANGUAGE:
        for match in pattern.finditer(rest):
            found.append((match[0], needs))
        rest = pattern.sub(lambda m: " " * len(m[0]), rest)
    return found


def check_text(text: str, verdicts: Mapping[str, str]) -> list[Problem]:
    """The outcome statements of the Markdown ``text`` that ``verdicts`` (``{claim id:
    verdict}``, the ledger) does not support; empty when every statement is supported."""
    problems = []
    for line, paragraph in _paragraphs(text):
        found = tags(paragraph)
        for claim, verdict in found:
            if claim not in verdicts:
                problems.append(Problem(line, paragraph, f"no claim {claim!r} in the ledger"))
            elif verdict not in VERDICTS:
                problems.append(Problem(line, paragraph, f"{verdict!r} is not a verdict"))
            elif verdicts[claim] != verdict:
                problems.append(
                    Problem(
                        line,
                        paragraph,
                        f"{claim} is {verdicts[claim]!r}, the text says {verdict!r}",
                    )
                )
        tagged = {verdict for _, verdict in found}
        for phrase, needs in _stated(paragraph):
            if not tagged & needs:
                problems.append(
                    Problem(
                        line,
                        paragraph,
                        f"{phrase!r} needs a tag [ledger: ID → {' | '.join(sorted(needs))}]",
                    )
                )
    return problems

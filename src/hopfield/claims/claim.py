"""A paper's claim as data, the evidence an experiment gives for it, and its verdict."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from hopfield.claims.verdict import NOT_RUN, UNTESTED
from hopfield.stats import DIRECTIONS, PairedComparison, compare_paired, exact_verdict

if TYPE_CHECKING:
    from hopfield.claims.records import ExperimentRecord

__all__ = [
    "KINDS",
    "PAPERS",
    "Claim",
    "Comparison",
    "Evidence",
    "Extractor",
    "Judgement",
    "Measured",
    "NotTested",
    "judge",
]

PAPERS = ("outeffhop", "nonparametric", "hyperset")
KINDS = ("exact", "empirical")


class NotTested(Exception):
    """An experiment's record is present but does not test the claim at its configuration; the
    message says why, and ``kind`` which way (:data:`~hopfield.claims.verdict.UNTESTED`): the
    premise is absent (no outliers formed, a failed validity gate; the message shows the
    measured premise), a toy stand-in, or not run (a smoke run, a parameter count of a preset
    smaller than the paper's, a model the preset leaves out, a record of another layout)."""

    def __init__(self, message: str, kind: str = NOT_RUN) -> None:
        if kind not in UNTESTED:
            raise ValueError(f"kind must be one of {UNTESTED}, got {kind!r}")
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Comparison:
    """Paired samples of ours and one rival, one pair per independent run.

    Attributes:
        rival: what ours is compared with (``"vanilla"``, ``"dense"``, ``"L iterations"``...).
        ours, rival_values: one value per run, paired by position.
        units: what a pair is (``"seed 0"``, ``"set 2"``, ``"ETTh1/24 seed 1"``).
        model: which of ours, when a claim compares several models (``"topk-20"``).
    """

    rival: str
    ours: tuple[float, ...]
    rival_values: tuple[float, ...]
    units: tuple[str, ...]
    model: str = ""

    def __post_init__(self) -> None:
        if not len(self.ours) == len(self.rival_values) == len(self.units):
            raise ValueError(
                f"comparison with {self.rival!r}: {len(self.ours)} ours, "
                f"{len(self.rival_values)} rival values and {len(self.units)} units"
            )


@dataclass(frozen=True)
class Measured:
    """The value an exact claim is checked on (a violation count, a parameter count)."""

    value: float
    detail: str = ""


Evidence = Measured | list[Comparison]
Extractor = Callable[["ExperimentRecord"], Evidence]


@dataclass(frozen=True)
class Claim:
    """One checkable statement of a paper.

    Attributes:
        id: ``<paper>-<location>-<what>[-<model>]``, e.g. ``OEH-T1-kurtosis-opt``.
        paper: one of :data:`PAPERS`.
        location: where the paper makes it (``"Table 1"``, ``"Lemma 2.1"``, ``"Fig. 5"``).
        statement: the claim in one sentence.
        paper_value: the paper's number or words (``None`` where it gives a figure only).
        metric: what is measured (``"avg kurtosis"``, ``"violations"``, ``"parameters"``).
        direction: ``higher``/``lower``: ours against the rival; ``equal``: they agree within
            ``min_effect``; ``at least``: ours matches or exceeds the rival (falls short by less
            than ``min_effect``). Exact claims use ``equal`` (the measured value against
            ``paper_value``).
        kind: ``exact`` (identities, bounds, counts: to ``tolerance``) or ``empirical`` (paired
            runs against a rival).
        experiment: the experiment that tests it, ``None`` if none does yet.
        extract: reads the evidence from that experiment's record (``None`` without experiment).
        min_effect: the smallest effect that counts (empirical claims; for ``equal`` the margin).
        relative: compare per-pair relative differences ``100·(ours − rival)/|rival|`` (%), so
            that ``min_effect`` is in percent.
        tolerance: how far an exact claim's value may be from ``paper_value``.
        also: other experiments holding the same evidence, tried in order after ``experiment``
            (e.g. ``outliers-opt`` after ``outliers``).
        note: what a reader needs to know (which unit test checks an unimplemented claim, why a
            metric was chosen).
        planned: for a parameter count, the job of the experiments' plan record
            (``hopfield plan --out``) whose count in the paper's convention tests the claim
            when no run of the paper preset does (``""``: none).
        planned_base: with ``planned``, a second job whose count is subtracted: the claim is
            the increment from that job's model to ``planned``'s (``""``: the count itself).
    """

    id: str
    paper: str
    location: str
    statement: str
    paper_value: Any
    metric: str
    direction: str
    kind: str
    experiment: str | None
    extract: Extractor | None = None
    min_effect: float = 0.0
    relative: bool = False
    tolerance: float = 0.0
    also: tuple[str, ...] = ()
    note: str = ""
    planned: str = ""
    planned_base: str = ""

    def __post_init__(self) -> None:
        if self.paper not in PAPERS:
            raise ValueError(f"claim {self.id}: paper must be one of {PAPERS}, got {self.paper!r}")
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.id}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"claim {self.id}: direction must be one of {DIRECTIONS}")
        if (self.experiment is None) != (self.extract is None):
            raise ValueError(f"claim {self.id}: an experiment needs an extractor and vice versa")
        numeric = isinstance(self.paper_value, (int, float))
        if self.kind == "exact" and self.experiment is not None and not numeric:
            raise ValueError(f"claim {self.id}: a tested exact claim needs a numeric paper_value")
        if self.planned_base and not self.planned:
            raise ValueError(f"claim {self.id}: planned_base needs planned")
        if self.planned and (self.kind != "exact" or self.experiment is None):
            raise ValueError(f"claim {self.id}: a planned count is an exact claim of an experiment")
        margined = self.direction in ("equal", "at least") and self.experiment is not None
        if margined and self.kind == "empirical" and not self.min_effect > 0:
            raise ValueError(
                f"claim {self.id}: an {self.direction!r} claim needs a margin min_effect > 0"
            )

    @property
    def experiments(self) -> tuple[str, ...]:
        """The experiments whose records may test the claim, in the order they are tried."""
        return () if self.experiment is None else (self.experiment, *self.also)


@dataclass(frozen=True)
class Judgement:
    """A claim's verdict on one piece of evidence (see :func:`judge`).

    Attributes:
        verdict: one of :data:`hopfield.claims.VERDICTS`.
        ours: the measured value (exact) or the mean of ours over the runs of the deciding
            comparison (empirical).
        comparisons: every comparison with its paired statistics (empirical claims).
        deciding: index into ``comparisons`` of the comparison that decides the verdict.
        detail: what an exact value was measured on.
    """

    verdict: str
    ours: float | None = None
    comparisons: tuple[tuple[Comparison, PairedComparison], ...] = ()
    deciding: int | None = None
    detail: str = ""


def _relative(comparison: Comparison) -> Comparison:
    """Pairs as ``(100·(ours − rival)/|rival|, 0)``: a difference in percent of the rival."""
    if any(r == 0 for r in comparison.rival_values):
        raise NotTested(f"a relative difference needs non-zero {comparison.rival} values")
    changes = tuple(
        100 * (o - r) / abs(r)
        for o, r in zip(comparison.ours, comparison.rival_values, strict=True)
    )
    return replace(comparison, ours=changes, rival_values=(0.0,) * len(changes))


def judge(claim: Claim, evidence: Evidence) -> Judgement:
    """The verdict on ``claim`` from ``evidence``.

    Exact claims: ``holds`` iff ``|value − paper_value| <= tolerance``. Empirical claims: every
    comparison is judged by :func:`compare_paired`; the claim ``holds`` if it holds against every
    rival, ``does not hold`` if it fails against one, and is ``inconclusive`` otherwise. The
    deciding comparison is the clearest failure (the lowest upper end of its interval), else
    the one with the lowest interval.
    """
    if claim.kind == "exact":
        if not isinstance(evidence, Measured):
            raise TypeError(f"claim {claim.id}: exact claims take Measured evidence")
        verdict = exact_verdict(evidence.value, float(claim.paper_value), tolerance=claim.tolerance)
        return Judgement(verdict, ours=evidence.value, detail=evidence.detail)
    if isinstance(evidence, Measured) or not evidence:
        raise TypeError(f"claim {claim.id}: empirical claims take a non-empty list of Comparison")
    judged = []
    for comparison in evidence:
        used = _relative(comparison) if claim.relative else comparison
        result = compare_paired(
            used.ours, used.rival_values, direction=claim.direction, min_effect=claim.min_effect
        )
        judged.append((comparison, result))
    verdicts = [r.verdict for _, r in judged]
    failing = [i for i, v in enumerate(verdicts) if v == "does not hold"]
    if failing:  # the clearest failure: the lowest upper end of the interval
        verdict = "does not hold"
        deciding = min(failing, key=lambda i: judged[i][1].interval[1])
    else:
        verdict = "holds" if all(v == "holds" for v in verdicts) else "inconclusive"
        deciding = min(range(len(judged)), key=lambda i: _weakness(judged[i][1], verdicts[i]))
    ours = judged[deciding][0].ours
    return Judgement(verdict, sum(ours) / len(ours), tuple(judged), deciding)


def _weakness(result: PairedComparison, verdict: str) -> tuple[int, float]:
    """Sort key: inconclusive comparisons first, then the lowest interval (NaN lowest)."""
    low = result.interval[0]
    return (0 if verdict != "holds" else 1, -math.inf if math.isnan(low) else low)

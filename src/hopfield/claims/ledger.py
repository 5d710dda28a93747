"""The claims ledger: every checkable claim of the three papers, judged from a results folder.

:data:`CLAIMS` gathers the claims of :mod:`hopfield.claims.outeffhop`,
:mod:`hopfield.claims.nonparametric` and :mod:`hopfield.claims.hyperset`.
:func:`evaluate` judges each from the experiment records of a folder: ``not implemented`` where
no experiment tests the claim, ``not run`` where the folder holds no record of its experiment,
``premise absent at this scale``, ``toy stand-in`` or ``not run`` where its records do not test
it (:class:`~hopfield.claims.claim.NotTested`; the reason is in ``note``), else the verdict of
:func:`hopfield.claims.claim.judge`. A parameter count (a claim with ``planned``) that no run of
the paper preset tests is judged from the folder's plan record (``plan/paper.json``, written by
``hopfield plan --all --preset paper --out DIR``): the models are the experiments' own, built on
the meta device.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hopfield.claims import hyperset, nonparametric, outeffhop
from hopfield.claims.claim import Claim, Evidence, Extractor, Judgement, NotTested, judge
from hopfield.claims.premises import check_premise
from hopfield.claims.records import ExperimentRecord, PlanRecord, load_plans, load_records
from hopfield.claims.verdict import NOT_RUN, UNTESTED
from hopfield.stats import PairedComparison

__all__ = ["CLAIMS", "UNREADABLE", "evaluate", "record_of"]

#: The note of a record whose files lack what the claim's extractor reads (a changed format).
UNREADABLE = "the record does not have the layout the extractor reads"

CLAIMS: tuple[Claim, ...] = (*outeffhop.CLAIMS, *nonparametric.CLAIMS, *hyperset.CLAIMS)


def _check_unique(claims: tuple[Claim, ...]) -> None:
    seen: set[str] = set()
    for claim in claims:
        if claim.id in seen:
            raise ValueError(f"claim id {claim.id} is declared twice")
        seen.add(claim.id)


_check_unique(CLAIMS)


def evaluate(directory: Path | str, claims: tuple[Claim, ...] = CLAIMS) -> list[dict[str, Any]]:
    """One record per claim (see :func:`record_of`) from the experiment records in
    ``directory`` (``directory/<experiment>/results.json``) and, for the parameter counts,
    its plan records (``directory/plan/<preset>.json``)."""
    records = load_records(directory)
    plans = load_plans(directory)
    return [_evaluate_one(claim, records, plans) for claim in claims]


Source = ExperimentRecord | PlanRecord


def _sources(
    claim: Claim, records: dict[str, list[ExperimentRecord]], plans: dict[str, list[PlanRecord]]
) -> list[Source]:
    """The records that may test ``claim``, in the order they are tried: runs of its
    experiments (every committed preset, the largest first), then (for a planned parameter
    count) their plans."""
    runs: list[Source] = [run for name in claim.experiments for run in records.get(name, [])]
    if not claim.planned:
        return runs
    return runs + [plan for name in claim.experiments for plan in plans.get(name, [])]


def _evidence(claim: Claim, extract: Extractor, source: Source) -> Evidence:
    """A run's evidence by the claim's extractor, for an empirical claim only once the run meets
    its experiment's training premise (:mod:`hopfield.claims.premises`); a plan's: the planned
    job's parameter count."""
    if isinstance(source, PlanRecord):
        return source.parameters(claim.planned, base=claim.planned_base)
    if claim.kind == "empirical":
        check_premise(source)
    return extract(source)


def _evaluate_one(
    claim: Claim, records: dict[str, list[ExperimentRecord]], plans: dict[str, list[PlanRecord]]
) -> dict[str, Any]:
    if claim.experiment is None or claim.extract is None:
        return record_of(claim, Judgement("not implemented"), None, claim.note)
    present = _sources(claim, records, plans)
    if not present:
        note = f"no {' or '.join(claim.experiments)} results in this folder"
        return record_of(claim, Judgement(NOT_RUN), None, note)
    reasons, kinds = [], set()
    for record in present:
        try:
            judgement = judge(claim, _evidence(claim, claim.extract, record))
        except NotTested as why:
            reasons.append(f"{record.name} ({record.preset}): {why}")
            kinds.add(why.kind)
            continue
        except (KeyError, IndexError, TypeError, ValueError) as error:
            reasons.append(f"{record.name} ({record.preset}): {UNREADABLE} ({error!r})")
            continue
        return record_of(claim, judgement, record, claim.note)
    kind = next((k for k in UNTESTED if k in kinds), NOT_RUN)  # the most informative
    return record_of(claim, Judgement(kind), present[0], "; ".join(reasons))


def _number(value: float | None) -> float | None:
    """JSON-safe: NaN and infinities become ``None``."""
    return None if value is None or not math.isfinite(value) else float(value)


def _test(result: PairedComparison) -> dict[str, Any]:
    wilcoxon: float | str | None = _number(result.p_wilcoxon)
    if result.p_wilcoxon is None:
        wilcoxon = "not computable (n < 6 or no non-zero difference)"
    return {
        "p_decision": _number(result.p_decision),
        "t": _number(result.t),
        "p_t": _number(result.p_t),
        "p_wilcoxon": wilcoxon,
    }


def record_of(
    claim: Claim, judgement: Judgement, record: Source | None, note: str
) -> dict[str, Any]:
    """The ledger's record of ``claim``: what the paper says, what we measured, at which scale,
    with which test, and the verdict.

    Keys: ``id``, ``paper``, ``location``, ``claim``, ``kind``, ``metric``, ``direction``,
    ``paper_value``, ``experiment``, ``scale`` (the preset of the record used, ``plan (paper preset,
    meta device)`` for a plan record, or ``None``),
    ``command`` (the run that gave the evidence, or that would), ``ours`` (measured value or
    mean of ours), ``model`` (which of ours), ``rival`` and ``rival_value`` (the deciding
    comparison), ``difference`` (mean difference, positive favours the claim; percent for
    relative claims), ``seeds`` (number of paired runs), ``units`` (what they are),
    ``interval`` (95 % t interval of the difference),
    ``test`` (``p_decision``, the two-sided p-value of the test the verdict was decided by:
    against the margin, TOST for equal claims, exact sign-flip without spread; and, for
    information, the paired t-test against 0 and the Wilcoxon p-value), ``comparisons`` (every rival), ``tolerance``
    (exact claims), ``verdict`` and ``note``.
    """
    out: dict[str, Any] = {
        "id": claim.id,
        "paper": claim.paper,
        "location": claim.location,
        "claim": claim.statement,
        "kind": claim.kind,
        "metric": claim.metric,
        "direction": claim.direction,
        "paper_value": claim.paper_value,
        "experiment": record.name if record is not None else claim.experiment,
        "scale": record.scale if record is not None else None,
        "command": _command(claim, record),
        "ours": _number(judgement.ours),
        "model": None,
        "rival": None,
        "rival_value": None,
        "difference": None,
        "seeds": None,
        "units": [],
        "interval": None,
        "test": None,
        "comparisons": [],
        "tolerance": claim.tolerance if claim.kind == "exact" else None,
        "verdict": judgement.verdict,
        "note": "; ".join(x for x in (judgement.detail, note) if x),
    }
    for i, (comparison, result) in enumerate(judgement.comparisons):
        entry = {
            "model": comparison.model,
            "rival": comparison.rival,
            "n": result.n,
            "ours": _number(sum(comparison.ours) / len(comparison.ours)),
            "rival_value": _number(sum(comparison.rival_values) / len(comparison.rival_values)),
            "difference": _number(result.mean_difference),
            "interval": [_number(result.interval[0]), _number(result.interval[1])],
            "test": _test(result),
            "units": list(comparison.units),
            "verdict": result.verdict,
        }
        out["comparisons"].append(entry)
        if i == judgement.deciding:
            out.update(
                model=entry["model"],
                rival=entry["rival"],
                rival_value=entry["rival_value"],
                difference=entry["difference"],
                seeds=entry["n"],
                units=entry["units"],
                interval=entry["interval"],
                test=entry["test"],
            )
    return out


def _command(claim: Claim, record: Source | None) -> str | None:
    if record is not None:
        return record.command
    if claim.experiment is None:
        return None
    return f"hopfield run {claim.experiment} --preset small"

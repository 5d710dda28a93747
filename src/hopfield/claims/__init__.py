"""The claims ledger: the papers' claims as data and verdicts on them from statistics (issue 15).

:func:`compare_paired` turns paired measurements of ours and a rival (per training seed or
memory set) into a :class:`PairedComparison`: the mean difference in the claim's favourable
direction, its 95 % t interval, a paired t-test, a Wilcoxon signed-rank test where there are
enough pairs, and a verdict in the ledger's vocabulary (:data:`VERDICTS`). :func:`exact_verdict`
judges exact claims (identities, bounds, parameter counts) to a tolerance.

A :class:`Claim` declares what a paper says, where, the metric and direction, and which
experiment tests it with which extractor (:mod:`hopfield.claims.extract`); the claims of the
three papers are in :mod:`hopfield.claims.outeffhop`, :mod:`hopfield.claims.nonparametric` and
:mod:`hopfield.claims.hyperset`, gathered by :mod:`hopfield.claims.ledger`, whose
:func:`~hopfield.claims.ledger.evaluate` judges them from a results folder;
:func:`~hopfield.claims.report.write_ledger` writes ``claims.json`` and ``CLAIMS.md``
(``hopfield claims DIR``).
"""

from hopfield.claims.claim import Claim, Comparison, Measured, NotTested, judge
from hopfield.claims.verdict import VERDICTS
from hopfield.stats import MIN_RUNS, PairedComparison, compare_paired, exact_verdict

__all__ = [
    "MIN_RUNS",
    "VERDICTS",
    "Claim",
    "Comparison",
    "Measured",
    "NotTested",
    "PairedComparison",
    "compare_paired",
    "exact_verdict",
    "judge",
]

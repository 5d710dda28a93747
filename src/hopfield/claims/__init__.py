"""Verdicts on the papers' claims, from statistics (issue 15).

:func:`compare_paired` turns paired measurements of ours and a rival (per training seed or
memory set) into a :class:`PairedComparison`: the mean difference in the claim's favourable
direction, its 95 % t interval, a paired t-test, a Wilcoxon signed-rank test where there are
enough pairs, and a verdict in the ledger's vocabulary (:data:`VERDICTS`). :func:`exact_verdict`
judges exact claims (identities, bounds, parameter counts) to a tolerance.
"""

from hopfield.claims.verdict import (
    MIN_RUNS,
    VERDICTS,
    PairedComparison,
    compare_paired,
    exact_verdict,
)

__all__ = ["MIN_RUNS", "VERDICTS", "PairedComparison", "compare_paired", "exact_verdict"]

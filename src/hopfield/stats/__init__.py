"""Statistics for verdicts from replicates: paired comparisons, exact tests, decision p-values.

A leaf package: it imports nothing else of ``hopfield``, so experiments, the claims ledger and
benchmarks all import it and never one another for it.
"""

from hopfield.stats.paired import (
    ALPHA,
    DIRECTIONS,
    MIN_RUNS,
    PairedComparison,
    compare_paired,
    exact_verdict,
    sign_flip_p,
)
from hopfield.stats.replicates import REPLICATE_MARK, replicate_key, split_replicate_key
from hopfield.stats.slopes import fit_slope, linear_slope

__all__ = [
    "ALPHA",
    "DIRECTIONS",
    "MIN_RUNS",
    "REPLICATE_MARK",
    "PairedComparison",
    "compare_paired",
    "exact_verdict",
    "fit_slope",
    "linear_slope",
    "replicate_key",
    "sign_flip_p",
    "split_replicate_key",
]

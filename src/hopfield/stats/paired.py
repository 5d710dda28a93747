"""Paired comparisons: a mean difference, its interval, the test of the decision and a verdict.

A leaf module: it imports nothing of ours (SciPy only), so experiments, the claims ledger and
benchmarks can all use it without importing one another.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ALPHA",
    "DIRECTIONS",
    "MIN_RUNS",
    "PairedComparison",
    "compare_paired",
    "exact_verdict",
    "sign_flip_p",
]

#: Fewest independent runs (pairs) on which an empirical claim can hold or fail.
MIN_RUNS = 3

#: Two-sided level of every decision: a claim holds or fails when the 95 % interval clears the
#: margin, i.e. when the decision's two-sided p-value is below 0.05.
ALPHA = 0.05

#: ``higher``/``lower``: ours is claimed larger/smaller than the rival; ``equal``: the two are
#: claimed to agree within ``min_effect`` (an equivalence margin); ``at least``: ours is claimed
#: to match or exceed the rival, i.e. to fall short of it by less than ``min_effect``
#: (non-inferiority).
DIRECTIONS = ("higher", "lower", "equal", "at least")

#: Largest ``n`` for which the exact sign-flip test enumerates all ``2**n`` sign patterns.
_EXACT_SIGN_FLIP_MAX_N = 20


@dataclass(frozen=True)
class PairedComparison:
    """Ours against a rival over ``n`` pairs (see :func:`compare_paired`).

    Attributes:
        n: number of pairs.
        mean_difference: mean of ``ours − rival``, signed so that positive favours the claim
            (unsigned for ``equal`` claims).
        interval: 95 % t interval of that mean (``(nan, nan)`` with fewer than 2 pairs; the
            single point ``(mean, mean)`` when every difference is the same).
        t, p_t: paired t statistic and two-sided p-value against a difference of 0 (the usual
            paired t-test, for information; ``nan`` where undefined).
        p_wilcoxon: two-sided Wilcoxon signed-rank p-value, ``None`` with fewer than 6 pairs or
            no non-zero difference (the test cannot reach 5 % then).
        p_decision: two-sided p-value of the test the verdict was decided by: the t-test of the
            mean difference against the margin ``min_effect`` (for ``equal`` claims twice the
            larger of the two one-sided p-values, TOST), or, when every difference is the same,
            the exact sign-flip test (at ``n = 3`` its smallest value is ``0.25``). ``nan``
            with fewer than 2 pairs.
        verdict: ``holds`` if ``p_decision < 0.05`` in the claim's favour, ``does not hold``
            if it is below 0.05 against it, else ``inconclusive``; always ``inconclusive`` with
            fewer than :data:`MIN_RUNS` pairs. A strict claim (``higher``/``lower``) whose pairs
            all tie exactly ``does not hold`` from :data:`MIN_RUNS` pairs on: no pair favours it.
    """

    n: int
    mean_difference: float
    interval: tuple[float, float]
    t: float
    p_t: float
    p_wilcoxon: float | None
    p_decision: float
    verdict: str

    def describe(self) -> str:
        """One line: mean difference, interval, tests and n."""
        low, high = self.interval
        text = f"Δ {self.mean_difference:+.4g} [{low:+.4g}, {high:+.4g}], n={self.n}"
        if not math.isnan(self.p_t):
            text += f", paired t p={self.p_t:.3g}"
        if self.p_wilcoxon is not None:
            text += f", Wilcoxon p={self.p_wilcoxon:.3g}"
        if not math.isnan(self.p_decision):
            text += f", decision p={self.p_decision:.3g}"
        return text


def _check_values(name: str, values: Sequence[float]) -> list[float]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}")
    out = [float(v) for v in values]
    if any(math.isnan(v) for v in out):
        raise ValueError(f"{name} contains NaN")
    return out


def compare_paired(
    ours: Sequence[float],
    rival: Sequence[float],
    *,
    direction: str = "higher",
    min_effect: float = 0.0,
) -> PairedComparison:
    """Compare paired measurements (pair ``i``: the same seed or timing repeat for both).

    Args:
        ours, rival: one value per independent run, in the same order.
        direction: ``"higher"`` if the claim is that ours is larger, ``"lower"`` if smaller,
            ``"equal"`` if the two agree within ``min_effect``, ``"at least"`` if ours matches
            or exceeds the rival (falls short by less than ``min_effect``).
        min_effect: the smallest favourable difference that counts (``>= 0``): the claim holds
            only if the mean difference is significantly above it, and does not hold if it is
            significantly below it. For ``"equal"`` the margin (``> 0``) the mean difference
            must lie significantly within for the claim to hold (significantly outside it: does
            not hold). For ``"at least"`` the margin (``> 0``) by which ours may fall short:
            the claim holds if the mean difference is significantly above ``-min_effect`` and
            does not hold if it is significantly below it.
    """
    a, b = _check_values("ours", ours), _check_values("rival", rival)
    if len(a) != len(b):
        raise ValueError(f"ours and rival must pair up, got {len(a)} and {len(b)} values")
    if not a:
        raise ValueError("ours: no values")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if not min_effect >= 0:
        raise ValueError(f"min_effect must be >= 0, got {min_effect}")
    if direction in ("equal", "at least") and not min_effect > 0:
        raise ValueError(f"an {direction!r} claim needs a margin min_effect > 0")
    sign = -1.0 if direction == "lower" else 1.0
    diffs = [sign * (x - y) for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    interval, t, p_t = _t_interval(diffs)
    if direction == "equal":
        p_decision, favours = _equivalence_p(diffs, min_effect)
    elif direction == "at least":
        p_decision, favours = _margin_p(diffs, -min_effect)
    else:
        p_decision, favours = _margin_p(diffs, min_effect)
    verdict = "inconclusive"
    if n >= MIN_RUNS:
        if direction in ("higher", "lower") and all(d == 0 for d in diffs):
            verdict = "does not hold"
        elif p_decision < ALPHA:
            verdict = "holds" if favours else "does not hold"
    return PairedComparison(
        n, sum(diffs) / n, interval, t, p_t, _wilcoxon(diffs), p_decision, verdict
    )


def _margin_p(diffs: list[float], margin: float) -> tuple[float, bool]:
    """Two-sided p of ``mean(diffs) = margin`` and whether the mean lies above the margin."""
    shifted = [d - margin for d in diffs]
    return _two_sided_p(shifted), sum(shifted) > 0


def _equivalence_p(diffs: list[float], margin: float) -> tuple[float, bool]:
    """TOST: ``(p, True)`` for equivalence within ``±margin``, else ``(p, False)`` for the
    mean lying outside the margin; ``p`` is two-sided (twice the one-sided p-value)."""
    mean = sum(diffs) / len(diffs)
    if abs(mean) >= margin:
        outside = margin if mean > 0 else -margin
        return _two_sided_p([d - outside for d in diffs]), False
    above = _one_sided_p([d + margin for d in diffs])  # H1: mean > −margin
    below = _one_sided_p([margin - d for d in diffs])  # H1: mean < +margin
    larger = max(above, below)
    return (larger if math.isnan(larger) else min(1.0, 2 * larger)), True


def _two_sided_p(values: list[float]) -> float:
    """Two-sided p-value of ``mean(values) = 0``: a t-test, or the exact sign-flip test when
    the values have no spread (the t-test is undefined there)."""
    mean = sum(values) / len(values)
    one_sided = _one_sided_p(values if mean >= 0 else [-v for v in values])
    return one_sided if math.isnan(one_sided) else min(1.0, 2 * one_sided)


def _one_sided_p(values: list[float]) -> float:
    """One-sided p-value of ``mean(values) > 0`` (``nan`` with fewer than 2 values)."""
    from scipy import stats

    n = len(values)
    if n < 2:
        return math.nan
    if max(values) == min(values):  # no spread: the t statistic is undefined
        return sign_flip_p(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return float(stats.t.sf(mean / (sd / math.sqrt(n)), n - 1))


def sign_flip_p(values: Sequence[float]) -> float:
    """Exact one-sided p-value of ``mean(values) > 0`` by the sign-flip permutation test: the
    share of the ``2**n`` sign patterns whose mean is at least the observed one.

    Valid for any paired differences that are symmetric about 0 under the null hypothesis; for
    ``n`` identical positive values it is ``2**-n``. Monte Carlo is not used: ``n`` up to 20.
    """
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        raise ValueError("values: no values")
    if n > _EXACT_SIGN_FLIP_MAX_N:
        raise ValueError(f"values: at most {_EXACT_SIGN_FLIP_MAX_N} for the exact test, got {n}")
    observed = sum(xs)
    tolerance = 1e-12 * max(1.0, sum(abs(x) for x in xs))
    count = sum(
        1
        for signs in itertools.product((1.0, -1.0), repeat=n)
        if sum(s * abs(x) for s, x in zip(signs, xs, strict=True)) >= observed - tolerance
    )
    return count / 2**n


def _t_interval(diffs: list[float]) -> tuple[tuple[float, float], float, float]:
    """95 % t interval of the mean, t statistic and two-sided p-value against 0."""
    from scipy import stats

    n = len(diffs)
    if n < 2:
        return (math.nan, math.nan), math.nan, math.nan
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    if sd == 0:
        t = math.nan if mean == 0 else math.copysign(math.inf, mean)
        return (mean, mean), t, (math.nan if mean == 0 else 0.0)
    se = sd / math.sqrt(n)
    half = float(stats.t.ppf(1 - ALPHA / 2, n - 1)) * se
    t = mean / se
    p = float(2 * stats.t.sf(abs(t), n - 1))
    return (mean - half, mean + half), t, p


def _wilcoxon(diffs: list[float]) -> float | None:
    from scipy import stats

    if len(diffs) < 6 or all(d == 0 for d in diffs):
        return None
    return float(stats.wilcoxon(diffs).pvalue)


def exact_verdict(ours: float, paper: float, *, tolerance: float) -> str:
    """``holds`` if ``|ours − paper| <= tolerance``, else ``does not hold`` (exact claims:
    identities, bounds, parameter counts)."""
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    if math.isnan(ours) or math.isnan(paper):
        raise ValueError("ours and paper must be numbers, got NaN")
    return "holds" if abs(ours - paper) <= tolerance else "does not hold"

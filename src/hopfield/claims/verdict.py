"""Paired comparisons and exact checks with the ledger's verdict vocabulary."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MIN_RUNS", "VERDICTS", "PairedComparison", "compare_paired", "exact_verdict"]

#: The verdict vocabulary of the claims ledger, exactly.
VERDICTS = ("holds", "does not hold", "inconclusive", "not tested at this scale", "not implemented")

#: Fewest independent runs (pairs) on which an empirical claim can hold or fail.
MIN_RUNS = 3

#: ``higher``/``lower``: ours is claimed larger/smaller than the rival; ``equal``: the two are
#: claimed to agree within ``min_effect`` (an equivalence margin).
DIRECTIONS = ("higher", "lower", "equal")


@dataclass(frozen=True)
class PairedComparison:
    """Ours against a rival over ``n`` pairs (see :func:`compare_paired`).

    Attributes:
        n: number of pairs.
        mean_difference: mean of ``ours − rival``, signed so that positive favours the claim
            (unsigned for ``equal`` claims).
        interval: 95 % t interval of that mean (``(nan, nan)`` with fewer than 2 pairs).
        t, p_t: paired t statistic and two-sided p-value (``nan`` where undefined).
        p_wilcoxon: two-sided Wilcoxon signed-rank p-value, ``None`` with fewer than 6 pairs or
            no non-zero difference (the test cannot reach 5 % then).
        verdict: ``holds`` (the interval lies above ``min_effect``), ``does not hold`` (it lies
            below it), else ``inconclusive``; for ``equal`` claims ``holds`` if the interval lies
            inside ``[−min_effect, min_effect]`` and ``does not hold`` if it lies outside it;
            always ``inconclusive`` with fewer than :data:`MIN_RUNS` pairs or when every pair
            ties.
    """

    n: int
    mean_difference: float
    interval: tuple[float, float]
    t: float
    p_t: float
    p_wilcoxon: float | None
    verdict: str

    def describe(self) -> str:
        """One line: mean difference, interval, tests and n."""
        low, high = self.interval
        text = f"Δ {self.mean_difference:+.4g} [{low:+.4g}, {high:+.4g}], n={self.n}"
        if not math.isnan(self.p_t):
            text += f", paired t p={self.p_t:.3g}"
        if self.p_wilcoxon is not None:
            text += f", Wilcoxon p={self.p_wilcoxon:.3g}"
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
    """Compare paired measurements (pair ``i``: the same seed or memory set for both).

    Args:
        ours, rival: one value per independent run, in the same order.
        direction: ``"higher"`` if the claim is that ours is larger, ``"lower"`` if smaller,
            ``"equal"`` if the two agree within ``min_effect``.
        min_effect: the smallest favourable difference that counts (``>= 0``): the claim holds
            only if the whole 95 % interval lies above it, and does not hold if the whole
            interval lies below it. For ``"equal"`` the margin (``> 0``) the whole interval
            must lie within for the claim to hold (outside it: does not hold).
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
    if direction == "equal" and not min_effect > 0:
        raise ValueError("an equal claim needs a margin min_effect > 0")
    sign = -1.0 if direction == "lower" else 1.0
    diffs = [sign * (x - y) for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    interval, t, p_t = _t_interval(diffs)
    p_wilcoxon = _wilcoxon(diffs)
    verdict = "inconclusive"
    if n >= MIN_RUNS and any(d != 0 for d in diffs):
        verdict = _decide(interval, direction, min_effect)
    return PairedComparison(n, mean, interval, t, p_t, p_wilcoxon, verdict)


def _decide(interval: tuple[float, float], direction: str, min_effect: float) -> str:
    """The verdict of a 95 % interval of the (signed) mean difference."""
    low, high = interval
    if direction == "equal":
        if -min_effect <= low and high <= min_effect:
            return "holds"
        if low > min_effect or high < -min_effect:
            return "does not hold"
        return "inconclusive"
    if low > min_effect:
        return "holds"
    if high < min_effect:
        return "does not hold"
    return "inconclusive"


def _t_interval(diffs: list[float]) -> tuple[tuple[float, float], float, float]:
    """95 % t interval of the mean, t statistic and two-sided p-value."""
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
    half = float(stats.t.ppf(0.975, n - 1)) * se
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

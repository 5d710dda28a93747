"""Growth exponents: the least-squares slope of a quantity against a size on log-log axes."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["fit_slope"]


def fit_slope(sizes: Sequence[float], values: Sequence[float]) -> float | None:
    """Least-squares slope of ``log value`` against ``log size`` (``None`` below two points)."""
    points = [(math.log(s), math.log(v)) for s, v in zip(sizes, values, strict=True) if v > 0]
    if len(points) < 2:
        return None
    mx = sum(p[0] for p in points) / len(points)
    my = sum(p[1] for p in points) / len(points)
    sxx = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / sxx

"""Least-squares slopes: growth exponents on log-log axes, and trends along a sequence."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["fit_slope", "linear_slope"]


def fit_slope(sizes: Sequence[float], values: Sequence[float]) -> float | None:
    """Least-squares slope of ``log value`` against ``log size`` (``None`` below two points)."""
    points = [(math.log(s), math.log(v)) for s, v in zip(sizes, values, strict=True) if v > 0]
    if len(points) < 2:
        return None
    mx = sum(p[0] for p in points) / len(points)
    my = sum(p[1] for p in points) / len(points)
    sxx = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / sxx


def linear_slope(values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` against ``0, 1, 2, ...`` (0.0 below two values)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x = (n - 1) / 2
    mean_y = sum(values) / n
    num = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    return num / sum((i - mean_x) ** 2 for i in range(n))

"""Timing helper shared by the benchmark scripts (run them from the repository root)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in seconds, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_ratio(
    fn: Callable[[], object], baseline: Callable[[], object], repeats: int, warmup: int = 1
) -> tuple[float, float, float]:
    """``(median of fn / baseline, median fn s, median baseline s)``, the two timed in turn.

    Timing the two alternately and taking the median of the per-pair ratios keeps the ratio
    steady when other work on the machine speeds up or slows down both over the run.
    """
    ratio, _, ours, base = interleaved_ratios(fn, baseline, repeats, warmup)
    return ratio, ours, base


#: Least seconds of timed pairs in :func:`interleaved_ratios`: calls of a few milliseconds get more
#: pairs than ``repeats`` (at most :data:`MOST_PAIRS`), whose median 7 pairs leave noisy (random
#: features at N = 128, 1.7 ms a call: medians 0.80–1.03 in three runs of 7 pairs, 29 Nov).
LEAST_SECONDS = 0.5
MOST_PAIRS = 101


def pairs_for(repeats: int, pair_seconds: float) -> int:
    """How many timed pairs :func:`interleaved_ratios` takes: ``repeats``, or more for pairs
    shorter than ``LEAST_SECONDS / repeats``, up to :data:`MOST_PAIRS`."""
    if pair_seconds <= 0:
        return repeats
    return max(repeats, min(MOST_PAIRS, math.ceil(LEAST_SECONDS / pair_seconds)))


def interleaved_ratios(
    fn: Callable[[], object], baseline: Callable[[], object], repeats: int, warmup: int = 1
) -> tuple[float, tuple[float, float], float, float]:
    """As :func:`interleaved_ratio`, plus the quartiles of the per-pair ratios:
    ``(median ratio, (q25, q75), median fn s, median baseline s)``. With a warmup, the last
    warm pair's time sets how many pairs are timed (:func:`pairs_for`)."""
    pair_seconds = 0.0
    for _ in range(warmup):
        start = time.perf_counter()
        fn()
        baseline()
        pair_seconds = time.perf_counter() - start
    ours: list[float] = []
    base: list[float] = []
    for _ in range(pairs_for(repeats, pair_seconds)):
        for call, times in ((fn, ours), (baseline, base)):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(ours, base, strict=True)]
    if len(ratios) > 1:
        q25, _, q75 = statistics.quantiles(ratios, n=4, method="inclusive")
    else:
        q25 = q75 = ratios[0]
    return statistics.median(ratios), (q25, q75), statistics.median(ours), statistics.median(base)


def ratio_row(
    row: str,
    fn: Callable[[], object],
    baseline: Callable[[], object],
    repeats: int,
    *,
    target: float,
    peer: str,
    **fields: object,
) -> dict[str, Any]:
    """One row of a peer table: ``fn`` and ``baseline`` timed in turn
    (:func:`interleaved_ratios`) as ``{"row", "ours_s", "peer_s", "ratio", "spread", "target",
    "peer"}`` plus ``fields`` (what the row measured, e.g. ``n=1024``)."""
    ratio, spread, ours_s, peer_s = interleaved_ratios(fn, baseline, repeats)
    return {
        "row": row,
        **fields,
        "ours_s": ours_s,
        "peer_s": peer_s,
        "ratio": ratio,
        "spread": spread,
        "target": target,
        "peer": peer,
    }


ROW_HEADER = f"{'row':40s} {'ours ms':>9s} {'peer ms':>9s} {'ratio':>6s} {'q25..q75':>12s} target"


def format_row(row: dict[str, Any]) -> str:
    """A row of :func:`ratio_row` as one line under :data:`ROW_HEADER`."""
    low, high = row["spread"]
    met = "met" if row["ratio"] <= row["target"] else "MISSED"
    return (
        f"{row['row']:40s} {1e3 * row['ours_s']:9.1f} {1e3 * row['peer_s']:9.1f} "
        f"{row['ratio']:6.2f} {low:5.2f}..{high:<5.2f} <= {row['target']:g} {met}  {row['peer']}"
    )


def timed_pass(fn: Callable[[], torch.Tensor], backward: bool) -> Callable[[], object]:
    """``fn`` as one timed call: the forward and backward of its output's sum (``backward``), or
    a forward without autograd."""
    if backward:
        return lambda: fn().sum().backward()

    def forward() -> object:
        with torch.no_grad():
            return fn()

    return forward

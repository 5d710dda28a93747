"""Efficient-structure benchmark: scaling of time and memory with the memory size, against dense.

One Hopfield association ``(B=4, H=1, L=S, d)`` per model, no grad, fp32, CPU. Every speed and
memory number is a ratio against dense softmax association measured in the same run (same
process, same threads), so the results transfer between machines; slopes are least-squares fits
of log time against log L; each time is the median process CPU time of the repeats (which, unlike
wall time, leaves out waiting for a core on a shared machine).
Run:

    python benchmarks/bench_efficient.py [--quick] [--threads N] [--json out.json]

Targets (issue #3, reported, not asserted): fitted slope <= 1.1 for Linear, random features and
the fixed-w window; >= 10x faster than dense at the largest size; dense and Top-K slope ~ 2.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import torch

from hopfield.experiments.efficiency import (
    Config,
    fit_slope,
    forward_function,
    peak_bytes,
    timings,
)

MODELS = ("dense", "topk", "random-0.9", "window-16", "window-sqrt", "linear", "rf", "rf-relu")
LINEAR_TARGETS = ("linear", "rf", "rf-relu", "window-16")


def run(
    sizes: list[int], dim: int, repeats: int, threads: int, max_seconds: float
) -> dict[str, float]:
    """Times, peak memory, slopes and ratios against dense for every model.

    A model stops growing when its predicted time per pass (quadratic growth for dense, Top-K and
    random mask, linear otherwise) exceeds ``max_seconds``; its later points are NaN.
    """
    torch.set_num_threads(threads)
    config = Config(dims=[dim], batch=4, seed=0)
    results: dict[str, float] = {"threads": threads, "dim": dim}
    nan = float("nan")
    for name in MODELS:
        measured: list[tuple[int, float]] = []
        for length in sizes:
            power = 2 if name in ("dense", "topk") or name.startswith("random") else 1
            if measured and measured[-1][1] * (length / measured[-1][0]) ** power > max_seconds:
                results[f"{name}_L{length}_ms"] = results[f"{name}_L{length}_peak_mib"] = nan
                continue
            forward = forward_function(
                "association", name, length, dim, config, torch.Generator().manual_seed(length)
            )
            elapsed = statistics.median(timings(forward, repeats, warmup=1)[1])
            measured.append((length, elapsed))
            results[f"{name}_L{length}_ms"] = 1e3 * elapsed
            results[f"{name}_L{length}_peak_mib"] = peak_bytes(forward) / 2**20
        slope = fit_slope([n for n, _ in measured], [t for _, t in measured])
        results[f"{name}_slope"] = nan if slope is None else slope
    for name in MODELS:
        for length in sizes:
            own, dense = results[f"{name}_L{length}_ms"], results[f"dense_L{length}_ms"]
            results[f"{name}_L{length}_speedup_vs_dense"] = dense / own
            results[f"{name}_L{length}_memory_vs_dense"] = (
                results[f"{name}_L{length}_peak_mib"] / results[f"dense_L{length}_peak_mib"]
            )
    return results


def targets(results: dict[str, float], sizes: list[int]) -> list[tuple[str, bool]]:
    """The issue's targets as (description, met); speed-ups at the largest size dense reached."""
    largest = max(n for n in sizes if not math.isnan(results[f"dense_L{n}_ms"]))
    checks = []
    for name in LINEAR_TARGETS:
        slope = results[f"{name}_slope"]
        checks.append((f"{name}: slope {slope:.2f} <= 1.1", slope <= 1.1))
        speedup = results[f"{name}_L{largest}_speedup_vs_dense"]
        checks.append(
            (f"{name}: {speedup:.1f}x faster than dense at L={largest} (>= 10)", speedup >= 10)
        )
    for name in ("dense", "topk"):
        slope = results[f"{name}_slope"]
        checks.append((f"{name}: slope {slope:.2f} ~ 2 (1.6 ... 2.4)", 1.6 <= slope <= 2.4))
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes 512..4096, one repeat")
    parser.add_argument("--dim", type=int, default=16, help="pattern dimension d")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--max-seconds", type=float, default=5.0, help="time cap per pass")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    sizes = [512, 1024, 2048, 4096] if args.quick else [1024, 2048, 4096, 8192, 16384]
    results = run(sizes, args.dim, 1 if args.quick else 3, args.threads, args.max_seconds)
    header = f"{'model':12s} " + " ".join(f"{'L=' + str(n):>10s}" for n in sizes)
    print("forward CPU time (ms, median)\n" + header)
    for name in MODELS:
        cells = " ".join(f"{results[f'{name}_L{n}_ms']:10.2f}" for n in sizes)
        print(f"{name:12s} {cells}   slope {results[f'{name}_slope']:.2f}")
    print("\nspeed-up vs dense (x) / peak memory vs dense (x)\n" + header)
    for name in MODELS:
        cells = " ".join(
            f"{results[f'{name}_L{n}_speedup_vs_dense']:5.1f}/{results[f'{name}_L{n}_memory_vs_dense']:<4.2f}"
            for n in sizes
        )
        print(f"{name:12s} {cells}")
    print("\ntargets")
    for text, met in targets(results, sizes):
        print(f"  [{'met' if met else 'MISSED'}] {text}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()

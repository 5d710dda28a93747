"""Efficient-structure benchmark: scaling of time and memory with the memory size, against dense.

One Hopfield association ``(B=4, H=1, L=S, d)`` per model, no grad, fp32, CPU. Every speed and
memory number is a ratio against dense softmax association measured in the same run (same
process, same threads), so the results transfer between machines; slopes are least-squares fits
of log time against log L; each time is the median process CPU time of the repeats (which, unlike
wall time, leaves out waiting for a core on a shared machine).
Run:

    python benchmarks/bench_efficient.py [--quick] [--threads N] [--json out.json]
    python benchmarks/bench_efficient.py --sparse-memory [--lengths 4096 16384] [--heads 1 8]

``--sparse-memory`` measures instead the peak resident-memory growth of sparsemax (the blockwise
path) and Top-K(64) attention, forward and forward+backward, at ``L = S`` with ``E = 64``, each
case in a fresh subprocess (``ru_maxrss`` after the call minus the resident size before it;
the inputs are excluded, their gradients included).

Targets (issue #3, reported, not asserted): fitted slope <= 1.1 for Linear, random features and
the fixed-w window; >= 10x faster than dense at the largest size; dense and Top-K slope ~ 2.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys

import torch

from hopfield.experiments.efficiency import Config, fit_slope, forward_function
from hopfield.experiments.measure import peak_bytes, timings

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


_MEMORY_CASE = """
import json, resource, sys, time
import torch
from hopfield.functional import Sparsemax, Softmax, TopK, associate

name, length, heads, dim, backward, threads = sys.argv[1:7]
length, heads, dim, threads = int(length), int(heads), int(dim), int(threads)
backward = backward == "1"
torch.set_num_threads(threads)
page = resource.getpagesize()
gen = torch.Generator().manual_seed(0)
q, k, v = (
    torch.randn(1, heads, length, dim, generator=gen).requires_grad_(backward) for _ in range(3)
)
if name == "sparsemax":
    kwargs = {"separation": Sparsemax()}
else:
    kwargs = {"separation": Softmax(), "structure": TopK(64)}
with open("/proc/self/statm") as handle:
    before = int(handle.read().split()[1]) * page
start_cpu, start_wall = time.process_time(), time.perf_counter()
with torch.set_grad_enabled(backward):
    out = associate(q, k, v, **kwargs)
    if backward:
        out.sum().backward()
cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start_wall
# VmHWM, the peak of this process's own memory map: ru_maxrss keeps the parent's peak across
# fork and exec (Linux), so a big benchmark process would lend every case its own peak
with open("/proc/self/status") as handle:
    peak = next(int(line.split()[1]) for line in handle if line.startswith("VmHWM:")) * 1024
print(json.dumps({"growth_mib": max(0, peak - before) / 2**20, "cpu_s": cpu, "wall_s": wall}))
"""


def sparse_memory(
    lengths: list[int],
    heads: list[int],
    dim: int,
    threads: int,
    models: tuple[str, ...] = ("sparsemax", "topk64"),
) -> list[dict[str, float | int | str | bool]]:
    """Peak RSS growth of sparsemax and Top-K(64) attention (``models``), one subprocess per case."""
    rows: list[dict[str, float | int | str | bool]] = []
    for length in lengths:
        for count in heads:
            for name in models:
                for backward in (False, True):
                    args = [name, length, count, dim, int(backward), threads]
                    done = subprocess.run(
                        [sys.executable, "-c", _MEMORY_CASE, *map(str, args)],
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    row = json.loads(done.stdout.strip().splitlines()[-1])
                    row.update(model=name, length=length, heads=count, dim=dim, backward=backward)
                    rows.append(row)
                    print(
                        f"{name:10s} L=S={length:6d} B1 H{count} E{dim} "
                        f"{'fwd+bwd' if backward else 'fwd    '} "
                        f"peak RSS growth {row['growth_mib']:8.1f} MiB   "
                        f"CPU {row['cpu_s']:8.1f} s   wall {row['wall_s']:8.1f} s",
                        flush=True,
                    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes 512..4096, one repeat")
    parser.add_argument("--dim", type=int, default=16, help="pattern dimension d")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--max-seconds", type=float, default=5.0, help="time cap per pass")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument(
        "--sparse-memory", action="store_true", help="peak memory of blockwise sparse attention"
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--heads", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    if args.sparse_memory:
        rows = sparse_memory(args.lengths, args.heads, 64, args.threads)
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(rows, handle, indent=2)
        return
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

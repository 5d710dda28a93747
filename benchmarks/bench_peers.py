"""Issue 16's speed table in one run: every efficient structure against the dense kernel or the
peer library it is meant to beat.

Each row times ours and its baseline in turn in one process and reports the median of the
per-pair ratios ours ÷ baseline, with their quartiles, beside the issue's target (reported, not
asserted). The rows come from

- ``peers_separation``: ``Sparsemax``, ``Entmax(1.5)`` and learnable-α ``Entmax`` ÷ the
  ``entmax`` package (8192 and 32768 rows × 1024 keys, forward + backward);
- ``peers_sparse_attention``: ``TopK(64)``, ``RandomMask(64)`` and ``RandomFeatures`` attention
  ÷ ``scaled_dot_product_attention`` (B 1, H 8, E 64, N = 1k … 8k);
- this file: one step of ``hopfield.memory.retrieve`` with its defaults ÷ ``softmax(βQMᵀ)M``
  (10 000 × 10 000, d 784);
- ``peers_hyperset``: one Hyper-SET iteration ÷ ``nn.TransformerEncoderLayer`` (B 4, N 1024,
  d 256, forward + backward);
- with ``--memory``: the peak resident-memory growth of sparsemax and Top-K(64) attention at
  N = 16k (``bench_efficient.sparse_memory``, one subprocess per case).

Run from the repository root (``--quick``: smaller sizes, for a smoke test):

    python benchmarks/bench_peers.py [--quick] [--repeats 7] [--threads 2] [--memory]
        [--json out.json] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any

import torch

from _timing import ROW_HEADER, format_row, ratio_row
from bench_core import retrieve_case
from bench_efficient import sparse_memory

RETRIEVE_TARGET = 1.15


def retrieve_rows(repeats: int, quick: bool) -> list[dict[str, Any]]:
    """``retrieve`` (one step, defaults) ÷ the plain formula, on the same inputs."""
    n = 2000 if quick else 10_000
    with torch.inference_mode():
        row = ratio_row(
            f"retrieve defaults, {n} x {n}, d 784",
            retrieve_case("retrieve", n),
            retrieve_case("plain", n),
            repeats,
            target=RETRIEVE_TARGET,
            peer="softmax(βQMᵀ)M",
        )
    return [row]


def row_sources() -> list[tuple[str, Callable[[int, bool], list[dict[str, Any]]]]]:
    """The row-producing functions, in the order of the issue's table."""
    import peers_hyperset
    import peers_separation
    import peers_sparse_attention

    return [
        ("separation", peers_separation.rows),
        ("sparse attention", peers_sparse_attention.rows),
        ("retrieve", retrieve_rows),
        ("Hyper-SET", peers_hyperset.rows),
    ]


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as the README's speed table."""
    lines = [
        "| measurement | baseline | ours ÷ baseline (median [q25, q75]) | target | met |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        low, high = row["spread"]
        target, met = "—", "—"  # no target at this size
        if math.isfinite(row["target"]):
            target = f"≤ {row['target']:g}"
            met = "yes" if row["ratio"] <= row["target"] else "**no**"
        lines.append(
            f"| {row['row']} | {row['peer']} | {row['ratio']:.2f} [{low:.2f}, {high:.2f}] "
            f"| {target} | {met} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, a smoke test")
    parser.add_argument("--repeats", type=int, default=7, help="timed pairs per row")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--memory", action="store_true", help="also the 16k peak-memory rows")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--markdown", action="store_true", help="print the README table")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows: list[dict[str, Any]] = []
    for name, source in row_sources():
        print(f"== {name}\n{ROW_HEADER}", flush=True)
        for row in source(args.repeats, args.quick):
            print(format_row(row), flush=True)
            rows.append(row)
    memory = sparse_memory([16384], [1], 64, args.threads) if args.memory else []
    if args.markdown:
        print("\n" + markdown(rows))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"threads": args.threads, "rows": rows, "memory": memory}, handle, indent=2)


if __name__ == "__main__":
    main()

"""Sparsemax and entmax against the ``entmax`` package (issue 16, item 1).

Scores ``(rows, keys)`` from ``randn``, fp32, CPU, the map over the last dim, forward + backward
(an upstream gradient from ``randn``). Each row times ours and the peer in turn in one process
(:func:`_timing.interleaved_ratios`) and reports the median of the per-pair ratios ours ÷ peer
with their quartiles. Run from the repository root:

    python benchmarks/peers_separation.py [--quick] [--repeats 5] [--threads 2]

Rows: :class:`~hopfield.functional.separation.Sparsemax` ÷ ``entmax.sparsemax``,
``Entmax(1.5)`` ÷ ``entmax.entmax15``, and learnable-alpha ``Entmax`` (alpha starting at 1.3, so
that it takes the bisection path, with the gradient for alpha) ÷ ``entmax.entmax_bisect`` (same
alpha tensor, same number of iterations). Target (issue 16, reported, not asserted): ≤ 0.9 at
8192 × 1024 and 32768 × 1024.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from _timing import ROW_HEADER, format_row, ratio_row
from hopfield.functional.separation import Entmax, Sparsemax

TARGET = 0.9
LEARNABLE_ALPHA = 1.3
MODELS = ("Sparsemax", "Entmax(1.5)", "Entmax(learnable)")
PEERS = {
    "Sparsemax": "entmax.sparsemax",
    "Entmax(1.5)": "entmax.entmax15",
    "Entmax(learnable)": "entmax.entmax_bisect",
}


def case(model: str, n: int, keys: int) -> tuple[Callable[[], object], Callable[[], object]]:
    """``(ours, peer)``: one forward + backward each on the same scores ``(n, keys)``."""
    import entmax as peer

    gen = torch.Generator().manual_seed(n + keys)
    scores = torch.randn(n, keys, generator=gen).requires_grad_(True)
    upstream = torch.randn(n, keys, generator=gen)
    ours_fn: Callable[[torch.Tensor], torch.Tensor]
    peer_fn: Callable[[torch.Tensor], torch.Tensor]
    if model == "Sparsemax":
        ours_fn, peer_fn = Sparsemax(), lambda x: peer.sparsemax(x, dim=-1)
    elif model == "Entmax(1.5)":
        ours_fn, peer_fn = Entmax(1.5), lambda x: peer.entmax15(x, dim=-1)
    else:
        learnable = Entmax(LEARNABLE_ALPHA, learnable=True)
        ours_fn = learnable
        # The peer gets the same alpha tensor (with its graph to the logit) and iterations.
        peer_fn = lambda x: peer.entmax_bisect(  # noqa: E731
            x, alpha=learnable.alpha, dim=-1, n_iter=learnable.iterations
        )

    def run(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], object]:
        def call() -> object:
            scores.grad = None
            fn(scores).backward(upstream)
            return scores.grad

        return call

    return run(ours_fn), run(peer_fn)


def rows(repeats: int, quick: bool, models: tuple[str, ...] = MODELS) -> list[dict[str, Any]]:
    """One dict per model and size: ``row, ours_s, peer_s, ratio, spread, target, peer``."""
    sizes = [(1024, 1024), (4096, 1024)] if quick else [(8192, 1024), (32768, 1024)]
    out: list[dict[str, Any]] = []
    for model in models:
        for n, keys in sizes:
            ours, peer = case(model, n, keys)
            row = f"{model} {n}x{keys} fwd+bwd"
            out.append(
                ratio_row(
                    row,
                    ours,
                    peer,
                    repeats,
                    target=TARGET,
                    peer=PEERS[model],
                    model=model,
                    n=n,
                    keys=keys,
                )
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1024 and 4096 rows only")
    parser.add_argument("--repeats", type=int, default=5, help="timed pairs per row (median)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--only", choices=MODELS, help="one model only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"ours ÷ entmax package, fp32 fwd+bwd, {args.threads} threads, {args.repeats} pairs")
    print(ROW_HEADER)
    for row in rows(args.repeats, args.quick, (args.only,) if args.only else MODELS):
        print(format_row(row), flush=True)


if __name__ == "__main__":
    main()

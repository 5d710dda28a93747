"""Sparse and random-feature attention against dense ``scaled_dot_product_attention`` (issue 16).

Self-attention ``B=1, H=8, L=S=N, E=64``, fp32, CPU. Each row times our structure and PyTorch's
dense SDPA in turn in one process (:func:`_timing.interleaved_ratios`) and reports the median of
the per-pair ratios ours ÷ SDPA with their quartiles, once for a no-grad forward pass ("fwd") and
once for forward + backward ("fwd+bwd"). Run from the repository root:

    python benchmarks/peers_sparse_attention.py [--quick] [--repeats 5] [--threads 2] [--memory]

``--memory`` adds the peak resident-memory growth of Top-K(64) attention at N = 8192 and 16384
(fresh subprocesses, :func:`bench_efficient.sparse_memory`).

Targets (issue 16, reported, not asserted): Top-K(64) ≤ 1.5 at N ≥ 2048; RandomMask(64) ≤ 1.0 at
N ≥ 2048 and ≤ 2 at 1024; RandomFeatures (softmax kernel) ≤ 1.0 at N ≥ 2048.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from _timing import ROW_HEADER, format_row, ratio_row, timed_pass
from hopfield.functional import Softmax, associate
from hopfield.functional.efficient import RandomMask, TopK
from hopfield.functional.efficient_kernel import RandomFeatures
from hopfield.functional.structures import Structure

PEER = "dense SDPA"
MODELS: dict[str, Callable[[], Structure]] = {
    "TopK(64)": lambda: TopK(64),
    "RandomMask(64)": lambda: RandomMask(64, seed=0),
    "RandomFeatures": lambda: RandomFeatures(seed=0),
}


def target(model: str, n: int) -> float:
    """The issue's target ratio for ``model`` at ``N = n`` (``inf`` where none is set)."""
    if model == "TopK(64)":
        return 1.5 if n >= 2048 else float("inf")
    if model == "RandomMask(64)":
        return 1.0 if n >= 2048 else 2.0
    return 1.0 if n >= 2048 else float("inf")


def padding_mask(batch: int, n: int) -> torch.Tensor:
    """A padding mask ``(batch, 1, 1, n)`` for sequences of ``n``, ``n/2``, ``n`` and ``n/4`` keys
    (in turn): what a batch of bags or sentences of several lengths looks like."""
    lengths = torch.tensor([n, n // 2, n, n // 4]).repeat(-(-batch // 4))[:batch]
    return (torch.arange(n) < lengths.view(batch, 1, 1, 1)).view(batch, 1, 1, n)


def case(
    model: str, n: int, backward: bool, *, batch: int = 1, padded: bool = False
) -> tuple[Callable[[], object], Callable[[], object]]:
    """``(ours, sdpa)``: one call each on the same inputs ``(batch, 8, n, 64)``; ``padded``: both
    with the same :func:`padding_mask`."""
    gen = torch.Generator().manual_seed(n)
    q, k, v = (
        torch.randn(batch, 8, n, 64, generator=gen).requires_grad_(backward) for _ in range(3)
    )
    mask = padding_mask(batch, n) if padded else None
    structure = MODELS[model]()
    separation = Softmax()

    def ours() -> torch.Tensor:
        out = associate(q, k, v, separation=separation, structure=structure, mask=mask)
        assert isinstance(out, torch.Tensor)
        return out

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    return timed_pass(ours, backward), timed_pass(sdpa, backward)


def rows(
    repeats: int,
    quick: bool,
    *,
    models: list[str] | None = None,
    sizes: list[int] | None = None,
    verbose: bool = False,
) -> list[dict[str, Any]]:
    """One dict per model, size and pass: ``row, ours_s, peer_s, ratio, spread, target, peer``
    (and ``model, n, backward``); ``verbose`` prints each row as it is measured."""
    if sizes is None:
        sizes = [1024, 2048] if quick else [1024, 2048, 4096, 8192]
    out: list[dict[str, Any]] = []
    for model in models or list(MODELS):
        for n in sizes:
            for backward in (False, True):
                ours, sdpa = case(model, n, backward)
                row = f"{model} N={n} {'fwd+bwd' if backward else 'fwd'}"
                out.append(
                    ratio_row(
                        row,
                        ours,
                        sdpa,
                        repeats,
                        target=target(model, n),
                        peer=PEER,
                        model=model,
                        n=n,
                        backward=backward,
                    )
                )
                if verbose:
                    print(format_row(out[-1]), flush=True)
    return out


def topk_memory(lengths: list[int], threads: int) -> list[dict[str, float | int | str | bool]]:
    """Peak RSS growth of Top-K(64) attention (``H = 8``), forward and forward + backward."""
    from bench_efficient import sparse_memory

    return sparse_memory(lengths, [8], 64, threads, models=("topk64",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 1024, 2048 only")
    parser.add_argument("--repeats", type=int, default=5, help="timed pairs per row (median)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--memory", action="store_true", help="Top-K peak memory at 8k/16k")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=None)
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="values of N")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"ours ÷ {PEER}, B=1 H=8 E=64 L=S=N fp32, {args.threads} threads, {args.repeats} pairs",
        flush=True,
    )
    print(ROW_HEADER)
    rows(args.repeats, args.quick, models=args.models, sizes=args.sizes, verbose=True)
    if args.memory:
        topk_memory([8192, 16384], args.threads)


if __name__ == "__main__":
    main()

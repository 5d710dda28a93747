"""Hyper-SET benchmark: one iteration vs one layer of the weight-shared pre-norm Transformer.

Both are measured in the same run (same process, same threads) at the same width and number of
tokens, forward and forward+backward; the result is the ratio Hyper-SET / Transformer beside the
ratio of their matmul FLOPs (spec §9.1). The Hyper-SET iteration includes its step-size network
(one ``Linear(d, 2d)`` per token); "layer only" times the layer with fixed step sizes. The
explicit bi-softmax uses one N×N softmax (``softmax(A, -2) = softmax(A, -1)ᵀ`` for the symmetric
``A``); its time against the two-softmax form is reported too, and the forward time of the fused
form (two SDPA calls, taken automatically from ``FUSED_MIN_TOKENS`` tokens) against it.

    python benchmarks/bench_hyperset.py [--quick] [--json out.json] [--threads T]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch

from _timing import median_time
from hopfield.nn.hyperset import (
    HyperSETEncoder,
    SharedTransformerEncoder,
    flops_per_iteration,
)
from hopfield.nn.hyperset_energy import attention_operator

CASES = [
    # name, batch, tokens, width, heads, Hyper-SET FF width
    ("Sudoku (d=128)", 32, 81, 128, 4, 512),
    ("CIFAR Small (d=384)", 32, 65, 384, 6, 384),
    ("Sudoku paper (d=768)", 8, 81, 768, 12, 3072),
    ("long sequence (d=256)", 4, 1024, 256, 4, 256),
]


def step(module: torch.nn.Module, x: torch.Tensor, backward: bool) -> Callable[[], object]:
    """A closure running one iteration (and its backward pass)."""

    def run() -> object:
        if backward:
            x.grad = None
            out = module(x)
            assert isinstance(out, torch.Tensor)
            out.sum().backward()
            return out
        with torch.no_grad():
            return module(x)

    return run


def hyperset_iteration(width: int, heads: int, ff: int) -> HyperSETEncoder:
    """One Hyper-SET iteration with its step-size network, step sizes made non-zero so that the
    timed path is the trained one."""
    hyperset = HyperSETEncoder(width, heads, ff, iterations=1, time_frequency=min(512, width))
    with torch.no_grad():
        assert hyperset.step_sizes is not None
        hyperset.step_sizes.step.bias.fill_(0.01)
    return hyperset


def bench_case(
    batch: int, tokens: int, width: int, heads: int, ff: int, repeats: int
) -> dict[str, float]:
    """Times (s) and ratios of one Hyper-SET iteration and one Transformer layer."""
    torch.manual_seed(0)
    x = torch.randn(batch, tokens, width, requires_grad=True)
    hyperset = hyperset_iteration(width, heads, ff)
    layer_only = HyperSETEncoder(width, heads, ff, iterations=1, step_size=0.1)
    transformer = SharedTransformerEncoder(width, heads, 4.0, iterations=1)
    out: dict[str, float] = {}
    for backward in (False, True):
        tag = "fwd_bwd" if backward else "fwd"
        t_h = median_time(step(hyperset, x, backward), repeats)
        t_l = median_time(step(layer_only, x, backward), repeats)
        t_t = median_time(step(transformer, x, backward), repeats)
        out[f"{tag}_hyperset_s"] = t_h
        out[f"{tag}_layer_only_s"] = t_l
        out[f"{tag}_transformer_s"] = t_t
        out[f"{tag}_ratio"] = t_h / t_t
        out[f"{tag}_layer_only_ratio"] = t_l / t_t
    f_h = flops_per_iteration("hyperset", tokens, width, ff) + 2 * tokens * width * 2 * width
    f_t = flops_per_iteration("transformer", tokens, width, 4 * width)
    out["flops_ratio"] = f_h / f_t
    out["hyperset_gflop"] = batch * f_h / 1e9
    out["transformer_gflop"] = batch * f_t / 1e9
    z = torch.nn.functional.rms_norm(
        torch.randn(batch, heads, tokens, width // heads), (width // heads,)
    )
    one = median_time(lambda: attention_operator(z, z, z, symmetric=True, fused=False), repeats)
    two = median_time(lambda: attention_operator(z, z, z, symmetric=False, fused=False), repeats)
    out["bisoftmax_one_vs_two_softmax"] = one / two
    fused = median_time(lambda: attention_operator(z, z, z, symmetric=True, fused=True), repeats)
    out["bisoftmax_fused_vs_explicit"] = fused / one
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small cases, few repeats")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cases = CASES[:2] if args.quick else CASES
    repeats = 5 if args.quick else 15
    rows = []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print(
        "| case | B | N | d | M | fwd ratio | fwd+bwd ratio | layer-only fwd+bwd ratio | "
        "FLOPs ratio | one/two softmax | fused/explicit |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, batch, tokens, width, heads, ff in cases:
        r = bench_case(batch, tokens, width, heads, ff, repeats)
        rows.append({"case": name, "batch": batch, "tokens": tokens, "width": width, **r})
        print(
            f"| {name} | {batch} | {tokens} | {width} | {ff} | {r['fwd_ratio']:.2f} | "
            f"{r['fwd_bwd_ratio']:.2f} | {r['fwd_bwd_layer_only_ratio']:.2f} | "
            f"{r['flops_ratio']:.2f} | {r['bisoftmax_one_vs_two_softmax']:.2f} | "
            f"{r['bisoftmax_fused_vs_explicit']:.2f} |",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows},
                handle,
                indent=2,
            )


if __name__ == "__main__":
    main()

"""The sink family on every path: cost against plain ``scaled_dot_product_attention``.

Each row is one separation on one path of :func:`hopfield.functional.sink.sink_attention` (or
:func:`~hopfield.functional.associate` for the maps without a sink path), timed in turn with
plain softmax SDPA on the same inputs (``interleaved_ratio``: the median of per-pair ratios),
forward and backward (forward only for FlexAttention, which has no CPU backward). Run from the
repository root:

    python benchmarks/bench_sink.py [--length N] [--repeats R] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from _timing import interleaved_ratio
from hopfield.functional import EntmaxSink, Separation, Sink, SoftmaxN, associate
from hopfield.functional.sink import flex_available, sink_attention


def separations(heads: int, width: int) -> dict[str, Separation]:
    """The rows' separations (learnable ones with their parameters)."""
    return {
        "SoftmaxN(1)": SoftmaxN(1.0),
        "Sink(0.5)": Sink(0.5),
        "Sink learnable per head": Sink(0.0, learnable=True, heads=heads),
        "Sink per head + value sink": Sink(0.0, learnable=True, heads=heads, value=width),
        "EntmaxSink(1.5)": EntmaxSink(1.5),
        "EntmaxSink learnable alpha + sink": EntmaxSink(
            1.5, learnable=True, num_heads=heads, learnable_logit=True, heads=heads
        ),
    }


def step(fn: Callable[[], Tensor], backward: bool) -> Callable[[], object]:
    def run() -> object:
        out = fn()
        if backward:
            out.sum().backward()
        return out

    return run


def call(
    separation: Separation, path: str, qkv: tuple[Tensor, Tensor, Tensor]
) -> Callable[[], Tensor]:
    """One causal association of ``separation`` on ``path`` (``"associate"``: its dispatch)."""

    def run() -> Tensor:
        if path == "associate":
            return associate(*qkv, separation=separation, causal=True)  # type: ignore[return-value]
        return sink_attention(*qkv, separation, path=path, causal=True)  # type: ignore[arg-type]

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    batch, heads, width = 2, 8, 64
    q, k, v = (torch.randn(batch, heads, args.length, width, requires_grad=True) for _ in range(3))
    rows = []
    for name, separation in separations(heads, width).items():
        paths = ["explicit", "sdpa", "lse"] if isinstance(separation, Sink) else ["associate"]
        if isinstance(separation, Sink) and flex_available():
            paths.append("flex")
        for path in paths:
            backward = path != "flex"
            qkv = (q, k, v) if backward else (q.detach(), k.detach(), v.detach())
            fn = call(separation, path, qkv)  # FlexAttention refuses CPU inputs needing grad
            base = step(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), backward)
            with warnings.catch_warnings(), torch.set_grad_enabled(backward):
                warnings.simplefilter("ignore")  # eager FlexAttention warns that it is not compiled
                ratio, ours, _ = interleaved_ratio(step(fn, backward), base, args.repeats)
            rows.append({"separation": name, "path": path, "backward": backward, "ratio": ratio})
            print(
                f"{name:36s} {path:9s} {'fwd+bwd' if backward else 'fwd':8s} "
                f"{1e3 * ours:8.1f} ms  {ratio:6.2f}x SDPA"
            )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"length": args.length, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()

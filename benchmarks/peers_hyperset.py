"""One Hyper-SET iteration against one ``nn.TransformerEncoderLayer`` (issue 16, item 5).

The long-sequence case of ``bench_hyperset.py``: ``B = 4``, ``N = 1024``, ``d = 256``, 4 heads,
fp32, and again in bf16 (weights and input; issue 31, item 4), forward + backward of
``out.sum()`` with respect to the input. Ours is one iteration of
``HyperSETEncoder`` with its step-size network (``bench_hyperset.hyperset_iteration``; the
bi-softmax attention takes the fused SDPA path automatically at this length). The peer is PyTorch's
pre-norm layer with a ``4d`` ReLU feedforward, ``batch_first=True`` and ``dropout=0.0`` (Hyper-SET
has no dropout; dropout would only slow the peer down). The two are timed in turn in one process
(:func:`_timing.ratio_row`); each row reports the median of the per-pair ratios
ours ÷ peer with their quartiles, beside the issue's target 1.2 (reported, not asserted).

Run from the repository root (``--quick``: N = 256):

    python benchmarks/peers_hyperset.py [--quick] [--repeats 7] [--threads 2]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from _timing import ROW_HEADER, format_row, ratio_row
from bench_hyperset import CASES, hyperset_iteration, step

PEER = "nn.TransformerEncoderLayer"
TARGET = 1.2
CASE = "long sequence (d=256)"


def rows(repeats: int, quick: bool) -> list[dict[str, Any]]:
    """Two rows, float32 and bfloat16 (weights and input): ``row, ours_s, peer_s, ratio,
    spread, target, peer`` (and the sizes)."""
    _, batch, tokens, width, heads, ff = next(case for case in CASES if case[0] == CASE)
    if quick:
        tokens = 256
    found = []
    for dtype, label in ((torch.float32, ""), (torch.bfloat16, " bf16")):
        torch.manual_seed(0)
        x = torch.randn(batch, tokens, width, dtype=dtype, requires_grad=True)
        ours = hyperset_iteration(width, heads, ff).to(dtype)
        peer = torch.nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        ).to(dtype)
        found.append(
            ratio_row(
                f"Hyper-SET iteration B{batch} N{tokens} d{width}{label} fwd+bwd",
                step(ours, x, True),
                step(peer, x, True),
                repeats,
                target=TARGET,
                peer=PEER,
                batch=batch,
                tokens=tokens,
                width=width,
                heads=heads,
            )
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 256")
    parser.add_argument("--repeats", type=int, default=7, help="timed pairs (median)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"ours ÷ {PEER}, fp32 and bf16, {args.threads} threads, {args.repeats} pairs")
    print(ROW_HEADER)
    for row in rows(args.repeats, args.quick):
        print(format_row(row))


if __name__ == "__main__":
    main()

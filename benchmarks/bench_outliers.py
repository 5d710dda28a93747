"""Outlier-efficient attention in transformers: training-step time per variant, recorder overhead.

Every number is a ratio against a baseline measured in the same run (same process, threads and
inputs; the cases are interleaved round-robin, so background load hits all of them alike). Run:

    python benchmarks/bench_outliers.py [--quick] [--device cpu|cuda] [--json out.json]

Targets (issue #5), BERT-small (4 layers, d 512, 8 heads, FFN 2048), batch 16 x 128 tokens with
padding, AdamW training step (forward, backward, update) against ``attn_implementation="sdpa"``:
``softmax1`` <= 1.05x, clipped and gated variants <= 1.3x; evaluation with the
:class:`~hopfield.outliers.ActivationRecorder` attached <= 1.2x without it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from hopfield.integrations import build_model
from hopfield.outliers import ActivationRecorder

BERT_SMALL = dict(
    num_hidden_layers=4,
    hidden_size=512,
    num_attention_heads=8,
    intermediate_size=2048,
    vocab_size=30522,
    max_position_embeddings=512,
)
VARIANTS = ("sdpa", "softmax", "softmax1", "clipped", "clipped_softmax1", "gated", "gated_softmax1")
TARGETS = {
    "softmax1": 1.05,
    "clipped": 1.3,
    "clipped_softmax1": 1.3,
    "gated": 1.3,
    "gated_softmax1": 1.3,
}


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def interleaved(
    cases: dict[str, Callable[[], object]], repeats: int, device: str, clock: Callable[[], float]
) -> dict[str, float]:
    """Median seconds per case (by ``clock``), run round-robin after two warm-up rounds."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(repeats + 2):
        for name, fn in cases.items():
            synchronize(device)
            start = clock()
            fn()
            synchronize(device)
            if round_ >= 2:
                times[name].append(clock() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def batch(size: int, length: int, device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 30522, (size, length), generator=g)
    mask = torch.ones(size, length, dtype=torch.long)
    mask[::2, length * 3 // 4 :] = 0  # half the sequences padded by a quarter
    labels = torch.where(torch.rand(size, length, generator=g) < 0.15, ids, -100)
    return {
        k: v.to(device)
        for k, v in {"input_ids": ids, "attention_mask": mask, "labels": labels}.items()
    }


def training_step(variant: str, data: dict[str, torch.Tensor], device: str) -> Callable[[], object]:
    torch.manual_seed(0)
    model = build_model("bert", variant, **BERT_SMALL).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> object:
        optimizer.zero_grad(set_to_none=True)
        loss = model(**data).loss
        loss.backward()
        optimizer.step()
        return loss

    return step


def evaluation(recorded: bool, data: dict[str, torch.Tensor], device: str) -> Callable[[], object]:
    torch.manual_seed(0)
    model = build_model("bert", "softmax1", **BERT_SMALL).to(device).eval()
    if recorded:
        ActivationRecorder(model, "bert")

    def forward() -> object:
        with torch.no_grad():
            return model(**data).logits

    return forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batch 4 x 64, 3 repeats")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=16, help="sequences per batch")
    parser.add_argument("--length", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    parser.add_argument(
        "--clock",
        default="wall",
        choices=["wall", "cpu"],
        help="wall time, or this process's CPU time (robust on a shared CPU with --threads 1)",
    )
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    size, length, repeats = (4, 64, 3) if args.quick else (args.batch, args.length, args.repeats)
    data = batch(size, length, args.device)
    if args.clock == "cpu" and args.device == "cuda":
        parser.error("--clock cpu measures CPU work only; use wall time on cuda")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    steps = interleaved(
        {v: training_step(v, data, args.device) for v in VARIANTS}, repeats, args.device, clock
    )
    evals = interleaved(
        {r: evaluation(r == "recorded", data, args.device) for r in ("plain", "recorded")},
        repeats,
        args.device,
        clock,
    )
    base = steps["sdpa"]
    results = {
        "device": args.device,
        "threads": torch.get_num_threads(),
        "clock": args.clock,
        "batch": [size, length],
        "train_step_seconds": steps,
        "train_step_ratio_vs_sdpa": {v: steps[v] / base for v in VARIANTS},
        "eval_seconds": evals,
        "recorder_ratio": evals["recorded"] / evals["plain"],
    }
    print(
        f"BERT-small training step, batch {size} x {length}, device {args.device}, "
        f"{torch.get_num_threads()} threads, {args.clock} clock, median of {repeats}"
    )
    print(f"{'variant':<18} {'ms':>9} {'ratio':>7} {'target':>7}")
    for v in VARIANTS:
        target = TARGETS.get(v)
        print(
            f"{v:<18} {steps[v] * 1e3:9.1f} {steps[v] / base:7.3f} "
            f"{'' if target is None else f'<= {target}':>7}"
        )
    print(f"evaluation with ActivationRecorder: {results['recorder_ratio']:.3f}x (target <= 1.2)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()

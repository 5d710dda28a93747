"""Training helpers shared by the Hyper-SET experiments (no experiment is registered here).

:func:`train_model` runs epochs of mini-batch training with gradient clipping and a per-epoch
learning rate, saving a checkpoint (model, optimiser, history) after every epoch in the run's
folder, so a stopped run resumes at its last finished epoch. :func:`trajectory_statistics`
computes the Fig. 5/6 read-outs (energies, effective rank, average angle, step sizes) along the
iterations of a Hyper-SET encoder.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from hopfield.experiments.results import RunContext, Table
from hopfield.nn.hyperset import HyperSETEncoder
from hopfield.nn.hyperset_energy import average_angle, effective_rank

__all__ = [
    "cosine_lr",
    "fraction_non_increasing",
    "linear_slope",
    "threads_limited",
    "train_model",
    "trajectory_statistics",
]


@contextmanager
def threads_limited(threads: int) -> Iterator[None]:
    """Run with ``torch.set_num_threads(threads)`` when positive (0 keeps the setting).

    One thread avoids the large slow-down of OpenMP spinning when other jobs share the cores.
    """
    previous = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def cosine_lr(epoch: int, epochs: int, peak: float, floor: float, warmup: int = 0) -> float:
    """Linear warm-up ``peak·(epoch+1)/warmup``, then cosine from ``peak`` to ``floor``."""
    if epoch < warmup:
        return peak * (epoch + 1) / warmup
    span = max(epochs - warmup, 1)
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * (epoch - warmup) / span))


def train_model(
    ctx: RunContext,
    tag: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    size: int,
    batch_size: int,
    epochs: int,
    loss_fn: Callable[[Tensor], Tensor],
    lr_at: Callable[[int], float],
    seed: int,
    grad_clip: float | None = None,
    evaluate: Callable[[], dict[str, float]] | None = None,
    eval_every: int = 0,
) -> dict[str, Any]:
    """Train ``model`` for ``epochs`` epochs, resuming from ``ctx.out_dir/<tag>.pt``.

    Args:
        size: number of training examples; ``loss_fn(indices)`` gets a long tensor of indices
            into the training set and returns the scalar loss of that batch.
        lr_at: learning rate of an epoch (set at its start).
        seed: the shuffling of epoch e uses ``seed + e`` (so a resumed run is identical).
        evaluate: called every ``eval_every`` epochs (and after the last); its metrics are
            appended to the history.

    Returns:
        ``{"epochs": [{"epoch", "loss", "lr", "seconds", **eval}], "train_seconds": float}``.
    """
    path = ctx.path(f"{tag}.pt")
    history: dict[str, Any] = {"epochs": [], "train_seconds": 0.0}
    start = 0
    if path.is_file():
        state = torch.load(path, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        history = state["history"]
        start = len(history["epochs"])
    for epoch in ctx.track(range(start, epochs), total=epochs - start, desc=tag):
        lr = lr_at(epoch)
        for group in optimizer.param_groups:
            group["lr"] = lr
        model.train()
        order = torch.randperm(size, generator=torch.Generator().manual_seed(seed + epoch))
        t0 = time.perf_counter()
        total, count = 0.0, 0
        for first in range(0, size, batch_size):
            batch = order[first : first + batch_size]
            loss = loss_fn(batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip:
                nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            total += float(loss.detach()) * len(batch)
            count += len(batch)
        seconds = time.perf_counter() - t0
        record: dict[str, Any] = {
            "epoch": epoch + 1,
            "loss": total / max(count, 1),
            "lr": lr,
            "seconds": seconds,
        }
        history["train_seconds"] += seconds
        if evaluate is not None and (
            (eval_every and (epoch + 1) % eval_every == 0) or epoch + 1 == epochs
        ):
            model.eval()
            with torch.no_grad():
                record.update(evaluate())
        history["epochs"].append(record)
        tmp = path.with_suffix(".tmp")
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "history": history},
            tmp,
        )
        tmp.replace(path)
    model.eval()
    return history


@torch.no_grad()
def trajectory_statistics(
    encoder: HyperSETEncoder, x0: Tensor, iterations: int
) -> list[dict[str, float]]:
    """Per-iteration read-outs of a Hyper-SET run from ``x0`` ``(B, N, d)`` (spec §5).

    For each t = 1..iterations: mean and std over samples of ``E_ATTN`` and ``E_FF`` (state after
    the iteration, gain-free normalisation), the effective rank and the average angle (paper
    definition, degrees) of the normalised tokens of head 0 and averaged over heads, the full rank
    of head 0, and the mean and fraction negative of ``α_t`` and ``γ_t``.
    """
    states, steps = encoder.trajectory(x0, iterations)
    rows = []
    for t, (x, (alpha, gamma)) in enumerate(zip(states, steps, strict=True)):
        layer = encoder.layer_at(t, iterations)
        e_attn, e_ff = layer.energies(x)
        z = layer.subspace_tokens(x)  # (B, H, N, p)
        erank = effective_rank(z)  # (B, H)
        angle = average_angle(z)  # (B, H)
        full = torch.linalg.matrix_rank(z[:, 0].double()).double()
        rows.append(
            {
                "t": t + 1,
                "e_attn": float(e_attn.mean()),
                "e_attn_std": float(e_attn.std()) if len(e_attn) > 1 else 0.0,
                "e_ff": float(e_ff.mean()),
                "e_ff_std": float(e_ff.std()) if len(e_ff) > 1 else 0.0,
                "erank_head0": float(erank[:, 0].mean()),
                "erank": float(erank.mean()),
                "full_rank_head0": float(full.mean()),
                "angle_head0": float(angle[:, 0].mean()),
                "angle": float(angle.mean()),
                "alpha_mean": float(alpha.mean()),
                "alpha_negative": float((alpha < 0).double().mean()),
                "gamma_mean": float(gamma.mean()),
                "gamma_negative": float((gamma < 0).double().mean()),
            }
        )
    return rows


def fraction_non_increasing(values: Sequence[float]) -> float:
    """Fraction of consecutive differences that are ``<= 0`` (1.0 for fewer than two values)."""
    if len(values) < 2:
        return 1.0
    steps = [b - a for a, b in itertools.pairwise(values)]
    return sum(s <= 0 for s in steps) / len(steps)


def linear_slope(values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` against ``0, 1, 2, ...``."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x = (n - 1) / 2
    mean_y = sum(values) / n
    num = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    return num / sum((i - mean_x) ** 2 for i in range(n))


# Columns of the per-iteration trajectory table: (header, key of a trajectory_statistics row).
TRAJECTORY_COLUMNS = (
    ("t", "t"),
    ("E_ATTN", "e_attn"),
    ("±", "e_attn_std"),
    ("E_FF", "e_ff"),
    ("±", "e_ff_std"),
    ("erank h0", "erank_head0"),
    ("full rank h0", "full_rank_head0"),
    ("erank mean", "erank"),
    ("angle h0 °", "angle_head0"),
    ("angle mean °", "angle"),
    ("α mean", "alpha_mean"),
    ("α<0", "alpha_negative"),
    ("γ mean", "gamma_mean"),
    ("γ<0", "gamma_negative"),
)


def trajectory_table(
    name: str, analysis: Sequence[dict[str, Any]], caption: str, *, full_rank: bool = False
) -> Table:
    """The energy / effective-rank / angle / step-size table of ``trajectory_statistics`` rows
    (the "full rank h0" column only when ``full_rank``)."""
    columns = [c for c in TRAJECTORY_COLUMNS if full_rank or c[1] != "full_rank_head0"]
    rows = [[row[key] for _, key in columns] for row in analysis]
    return Table(name, [header for header, _ in columns], rows, caption)


def energy_trend_metrics(analysis: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Slope and fraction of non-increasing steps of E_ATTN and E_FF along ``analysis``."""
    metrics: dict[str, float] = {}
    for key in ("e_attn", "e_ff"):
        values = [row[key] for row in analysis]
        metrics[f"{key}_slope"] = linear_slope(values)
        metrics[f"{key}_fraction_decreasing"] = fraction_non_increasing(values)
    return metrics

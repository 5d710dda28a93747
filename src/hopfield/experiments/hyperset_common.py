"""Training helpers shared by the Hyper-SET experiments (no experiment is registered here).

:func:`train_model` trains one model through :class:`hopfield.training.Trainer` (several
processes, a per-epoch learning rate, a checkpoint with the RNG states after every epoch, so a
stopped run resumes to the result of an uninterrupted one). :func:`trajectory_statistics`
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
    "device_of",
    "fraction_non_increasing",
    "linear_slope",
    "save_runs",
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
    collate: Callable[[Tensor], Any],
    loss_fn: Callable[[nn.Module, Any], Tensor],
    *,
    size: int,
    batch_size: int,
    epochs: int,
    lr_at: Callable[[int], float],
    seed: int,
    optimizer: str = "adamw",
    betas: tuple[float, float] = (0.9, 0.999),
    weight_decay: float = 0.0,
    grad_clip: float | None = None,
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
    eval_every: int = 0,
    identity: Any = None,
) -> dict[str, Any]:
    """Train ``model`` for ``epochs`` epochs with :class:`hopfield.training.Trainer` in the
    folder ``ctx.out_dir/runs/<tag>/`` (log, a checkpoint after every epoch, ``run.json``).

    The run trains on several processes under ``torchrun`` (``batch_size`` is the global batch),
    resumes from its newest checkpoint when ``run.json`` records the same ``identity`` (what
    defines the run: settings, JSON-serialisable), and returns at once where it had finished.
    Each epoch is a permutation of the training set drawn from ``seed`` cut into full global
    batches (the incomplete last batch is dropped). Randomness (augmentation, masks) belongs in
    ``collate`` and must come from the global torch RNG, which the checkpoints hold.

    Args:
        collate: ``collate(indices (b,) long) -> batch`` of CPU tensors for the micro-batch of
            training-set ``indices`` (moved to the model's device by the Trainer).
        loss_fn: ``loss_fn(model, batch) -> scalar``; it must call the ``model`` it is given
            (under several processes the DDP wrapper that averages the gradients).
        size: number of training examples.
        lr_at: learning rate of a 0-based epoch.
        optimizer, betas, weight_decay: Adam (coupled weight decay) or AdamW; weight decay
            applies to weights and normalisation gains, not to biases.
        evaluate: ``evaluate(model) -> metrics`` every ``eval_every`` epochs and after the last
            (the same numbers on every process).

    Returns:
        ``{"epochs": [{"epoch", "loss", "lr", **eval}], "train_seconds", "steps", "finished",
        "resumed_from", "processes"}`` (``train_seconds``: the wall time of this call's
        training, so only the part after the resume for a resumed run).
    """
    from hopfield.experiments.outliers_tasks import same_run
    from hopfield.training import Trainer, steps_per_epoch

    per_epoch = steps_per_epoch(size, batch_size)
    if per_epoch < 1:
        raise ValueError(f"batch_size: {batch_size} exceeds the {size} training examples")
    lr = lr_at(0) or 1.0
    config = ctx.training_config(
        epochs=epochs,
        batch_size=batch_size,
        optimizer=optimizer,
        lr=lr,
        betas=betas,
        weight_decay=weight_decay,
        decay_norm_weights=True,
        grad_clip=grad_clip,
        seed=seed,
        log_every="epoch",
        eval_every=eval_every * per_epoch,
        checkpoint_every="epoch",
    )
    folder = f"runs/{tag}"
    state = same_run(ctx, f"{folder}/run.json", {"identity": identity, "size": size})
    trainer = Trainer(
        model,
        range(size),
        loss_fn,
        config,
        ctx.path(folder),
        collate_fn=lambda indices: collate(torch.as_tensor(indices, dtype=torch.long)),
        evaluate=evaluate,
        schedule=lambda step: lr_at(step // per_epoch) / lr,
        progress=ctx.progress,
    )
    start = time.perf_counter()
    try:
        result = trainer.fit(resume=state == "same")
    finally:
        trainer.close()
    model.eval()  # on the accelerator's device: evaluations move their inputs there (device_of)
    epochs_log = [
        {"epoch": r["step"] // per_epoch, "loss": r["loss"], "lr": r["lr"], **r.get("eval", {})}
        for r in result.log
    ]
    return {
        "epochs": epochs_log,
        "train_seconds": time.perf_counter() - start,
        "steps": result.step,
        "finished": result.finished,
        "resumed_from": result.resumed_from,
        "processes": result.processes,
    }


def save_runs(ctx: RunContext, results: dict[str, dict[str, Any]]) -> None:
    """Write ``runs.json``: per model its parameters, optimiser steps, whether it finished and
    how many processes trained it (the main process writes)."""
    keys = ("params", "steps", "finished", "processes")
    ctx.save_json("runs.json", {name: {k: r[k] for k in keys} for name, r in results.items()})


def device_of(model: nn.Module) -> torch.device:
    """Where ``model``'s parameters are (after training: the accelerator's device)."""
    return next(model.parameters()).device


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

"""Training helpers shared by the Hyper-SET experiments (no experiment is registered here).

:func:`train_model` trains one model through :class:`hopfield.training.Trainer` (several
processes, the preset's batch as the global batch, a per-epoch learning rate as a ``schedule``
callable, a checkpoint with every process's RNG states after every epoch, so a stopped run
resumes to the result of an uninterrupted one). :func:`train_or_reuse` keeps the books of a list
of models with the helpers of :mod:`hopfield.experiments.forecasting_common`: each model trains
in ``out_dir/runs/<model>/``, whose checkpoints are resumed only for the same run, and its record
in ``runs.json`` (what the report needs, the process count, the step limit) is reused instead of
training again. :func:`trajectory_statistics` computes the Fig. 5/6 read-outs (energies,
effective rank, average angle, step sizes, and per head for Figs. 9-12) along the iterations of
a Hyper-SET encoder; :func:`subspace_trajectory` the per-head effective rank and angle of any
encoder with subspace tokens (Hyper-SET, the shared-QKV Transformers of Figs. 13-14).
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, cast

import torch
from torch import Tensor, nn

from hopfield.experiments.forecasting_common import EpochClock, reusable, save_run
from hopfield.experiments.outliers_tasks import same_run
from hopfield.experiments.registry import ConfigError
from hopfield.experiments.results import RunContext, Table
from hopfield.models.shared_qkv import SharedQKVTransformerEncoder
from hopfield.nn.hyperset import HyperSETEncoder
from hopfield.nn.hyperset_energy import average_angle, effective_rank
from hopfield.stats import linear_slope, replicate_key, split_replicate_key
from hopfield.training import Trainer, steps_per_epoch

__all__ = [
    "cosine_lr",
    "device_of",
    "fraction_non_increasing",
    "head_statistics",
    "name_seed",
    "replicate_table",
    "run_folder",
    "run_identity",
    "subspace_trajectory",
    "threads_limited",
    "train_model",
    "train_or_reuse",
    "train_replicates",
    "trajectory_statistics",
]

#: Encoders whose ``layer_at(t, L).subspace_tokens(x)`` gives per-head tokens ``(B, H, N, p)``.
SubspaceEncoder = HyperSETEncoder | SharedQKVTransformerEncoder


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


def name_seed(name: str) -> int:
    """The seed index of the run of model ``name``: the CRC-32 of its UTF-8 bytes, in
    ``[0, 2**32)``. It depends on the name alone, so a model's run is the same whichever other
    models a preset lists and in whatever order."""
    return zlib.crc32(name.encode("utf-8"))


def run_identity(config: Any, loops: Sequence[str], ctx: RunContext, **run: Any) -> dict[str, Any]:
    """What defines one model's run: the fields of the dataclass ``config`` but the outer
    ``loops`` (which models to train, thread counts), the precision, and ``run`` (the model's
    name, what seeds it, where the data come from). When a run is seeded by its model's name
    (:func:`name_seed`), adding a model to the lists of a preset or removing one leaves the runs
    of the others reusable."""
    fields = {k: v for k, v in asdict(config).items() if k not in loops}
    return {"config": fields, "mixed_precision": ctx.mixed_precision or "no", **run}


def run_folder(name: str) -> str:
    """The folder of model ``name``'s run below ``out_dir`` (log, checkpoints, ``run.json``)."""
    return f"runs/{name}"


def train_replicates(
    ctx: RunContext,
    config: Any,
    loops: Sequence[str],
    names: Sequence[str],
    data: str,
    train: Callable[[str, int, str, dict[str, Any]], dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """The records of ``config.seeds`` replicates of every model of ``names`` (all of the first
    replicate's first), keyed by :func:`replicate_key`, each trained or reused by
    :func:`train_or_reuse`. Replicate ``r`` of model ``name`` is seeded by ``config.seed + r``
    and its name (:func:`name_seed`); ``train(name, seed, key, identity)`` trains it. The first
    replicate's identity has no ``replicate`` field, so one-seed records stay reusable."""

    def identity_of(_: int, key: str) -> dict[str, Any]:
        name, replicate = split_replicate_key(key)
        extra = {"replicate": replicate} if replicate else {}
        return run_identity(
            config, loops, ctx, model=name, seed_index=name_seed(name), data=data, **extra
        )

    def train_one(_: int, key: str, identity: dict[str, Any]) -> dict[str, Any]:
        name, replicate = split_replicate_key(key)
        return train(name, config.seed + replicate, key, identity)

    keys = [replicate_key(name, r) for r in range(config.seeds) for name in names]
    return train_or_reuse(ctx, keys, identity_of, train_one)


def replicate_table(
    config: Any, names: Sequence[str], every: dict[str, Any], metric: str,
    value: Callable[[dict[str, Any]], float],
) -> Table:  # fmt: skip
    """``metric`` (``value`` of a run's record) of every model over its ``config.seeds``
    replicates: mean, sd and range."""
    rows = []
    for name in names:
        runs = [value(every[replicate_key(name, r)]) for r in range(config.seeds)]
        values = torch.tensor(runs, dtype=torch.float64)
        rows.append([name, len(runs), float(values.mean()), float(values.std()),
                     float(values.min()), float(values.max())])  # fmt: skip
    return Table(
        f"{metric} over the replicates",
        ["model", "seeds", "mean", "sd", "min", "max"],
        rows,
        f"Seeds {config.seed} to {config.seed + config.seeds - 1}: each replicate draws its own "
        "initial weights and batch order on the same data (the other tables show the "
        f"seed-{config.seed} runs). The claims ledger pairs the models by seed.",
    )


def train_or_reuse(
    ctx: RunContext,
    names: Sequence[str],
    identity_of: Callable[[int, str], dict[str, Any]],
    train: Callable[[int, str, dict[str, Any]], dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """The records of the models ``names``, in order.

    A record is reused from ``runs.json`` where the same run (``identity_of(index, name)``)
    was made under this invocation's step limit
    (:func:`~hopfield.experiments.forecasting_common.reusable`); otherwise ``train(index, name,
    identity)`` returns it (with ``finished``) and the main process saves it in ``runs.json``
    (:func:`~hopfield.experiments.forecasting_common.save_run`, which deletes a finished run's
    checkpoints). Every process must call it alike.
    """
    runs: dict[str, Any] = ctx.load_json("runs.json") or {}
    for index, name in enumerate(names):
        identity = identity_of(index, name)
        if reusable(runs.get(name), identity, ctx):
            continue
        record = train(index, name, identity)
        save_run(
            ctx, runs, name, record, identity=identity, folder=run_folder(name),
            finished=record["finished"],
        )  # fmt: skip
    return {name: runs[name] for name in names}


def train_model(
    ctx: RunContext,
    name: str,
    model: nn.Module,
    collate: Callable[[Tensor], Any],
    loss_fn: Callable[[nn.Module, Any], Tensor],
    *,
    size: int,
    batch_size: int,
    epochs: int,
    lr_at: Callable[[int], float],
    seed: int,
    identity: Any,
    optimizer: str = "adamw",
    betas: tuple[float, float] = (0.9, 0.999),
    weight_decay: float = 0.0,
    grad_clip: float | None = None,
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
    eval_every: int = 0,
    count_fn: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """Train ``model`` for ``epochs`` epochs with :class:`hopfield.training.Trainer` in
    ``ctx.out_dir/runs/<name>/`` (log, a checkpoint after every epoch, ``run.json``).

    The run trains on several processes under ``torchrun`` (``batch_size`` is the global batch)
    and resumes from its newest checkpoint when ``run.json`` records the same ``identity`` (what
    defines the run, JSON-serialisable) and process count; otherwise it starts over. Each epoch
    is a permutation of the training set drawn from ``seed`` cut into full global batches (the
    incomplete last batch is dropped). Randomness (augmentation, masks) belongs in ``collate``
    and must come from the global torch RNG, which the checkpoints hold.

    Args:
        collate: ``collate(indices (b,) long) -> batch`` of CPU tensors for the micro-batch of
            training-set ``indices`` (moved to the model's device by the Trainer).
        loss_fn: ``loss_fn(model, batch) -> scalar``; it must call the ``model`` it is given
            (under several processes the DDP wrapper that averages the gradients).
        size: number of training examples.
        lr_at: learning rate of a 0-based epoch.
        optimizer, betas, weight_decay: Adam (coupled weight decay) or AdamW; weight decay
            applies to weights and normalisation gains, not to biases.
        evaluate: ``evaluate(model) -> metrics`` every ``eval_every`` epochs (``0``: never) and
            after the last (the same numbers on every process).
        count_fn: the terms ``loss_fn`` averages over in a batch, when their number varies
            (:class:`~hopfield.training.Trainer`'s ``count_fn``).

    Returns:
        ``{"epochs": [{"epoch", "loss", "lr", "seconds", **eval}], "seconds", "steps",
        "finished", "resumed_from", "processes"}``: per finished epoch the mean training loss,
        the learning rate and the training wall time (the slowest process's; evaluation and
        checkpoint excluded), all from the Trainer's log, so a resumed run reports every epoch;
        ``seconds`` is their sum plus the time of the trained part of an unfinished epoch.
        Afterwards ``model`` is in eval mode on the accelerator's device.
    """
    per_epoch = steps_per_epoch(size, batch_size)
    if per_epoch < 1:
        raise ConfigError(f"batch_size: {batch_size} exceeds the {size} training examples")
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
        eval_every="epoch",  # every epoch's training time; ``evaluate`` on its own period
        checkpoint_every="epoch",
    )
    folder = run_folder(name)
    checkpoints = {"identity": identity, "size": size, "processes": ctx.processes}
    resume = same_run(ctx, f"{folder}/run.json", checkpoints) == "same"
    clock, timing = EpochClock(), {"open": False}

    def timed_loss(model: nn.Module, batch: Any) -> Tensor:
        clock.start()
        timing["open"] = True
        return loss_fn(model, batch)

    def epoch_end(model: nn.Module) -> dict[str, float]:
        metrics = {"seconds": clock.lap()[0]}
        timing["open"] = False
        epoch = trainer.step // per_epoch  # the Trainer counts the step before evaluating
        if evaluate is not None and (epoch == epochs or (eval_every and epoch % eval_every == 0)):
            metrics.update(evaluate(model))
        return metrics

    trainer = Trainer(
        model,
        range(size),
        timed_loss,
        config,
        ctx.path(folder),
        collate_fn=lambda indices: collate(torch.as_tensor(indices, dtype=torch.long)),
        evaluate=epoch_end,
        schedule=lambda step: lr_at(step // per_epoch) / lr,
        count_fn=count_fn,
        progress=ctx.progress,
    )
    try:
        result = trainer.fit(resume=resume)
    finally:
        trainer.close()
    model.eval()  # on the accelerator's device: evaluations move their inputs there (device_of)
    history = [
        {"epoch": r["step"] // per_epoch, "loss": r["loss"], "lr": r["lr"], **r["eval"]}
        for r in result.log
        if "eval" in r
    ]
    unfinished = clock.lap()[0] if timing["open"] else 0.0
    return {
        "epochs": history,
        "seconds": sum(e["seconds"] for e in history) + unfinished,
        "steps": result.step,
        "finished": result.finished,
        "resumed_from": result.resumed_from,
        "processes": result.processes,
    }


def device_of(model: nn.Module) -> torch.device:
    """Where ``model``'s parameters are (after training: the accelerator's device)."""
    return next(model.parameters()).device


def _per_head(values: Tensor) -> list[float]:
    """Means over samples of ``values`` ``(B, H)``, one per head."""
    return [float(values[:, h].mean()) for h in range(values.shape[1])]


@torch.no_grad()
def head_statistics(z: Tensor) -> dict[str, Any]:
    """Effective rank and average angle (paper Def. D.2, degrees) of subspace tokens ``z``
    ``(B, H, N, p)``: per head (means over samples, ``"erank_heads"``, ``"angle_heads"``, H
    floats each) and their means over samples and heads (``"erank"``, ``"angle"``)."""
    erank = effective_rank(z)  # (B, H)
    angle = average_angle(z)  # (B, H)
    return {
        "erank": float(erank.mean()),
        "angle": float(angle.mean()),
        "erank_heads": _per_head(erank),
        "angle_heads": _per_head(angle),
    }


@torch.no_grad()
def trajectory_statistics(
    encoder: HyperSETEncoder, x0: Tensor, iterations: int
) -> list[dict[str, Any]]:
    """Per-iteration read-outs of a Hyper-SET run from ``x0`` ``(B, N, d)`` (spec §5).

    For each t = 1..iterations: mean and std over samples of ``E_ATTN`` and ``E_FF`` (state after
    the iteration, gain-free normalisation), the effective rank and the average angle (paper
    definition, degrees) of the normalised tokens of head 0, averaged over heads and per head
    (``"erank_heads"``, ``"angle_heads"``: H floats, Figs. 9-12), the full rank of head 0, and the
    mean and fraction negative of ``α_t`` and ``γ_t``.
    """
    states, steps = encoder.trajectory(x0, iterations)
    rows = []
    for t, (x, (alpha, gamma)) in enumerate(zip(states, steps, strict=True)):
        layer = encoder.layer_at(t, iterations)
        e_attn, e_ff = layer.energies(x)
        z = layer.subspace_tokens(x)  # (B, H, N, p)
        heads = head_statistics(z)
        full = torch.linalg.matrix_rank(z[:, 0].double()).double()
        rows.append(
            {
                "t": t + 1,
                "e_attn": float(e_attn.mean()),
                "e_attn_std": float(e_attn.std()) if len(e_attn) > 1 else 0.0,
                "e_ff": float(e_ff.mean()),
                "e_ff_std": float(e_ff.std()) if len(e_ff) > 1 else 0.0,
                "erank_head0": heads["erank_heads"][0],
                "erank": heads["erank"],
                "full_rank_head0": float(full.mean()),
                "angle_head0": heads["angle_heads"][0],
                "angle": heads["angle"],
                "alpha_mean": float(alpha.mean()),
                "alpha_negative": float((alpha < 0).double().mean()),
                "gamma_mean": float(gamma.mean()),
                "gamma_negative": float((gamma < 0).double().mean()),
                "erank_heads": heads["erank_heads"],
                "angle_heads": heads["angle_heads"],
            }
        )
    return rows


@torch.no_grad()
def subspace_trajectory(
    encoder: SubspaceEncoder, x0: Tensor, iterations: int
) -> list[dict[str, Any]]:
    """:func:`head_statistics` of the subspace tokens of ``X_0`` (the embedding, ``t = 0``) and
    of the states ``X_1..X_L`` of a run of ``iterations`` from ``x0`` ``(B, N, d)``; each state is
    projected by the layer that produced it (``X_0`` by the first). Rows ``{"t", "erank",
    "angle", "erank_heads", "angle_heads"}``."""
    _, states = cast(tuple[Tensor, list[Tensor]], encoder(x0, iterations, return_states=True))
    return [
        {"t": t, **head_statistics(encoder.layer_at(max(t - 1, 0), iterations).subspace_tokens(x))}
        for t, x in enumerate([x0, *states])
    ]


def fraction_non_increasing(values: Sequence[float]) -> float:
    """Fraction of consecutive differences that are ``<= 0`` (1.0 for fewer than two values)."""
    if len(values) < 2:
        return 1.0
    steps = [b - a for a, b in itertools.pairwise(values)]
    return sum(s <= 0 for s in steps) / len(steps)


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

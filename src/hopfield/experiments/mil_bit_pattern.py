"""``mil-bit-pattern``: the synthetic bit-pattern MIL task, test accuracy per pooling method.

Bags of random bit strings; positive bags hold one of a few fixed *signal* strings (see
:func:`hopfield.data.mil.make_bit_pattern_bags`). The task needs no data files, so it is a quick
check that every member of the Hopfield family can learn to single out one instance in a bag,
and how that degrades as bags grow. Not in the nonparametric paper's tables: the official code
has a ``bit_pattern.py`` (dense vs sparse), after the demonstration of Ramsauer et al.'s
``hopfield-layers``.

Every run trains through :func:`~hopfield.experiments.mil_common.train_mil_model`
(:class:`~hopfield.training.Trainer`: AdamW, cosine decay per step, gradient clipping 1.0, the
best validation accuracy's epoch restored; a training epoch drops its incomplete last batch,
none at the preset sizes). Finished runs are saved and not repeated; a stopped run resumes from
its Trainer checkpoint; under ``torchrun`` every process trains every run together
(:mod:`hopfield.experiments.mil_common`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from hopfield.data.mil import make_bit_pattern_bags
from hopfield.experiments.checks import check_int_items, check_ints, check_reals, config_errors
from hopfield.experiments.mil_common import (
    RunStore,
    check_methods,
    check_training,
    mean_pm_std,
    mil_training_config,
    torch_threads,
    train_mil_model,
)
from hopfield.experiments.registry import Experiment, register
from hopfield.experiments.results import Results, RunContext, Table, mean_std
from hopfield.models.mil import MILNet


@dataclass
class Config:
    """Settings of the bit-pattern task and the model."""

    bag_sizes: tuple[int, ...] = (16, 64)
    methods: tuple[str, ...] = (
        "dense",
        "sparse",
        "topk-20",
        "topk-50",
        "outeffhop",
        "linear",
        "random-features",
    )
    train_bags: int = 2048
    valid_bags: int = 256
    test_bags: int = 512
    num_bits: int = 8
    num_signals: int = 8
    signals_per_bag: int = 1
    embedding_size: int = 64
    num_heads: int = 4
    quantity: int = 2
    scale: float = 1.0
    epochs: int = 30
    batch_size: int = 64
    lr: float = 3e-3
    seeds: int = 5
    threads: int = 0
    seed: int = 0


PRESETS = {
    "tiny": Config(
        bag_sizes=(8,),
        methods=("dense", "sparse"),
        train_bags=64,
        valid_bags=16,
        test_bags=16,
        embedding_size=16,
        num_heads=2,
        epochs=2,
        batch_size=16,
        seeds=1,
        threads=1,
    ),
    "small": Config(train_bags=1024, test_bags=256, epochs=20, seeds=2, embedding_size=32),
    "paper": Config(),
}


def train_one(
    config: Config,
    ctx: RunContext,
    bag_size: int,
    method: str,
    seed: int,
    out_dir: str | os.PathLike[str],
) -> dict[str, Any]:
    """Test accuracy and AUC at the best-validation epoch of one run (trained in ``out_dir``),
    and how it trained (:meth:`~hopfield.experiments.mil_common.MILRun.record`)."""
    run_seed = config.seed + 1000 * seed + bag_size
    signals = None
    sets = []
    for offset, count in enumerate((config.train_bags, config.valid_bags, config.test_bags)):
        bags, signals = make_bit_pattern_bags(
            count,
            bag_size,
            num_bits=config.num_bits,
            num_signals=config.num_signals,
            signals_per_bag=config.signals_per_bag,
            seed=run_seed + offset,
            signals=signals,
        )
        sets.append(bags)
    train, valid, test = sets
    torch.manual_seed(run_seed)
    model = MILNet(
        config.num_bits,
        embedding_size=config.embedding_size,
        num_heads=config.num_heads,
        quantity=config.quantity,
        method=method,
        scale=config.scale,
        seed=run_seed,
    )
    training = mil_training_config(
        ctx,
        epochs=config.epochs,
        batch_size=config.batch_size,
        lr=config.lr,
        select_by="accuracy",
        seed=run_seed,
    )
    result = train_mil_model(model, train, {"valid": valid, "test": test}, out_dir, training)
    return {
        "accuracy": result.best["test_accuracy"],
        "auc": result.best["test_auc"],
        **result.record(),
    }


def check_config(config: Config) -> None:
    """:class:`ConfigError` naming the first field ``config`` cannot run with."""
    check_methods(config.methods)
    check_int_items("bag_sizes", config.bag_sizes)
    check_ints(config, "train_bags", "valid_bags", "test_bags", minimum=2)
    check_ints(config, "embedding_size", "num_heads", "quantity", "seeds")
    check_ints(config, "threads", minimum=0)
    check_reals(config, "scale", low=0.0, low_open=True)
    check_training(config.epochs, [config.batch_size], config.lr, 0.0)
    with config_errors():  # the data's own checks name its fields
        for bag_size in config.bag_sizes:
            make_bit_pattern_bags(
                2,
                bag_size,
                num_bits=config.num_bits,
                num_signals=config.num_signals,
                signals_per_bag=config.signals_per_bag,
            )


def run(config: Config, ctx: RunContext) -> Results:
    """Train every (bag size, method, seed); finished runs are saved and not repeated."""
    check_config(config)
    store = RunStore(ctx, config)
    runs = [
        (size, method, seed)
        for size in config.bag_sizes
        for method in config.methods
        for seed in range(config.seeds)
    ]
    with torch_threads(config.threads):
        for size, method, seed in ctx.track(runs, len(runs), "runs"):
            key = f"{size}/{method}/{seed}"
            if key not in store:
                store.add(key, train_one(config, ctx, size, method, seed, store.work_dir(key)))

    def accuracies(size: int, method: str) -> list[float]:
        return [store[f"{size}/{method}/{s}"]["accuracy"] for s in range(config.seeds)]

    table = Table(
        "Bit-pattern MIL: test accuracy",
        ["method", *(f"bag size {size}" for size in config.bag_sizes)],
        [
            [method, *(mean_pm_std(accuracies(size, method)) for size in config.bag_sizes)]
            for method in config.methods
        ],
        caption=(
            f"{config.num_bits}-bit instances, {config.num_signals} signal patterns, "
            f"{config.signals_per_bag} per positive bag; mean ± std over {config.seeds} seed(s)"
        ),
    )
    metrics = {
        f"accuracy/{method}/{size}": mean_std(accuracies(size, method))[0]
        for method in config.methods
        for size in config.bag_sizes
    }
    return Results(tables=[table], metrics=metrics)


register(
    Experiment(
        name="mil-bit-pattern",
        summary="Synthetic bit-pattern MIL: can each pooling method find the signal instance?",
        presets=PRESETS,
        run=run,
        check=check_config,
        paper="not in the papers' tables (official code bit_pattern.py; hopfield-layers demo)",
        tags=("mil",),
    )
)

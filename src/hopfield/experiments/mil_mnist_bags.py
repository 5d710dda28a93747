"""``mil-mnist-bags``: MIL on MNIST bags, test accuracy vs bag size (nonparametric paper, G.2).

A bag of ``M`` digit images is positive when it holds a 9 (exactly one, at a random position);
balanced signal / non-signal bags. The model (:class:`hopfield.models.mil.MILNet`) embeds the
images, pools them with a Hopfield pooling of each member of the model family (Dense, Sparse,
Top-K 20/50/80 %, Random features, Random mask, Linear, OutEffHop) and classifies the bag.
Reported: test accuracy at the best-validation epoch, mean ± std over seeds, per bag size
(Table 2 settings in the ``paper`` preset; Figure 3), and learning curves at one bag size
(Figure 4).

Images: the MNIST test split of the shared data (images 0-7999 make training and validation
bags, 8000-9999 test bags; validation bags use the last ``valid_image_fraction`` of the former),
or scikit-learn's digits (``source="digits"``). With ``--stand-in-data`` an absent MNIST test
split is replaced by random images of its shape.

Every run trains through :func:`~hopfield.experiments.mil_common.train_mil_model`
(:class:`~hopfield.training.Trainer`: AdamW, cosine decay per step, gradient clipping 1.0, the
best validation accuracy's epoch restored), with a checkpoint every ``checkpoint_every`` (the
``paper`` runs are long: a stopped run resumes from its last epoch). A training epoch drops its
incomplete last batch (``paper``: 4000 bags at batch 256 are 15 steps, the last 160 bags of each
epoch's permutation unused; the hand-written loop before it trained 16 steps, the last of 160
bags). Runs go to a pool of worker processes (one torch thread each) when ``workers`` allows, or
one after the other with every process of a ``torchrun`` job training each model together;
finished runs are saved and not repeated, a run cut by ``--max-steps`` resumes from its
checkpoint (:mod:`hopfield.experiments.mil_common`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hopfield.data import DataNotFoundError
from hopfield.data.mil import load_mnist_bag_pools, make_mnist_bags, stand_in_mnist_bag_pools
from hopfield.experiments.checks import (
    check_choice,
    check_int_items,
    check_ints,
    check_reals,
    config_errors,
)
from hopfield.experiments.mil_common import (
    RunStore,
    check_methods,
    check_training,
    mean_pm_std,
    mil_training_config,
    run_tasks,
    torch_threads,
    train_mil_model,
)
from hopfield.experiments.registry import ConfigError, Experiment, register
from hopfield.experiments.results import Results, RunContext, Table, mean_std
from hopfield.models.mil import MILNet
from hopfield.training import Period, TrainingConfig

PAPER_METHODS = (
    "dense",
    "sparse",
    "topk-20",
    "topk-50",
    "topk-80",
    "random-features",
    "random-mask-50",
    "linear",
    "outeffhop",
)


@dataclass
class Config:
    """Settings (``paper``: Table 2 of the nonparametric Hopfield paper)."""

    source: str = "mnist"
    bag_sizes: tuple[int, ...] = (5, 10, 20, 30, 50, 80, 100)
    methods: tuple[str, ...] = PAPER_METHODS
    train_pairs: int = 2000
    valid_pairs: int = 250
    test_pairs: int = 500
    valid_image_fraction: float = 0.15
    target: int = 9
    epochs: int = 150
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.0
    embedding_size: int = 256
    num_heads: int = 4
    head_size: int = 64
    scale: float = 0.1
    quantity: int = 2
    large_bag_quantity: int = 4
    large_bag_size: int = 100
    attention_dropout: float = 0.0
    dropout: float = 0.0
    seeds: int = 10
    curve_bag_size: int = 50
    checkpoint_every: Period = "epoch"
    workers: int = 0
    threads: int = 0
    seed: int = 0
    figures: bool = True


PRESETS = {
    "tiny": Config(
        source="digits",
        bag_sizes=(5, 10),
        methods=("dense", "sparse", "topk-50"),
        train_pairs=40,
        valid_pairs=10,
        test_pairs=20,
        epochs=2,
        batch_size=16,
        embedding_size=16,
        num_heads=2,
        head_size=8,
        seeds=1,
        curve_bag_size=10,
        checkpoint_every=0,
        workers=1,
        threads=1,
        figures=False,
    ),
    "small": Config(
        bag_sizes=(5, 20, 50, 100),
        train_pairs=300,
        valid_pairs=100,
        test_pairs=250,
        epochs=20,
        batch_size=64,
        embedding_size=64,
        head_size=16,
        seeds=2,
    ),
    "paper": Config(),
}


Pools = tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]

CURVES = ("train_loss", "train_accuracy", "valid_loss", "valid_accuracy", "test_accuracy")
"""The per-epoch curves saved for the runs at ``curve_bag_size`` (Figure 4)."""


@functools.lru_cache(maxsize=2)
def load_pools(source: str, data_dir: str | None, stand_in: bool) -> tuple[Pools, bool]:
    """The image pools of ``source`` and whether they are stand-ins: random images of the MNIST
    test split's shape when it is absent and ``stand_in`` allows (else
    :class:`~hopfield.data.DataNotFoundError`)."""
    try:
        return load_mnist_bag_pools(source, data_dir), False
    except DataNotFoundError:
        if not stand_in or source != "mnist":
            raise
        return stand_in_mnist_bag_pools(), True


@dataclass(frozen=True)
class RunTask:
    """One training run: bag size, method and seed, and where it trains."""

    config: Config
    ctx: RunContext
    bag_size: int
    method: str
    seed: int
    work_dir: Path

    @property
    def key(self) -> str:
        return _key(self.bag_size, self.method, self.seed)


def train_one(task: RunTask) -> dict[str, Any]:
    """One training run -> its test accuracy and AUC at the best validation epoch, how it trained
    (:meth:`~hopfield.experiments.mil_common.MILRun.record`) and, at ``curve_bag_size``, its
    per-epoch curves."""
    config, ctx, bag_size = task.config, task.ctx, task.bag_size
    data_dir = str(ctx.data_dir) if ctx.data_dir is not None else None
    (pool_x, pool_y), (test_x, test_y) = load_pools(config.source, data_dir, ctx.stand_in_data)[0]
    cut = round(pool_x.shape[0] * (1 - config.valid_image_fraction))
    run_seed = config.seed + 1000 * task.seed + bag_size
    common = {"bag_size": bag_size, "target": config.target}
    train = make_mnist_bags(pool_x[:cut], pool_y[:cut], config.train_pairs, seed=run_seed, **common)
    valid = make_mnist_bags(
        pool_x[cut:], pool_y[cut:], config.valid_pairs, seed=run_seed + 1, **common
    )
    test = make_mnist_bags(test_x, test_y, config.test_pairs, seed=run_seed + 2, **common)
    torch.manual_seed(run_seed)
    quantity = config.large_bag_quantity if bag_size >= config.large_bag_size else config.quantity
    model = MILNet(
        train.num_features,
        embedding_size=config.embedding_size,
        num_heads=config.num_heads,
        head_size=config.head_size,
        quantity=quantity,
        method=task.method,
        scale=config.scale,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        seed=run_seed,
    )
    training = mil_training_config(
        ctx,
        epochs=config.epochs,
        batch_size=config.batch_size,
        lr=config.lr,
        weight_decay=config.weight_decay,
        select_by="accuracy",
        seed=run_seed,
        checkpoint_every=config.checkpoint_every,
    )
    result = train_mil_model(model, train, {"valid": valid, "test": test}, task.work_dir, training)
    out: dict[str, Any] = {
        "test_accuracy": result.best["test_accuracy"],
        "test_auc": result.best["test_auc"],
        **result.record(),
    }
    if bag_size == config.curve_bag_size:
        out["curves"] = {name: result.curves.get(name, []) for name in CURVES}
    return out


def _key(bag_size: int, method: str, seed: int) -> str:
    return f"{bag_size}/{method}/{seed}"


def check_config(config: Config) -> None:
    """:class:`ConfigError` naming the first field ``config`` cannot run with."""
    check_choice("source", config.source, ("mnist", "digits"))
    check_methods(config.methods)
    check_int_items("bag_sizes", config.bag_sizes)
    check_ints(config, "train_pairs", "valid_pairs", "test_pairs", "embedding_size", "num_heads")
    check_ints(config, "head_size", "quantity", "large_bag_quantity", "seeds")
    check_ints(config, "workers", "threads", minimum=0)
    check_ints(config, "target", minimum=0)
    if config.target > 9:
        raise ConfigError(f"target must be a digit 0..9, got {config.target}")
    check_reals(config, "valid_image_fraction", low=0.0, high=1.0, low_open=True, high_open=True)
    check_reals(config, "dropout", "attention_dropout", low=0.0, high=1.0, high_open=True)
    check_reals(config, "scale", low=0.0, low_open=True)
    check_training(config.epochs, [config.batch_size], config.lr, config.weight_decay)
    with config_errors():
        TrainingConfig(epochs=1, checkpoint_every=config.checkpoint_every)


def run(config: Config, ctx: RunContext) -> Results:
    """Train every (bag size, method, seed), resuming from the runs already saved."""
    check_config(config)
    data_dir = str(ctx.data_dir) if ctx.data_dir is not None else None
    # fail early (DataNotFoundError) when the images are absent and no stand-in is allowed
    stand_in = load_pools(config.source, data_dir, ctx.stand_in_data)[1]
    store = RunStore(ctx, config)
    tasks = [
        RunTask(config, ctx, size, method, seed, store.work_dir(key))
        for size in config.bag_sizes
        for method in config.methods
        for seed in range(config.seeds)
        if (key := _key(size, method, seed)) not in store
    ]
    with torch_threads(config.threads):
        done = run_tasks(train_one, tasks, config.workers)
        for task, result in ctx.track(done, len(tasks), "runs"):
            store.add(task.key, result)

    def accuracies(size: int, method: str) -> list[float]:
        return [store[_key(size, method, s)]["test_accuracy"] for s in range(config.seeds)]

    rows = [
        [method, *(mean_pm_std(accuracies(size, method)) for size in config.bag_sizes)]
        for method in config.methods
    ]
    metrics = {
        f"accuracy/{method}/{size}": mean_std(accuracies(size, method))[0]
        for method in config.methods
        for size in config.bag_sizes
    }
    tables = [
        Table(
            "Test accuracy vs bag size (MNIST bags, target digit 9)",
            ["method", *(f"M={size}" for size in config.bag_sizes)],
            rows,
            caption=(
                f"{config.source} images; mean ± std over {config.seeds} seed(s); accuracy at the "
                "best-validation epoch. The paper gives this only as a plot (Figure 3): Dense, "
                "Linear and Random masked lose accuracy with larger bags, Sparse and Top-K keep it."
            ),
        ),
        _settings_table(config),
    ]
    notes = _trend_notes(config, accuracies)
    if stand_in:
        notes.append(
            "STAND-IN DATA (--stand-in-data): the MNIST test split is absent; the bags were made "
            "of random images with random digit labels; these numbers mean nothing."
        )
    results = Results(tables=tables, metrics=metrics, notes=notes)
    if config.figures:
        results.figures = _figures(config, store, ctx, accuracies)
    return results


def _settings_table(config: Config) -> Table:
    paper = PRESETS["paper"]
    names = [
        ("batch size", "batch_size"),
        ("learning rate", "lr"),
        ("embedding dimension", "embedding_size"),
        ("number of heads", "num_heads"),
        ("head dimension", "head_size"),
        ("train set size (pairs)", "train_pairs"),
        ("test set size (pairs)", "test_pairs"),
        ("scaling", "scale"),
        ("number of patterns", "quantity"),
        ("epochs", "epochs"),
    ]
    return Table(
        "Hyper-parameters (paper Table 2 beside this run)",
        ["parameter", "this run", "paper"],
        [[label, getattr(config, name), getattr(paper, name)] for label, name in names],
    )


def _trend_notes(config: Config, accuracies: Any) -> list[str]:
    """The paper's Figure 3 claim checked per bag size: Sparse and Top-K above Dense."""
    if len(config.bag_sizes) < 2:
        return []
    mean = {
        (m, size): mean_std(accuracies(size, m))[0]
        for m in config.methods
        for size in config.bag_sizes
    }
    small, large = min(config.bag_sizes), max(config.bag_sizes)
    notes = [
        f"accuracy drop from M={small} to M={large}: "
        + ", ".join(f"{m} {mean[m, small] - mean[m, large]:+.3f}" for m in config.methods)
    ]
    sparse_like = [m for m in config.methods if m == "sparse" or m.startswith("topk")]
    if "dense" not in config.methods or not sparse_like:
        return notes
    for size in sorted(config.bag_sizes)[1:]:
        gaps = {m: mean[m, size] - mean["dense", size] for m in sparse_like}
        verdict = "observed" if all(g > 0 for g in gaps.values()) else "NOT observed"
        notes.append(
            f"M={size}: accuracy minus Dense's: "
            + ", ".join(f"{m} {g:+.3f}" for m, g in gaps.items())
            + f"; paper trend (Sparse and Top-K above Dense for larger bags) {verdict}"
        )
    return notes


def _figures(config: Config, store: RunStore, ctx: RunContext, accuracies: Any) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for method in config.methods:
        stats = [mean_std(accuracies(size, method)) for size in config.bag_sizes]
        mean = torch.tensor([s[0] for s in stats])
        std = torch.tensor([s[1] for s in stats])
        ax.plot(config.bag_sizes, mean, marker="o", label=method)
        ax.fill_between(config.bag_sizes, mean - std, mean + std, alpha=0.15)
    ax.set(xlabel="bag size (memory size M)", ylabel="test accuracy", title="MNIST bags")
    ax.legend(fontsize=7)
    fig.tight_layout()
    ctx.save_figure(fig, "accuracy_vs_bag_size.png", dpi=120)
    files = ["accuracy_vs_bag_size.png"]
    if config.curve_bag_size not in config.bag_sizes:
        return files
    fig, axes = plt.subplots(2, 2, figsize=(9, 6), sharex=True)
    panels = [
        ("train_loss", "train loss"),
        ("train_accuracy", "train accuracy"),
        ("valid_loss", "validation loss"),
        ("valid_accuracy", "validation accuracy"),
    ]
    for method in config.methods:
        runs = [
            store[_key(config.curve_bag_size, method, s)]["curves"] for s in range(config.seeds)
        ]
        for ax, (name, label) in zip(axes.flat, panels, strict=True):
            curve = torch.tensor([r[name] for r in runs]).mean(dim=0)
            ax.plot(range(1, len(curve) + 1), curve, label=method)
            ax.set(ylabel=label)
    for ax in axes[1]:
        ax.set(xlabel="epoch")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"Learning curves at bag size {config.curve_bag_size} (mean over seeds)")
    fig.tight_layout()
    ctx.save_figure(fig, "learning_curves.png", dpi=120)
    return [*files, "learning_curves.png"]


register(
    Experiment(
        name="mil-mnist-bags",
        summary="MIL on MNIST bags: test accuracy vs bag size for the Hopfield model family",
        presets=PRESETS,
        run=run,
        check=check_config,
        paper="Nonparametric Hopfield (Hu et al. 2025), Table 2 settings, Figures 3-4",
        tags=("mil", "nonparametric"),
    )
)

"""Experiment ``convergence``: Dense vs Sparse vs OutEffHop Hopfield layers in a small ViT.

OutEffHop (Hu et al., 2024), App. D.2 "faster convergence" (Figure 7 of the ICML/arXiv version,
Figure 6 of the workshop version) with the hyper-parameters of its Table 3: a ViT whose attention
is a Hopfield layer (:class:`hopfield.models.vision.VisionHopfield`) with the separation map

* ``dense``: softmax (Ramsauer et al., 2020),
* ``sparse``: sparsemax (Hu et al., 2023),
* ``outeffhop``: Softmax_1 (OutEffHop),

trained with Adam and a cosine learning-rate schedule; per epoch we record the mean training loss
and the test loss and accuracy, for each model and seed (mean ± std over seeds). The paper shows
curves only (no numbers); its claim is that OutEffHop converges faster. We measure "faster" by the
mean test accuracy over the epochs (the area under the accuracy curve) and by the first epoch at
which a model reaches 95 % of the best final accuracy of all models.

Training uses :class:`hopfield.training.Trainer` (one run folder per dataset, model and seed
below ``out_dir/runs``) with a checkpoint at the end of every epoch: a stopped run continues from
its last finished epoch, and ``until_epoch`` splits a long run into several invocations (it is no
setting of the run: the next invocation, without it or with a larger one, continues). A run
folder's ``settings.json`` records what defines its run (settings, data); a folder whose record
differs starts over. ``batch_size`` is the global batch (images per optimiser step over all
processes); under ``torchrun`` every process trains on its share of each batch and evaluates the
whole test set (identical numbers), and only the main process writes files.

Datasets: ``digits`` (tiny preset, always present), ``fashion-mnist`` (Debian package
``dataset-fashion-mnist`` or ``images/fashion-mnist/`` below the data root), ``cifar10`` and ``cifar100`` when
present. Datasets that are absent are skipped with a note; if none is present the run fails with
:class:`hopfield.data.DataNotFoundError`. With ``hopfield run --stand-in-data`` an absent dataset
is replaced by random images of its shapes (:func:`hopfield.data.images.stand_in_images`, as many
as the real split or ``train_size``/``test_size``), with a note.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from hopfield.data.files import DataNotFoundError
from hopfield.data.images import IMAGE_DATASETS, load_image_dataset, stand_in_images
from hopfield.experiments.checks import check_choice, check_ints, check_reals, check_subset
from hopfield.experiments.outliers_tasks import same_run
from hopfield.experiments.registry import ConfigError, Experiment, register
from hopfield.experiments.results import Results, RunContext, Table, mean_std
from hopfield.functional import Separation, Softmax, SoftmaxN, Sparsemax
from hopfield.models.vision import VisionHopfield, vision_hopfield_parameters
from hopfield.training import SCHEDULES, Trainer

__all__ = ["MODELS", "PAPER_TABLE3", "PRESETS", "Config", "build_model", "run"]

MODELS: dict[str, tuple[str, Callable[[], Separation]]] = {
    "dense": ("Dense (Softmax)", Softmax),
    "sparse": ("Sparse (Sparsemax)", Sparsemax),
    "outeffhop": ("OutEffHop (Softmax_1)", lambda: SoftmaxN(1.0)),
}
"""Model key -> (label, factory of its separation map)."""

PAPER_TABLE3: dict[str, Any] = {
    "lr": 1e-4,
    "embed_dim": 512,
    "mlp_dim": 1024,
    "dropout": 0.3,
    "activation": "GELU",
    "epochs": 100,
    "batch_size": 512,
    "optimizer": "Adam",
    "patch_size": 32,
}
"""OutEffHop Table 3 (hyper-parameters of the convergence study), transcribed."""

REACH_FRACTION = 0.95
"""``epochs to 95 %``: first epoch whose test accuracy reaches this fraction of the best final one."""


@dataclass
class Config:
    """Configuration of the convergence experiment.

    Attributes:
        seed: first seed; ``seeds`` runs use ``seed, seed + 1, ...`` (model initialisation,
            dropout and data order).
        seeds: runs per model (mean ± std over them).
        datasets: image datasets to train on (absent ones are skipped with a note).
        models: keys of :data:`MODELS`.
        train_size, test_size: use a random subset of this size (0 = the whole split); the
            subset depends on ``seed`` only, so every model sees the same images.
        epochs, batch_size, lr, schedule: training (Adam, i.e. no weight decay; the schedule of
            :mod:`hopfield.training` without warm-up); the incomplete last batch is dropped.
        patch_size, embed_dim, num_heads, mlp_dim, depth, dropout: the ViT.
        until_epoch: stop every run after this epoch (0 = train to ``epochs``). It only limits
            the sitting (as ``--max-steps`` does) and is no setting of the run: the same command
            with a larger ``until_epoch`` or without it continues every run from its checkpoint
            (no ``--overwrite`` needed; ``--overwrite`` is for other settings).
    """

    seed: int = 0
    seeds: int = 1
    datasets: tuple[str, ...] = ("fashion-mnist",)
    models: tuple[str, ...] = ("dense", "sparse", "outeffhop")
    train_size: int = 0
    test_size: int = 0
    epochs: int = 10
    batch_size: int = 128
    lr: float = 1e-3
    schedule: str = "cosine"
    patch_size: int = 7
    embed_dim: int = 64
    num_heads: int = 4
    mlp_dim: int = 128
    depth: int = 3
    dropout: float = 0.1
    until_epoch: int = 0

    def __post_init__(self) -> None:
        """:class:`ConfigError` naming the first field the experiment cannot run with."""
        self.datasets = tuple(self.datasets)
        self.models = tuple(self.models)
        check_subset("models", self.models, tuple(MODELS))
        check_subset("datasets", self.datasets, tuple(IMAGE_DATASETS))
        check_choice("schedule", self.schedule, SCHEDULES)
        check_ints(
            self,
            "seeds",
            "epochs",
            "batch_size",
            "patch_size",
            "embed_dim",
            "num_heads",
            "mlp_dim",
            "depth",
        )
        check_ints(self, "train_size", "test_size", "until_epoch", minimum=0)
        check_reals(self, "lr", low=0.0, low_open=True)
        check_reals(self, "dropout", low=0.0, high=1.0, high_open=True)
        if self.embed_dim % self.num_heads:
            raise ConfigError(
                f"embed_dim ({self.embed_dim}) must be divisible by num_heads ({self.num_heads})"
            )
        if 0 < self.train_size < self.batch_size:
            raise ConfigError(
                f"batch_size ({self.batch_size}) must not exceed train_size ({self.train_size})"
            )


PRESETS = {
    "tiny": Config(
        datasets=("digits",),
        train_size=384,
        epochs=2,
        batch_size=64,
        lr=1e-2,
        patch_size=4,
        embed_dim=16,
        num_heads=2,
        mlp_dim=32,
        depth=1,
        dropout=0.0,
    ),
    "small": Config(
        datasets=("fashion-mnist",),
        seeds=2,
        train_size=6000,
        test_size=2000,
        epochs=8,
        batch_size=128,
        lr=1e-3,
        patch_size=7,
        embed_dim=64,
        num_heads=4,
        mlp_dim=128,
        depth=3,
        dropout=0.1,
    ),
    "paper": Config(
        datasets=("fashion-mnist", "cifar10", "cifar100"),
        seeds=3,
        epochs=100,
        batch_size=512,
        lr=1e-4,
        patch_size=32,
        embed_dim=512,
        num_heads=4,
        mlp_dim=1024,
        depth=3,
        dropout=0.3,
    ),
}


def build_model(
    config: Config, model: str, image_size: int, in_channels: int, num_classes: int
) -> VisionHopfield:
    """The ViT of ``config`` with the separation map of ``MODELS[model]``."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {model!r}")
    return VisionHopfield(
        image_size,
        in_channels,
        num_classes,
        patch_size=config.patch_size,
        embed_dim=config.embed_dim,
        num_heads=config.num_heads,
        mlp_dim=config.mlp_dim,
        depth=config.depth,
        separation=MODELS[model][1](),
        dropout=config.dropout,
    )


# --- data -------------------------------------------------------------------------------------


@dataclass
class _Data:
    train: tuple[Tensor, Tensor]
    test: tuple[Tensor, Tensor]
    num_classes: int
    source: str  # the dataset, or what stands in for it


def _subset(images: Tensor, labels: Tensor, size: int, seed: int) -> tuple[Tensor, Tensor]:
    if size == 0 or size >= len(labels):
        return images, labels
    keep = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))[:size]
    return images[keep], labels[keep]


def _stand_in(name: str, config: Config, missing: DataNotFoundError) -> _Data:
    """Random images of ``name``'s shapes and classes: ``train_size``/``test_size`` of them (0:
    as many as the real split)."""
    train = stand_in_images(name, "train", count=config.train_size or None)
    test = stand_in_images(name, "test", count=config.test_size or None)
    return _Data(
        train=train.tensors(),
        test=test.tensors(),
        num_classes=train.classes,
        source=f"STAND-IN random images of {name}'s shapes ({missing})",
    )


def _load(name: str, config: Config, ctx: RunContext) -> _Data:
    try:
        train = load_image_dataset(name, "train", ctx.data_dir)
        test = load_image_dataset(name, "test", ctx.data_dir)
    except DataNotFoundError as missing:
        if not ctx.stand_in_data:
            raise
        data = _stand_in(name, config, missing)
    else:
        train = _subset(*train, config.train_size, config.seed)
        test = _subset(*test, config.test_size, config.seed + 1)
        num_classes = int(max(train[1].max(), test[1].max())) + 1
        data = _Data(train=train, test=test, num_classes=num_classes, source=name)
    images = data.train[0]
    if images.shape[2] != images.shape[3]:
        raise ValueError(f"{name}: images must be square, got {tuple(images.shape[2:])}")
    if len(images) < config.batch_size:
        raise ConfigError(
            f"batch_size ({config.batch_size}) exceeds the {len(images)} training images of {name}"
        )
    return data


class _Pairs:
    """``(image, label)`` examples of two tensors, for :class:`~hopfield.training.Trainer`."""

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.images[i], self.labels[i]


def _loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def _evaluator(
    images: Tensor, labels: Tensor, batch_size: int
) -> Callable[[nn.Module], dict[str, float]]:
    def evaluate(model: nn.Module) -> dict[str, float]:
        device = next(model.parameters()).device
        loss, correct = 0.0, 0
        for start in range(0, len(labels), batch_size):
            x = images[start : start + batch_size].to(device)
            y = labels[start : start + batch_size].to(device)
            logits = model(x)
            loss += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(-1) == y).sum())
        return {"test_loss": loss / len(labels), "test_accuracy": correct / len(labels)}

    return evaluate


# --- one training run -------------------------------------------------------------------------

_RUN_FIELDS = (
    "train_size",
    "test_size",
    "epochs",
    "batch_size",
    "lr",
    "schedule",
    "patch_size",
    "embed_dim",
    "num_heads",
    "mlp_dim",
    "depth",
    "dropout",
)


def _train(
    config: Config, ctx: RunContext, data: _Data, dataset: str, model_key: str, seed: int
) -> dict[str, Any]:
    """Train one model; returns its per-epoch curves and whether it reached ``epochs``."""
    folder = f"runs/{dataset}-{model_key}-seed{seed}"
    run_dir = ctx.path(folder)
    settings: dict[str, Any] = {name: getattr(config, name) for name in _RUN_FIELDS}
    settings.update(seed=seed, subset_seed=config.seed)  # the subsets are drawn with config.seed
    settings.update(data=data.source)
    state = same_run(ctx, f"{folder}/settings.json", settings)

    images, labels = data.train
    steps_per_epoch = len(labels) // config.batch_size
    torch.manual_seed(seed)
    model = build_model(config, model_key, images.shape[-1], images.shape[1], data.num_classes)
    training = ctx.training_config(
        max_steps=config.epochs * steps_per_epoch,
        batch_size=config.batch_size,
        lr=config.lr,
        weight_decay=0.0,
        schedule=config.schedule,
        grad_clip=None,
        seed=seed,
        checkpoint_every=steps_per_epoch,
        log_every=steps_per_epoch,
        eval_every=steps_per_epoch,
        cpu=not torch.cuda.is_available(),
    )
    trainer = Trainer(
        model,
        _Pairs(images, labels),
        _loss,
        training,
        run_dir,
        evaluate=_evaluator(*data.test, max(config.batch_size, 256)),
        progress=ctx.progress,
    )
    until = config.until_epoch * steps_per_epoch if config.until_epoch else None
    result = trainer.fit(resume=state == "same", until_step=until)
    trainer.close()
    records = [r for r in result.log if "eval" in r]
    return {
        "train_loss": [r["loss"] for r in records],
        "test_loss": [r["eval"]["test_loss"] for r in records],
        "test_accuracy": [r["eval"]["test_accuracy"] for r in records],
        "finished": result.finished,
        "steps": result.step,
        "processes": result.processes,
        "restarted": state == "changed",
    }


# --- summaries --------------------------------------------------------------------------------


def _cell(values: list[float]) -> float | str | None:
    if not values:
        return None
    mean, std = mean_std(values)
    return mean if len(values) == 1 else f"{mean:.4g} ± {std:.2g}"


def _epochs_to_reach(curve: list[float], target: float) -> int | None:
    return next((i + 1 for i, acc in enumerate(curve) if acc >= target), None)


def _summarise(
    dataset: str, runs: dict[str, list[dict[str, Any]]], epochs: int
) -> tuple[Table, Table, dict[str, float]]:
    finals = [r["test_accuracy"][-1] for rs in runs.values() for r in rs if r["test_accuracy"]]
    target = REACH_FRACTION * max(finals) if finals else math.inf
    rows, metrics = [], {}
    for key, rs in runs.items():
        done = [r for r in rs if r["test_accuracy"]]
        final_acc = [r["test_accuracy"][-1] for r in done]
        area = [sum(r["test_accuracy"]) / len(r["test_accuracy"]) for r in done]
        reach = [_epochs_to_reach(r["test_accuracy"], target) for r in done]
        reached = [float(e) for e in reach if e is not None]
        summary = {
            "first_train_loss": [r["train_loss"][0] for r in done],
            "final_train_loss": [r["train_loss"][-1] for r in done],
            "final_test_loss": [r["test_loss"][-1] for r in done],
            "final_test_accuracy": final_acc,
            "mean_test_accuracy": area,
        }
        for name, values in summary.items():
            if values:
                metrics[f"{dataset}/{key}/{name}"] = mean_std(values)[0]
        rows.append(
            [
                MODELS[key][0],
                len(done),
                min((len(r["test_accuracy"]) for r in done), default=0),
                *(_cell(v) for v in summary.values()),
                _cell(reached)
                if len(reached) == len(done)
                else f"not reached in {len(reach) - len(reached)} run(s)",
                "curves only (Fig. 7)",
            ]
        )
    summary_table = Table(
        name=f"Convergence on {dataset}",
        columns=[
            "model",
            "seeds",
            "epochs",
            "train loss ep. 1",
            "final train loss",
            "final test loss",
            "final test acc.",
            "mean test acc. over epochs",
            f"epochs to {REACH_FRACTION:.0%} of best final acc.",
            "paper",
        ],
        rows=rows,
        caption=(
            "Mean (± std over seeds). 'mean test acc. over epochs' is the area under the accuracy "
            "curve (higher = faster convergence). The paper reports curves, no numbers."
        ),
    )
    curve_rows = []
    for epoch in range(epochs):
        row: list[Any] = [epoch + 1]
        for rs in runs.values():
            for metric in ("train_loss", "test_loss", "test_accuracy"):
                values = [r[metric][epoch] for r in rs if len(r[metric]) > epoch]
                row.append(_cell(values))
        if any(c is not None for c in row[1:]):
            curve_rows.append(row)
    curves_table = Table(
        name=f"Curves on {dataset}",
        columns=["epoch"]
        + [
            f"{key} {metric}" for key in runs for metric in ("train loss", "test loss", "test acc.")
        ],
        rows=curve_rows,
        caption="Per epoch: mean training loss over the epoch, test loss and test accuracy after it.",
    )
    return summary_table, curves_table, metrics


def _claim_note(dataset: str, runs: dict[str, list[dict[str, Any]]]) -> str | None:
    """Whether OutEffHop has the highest mean test accuracy over epochs, beyond the seed spread."""
    areas = {
        key: [sum(r["test_accuracy"]) / len(r["test_accuracy"]) for r in rs if r["test_accuracy"]]
        for key, rs in runs.items()
    }
    if "outeffhop" not in areas or len(areas) < 2 or not all(areas.values()):
        return None
    stats = {key: mean_std(values) for key, values in areas.items()}
    best = max(stats, key=lambda k: stats[k][0])
    rival = max((k for k in stats if k != "outeffhop"), key=lambda k: stats[k][0])
    gap = stats["outeffhop"][0] - stats[rival][0]
    spread = max(stats["outeffhop"][1], stats[rival][1])
    if best == "outeffhop" and gap > spread > 0:
        verdict = "holds"
    elif abs(gap) <= spread:
        verdict = "no clear difference (within one std over seeds)"
    elif best == "outeffhop":
        verdict = "holds in this single seed"
    else:
        verdict = "not reproduced"
    listed = ", ".join(f"{k} {m:.4f} ± {sd:.4f}" for k, (m, sd) in stats.items())
    return (
        f"{dataset}: paper claim 'OutEffHop converges faster', by the mean test accuracy over the "
        f"epochs ({listed}): fastest here {MODELS[best][0]}; OutEffHop minus the best other model "
        f"({MODELS[rival][0]}) = {gap:+.4f}; claim: {verdict} at this scale."
    )


def _hyperparameter_table(config: Config, parameters: dict[str, int]) -> Table:
    ours: dict[str, Any] = {
        "lr": config.lr,
        "embed_dim": config.embed_dim,
        "mlp_dim": config.mlp_dim,
        "dropout": config.dropout,
        "activation": "GELU",
        "epochs": config.epochs,
        "batch_size": config.batch_size,
        "optimizer": f"Adam ({config.schedule} schedule)",
        "patch_size": config.patch_size,
    }
    rows = [[name, PAPER_TABLE3[name], ours[name]] for name in PAPER_TABLE3]
    rows += [
        ["blocks / heads", "3 / 4 (authors' code)", f"{config.depth} / {config.num_heads}"],
        ["seeds", "3 (authors' code)", config.seeds],
    ]
    rows += [[f"parameters ({name})", None, count] for name, count in parameters.items()]
    return Table(
        name="Table 3: hyper-parameters",
        columns=["hyper-parameter", "paper", "this run"],
        rows=rows,
        caption="OutEffHop Table 3 beside the configuration of this run.",
    )


def _figure(ctx: RunContext, curves: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = (
        ("loss", (("train_loss", "-", "train"), ("test_loss", "--", "test"))),
        ("test accuracy", (("test_accuracy", "-", ""),)),
    )
    fig, axes = plt.subplots(len(curves), 2, figsize=(10, 3.6 * len(curves)), squeeze=False)
    for row, (dataset, runs) in enumerate(curves.items()):
        for col, (label, lines) in enumerate(panels):
            ax = axes[row][col]
            for index, (key, rs) in enumerate(runs.items()):
                color = f"C{index}"
                for metric, style, suffix in lines:
                    length = min((len(r[metric]) for r in rs), default=0)
                    if length == 0:
                        continue
                    values = torch.tensor([r[metric][:length] for r in rs], dtype=torch.float64)
                    mean = values.mean(0)
                    std = values.std(0) if len(rs) > 1 else torch.zeros_like(mean)
                    epochs = torch.arange(1, length + 1)
                    name = f"{MODELS[key][0]} {suffix}".strip()
                    ax.plot(epochs, mean, style, color=color, marker="o", markersize=3, label=name)
                    ax.fill_between(epochs, mean - std, mean + std, color=color, alpha=0.2)
            ax.set_title(f"{dataset}: {label}")
            ax.set_xlabel("epoch")
            ax.set_ylabel(label)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
    fig.tight_layout()
    name = "convergence.png"
    ctx.save_figure(fig, name, dpi=120)
    return name


# --- the experiment ---------------------------------------------------------------------------


def run(config: Config, ctx: RunContext) -> Results:
    """Train every model on every present dataset; tables, metrics and the Figure-7-style plot."""
    if not isinstance(config, Config):
        raise TypeError(f"config must be a convergence Config, got {type(config).__name__}")
    ctx.save_json("config.json", asdict(config))
    loaded: dict[str, _Data] = {}
    missing: list[DataNotFoundError] = []
    notes: list[str] = []
    for name in config.datasets:
        try:
            loaded[name] = _load(name, config, ctx)
        except DataNotFoundError as error:
            missing.append(error)
            notes.append(f"{name} skipped: {error}")
            continue
        if loaded[name].source != name:
            notes.append(
                f"{name}: trained and evaluated on {loaded[name].source} (hopfield run "
                "--stand-in-data): its numbers only show that the recipe runs."
            )
    if not loaded:
        raise missing[0]

    curves: dict[str, dict[str, list[dict[str, Any]]]] = {}
    parameters: dict[str, int] = {}
    jobs = [
        (d, m, config.seed + k) for d in loaded for m in config.models for k in range(config.seeds)
    ]
    for dataset, key, seed in ctx.track(jobs, total=len(jobs), desc="convergence"):
        data = loaded[dataset]
        result = _train(config, ctx, data, dataset, key, seed)
        if result["restarted"]:
            notes.append(
                f"{dataset}/{key}/seed {seed}: the settings differ from the earlier run in its "
                "folder; trained from scratch."
            )
        if not result["finished"]:
            notes.append(
                f"{dataset}/{key}/seed {seed}: stopped after step {result['steps']} (epoch "
                f"{len(result['test_accuracy'])} of {config.epochs}; until_epoch or hopfield run "
                "--max-steps); the same command without them (or with larger ones) continues "
                "from the checkpoint."
            )
        curves.setdefault(dataset, {}).setdefault(key, []).append(result)
        images = data.train[0]
        parameters[dataset] = vision_hopfield_parameters(
            images.shape[-1],
            images.shape[1],
            data.num_classes,
            patch_size=config.patch_size,
            embed_dim=config.embed_dim,
            mlp_dim=config.mlp_dim,
            depth=config.depth,
        )
    ctx.save_json("curves.json", curves)

    tables = [_hyperparameter_table(config, parameters)]
    metrics: dict[str, float] = {}
    for dataset, runs in curves.items():
        summary, per_epoch, found = _summarise(dataset, runs, config.epochs)
        tables += [summary, per_epoch]
        metrics.update(found)
        note = _claim_note(dataset, runs)
        if note:
            notes.append(note)
    if config.patch_size >= min(d.train[0].shape[-1] for d in loaded.values()):
        notes.append(
            f"patch_size {config.patch_size} covers the whole image: one patch plus the class "
            "token, so each Hopfield layer associates two tokens (the paper's Table 3 setting on "
            "32x32 CIFAR images)."
        )
    return Results(tables=tables, metrics=metrics, figures=[_figure(ctx, curves)], notes=notes)


register(
    Experiment(
        name="convergence",
        summary="Dense vs Sparse vs OutEffHop Hopfield layers in a small ViT: loss/accuracy per epoch",
        presets=PRESETS,
        run=run,
        paper="OutEffHop (Hu et al., 2024) Table 3 / Figure 7 (workshop Figure 6)",
        tags=("outeffhop", "training"),
    )
)

"""``hyperset-images``: Hyper-SET vs a weight-shared Transformer on image classification (§5.2).

Models (spec §4.2): a patch grid with a CLS token and fixed sinusoidal positions; Hyper-SET at
the Transformer's width ("Small", about half the parameters) and at a larger width ("Scale-up",
about the Transformer's parameters), one layer × L iterations; the Transformer is a pre-LayerNorm
layer applied L times. Training follows Table 8 (Adam, coupled weight decay 5e-5, warm-up then
cosine from 1e-3 to 1e-5, label smoothing 0.1, random-crop augmentation). Optional parts of the
paper in the same layout: the alternative designs of Table 3, the layer–iteration trade-off of
Fig. 4 (K distinct layers × L/K iterations), depth-wise LoRA ranks (Table 4) and the scaled-up
models of Table 20 (``<base>-d<width>``). The baselines beside the Transformer are CRATE, CRATE-T
and the Energy Transformer (``"et"``, :mod:`hopfield.models.energy_transformer`). The Hyper-SET
energy / effective-rank / angle trajectories on test images (Figs. 5-6, bottom) are reported too,
per head as figures (Figs. 11-12), with the token evolution of one test image (Fig. 1). With
``contrast`` the App. F.3 comparison (Figs. 13-14) trains Hyper-SET, Hyper-SET with fixed step
size 0.1, the shared-QKV Transformer and its sign-reversed variant
(:mod:`hopfield.models.shared_qkv`) with the same recipe and tabulates the effective rank and
angle of every subspace along the iterations.

Data: scikit-learn digits (always present; 8×8, grid 4 → 2×2-pixel patches), MNIST (only its
test split is in the shared data: ``split_test_for_train`` carves a train set out of it),
Fashion-MNIST (Debian package ``dataset-fashion-mnist``), CIFAR-10 / CIFAR-100 and ImageNet-100
(``dataset="imagenet100"``, 224-pixel images from a user-supplied class-folder tree and CMC class
list, :mod:`hopfield.data.imagenet100`; the paper's grid there is 16) when present.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hopfield.data import DataNotFoundError, data_root
from hopfield.data.imagenet100 import FOLDER, ImageFolderCache, load_imagenet100
from hopfield.data.images import (
    IMAGE_DATASETS,
    STAND_IN_SHAPES,
    StandInImages,
    load_image_dataset,
    stand_in_images,
)
from hopfield.experiments.checks import (
    check_choice,
    check_int_items,
    check_ints,
    check_reals,
    check_subset,
)
from hopfield.experiments.hyperset_common import (
    cosine_lr,
    device_of,
    energy_trend_metrics,
    name_seed,
    replicate_table,
    subspace_trajectory,
    threads_limited,
    train_model,
    train_replicates,
    trajectory_statistics,
    trajectory_table,
)
from hopfield.experiments.hyperset_figures import (
    draw_head_figure,
    draw_token_evolution,
    token_evolution,
)
from hopfield.experiments.hyperset_sudoku import VARIANTS
from hopfield.experiments.outliers_tasks import main_process_first
from hopfield.experiments.registry import ConfigError, Experiment, register
from hopfield.experiments.results import Results, RunContext, Table
from hopfield.models.energy_transformer import energy_image_classifier
from hopfield.models.hyperset import ImageClassifier, image_classifier
from hopfield.models.shared_qkv import SharedQKVTransformerEncoder, shared_qkv_image_classifier
from hopfield.nn.hyperset import FEEDFORWARD_KINDS, HyperSETEncoder, count_parameters

# Table 1 (top-1 %, 1 layer × 12 iterations): CIFAR-10, CIFAR-100, ImageNet-100; params (M).
PAPER_TABLE1 = {
    "transformer": (1.79, 89.90, 61.89, 69.44),
    "crate-t": (0.32, 86.77, 60.52, 61.12),
    "crate": (0.47, 86.97, 61.13, 63.52),
    "et": (0.91, 75.98, 52.50, 40.40),
    "hyperset": (0.96, 88.89, 62.48, 67.64),
    "hyperset-scaleup": (1.61, 90.11, 63.41, 70.16),
}
# Table 3 (Small Scale-up): CIFAR-10, CIFAR-100.
PAPER_TABLE3 = {
    "hyperset": (90.11, 63.41),
    "attention-sigmoid": (85.93, 59.72),
    "attention-linear": (84.88, 56.97),
    "ff-softmax": (88.20, 62.44),
    "ff-gated": (84.99, 59.29),
    "fixed-0.5": (25.81, 57.92),
    "fixed-0.1": (81.45, 58.29),
}
# Fig. 4 (CIFAR-100 top-1 %, params M) per number of distinct layers K (L = 12 / K iterations each).
PAPER_FIG4 = {
    "hyperset-scaleup": {1: (63.49, 1.66), 2: (63.54, 2.18), 6: (64.22, 4.28), 12: (64.98, 7.43)},
    "transformer": {1: (61.90, 1.83), 2: (63.45, 3.60), 6: (64.32, 10.68), 12: (64.38, 21.31)},
}
# Table 4 (ImageNet-100, Small Scale-up + depth-wise LoRA): rank -> (params M, top-1 %).
PAPER_TABLE4 = {
    0: (1.93, 70.16),
    4: (2.03, 70.36),
    8: (2.13, 70.40),
    16: (2.33, 70.56),
    32: (2.72, 72.20),
}
# Table 20 (scaled up, 1 layer × 12 iterations): width, params M and top-1 % on CIFAR-10, then
# on CIFAR-100.
PAPER_TABLE20 = {
    "transformer": (1152, 16.0, 89.42, 16.1, 62.83),
    "crate": (1152, 4.1, 88.77, 4.2, 63.39),
    "et": (1152, 8.0, 76.21, 8.1, 55.47),
    "hyperset": (1536, 14.3, 90.62, 14.4, 66.30),
}
#: Heads of the ``<base>-d<width>`` models (Table 20). Hyper-SET's 14,268,394 parameters at
#: d = 1536 (spec §4.5) pin 12 heads; the other models' counts do not depend on the heads.
WIDE_HEADS = 12
PAPER_COLUMN = {"cifar10": 1, "cifar100": 2}


@dataclass
class Config:
    """Settings of the image-classification experiment."""

    seed: int = 42
    seeds: int = 1  # runs per model, seeded seed, seed + 1, ... (weights and order; same split)
    dataset: str = "cifar10"  # digits | mnist | fashion-mnist | cifar10
    split_test_for_train: bool = False  # carve train/test out of the test split (MNIST here)
    holdout: int = 2000  # test images kept when split_test_for_train
    train_size: int = 0  # 0 = all
    test_size: int = 0  # test images evaluated (0 = all)
    grid: int = 8  # patches per side (the paper's "patch size")
    d_model: int = 384
    num_heads: int = 6
    scaleup_d_model: int = 512
    scaleup_num_heads: int = 8
    iterations: int = 12
    time_frequency: int = 512
    feedforward: str = "gelu"  # the classification code's activation ("relu" in the paper text)
    epochs: int = 200
    batch_size: int = 128
    lr: float = 1e-3
    min_lr: float = 1e-5
    warmup_epochs: int = 5
    weight_decay: float = 5e-5
    label_smoothing: float = 0.1
    crop_padding: int = 4
    flip: bool = True
    models: tuple[str, ...] = ("hyperset", "hyperset-scaleup", "transformer")
    ablations: tuple[str, ...] = ()  # Table 3 variants of the Scale-up model
    layer_splits: tuple[int, ...] = ()  # Fig. 4: K distinct layers (Scale-up and Transformer)
    lora_ranks: tuple[int, ...] = ()  # Table 4: depth-wise LoRA on the Scale-up model
    contrast: bool = False  # App. F.3 (Figs. 13-14): the models of CONTRAST, appended
    analysis_size: int = 256
    eval_batch_size: int = 1000
    threads: int = 1


PRESETS = {
    "tiny": Config(
        dataset="digits", train_size=128, grid=4, d_model=16, num_heads=2, scaleup_d_model=24,
        scaleup_num_heads=2, iterations=2, time_frequency=16, epochs=1, batch_size=64,
        warmup_epochs=1, crop_padding=1, flip=True, ablations=("fixed-0.1",),
        layer_splits=(2,), lora_ranks=(2,), analysis_size=16, eval_batch_size=360,
        models=("hyperset", "hyperset-scaleup", "transformer", "crate", "et"), contrast=True,
    ),
    "small": Config(
        dataset="digits", grid=4, d_model=64, num_heads=4, scaleup_d_model=96,
        scaleup_num_heads=4, iterations=12, time_frequency=64, epochs=12, batch_size=128,
        warmup_epochs=2, crop_padding=1, flip=False,
        models=("hyperset", "hyperset-scaleup", "transformer", "et"),
        ablations=("attention-sigmoid", "fixed-0.1"),
        layer_splits=(2,), lora_ranks=(4,), analysis_size=360, eval_batch_size=360,
        contrast=True,
    ),
    "paper": Config(
        models=("hyperset", "hyperset-scaleup", "transformer", "crate", "crate-t", "et",
                "transformer-d1152", "crate-d1152", "et-d1152", "hyperset-d1536"),
        lora_ranks=(4, 8, 16, 32), contrast=True, threads=0,
    ),
}  # fmt: skip


#: Images per split of the stand-ins (``--stand-in-data``) of an absent dataset.
STAND_IN_COUNTS = {"train": 1024, "test": 256}

#: Config fields that only say which models to train (or how many threads): not part of a run.
LOOPS = ("models", "ablations", "layer_splits", "lora_ranks", "contrast", "threads", "seeds")


#: App. F.3 (Figs. 13-14): Hyper-SET, with fixed step size 0.1, the shared-QKV Transformer and
#: that Transformer with the attention update's sign reversed, trained with the same recipe.
CONTRAST = ("hyperset", "hyperset+fixed-0.1", "shared-qkv", "shared-qkv-reversed")


#: ImageNet-100 (:mod:`hopfield.data.imagenet100`): side of the cached images, the usual
#: ImageNet channel statistics used to normalise them, and its number of classes.
IMAGENET100_SIZE = 224
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGENET100_CLASSES = 100

#: Every ``Config.dataset`` and the side of its images.
IMAGE_SIDES = {**{name: STAND_IN_SHAPES[name][1] for name in IMAGE_DATASETS},
               "imagenet100": IMAGENET100_SIZE}  # fmt: skip


class FolderImages:
    """The first ``count`` images of an :class:`~hopfield.data.imagenet100.ImageFolderCache`,
    read on demand and normalised per channel: ``images[index]`` float32 ``(..., 3, S, S)`` for a
    slice or a long tensor of indices, as a tensor of normalised images would give."""

    def __init__(self, cache: ImageFolderCache, count: int = 0) -> None:
        self.cache = cache
        self.count = min(count, len(cache)) if count else len(cache)
        self.mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def __len__(self) -> int:
        return self.count

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(count, 3, S, S)``."""
        return (self.count, *self.cache.shape[1:])

    def __getitem__(self, index: slice | Tensor) -> Tensor:
        positions = torch.arange(self.count)[index]
        return (self.cache[positions].float() / 255.0 - self.mean) / self.std


Images = Tensor | FolderImages


@dataclass
class _Images:
    """Normalised training and test images ``(N, C, H, W)`` with their labels, the number of
    classes (of the whole splits), and where they come from (the dataset's name, or a
    ``"STAND-IN ..."`` note)."""

    x_train: Images
    y_train: Tensor
    x_test: Images
    y_test: Tensor
    num_classes: int
    source: str


def _split(name: str, split: str, ctx: RunContext) -> tuple[Tensor, Tensor, str]:
    """Images ``(N, C, H, W)``, labels and source of a split; with ``--stand-in-data``, random
    images of the dataset's shape where it is absent
    (:func:`hopfield.data.images.stand_in_images`)."""
    try:
        return (*load_image_dataset(name, split, ctx.data_dir), name)
    except DataNotFoundError:
        if not ctx.stand_in_data:
            raise
    images, labels = stand_in_images(name, split, count=STAND_IN_COUNTS[split]).tensors()
    note = f"STAND-IN random images in place of {name}, which is absent; the numbers mean nothing."
    return images, labels, note


def _imagenet100(config: Config, ctx: RunContext) -> _Images:
    """ImageNet-100 from ``<data root>/images/imagenet100`` (train / val), cached once at 224
    pixels beside the data when that folder is writable, else in the run folder; with
    ``--stand-in-data`` random 100-class images where it is absent."""
    root = data_root(ctx.data_dir)
    tree = None if root is None else root / FOLDER
    cache = None if tree is not None and os.access(tree, os.W_OK) else ctx.out_dir / "imagenet100"

    def load(split: str, count: int) -> tuple[FolderImages, Tensor]:
        images = main_process_first(
            lambda: load_imagenet100(split, ctx.data_dir, size=IMAGENET100_SIZE, cache_dir=cache)
        )
        part = FolderImages(images, count)
        return part, images.labels[: len(part)]

    x_train: Images
    x_test: Images
    try:
        x_train, y_train = load("train", config.train_size)
        x_test, y_test = load("val", config.test_size)
        source, classes = "imagenet100", len(x_train.cache.classes)
    except DataNotFoundError:
        if not ctx.stand_in_data:
            raise
        (x_train, y_train), (x_test, y_test) = (
            StandInImages(
                min(limit or count, count), 3, IMAGENET100_SIZE, IMAGENET100_CLASSES, seed=seed
            ).tensors()
            for seed, (count, limit) in enumerate(
                ((STAND_IN_COUNTS["train"], config.train_size),
                 (STAND_IN_COUNTS["test"], config.test_size)), start=1
            )
        )  # fmt: skip
        source, classes = (
            "STAND-IN random images in place of imagenet100, which is absent; the numbers mean "
            "nothing.",
            IMAGENET100_CLASSES,
        )
    return _Images(x_train, y_train, x_test, y_test, classes, source)


def _data(config: Config, ctx: RunContext) -> _Images:
    if config.dataset == "imagenet100":
        return _imagenet100(config, ctx)
    if config.split_test_for_train:
        images, labels = load_image_dataset(config.dataset, "test", ctx.data_dir)
        order = torch.randperm(len(images), generator=torch.Generator().manual_seed(config.seed))
        test, train = order[: config.holdout], order[config.holdout :]
        x_train, y_train, x_test, y_test = images[train], labels[train], images[test], labels[test]
        source = f"{config.dataset} test split"
    else:
        x_train, y_train, source = _split(config.dataset, "train", ctx)
        x_test, y_test, _ = _split(config.dataset, "test", ctx)
    num_classes = int(torch.cat([y_train, y_test]).max()) + 1
    if config.train_size:
        x_train, y_train = x_train[: config.train_size], y_train[: config.train_size]
    if config.test_size:
        x_test, y_test = x_test[: config.test_size], y_test[: config.test_size]
    mean = x_train.mean(dim=(0, 2, 3), keepdim=True)
    std = x_train.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    return _Images(x_train, y_train, x_test, y_test, num_classes, source)


def augment(
    images: Tensor, padding: int, flip: bool, generator: torch.Generator | None = None
) -> Tensor:
    """Random crop after zero padding (per image) and optional horizontal flip (randomness from
    ``generator``, default the global torch RNG)."""
    if padding:
        b, _, h, w = images.shape
        padded = F.pad(images, (padding,) * 4)
        dy = torch.randint(0, 2 * padding + 1, (b,), generator=generator)
        dx = torch.randint(0, 2 * padding + 1, (b,), generator=generator)
        rows = (dy[:, None] + torch.arange(h))[:, None, :, None]
        cols = (dx[:, None] + torch.arange(w))[:, None, None, :]
        index = torch.arange(b)[:, None, None, None]
        images = padded[index, torch.arange(images.shape[1])[None, :, None, None], rows, cols]
    if flip:
        mask = torch.rand(images.shape[0], generator=generator) < 0.5
        images = torch.where(mask[:, None, None, None], images.flip(-1), images)
    return images


def _augmented(
    images: Images, labels: Tensor, config: Config, indices: Tensor
) -> tuple[Tensor, Tensor]:
    """The training micro-batch of ``indices``: augmented images and their labels."""
    return augment(images[indices], config.crop_padding, config.flip), labels[indices]


def _loss(config: Config) -> Callable[[nn.Module, tuple[Tensor, Tensor]], Tensor]:
    def loss_fn(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        images, labels = batch
        return F.cross_entropy(model(images), labels, label_smoothing=config.label_smoothing)

    return loss_fn


#: Base models of :func:`build`.
BASES = (
    "hyperset",
    "hyperset-scaleup",
    "transformer",
    "crate",
    "crate-t",
    "et",
    "shared-qkv",
    "shared-qkv-reversed",
)


def _parse(name: str) -> tuple[str, dict[str, Any]]:
    """``(base, options)`` of a model name (see :func:`build`)."""
    options: dict[str, Any] = {}
    base = name
    if "+" in name:
        base, variant = name.split("+", 1)
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; known: {sorted(VARIANTS)}")
        options.update(VARIANTS[variant])
    if "-layers" in base:
        base, k = base.split("-layers")
        options["num_layers"] = int(k)
    if "-lora" in base:
        base, r = base.split("-lora")
        options["lora_rank"] = int(r)
    wide = re.fullmatch(r"(.+)-d(\d+)", base)
    if wide:
        base, options["width"] = wide[1], int(wide[2])
        if options["width"] % WIDE_HEADS:
            raise ValueError(f"the width of {name!r} must be a multiple of {WIDE_HEADS} heads")
    if base not in BASES:
        raise ValueError(f"unknown model {name!r}")
    return base, options


def check_config(config: Config) -> None:
    """:class:`ConfigError` naming the first field ``config`` cannot run with."""
    check_choice("dataset", config.dataset, tuple(IMAGE_SIDES))
    check_ints(config, "grid", "d_model", "num_heads", "scaleup_d_model", "scaleup_num_heads")
    check_ints(config, "iterations", "epochs", "batch_size", "analysis_size", "eval_batch_size",
               "seeds")  # fmt: skip
    check_ints(config, "time_frequency", minimum=4)
    check_ints(config, "holdout", "train_size", "test_size", "crop_padding", "warmup_epochs",
               "threads", minimum=0)  # fmt: skip
    check_reals(config, "lr", low=0.0, low_open=True)
    check_reals(config, "min_lr", "weight_decay", low=0.0)
    check_reals(config, "label_smoothing", low=0.0, high=1.0, high_open=True)
    check_choice("feedforward", config.feedforward, FEEDFORWARD_KINDS)
    for width, heads in (("d_model", "num_heads"), ("scaleup_d_model", "scaleup_num_heads")):
        if getattr(config, width) % getattr(config, heads):
            raise ConfigError(
                f"{width} ({getattr(config, width)}) must be divisible by {heads} "
                f"({getattr(config, heads)})"
            )
    side = IMAGE_SIDES[config.dataset]
    if side % config.grid:
        raise ConfigError(
            f"grid ({config.grid}) must divide the {side}-pixel images of {config.dataset}"
        )
    if 0 < config.train_size < config.batch_size:
        raise ConfigError(
            f"batch_size ({config.batch_size}) must not exceed train_size ({config.train_size})"
        )
    check_subset("ablations", config.ablations, tuple(VARIANTS), allow_empty=True)
    check_int_items("layer_splits", config.layer_splits, allow_empty=True)
    uneven = [k for k in config.layer_splits if config.iterations % k]
    if uneven:
        raise ConfigError(f"layer_splits {uneven} must divide iterations ({config.iterations})")
    check_int_items("lora_ranks", config.lora_ranks, minimum=0, allow_empty=True)
    check_choice("contrast", config.contrast, (False, True))
    if not _model_names(config):
        raise ConfigError("models, ablations, layer_splits and lora_ranks name no model")
    known = f"{', '.join(BASES)}, with +<variant>, -layers<K>, -lora<r> or -d<width>"
    for name in config.models:
        try:
            _parse(name)
        except ValueError as error:
            raise ConfigError(
                f"models: {name!r} is not a model ({error}); choose from {known}"
            ) from None


def build(
    config: Config, name: str, image_size: int, channels: int, num_classes: int = 10
) -> ImageClassifier:
    """Model ``name``: ``hyperset``, ``hyperset-scaleup``, ``transformer``, ``crate``, ``crate-t``,
    ``et`` (Energy Transformer), ``shared-qkv`` / ``shared-qkv-reversed`` (App. F.3),
    ``<base>+<v>`` (a Table 3 variant, e.g. ``hyperset-scaleup+fixed-0.1``),
    ``<base>-layers<K>`` (Fig. 4), ``hyperset-scaleup-lora<r>`` (Table 4) or ``<base>-d<width>``
    (Table 20: width ``d``, :data:`WIDE_HEADS` heads and, for Hyper-SET, the time-embedding
    frequency ``F = d``, which the paper's 14.3 M parameters imply)."""
    base, options = _parse(name)
    scale = base == "hyperset-scaleup"
    width = options.pop("width", None)
    common: dict[str, Any] = {
        "num_classes": num_classes,
        "image_size": image_size,
        "in_channels": channels,
        "grid": config.grid,
        "d_model": width or (config.scaleup_d_model if scale else config.d_model),
        "num_heads": WIDE_HEADS
        if width
        else (config.scaleup_num_heads if scale else config.num_heads),
        "iterations": config.iterations,
    }
    if base == "et":
        return energy_image_classifier(**common, **options)
    if base.startswith("shared-qkv"):
        reverse = base == "shared-qkv-reversed"
        return shared_qkv_image_classifier(**common, reverse_attention=reverse, **options)
    if base in ("transformer", "crate", "crate-t"):
        return image_classifier(base, **common, **options)
    options.setdefault("feedforward", config.feedforward)
    frequency = width or config.time_frequency
    return image_classifier("hyperset", **common, time_frequency=frequency, **options)


@torch.no_grad()
def accuracy(model: ImageClassifier, images: Images, labels: Tensor, batch_size: int) -> float:
    """Top-1 accuracy (%)."""
    model.eval()
    device = device_of(model)
    correct = 0
    for first in range(0, len(images), batch_size):
        logits = model(images[first : first + batch_size].to(device))
        assert isinstance(logits, Tensor)
        correct += int((logits.argmax(-1).cpu() == labels[first : first + batch_size]).sum())
    return 100.0 * correct / len(images)


def run(config: Config, ctx: RunContext) -> Results:
    """Train every model and tabulate in the layout of Table 1, Table 3, Fig. 4 and Table 4."""
    check_config(config)
    with threads_limited(config.threads):
        return _run(config, ctx)


def _model_names(config: Config) -> list[str]:
    names = list(config.models)
    names += [f"hyperset-scaleup+{v}" for v in config.ablations]
    for k in config.layer_splits:
        names += [f"hyperset-scaleup-layers{k}", f"transformer-layers{k}"]
    names += [f"hyperset-scaleup-lora{r}" for r in config.lora_ranks]
    if config.contrast:
        names += [name for name in CONTRAST if name not in names]
    return names


def _run(config: Config, ctx: RunContext) -> Results:
    data = _data(config, ctx)
    names = _model_names(config)
    every = train_replicates(
        ctx, config, LOOPS, names, data.source,
        lambda name, seed, key, identity: _train(config, ctx, data, name, seed, key, identity),
    )  # fmt: skip
    results = {name: every[name] for name in names}  # the first replicate fills the tables
    analysis = results["hyperset"]["analysis"] if "hyperset" in results else []
    report = _report(config, results, analysis)
    if config.contrast:
        tables, metrics, notes = _contrast(results)
        report.tables.extend(tables)
        report.metrics.update(metrics)
        report.notes.extend(notes)
    if config.seeds > 1:
        report.tables.append(
            replicate_table(config, names, every, "Top-1 accuracy (%)", lambda r: r["accuracy"])
        )
    report.tables.extend(_token_table(results))
    report.figures.extend(_figures(ctx, config, results))
    if data.source.startswith("STAND-IN"):
        report.notes.insert(0, data.source)
    return report


def _train(
    config: Config, ctx: RunContext, data: _Images, name: str, seed: int, key: str,
    identity: Any,
) -> dict[str, Any]:  # fmt: skip
    """Train model ``name`` (seeded by ``seed`` and its name, :func:`name_seed`; its run is
    ``key``, :func:`replicate_key`) and test it: its record for ``runs.json`` (with the Figs.
    5-6 trajectories and the Fig. 1 token evolution for ``"hyperset"``, and the per-subspace
    trajectories of Figs. 13-14 for the models of :data:`CONTRAST`)."""
    _, channels, size, _ = data.x_train.shape
    index = name_seed(name)
    torch.manual_seed(seed * 1000 + index)
    model = build(config, name, size, channels, data.num_classes)
    trained = train_model(
        ctx, key, model, partial(_augmented, data.x_train, data.y_train, config), _loss(config),
        size=len(data.x_train), batch_size=config.batch_size,
        epochs=config.epochs, seed=seed * 7919 + index, optimizer="adam",
        weight_decay=config.weight_decay, identity=identity,
        lr_at=lambda e: cosine_lr(e, config.epochs, config.lr, config.min_lr,
                                  config.warmup_epochs),
    )  # fmt: skip
    record = {
        "params": count_parameters(model),
        "accuracy": accuracy(model, data.x_test, data.y_test, config.eval_batch_size),
        **trained,
    }
    if name not in CONTRAST:  # "hyperset" is one of them
        return record
    with torch.no_grad():
        x0 = model.embed(data.x_test[: config.analysis_size].to(device_of(model)))
    encoder = model.encoder
    assert isinstance(encoder, HyperSETEncoder | SharedQKVTransformerEncoder)
    record["subspaces"] = subspace_trajectory(encoder, x0, config.iterations)
    if name == "hyperset":
        assert isinstance(encoder, HyperSETEncoder)
        record["analysis"] = trajectory_statistics(encoder, x0, config.iterations)
        record["token_evolution"] = token_evolution(encoder, x0[:1], config.iterations)
    return record


#: Figs. 13-14: how the per-subspace effective rank and angle evolve for each contrast model.
PAPER_CONTRAST = {
    "hyperset": "rise",
    "hyperset+fixed-0.1": "rise",
    "shared-qkv": "rise",
    "shared-qkv-reversed": "fall",
}


def _rising(rows: list[dict[str, Any]], key: str) -> str:
    """``"k/H"``: the heads whose ``key`` per head is higher at ``X_L`` than at ``X_0``."""
    first, last = rows[0][key], rows[-1][key]
    return f"{sum(b > a for a, b in zip(first, last, strict=True))}/{len(first)}"


def _contrast(
    results: dict[str, dict[str, Any]],
) -> tuple[list[Table], dict[str, float], list[str]]:
    """App. F.3 (Figs. 13-14): a summary table (change from ``X_0`` to ``X_L`` of the effective
    rank and angle, mean over heads, and how many heads rise), the per-subspace trajectories,
    the changes as metrics ``contrast_<model>_{erank,angle}_change``, and a note naming
    contrast records without subspace statistics (written by older code)."""
    names = [n for n in CONTRAST if "subspaces" in results.get(n, {})]
    summary, per_head, metrics = [], [], {}
    for name in names:
        rows = results[name]["subspaces"]
        changes = {key: rows[-1][key] - rows[0][key] for key in ("erank", "angle")}
        metrics.update({f"contrast_{name}_{k}_change": v for k, v in changes.items()})
        summary.append([
            name, results[name]["params"], results[name]["accuracy"],
            rows[0]["erank"], rows[-1]["erank"], changes["erank"], _rising(rows, "erank_heads"),
            rows[0]["angle"], rows[-1]["angle"], changes["angle"], _rising(rows, "angle_heads"),
            PAPER_CONTRAST[name],
        ])  # fmt: skip
        per_head += [[name, r["t"], *r["erank_heads"], *r["angle_heads"]] for r in rows]
    missing = [n for n in CONTRAST if n in results and n not in names]
    notes = [
        f"App. F.3 contrast: the records of {', '.join(missing)} predate the subspace statistics "
        "(remove them from runs.json to retrain)."
    ] if missing else []  # fmt: skip
    if not names:
        return [], metrics, notes
    heads = len(results[names[0]]["subspaces"][0]["erank_heads"])
    tables = [
        Table(
            "Subspace separation: Hyper-SET vs shared-QKV Transformers (App. F.3, Figs. 13-14)",
            ["model", "params", "top-1 % (ours)", "erank t=0", "erank t=L", "Δ erank",
             "heads erank ↑", "angle t=0 °", "angle t=L °", "Δ angle °", "heads angle ↑",
             "paper: rank and angle"],
            summary,
            "Effective rank and average angle (Def. D.2) of the gain-free RMS-normalised "
            "subspace tokens of the test images, means over images and heads; t = 0 is the "
            "embedding X_0. Subspace tokens: Hyper-SET's normalised projections W_hᵀx, the "
            "shared-QKV Transformers' attention inputs W_hᵀLN(x). Same recipe for all four; "
            "shared-qkv-reversed updates x ← x − attn(LN(x)). Paper: CIFAR-10 validation set.",
        ),
        Table(
            "Effective rank and angle per subspace along the iterations (Figs. 13-14)",
            ["model", "t", *[f"erank h{h}" for h in range(heads)],
             *[f"angle h{h} °" for h in range(heads)]],
            per_head,
            "Means over the test images of each head's effective rank and average angle.",
        ),
    ]  # fmt: skip
    return tables, metrics, notes


def _token_table(results: dict[str, dict[str, Any]]) -> list[Table]:
    """Fig. 1 in numbers: per t the angle of one image's subspace tokens and their alignment
    with the feed-forward anchors (none without a token evolution in the record)."""
    evolution = results.get("hyperset", {}).get("token_evolution")
    if evolution is None:
        return []
    rows = [[t, angle, align] for t, (angle, align) in
            enumerate(zip(evolution["angle"], evolution["alignment"], strict=True))]  # fmt: skip
    return [
        Table(
            "Token evolution of one test image (Fig. 1)",
            ["t", f"angle head {evolution['head']} °", "mean max cos to anchors"],
            rows,
            "Small Hyper-SET, first test image: average angle (Def. D.2) of the tokens "
            "projected onto one subspace, and the mean over tokens of the largest cosine "
            "between x_i and a feed-forward direction d_m (the anchors); t = 0 is X_0.",
        )
    ]


def _figures(ctx: RunContext, config: Config, results: dict[str, dict[str, Any]]) -> list[str]:
    """Figs. 11-12 (per-head rank and angle of Hyper-SET), Figs. 13-14 (the contrast) and
    Fig. 1 (token evolution), each where the records hold its data."""
    figures = []
    hyperset = results.get("hyperset", {})
    analysis = hyperset.get("analysis", [])
    if analysis and "erank_heads" in analysis[0]:
        figures.append(draw_head_figure(
            ctx, "images_heads_rank_angle.png",
            [(f"Hyper-SET, {config.dataset} test images (Figs. 11-12)", analysis)],
        ))  # fmt: skip
    columns = [(name, results[name]["subspaces"]) for name in CONTRAST
               if config.contrast and "subspaces" in results.get(name, {})]  # fmt: skip
    if columns:
        figures.append(draw_head_figure(ctx, "images_contrast_rank_angle.png", columns))
    if "token_evolution" in hyperset:
        what = f"Small Hyper-SET, first {config.dataset} test image"
        figures.append(draw_token_evolution(
            ctx, "images_token_evolution.png", hyperset["token_evolution"], what
        ))  # fmt: skip
    return figures


def _row(results: dict[str, dict[str, Any]], name: str) -> list[Any]:
    r = results[name]
    return [r["params"], r["accuracy"], round(r["seconds"], 1)]


def _report(
    config: Config, results: dict[str, dict[str, Any]], analysis: list[dict[str, float]]
) -> Results:
    tables: list[Table] = []
    metrics: dict[str, float] = {}
    notes: list[str] = []
    for name, r in results.items():
        metrics[f"{name}_accuracy"] = r["accuracy"]
        metrics[f"{name}_params"] = float(r["params"])
    setting = (
        f"{config.dataset}, grid {config.grid}, d={config.d_model} (Scale-up "
        f"{config.scaleup_d_model}), L={config.iterations}, {config.epochs} epochs"
    )
    main = [
        n
        for n in ("transformer", "crate-t", "crate", "et", "hyperset", "hyperset-scaleup")
        if n in results
    ]
    tables.append(
        Table(
            "Image classification: Hyper-SET vs Transformer (Table 1 layout)",
            [
                "model",
                "params",
                "top-1 % (ours)",
                "train s",
                "params M (paper)",
                "CIFAR-10 % (paper)",
                "CIFAR-100 % (paper)",
                "IN-100 % (paper)",
            ],
            [[n, *_row(results, n), *PAPER_TABLE1[n]] for n in main],
            f"Ours: {setting}. Paper: CIFAR-10/100 (grid 8) and ImageNet-100 (grid 16), "
            "d=384 / Scale-up 512, 12 iterations, 200 epochs.",
        )
    )
    if "hyperset" in results and "transformer" in results:
        metrics["param_ratio_small"] = (
            results["hyperset"]["params"] / results["transformer"]["params"]
        )
        metrics["C1_gap_small"] = (
            results["hyperset"]["accuracy"] - results["transformer"]["accuracy"]
        )
    if "hyperset-scaleup" in results and "transformer" in results:
        metrics["C2_gap_scaleup"] = (
            results["hyperset-scaleup"]["accuracy"] - results["transformer"]["accuracy"]
        )
    variants = [n.split("+", 1)[1] for n in results if n.startswith("hyperset-scaleup+")]
    if variants and "hyperset-scaleup" in results:
        rows = [
            [
                "learned steps, bi-softmax, FF (ours)",
                *_row(results, "hyperset-scaleup"),
                *PAPER_TABLE3["hyperset"],
            ]
        ]
        rows += [[v, *_row(results, f"hyperset-scaleup+{v}"), *PAPER_TABLE3.get(v, (None, None))]
                 for v in variants]  # fmt: skip
        tables.append(
            Table(
                "Alternative designs (Table 3)",
                [
                    "variant",
                    "params",
                    "top-1 % (ours)",
                    "train s",
                    "CIFAR-10 % (paper)",
                    "CIFAR-100 % (paper)",
                ],
                rows,
                f"Small Scale-up model with one component changed. Ours: {setting}.",
            )
        )
    if config.layer_splits:
        rows = []
        for arch in ("hyperset-scaleup", "transformer"):
            for k in (1, *config.layer_splits):
                name = arch if k == 1 else f"{arch}-layers{k}"
                if name in results:
                    acc, params = PAPER_FIG4[arch].get(k, (None, None))
                    rows.append(
                        [arch, k, config.iterations // k, *_row(results, name), acc, params]
                    )
        tables.append(
            Table(
                "Layer-iteration trade-off (Fig. 4)",
                [
                    "model",
                    "layers K",
                    "iterations each",
                    "params",
                    "top-1 % (ours)",
                    "train s",
                    "CIFAR-100 % (paper)",
                    "params M (paper)",
                ],
                rows,
                "Constant effective depth: K distinct layers each applied L/K times. Paper: "
                "12 iterations, Scale-up d=512 vs Transformer d=384.",
            )
        )
    if config.lora_ranks and "hyperset-scaleup" in results:
        rows = [[0, *_row(results, "hyperset-scaleup"), *PAPER_TABLE4[0]]]
        rows += [[r, *_row(results, f"hyperset-scaleup-lora{r}"), *PAPER_TABLE4.get(r, (None, None))]
                 for r in config.lora_ranks]  # fmt: skip
        tables.append(
            Table(
                "Depth-wise LoRA (Table 4)",
                [
                    "rank",
                    "params",
                    "top-1 % (ours)",
                    "train s",
                    "params M (paper)",
                    "IN-100 % (paper)",
                ],
                rows,
                "Independent rank-r adapters per iteration on W and D (scale 4). "
                "Paper: ImageNet-100, Small Scale-up.",
            )
        )
    wide = [n for n in results if _parse(n)[1].get("width")]
    if wide:
        tables.append(_table20(results, wide, setting))
    if analysis:
        tables.append(
            trajectory_table(
                "Hyper-SET energy, effective rank and angle along the iterations (Figs. 5-6)",
                analysis,
                "Small Hyper-SET on test images; gain-free normalised projections.",
            )
        )
        metrics.update(energy_trend_metrics(analysis))
    notes.append(
        "CRATE, CRATE-T and the Energy Transformer rows of Table 1 are run when listed in "
        "`models`; CIFAR-100 and ImageNet-100 are not available offline."
    )
    return Results(tables=tables, metrics=metrics, notes=notes)


def _table20(results: dict[str, dict[str, Any]], names: list[str], setting: str) -> Table:
    """The scaled-up models (``<base>-d<width>``) beside Table 20."""
    rows = []
    for name in names:
        base, options = _parse(name)
        rows.append([name, options["width"], *_row(results, name),
                     *PAPER_TABLE20.get(base, (None,) * 5)])  # fmt: skip
    return Table(
        "Scaling up (Table 20)",
        ["model", "d", "params", "top-1 % (ours)", "train s", "d (paper)",
         "params M CIFAR-10 (paper)", "CIFAR-10 % (paper)", "params M CIFAR-100 (paper)",
         "CIFAR-100 % (paper)"],
        rows,
        f"Ours: {setting}; each model at its own width d ({WIDE_HEADS} heads; Hyper-SET with "
        "time-embedding frequency F = d). Paper: 1 layer × 12 iterations, widths chosen for "
        "similar parameter counts.",
    )  # fmt: skip


register(
    Experiment(
        name="hyperset-images",
        summary="Hyper-SET vs weight-shared Transformer on image classification, with the "
        "alternative designs, layer-iteration trade-off and depth-wise LoRA",
        presets=PRESETS,
        run=run,
        check=check_config,
        paper="Hyper-SET §5.2, Table 1, Table 3, Fig. 4, Table 4 (Hu, Zou & Xu)",
        tags=("hyperset",),
    )
)

"""What each experiment's preset trains, as :class:`hopfield.plan.TrainingJob` objects.

For every experiment that trains models, a function ``<experiment>_jobs(config) ->
list[TrainingJob]`` lists the models the preset trains (built with the experiment's own
builders, so parameter counts and shapes are the real ones), their batches, losses, optimiser
steps and how many runs of each; :data:`JOBS` maps experiment names to them. Experiments that
train nothing are in :data:`NOT_TRAINED` with what they compute. :func:`hopfield.plan.plan`
prices them (``hopfield plan NAME --preset paper``).

This module registers no experiment and imports the experiment modules only when a job list is
asked for. Dataset sizes that the numbers rest on are the published sizes of the datasets (stated
in each job's notes); a preset that stops early (early stopping, a search that ends at its first
success) is priced at its longest schedule, and the notes say so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hopfield.data.timeseries import series_count
from hopfield.plan import DataNeed, TrainingJob
from hopfield.training import steps_per_epoch

__all__ = [
    "JOBS",
    "NOT_TRAINED",
    "convergence_jobs",
    "hyperset_images_jobs",
    "hyperset_mim_jobs",
    "hyperset_sudoku_jobs",
    "jobs_of",
    "mil_benchmark_jobs",
    "mil_bit_pattern_jobs",
    "mil_mnist_bags_jobs",
    "outlier_formation_jobs",
    "outliers_jobs",
    "stanhop_outliers_jobs",
    "timeseries_hopfield_jobs",
    "untrained_data",
]

Batch = Any
Builder = Callable[[torch.device], nn.Module]


def _on(factory: Callable[[], nn.Module]) -> Builder:
    """``build(device)``: ``factory()`` with ``device`` as the default device."""

    def build(device: torch.device) -> nn.Module:
        with device:
            return factory()

    return build


def _image_batch(channels: int, side: int, classes: int) -> Callable[[int, torch.device], Batch]:
    """Images ``(n, C, S, S)`` float32 and labels ``(n,)`` int64."""

    def make(n: int, device: torch.device) -> Batch:
        return (
            torch.rand(n, channels, side, side, device=device),
            torch.randint(classes, (n,), device=device),
        )

    return make


def _cross_entropy(model: nn.Module, batch: Batch) -> Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def _causal_lm_loss(model: nn.Module, batch: Batch) -> Tensor:
    return model(**batch).loss


def _stanhop_counted(model: nn.Module) -> int:
    """STanHop-Net parameters without the two position tables (OutEffHop Table 1's count)."""
    from hopfield.models.stanhop import STanHopNet

    if not isinstance(model, STanHopNet):
        raise TypeError(f"expected a STanHopNet, got {type(model).__name__}")
    return model.parameter_counts()["without_position_tables"]


def _mse(model: nn.Module, batch: Batch) -> Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


def _window_batch(
    in_len: int, out_len: int, inputs: int, targets: int
) -> Callable[[int, torch.device], Batch]:
    """Windows ``x (n, T, C_in)`` and ``y (n, τ, C_out)``."""

    def make(n: int, device: torch.device) -> Batch:
        return (
            torch.randn(n, in_len, inputs, device=device),
            torch.randn(n, out_len, targets, device=device),
        )

    return make


def _frozen(value: Any) -> Hashable:
    """A hashable copy of a configuration (dataclasses, lists and dicts become tuples), for
    ``TrainingJob.cache_key``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ((f.name, _frozen(getattr(value, f.name))) for f in dataclasses.fields(value))
        return (type(value).__name__, *fields)
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in sorted(value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    hash(value)  # anything else must be hashable already
    return value


def _same_fields(config: Any, paper: Any, names: Sequence[str]) -> bool:
    return all(getattr(config, n) == getattr(paper, n) for n in names)


def _image_needs(name: str, splits: Sequence[str] = ("train", "test")) -> tuple[DataNeed, ...]:
    from hopfield.data.images import image_files

    return tuple(DataNeed.of(f) for split in splits for f in image_files(name, split))


def _image_shape(name: str) -> tuple[int, int, int, dict[str, int]]:
    """``(channels, side, classes, {split: images})`` of an image dataset."""
    from hopfield.data.images import STAND_IN_SHAPES

    if name not in STAND_IN_SHAPES:
        raise ValueError(f"no known shape for image dataset {name!r}")
    return STAND_IN_SHAPES[name]


# --- convergence --------------------------------------------------------------------------------


def convergence_jobs(config: Any) -> list[TrainingJob]:
    """Every (dataset, model) of ``convergence``; runs = seeds. Steps per epoch = train images //
    batch (the Trainer drops the incomplete batch)."""
    from hopfield.experiments.convergence import _loss, build_model
    from hopfield.models.vision import num_patches

    jobs = []
    for dataset in config.datasets:
        channels, side, classes, counts = _image_shape(dataset)
        images = min(config.train_size or counts["train"], counts["train"])
        per_epoch = images // config.batch_size
        note = (
            f"convergence {dataset}: {images:,} training images ({counts['train']:,} in the train "
            f"split), {per_epoch} steps per epoch at batch {config.batch_size}, "
            f"{config.epochs} epochs; datasets that are absent are skipped by the experiment."
        )
        for key in config.models:
            jobs.append(
                TrainingJob(
                    name=f"{dataset} {key}",
                    build_model=_on(partial(build_model, config, key, side, channels, classes)),
                    make_batch=_image_batch(channels, side, classes),
                    loss=_loss,
                    global_batch=config.batch_size,
                    optimizer_steps=max(1, config.epochs * per_epoch),
                    runs=config.seeds,
                    tokens_per_example=num_patches(side, config.patch_size) + 1,
                    data=_image_needs(dataset),
                    group=dataset,
                    notes=(note,),
                )
            )
    return jobs


# --- outliers (BERT, OPT, ViT) ------------------------------------------------------------------


def _text_needs(dataset: str) -> tuple[DataNeed, ...]:
    from hopfield.data.text import WIKITEXT2_FILES

    if dataset == "wikitext-2":
        return (
            DataNeed.of(WIKITEXT2_FILES["valid"]),
            DataNeed.of(WIKITEXT2_FILES["test"]),
            DataNeed.of(WIKITEXT2_FILES["train"], note="optional: without it valid.txt trains"),
        )
    if dataset == "synthetic":
        return ()
    hub = {
        "bookcorpus-wiki40b": "bookcorpus/bookcorpus + google/wiki40b (en)",
        "wikitext-103": "Salesforce/wikitext (wikitext-103-raw-v1)",
    }
    return (
        DataNeed(
            hub.get(dataset, dataset),
            note="Hugging Face Hub corpus, streamed into memory-mapped token stores in the "
            "cache folder; not checked here (hopfield run --stand-in-data replaces it)",
        ),
    )


def outliers_jobs(config: Any) -> list[TrainingJob]:
    """Every (model family, attention variant) of the outlier study; runs = training seeds."""
    from hopfield.experiments.outliers import PAPER_TABLE1, architecture, resolve
    from hopfield.experiments.outliers_tasks import stand_in_model_config
    from hopfield.integrations import build_model, paper_parameter_count

    jobs = []
    union = (
        ("outliers trains the models of outliers-bert, outliers-opt and outliers-vit together "
         "(do not add their rows up).",)
        if config.model == "all"
        else ()
    )  # fmt: skip
    for settings in resolve(config):
        family = settings.family
        arch = architecture(settings)
        if family == "vit":
            if settings.dataset == "imagenet":
                channels, side, classes = 3, settings.image_size, 1000
                data: tuple[DataNeed, ...] = tuple(
                    DataNeed(f"images/imagenet/{s}", folder=f"images/imagenet/{s}")
                    for s in ("train", "val")
                )
                note = (
                    f"vit: ImageNet-1k, 1,281,167 training images, {settings.batch_size:,} per "
                    f"step: {settings.steps:,} steps = "
                    f"{settings.steps * settings.batch_size / 1_281_167:.1f} epochs. ViT-S/16 has "
                    "22,050,664 parameters (checked); the paper prints 22.03m."
                )
            else:
                channels, side, classes, counts = _image_shape(settings.dataset)
                data = _image_needs(settings.dataset)
                note = f"vit: {settings.dataset}, {counts['train']:,} training images."
            model_config: dict[str, Any] = {
                "image_size": side,
                "patch_size": settings.patch_size,
                "num_channels": channels,
                "num_labels": classes,
            }
            tokens = (side // settings.patch_size) ** 2 + 1
            make_batch = _image_batch(channels, side, classes)

            def loss(model: nn.Module, batch: Batch) -> Tensor:
                images, labels = batch
                return model(pixel_values=images, labels=labels).loss

        else:
            model_config = stand_in_model_config(settings)
            tokens = settings.seq_len
            data = _text_needs(settings.dataset)
            note = (
                f"{family}: {settings.steps:,} steps × {settings.batch_size} sequences × "
                f"{settings.seq_len} tokens = {settings.steps * settings.batch_size * settings.seq_len / 1e9:.2f}B "
                f"training tokens from {settings.dataset}."
            )

            def make_batch(n: int, device: torch.device, settings: Any = settings) -> Batch:
                return torch.randint(settings.vocab_size, (n, settings.seq_len), device=device)

            def loss(model: nn.Module, batch: Batch) -> Tensor:
                # BERT masks 15 % of the tokens, OPT predicts every next token; the model and
                # its vocabulary projection run over all positions either way.
                return model(input_ids=batch, labels=batch).loss

        for variant in dict.fromkeys(config.variants):
            label = PAPER_TABLE1[family, variant][4] if config.scale == "paper" else ""
            jobs.append(
                TrainingJob(
                    name=f"{family} {variant}",
                    build_model=_on(partial(build_model, family, variant, **model_config, **arch)),
                    make_batch=make_batch,
                    loss=loss,
                    global_batch=settings.batch_size,
                    optimizer_steps=settings.steps,
                    runs=config.seeds,
                    tokens_per_example=tokens,
                    micro_batch_size=settings.micro_batch_size,
                    data=data,
                    count_parameters=paper_parameter_count,
                    group=family,
                    precision=(
                        "fp32"
                        if settings.mixed_precision == "no"
                        else f"{settings.mixed_precision} autocast"
                    ),
                    notes=(
                        note,
                        "Evaluation and W8A8 calibration after training are not counted.",
                        *union,
                    ),
                    paper_label=label,
                    # the settings determine model, batch and loss: outliers and
                    # outliers-<family> share the measurement under `hopfield plan --all`
                    cache_key=("outliers", _frozen(settings), variant),
                )
            )
    return jobs


# --- outlier-formation --------------------------------------------------------------------------


_SEARCH_NOTE = (
    "outlier-formation: an upper bound. The search stops at the first point that forms "
    "outliers; priced here is every point it may try, and the comparison at the "
    "costliest of them (with a success at the cheapest point it trains 1 search run "
    "and the comparison there)."
)
_ARMS_NOTE = (
    "outlier-formation, decisive test: an upper bound. An arm whose vanilla and gated runs fail "
    "the validity gate trains no Softmax_1 variant (half its runs)."
)


def _formation_job(
    name: str, group: str, point_config: Any, variant: str, runs: int, note: str = _SEARCH_NOTE
) -> TrainingJob:
    """One outlier-formation training job: ``runs`` runs of ``variant`` under ``point_config``."""
    from hopfield.experiments.outlier_formation import build

    seq, vocab = point_config.seq_len, point_config.vocab_size

    def make_batch(n: int, device: torch.device) -> Batch:
        ids = torch.randint(vocab, (n, seq), device=device)
        return {"input_ids": ids, "labels": ids}

    return TrainingJob(
        name=name,
        build_model=_on(partial(build, point_config, variant)),
        make_batch=make_batch,
        loss=_causal_lm_loss,
        global_batch=point_config.batch_size,
        optimizer_steps=point_config.steps,
        runs=runs,
        tokens_per_example=seq,
        data=_text_needs("wikitext-2") if point_config.data == "wikitext-2" else (),
        group=group,
        notes=(note,),
    )


def outlier_formation_jobs(config: Any) -> list[TrainingJob]:
    """The search (every point it may train, grouped by model size and steps) and the
    comparison (every variant × seed) at the costliest point: an upper bound. With ``arms``
    (the decisive test): every variant × seed of every arm, the upper bound of an arm that
    passes its validity gate."""
    from hopfield.experiments.outlier_formation import (
        COST_FIELDS,
        grid_points,
        ladder_points,
        training_gflop,
    )

    if config.arms:
        from hopfield.experiments.outlier_decisive import arm_config

        arms = {name: arm_config(config, o) for name, o in config.arms.items()}
        return [
            _formation_job(name, f"arm {name}", arm, variant, len(arm.seeds), _ARMS_NOTE)
            for name, arm in arms.items()
            for variant in config.variants
        ]
    if config.strategy == "ladder":
        first = ladder_points(config)
        names = {p.name for p in first}
        second = [p for p in ladder_points(config, first[0].overrides) if p.name not in names]
        points = [("search stage 1", p) for p in first] + [("search stage 2", p) for p in second]
    else:
        points = [("search", p) for p in grid_points(config)]
    if config.max_configs:
        points = points[: config.max_configs]
    shape_fields = (*COST_FIELDS, "num_heads")

    jobs: list[TrainingJob] = []
    grouped: dict[tuple[str, tuple[Any, ...]], list[Any]] = {}
    for group, point in points:
        key = (group, tuple(getattr(point.config, f) for f in shape_fields))
        grouped.setdefault(key, []).append(point)
    for (group, _), members in grouped.items():
        c = members[0].config
        name = (
            f"{group}: L{c.num_layers} d{c.hidden_size} F{c.ffn_dim} V{c.vocab_size} "
            f"T{c.seq_len}, {c.steps:,} steps ({len(members)} point(s))"
        )
        jobs.append(_formation_job(name, group, c, "softmax", len(members)))
    if config.compare and points:
        costliest = max((p for _, p in points), key=lambda p: training_gflop(p.config))
        c = costliest.config
        for variant in config.variants:
            name = f"comparison {variant} at L{c.num_layers} F{c.ffn_dim}, {c.steps:,} steps"
            jobs.append(
                _formation_job(name, "comparison (costliest point)", c, variant, len(config.seeds))
            )
    return jobs


# --- outlier-benchmark --------------------------------------------------------------------------


def outlier_benchmark_jobs(config: Any) -> list[TrainingJob]:
    """Every (task, arm) of ``outlier-benchmark``: its SinkLM trained once per paired seed."""
    from hopfield.experiments.outlier_benchmark import ARMS, next_token_loss
    from hopfield.models.sink_lm import SinkLM, SinkLMConfig

    jobs = []
    for task in config.tasks:
        vocab = config.bb_vocab if task == "bigram_backcopy" else config.lm_vocab

        def make_batch(n: int, device: torch.device, vocab: int = vocab) -> Batch:
            return torch.randint(vocab, (n, config.seq_len), device=device)

        for arm in config.arms:
            model = SinkLMConfig(vocab, config.seq_len, config.d_model, config.num_layers,
                                 config.num_heads, config.ffn_size, ARMS[arm].attention)  # fmt: skip
            jobs.append(
                TrainingJob(
                    name=f"{task} {arm}",
                    build_model=_on(partial(SinkLM, model)),
                    make_batch=make_batch,
                    loss=next_token_loss,
                    global_batch=config.batch_size,
                    optimizer_steps=config.steps,
                    runs=config.seeds,
                    tokens_per_example=config.seq_len,
                    data=_text_needs("wikitext-2") if task == "wikitext" else (),
                    group=task,
                    precision="bf16 autocast" if config.mixed_precision == "bf16" else "fp32",
                    notes=(f"{task}: {ARMS[arm].optimizer}, one run per paired seed.",),
                )
            )
    return jobs


# --- stanhop-outliers ---------------------------------------------------------------------------


#: STanHop-Net parameter counts as OutEffHop Table 1 prints them (ETTh1, T 168, τ 24, L 6),
#: counted without the position tables (spec stanhop.md §11).
STANHOP_PAPER_COUNTS = {
    "dense": "35.13m",
    "outeffhop": "35.13m",
    "clipped": "35.13m",
    "clipped_outeffhop": "35.13m",
    "gated": "35.15m",
    "gated_outeffhop": "35.15m",
}
_STANHOP_ARCH = ("d_model", "d_ff", "num_heads", "e_layers", "factor", "win_size")


def _train_rows(dataset: str, protocol: str, max_rows: int | None) -> tuple[int, str]:
    """Training rows of a forecasting split and where the number comes from."""
    from hopfield.data.timeseries import DATASETS, split_sizes

    if dataset == "synthetic":
        rows = max_rows or 2000
        return split_sizes(rows, "ratio")[0], f"synthetic series of {rows} rows"
    if dataset not in DATASETS:
        raise ValueError(f"no known row count for {dataset!r}; known: {sorted(DATASETS)}")
    total = DATASETS[dataset].shape[0]
    rows = total if max_rows is None else min(max_rows, total)
    if protocol == "stanhop" and max_rows is None and DATASETS[dataset].stanhop_rows:
        train = DATASETS[dataset].stanhop_rows[0]  # type: ignore[index]
        return train, f"{dataset}: {train:,} training rows (STanHop month split of {rows:,} rows)"
    train = split_sizes(rows, "ratio")[0]
    return train, f"{dataset}: {train:,} training rows (70 % of {rows:,} rows)"


def _series_needs(dataset: str) -> tuple[DataNeed, ...]:
    from hopfield.data.timeseries import DATASETS

    return (DataNeed.of(DATASETS[dataset].file),) if dataset in DATASETS else ()


def _epoch_steps(windows: int, batch: int, cap: int | None) -> int:
    steps = steps_per_epoch(windows, batch)  # the Trainer drops the incomplete last batch
    return min(steps, cap) if cap else steps


def stanhop_outliers_jobs(config: Any) -> list[TrainingJob]:
    """Every (setting, association) of ``stanhop-outliers``; runs = seeds; the longest schedule
    (``epochs``; early stopping with ``patience`` ends most runs sooner)."""
    from hopfield.experiments.stanhop_outliers import PRESETS, build_model, parse_setting

    paper_arch = _same_fields(config, PRESETS["paper"], _STANHOP_ARCH)
    jobs = []
    for raw in config.settings:
        dataset, horizon, in_len, seg_len, _, batch = parse_setting(raw)
        protocol = "ratio" if config.max_rows else "stanhop"
        train, where = _train_rows(dataset, protocol, config.max_rows)
        windows = train - in_len - horizon + 1
        per_epoch = _epoch_steps(windows, batch, config.max_train_batches)
        series = series_count(dataset)
        note = (
            f"stanhop {dataset} T{in_len}→{horizon}: {where}, {windows:,} windows, {per_epoch} "
            f"steps per epoch at batch {batch}, at most {config.epochs} epochs (early stopping "
            f"after {config.patience} epochs without improvement usually ends sooner)."
        )
        table1 = paper_arch and (dataset, horizon, in_len, seg_len) == ("ETTh1", 24, 168, 6)
        for kind in config.models:
            label = STANHOP_PAPER_COUNTS.get(kind, "") if table1 else ""
            jobs.append(
                TrainingJob(
                    name=f"{dataset} T{in_len}→{horizon} {kind}",
                    build_model=_on(
                        partial(build_model, config, series, in_len, horizon, seg_len, kind)
                    ),
                    make_batch=_window_batch(in_len, horizon, series, series),
                    loss=_mse,
                    global_batch=batch,
                    optimizer_steps=config.epochs * per_epoch,
                    runs=config.seeds,
                    tokens_per_example=in_len,
                    data=_series_needs(dataset),
                    count_parameters=_stanhop_counted,
                    group=f"{dataset} T{in_len}→{horizon}",
                    notes=(note,),
                    paper_label=label,
                )
            )
    return jobs


# --- timeseries-hopfield ------------------------------------------------------------------------


_BLOCKWISE_NOTE = (
    "timeseries sparse: Sparsemax attention takes the blockwise solver at these sizes "
    "(micro-batch × heads × queries × keys ≥ 2^18), which passes over the keys until the "
    "supports settle, as often as the data need; on the meta device it makes one pass: its "
    "FLOPs are a lower bound."
)


def timeseries_hopfield_jobs(config: Any) -> list[TrainingJob]:
    """Every (dataset, horizon, model) of ``timeseries-hopfield`` (input length = horizon);
    runs = seeds; the longest schedule (``epochs``; early stopping usually ends sooner)."""
    from hopfield.experiments.timeseries_hopfield import build_model

    frozen = _frozen(config)  # with (model, horizon, inputs, targets): all the builder reads
    jobs = []
    for dataset in config.datasets:
        train, where = _train_rows(dataset, "ratio", config.max_rows)
        columns = series_count(dataset)
        inputs = 1 if config.features == "S" else columns
        targets = columns if config.features == "M" else 1
        for horizon in config.horizons:
            windows = train - 2 * horizon + 1
            per_epoch = _epoch_steps(windows, config.batch_size, config.max_train_batches)
            note = (
                f"timeseries {dataset} H{horizon}: {where}, {windows:,} windows, {per_epoch} steps "
                f"per epoch at batch {config.batch_size}, at most {config.epochs} epochs "
                f"(early stopping after {config.patience} epochs without improvement)."
            )
            for name in config.models:
                notes = (note, _BLOCKWISE_NOTE) if name == "sparse" else (note,)
                jobs.append(
                    TrainingJob(
                        name=f"{dataset} H{horizon} {name}",
                        build_model=_on(
                            partial(build_model, name, horizon, horizon, inputs, config)
                        ),
                        make_batch=_window_batch(horizon, horizon, inputs, targets),
                        loss=_mse,
                        global_batch=config.batch_size,
                        optimizer_steps=config.epochs * per_epoch,
                        runs=config.seeds,
                        tokens_per_example=horizon,
                        data=_series_needs(dataset),
                        group=f"{dataset} H{horizon}",
                        notes=notes,
                        cache_key=("timeseries", name, horizon, inputs, targets, frozen),
                    )
                )
    return jobs


# --- MIL ----------------------------------------------------------------------------------------


def _bag_batch(bag: int, features: int) -> Callable[[int, torch.device], Batch]:
    """Bags ``(n, S, F)``, no padding mask (all bags of the batch padded to ``S``), labels."""

    def make(n: int, device: torch.device) -> Batch:
        return (
            torch.randn(n, bag, features, device=device),
            None,
            torch.randint(2, (n,), device=device).float(),
        )

    return make


def _bag_loss(model: nn.Module, batch: Batch) -> Tensor:
    x, mask, y = batch
    return F.binary_cross_entropy_with_logits(model(x, mask), y)


def _mil_net(features: int, method: str, **options: Any) -> Callable[[], nn.Module]:
    from hopfield.models.mil import MILNet

    # seed=None: the seed only picks the random subsets of the random-mask pooling (and random
    # features); with one they make a torch.Generator on the model's device.
    return partial(MILNet, features, method=method, seed=None, **options)


_RANDOM_MASK_NOTE = (
    "Random-mask pooling draws how many keys each query keeps at run time (an integer the meta "
    "device cannot give), so its jobs are measured on the CPU with real tensors (small models)."
)


def _mil_device(method: str) -> dict[str, Any]:
    """``measure_on`` (and a note) for a MIL pooling method."""
    if method.startswith("random-mask"):
        return {"measure_on": "cpu"}
    return {}


def mil_benchmark_jobs(config: Any) -> list[TrainingJob]:
    """Every trial of the random search of ``mil-benchmark`` (data sets × methods × seeds × folds ×
    trials, the draws of :func:`~hopfield.experiments.mil_benchmark.sample_trials`), grouped by
    (data set, method, width, heads, batch size); fold sizes from
    :func:`~hopfield.experiments.mil_benchmark.split_folds` on the data sets' label counts."""
    import numpy as np

    from hopfield.data.mil import MIL_DATASETS, MIL_SHAPES
    from hopfield.experiments.mil_benchmark import sample_trials, split_folds

    dropout = max(config.dropouts)
    frozen = _frozen(config)
    jobs = []
    for dataset in config.datasets:
        if dataset not in MIL_SHAPES:
            raise ValueError(f"no known shape for MIL data set {dataset!r}")
        features, bag, positive, negative = MIL_SHAPES[dataset]
        labels = np.array([1] * positive + [0] * negative)
        combos: dict[tuple[int, int, int], list[int]] = {}  # (width, heads, batch) -> steps
        for seed in range(config.seeds):
            folds = split_folds(labels, config, seed)
            for fold, (train, _, _) in enumerate(folds):
                for trial in sample_trials(config, seed, fold):
                    key = (trial["width"], trial["heads"], trial["batch_size"])
                    steps = config.epochs * steps_per_epoch(len(train), trial["batch_size"])
                    combos.setdefault(key, []).append(steps)
        note = (
            f"mil-benchmark {dataset}: {positive + negative} bags ({features} features), "
            f"{config.folds}-fold CV with a {config.valid_fraction:.0%} validation split, "
            f"{config.trials} trials per fold; bags padded to the largest bag ({bag} instances, an "
            f"upper bound); measured with dropout {dropout} (the largest of the search space)."
        )
        for method in config.methods:
            for (width, heads, batch), steps in sorted(combos.items()):
                options = {
                    "embedding_size": width,
                    "num_heads": heads,
                    "quantity": config.quantity,
                    "dropout": dropout,
                }
                jobs.append(
                    TrainingJob(
                        name=f"{dataset} {method} width {width} heads {heads} batch {batch}",
                        build_model=_on(_mil_net(features, method, **options)),
                        make_batch=_bag_batch(bag, features),
                        loss=_bag_loss,
                        global_batch=batch,
                        optimizer_steps=max(steps),
                        runs=len(steps),
                        total_steps=sum(steps),
                        tokens_per_example=bag,
                        data=(DataNeed.of(MIL_DATASETS[dataset]),),
                        group=dataset,
                        notes=(note, _RANDOM_MASK_NOTE) if _mil_device(method) else (note,),
                        cache_key=("mil", dataset, method, width, heads, frozen),
                        **_mil_device(method),
                    )
                )
    return jobs


def mil_bit_pattern_jobs(config: Any) -> list[TrainingJob]:
    """Every (bag size, method) of ``mil-bit-pattern``; runs = seeds."""
    per_epoch = steps_per_epoch(config.train_bags, config.batch_size)
    options = {
        "embedding_size": config.embedding_size,
        "num_heads": config.num_heads,
        "quantity": config.quantity,
        "scale": config.scale,
    }
    return [
        TrainingJob(
            name=f"bag {size} {method}",
            build_model=_on(_mil_net(config.num_bits, method, **options)),
            make_batch=_bag_batch(size, config.num_bits),
            loss=_bag_loss,
            global_batch=config.batch_size,
            optimizer_steps=config.epochs * per_epoch,
            runs=config.seeds,
            tokens_per_example=size,
            group=f"bag size {size}",
            notes=(
                f"mil-bit-pattern: {config.train_bags:,} generated training bags, {per_epoch} steps "
                f"per epoch, {config.epochs} epochs.",
                *((_RANDOM_MASK_NOTE,) if _mil_device(method) else ()),
            ),
            **_mil_device(method),
        )
        for size in config.bag_sizes
        for method in config.methods
    ]


def mil_mnist_bags_jobs(config: Any) -> list[TrainingJob]:
    """Every (bag size, method) of ``mil-mnist-bags``; runs = seeds."""
    from hopfield.data.images import image_files

    features = 784 if config.source == "mnist" else 64
    bags = 2 * config.train_pairs
    per_epoch = steps_per_epoch(bags, config.batch_size)
    data = (
        tuple(DataNeed.of(f) for f in image_files("mnist", "test"))
        if config.source == "mnist"
        else ()
    )
    jobs = []
    for size in config.bag_sizes:
        quantity = config.large_bag_quantity if size >= config.large_bag_size else config.quantity
        options = {
            "embedding_size": config.embedding_size,
            "num_heads": config.num_heads,
            "head_size": config.head_size,
            "quantity": quantity,
            "scale": config.scale,
            "dropout": config.dropout,
            "attention_dropout": config.attention_dropout,
        }
        for method in config.methods:
            jobs.append(
                TrainingJob(
                    name=f"bag {size} {method}",
                    build_model=_on(_mil_net(features, method, **options)),
                    make_batch=_bag_batch(size, features),
                    loss=_bag_loss,
                    global_batch=config.batch_size,
                    optimizer_steps=config.epochs * per_epoch,
                    runs=config.seeds,
                    tokens_per_example=size,
                    data=data,
                    group=f"bag size {size}",
                    notes=(
                        f"mil-mnist-bags: {bags:,} training bags ({config.train_pairs:,} pairs), "
                        f"{per_epoch} steps per epoch, {config.epochs} epochs.",
                        *((_RANDOM_MASK_NOTE,) if _mil_device(method) else ()),
                    ),
                    **_mil_device(method),
                )
            )
    return jobs


# --- Hyper-SET ----------------------------------------------------------------------------------

#: Hyper-SET Table 1 parameter counts as printed (CIFAR-10 / -100; spec hyperset.md §4.5).
HYPERSET_IMAGE_COUNTS: dict[tuple[str, str], str] = {
    ("cifar10", "hyperset"): "0.96M",
    ("cifar10", "hyperset-scaleup"): "1.61M",
    ("cifar10", "transformer"): "1.79M",
    ("cifar10", "crate"): "0.47M",
    ("cifar10", "crate-t"): "0.32M",
    ("cifar10", "et"): "0.91M",
    ("cifar10", "hyperset-d1536"): "14.3M",
    ("cifar100", "hyperset-d1536"): "14.4M",
    ("cifar100", "hyperset-scaleup"): "1.66M",
    ("cifar100", "transformer"): "1.83M",
}
_IMAGE_ARCH = ("grid", "d_model", "num_heads", "scaleup_d_model", "scaleup_num_heads",
               "iterations", "time_frequency")  # fmt: skip


def hyperset_images_jobs(config: Any) -> list[TrainingJob]:
    """Every model of ``hyperset-images`` (main models, Table 3 variants, Fig. 4 layer splits,
    Table 4 LoRA ranks); ``seeds`` runs each."""
    from hopfield.experiments.hyperset_images import PRESETS, _model_names, build
    from hopfield.nn.hyperset import count_parameters

    channels, side, classes, counts = _image_shape(config.dataset)
    if config.split_test_for_train:
        images = counts["test"] - config.holdout
        data = _image_needs(config.dataset, ("test",))
    else:
        images = counts["train"]
        data = _image_needs(config.dataset)
    if config.train_size:
        images = min(images, config.train_size)
    per_epoch = steps_per_epoch(images, config.batch_size)
    paper_arch = _same_fields(config, PRESETS["paper"], _IMAGE_ARCH)
    note = (
        f"hyperset-images {config.dataset}: {images:,} training images, {per_epoch} steps per "
        f"epoch (the incomplete last batch dropped), {config.epochs} epochs; {config.iterations} iterations "
        "of one shared layer."
    )

    def loss(model: nn.Module, batch: Batch) -> Tensor:
        images, labels = batch
        return F.cross_entropy(model(images), labels, label_smoothing=config.label_smoothing)

    jobs = []
    for name in _model_names(config):
        label = HYPERSET_IMAGE_COUNTS.get((config.dataset, name), "") if paper_arch else ""
        jobs.append(
            TrainingJob(
                name=name,
                build_model=_on(partial(build, config, name, side, channels, classes)),
                make_batch=_image_batch(channels, side, classes),
                loss=loss,
                global_batch=config.batch_size,
                optimizer_steps=config.epochs * per_epoch,
                tokens_per_example=config.grid**2 + 1,
                data=data,
                count_parameters=count_parameters,
                notes=(note,),
                paper_label=label,
                runs=config.seeds,
            )
        )
    return jobs


#: Training puzzles of the RRN "sudoku-hard" train split (Palm et al., 2018).
RRN_TRAIN_PUZZLES = 180_000


def hyperset_sudoku_jobs(config: Any) -> list[TrainingJob]:
    """Every model of ``hyperset-sudoku`` (Hyper-SET, Transformer, ablations); ``seeds`` runs
    each."""
    from hopfield.data.sudoku import RRN_FILES, SATNET_FILES
    from hopfield.experiments.hyperset_sudoku import PRESETS, blank_loss, build
    from hopfield.nn.hyperset import count_parameters

    puzzles = config.train_size
    data: tuple[DataNeed, ...] = ()
    if config.dataset == "rrn-hard":
        puzzles = min(puzzles, RRN_TRAIN_PUZZLES)
        data = (DataNeed.of(RRN_FILES["train"]), DataNeed.of(RRN_FILES["test"]))
    elif config.dataset == "satnet":
        data = tuple(DataNeed.of(f) for f in SATNET_FILES.values())
    per_epoch = steps_per_epoch(puzzles, config.batch_size)
    paper_arch = _same_fields(
        config, PRESETS["paper"], ("d_model", "num_heads", "ff_ratio", "time_frequency")
    )
    labels = {"hyperset": "5.20 M"}  # App. D.2; the paper prints no Transformer count
    note = (
        f"hyperset-sudoku {config.dataset}: {puzzles:,} training puzzles, {per_epoch} steps per "
        f"epoch (the incomplete last batch dropped), {config.epochs} epochs; {config.iterations} iterations "
        "of one shared layer."
    )

    def make_batch(n: int, device: torch.device) -> Batch:
        return (
            torch.randint(10, (n, 81), device=device),
            torch.randint(1, 10, (n, 81), device=device),
        )

    def loss(model: nn.Module, batch: Batch) -> Tensor:
        puzzles, solutions = batch
        return blank_loss(model(puzzles), puzzles, solutions)

    jobs = []
    for name in (*config.models, *config.ablations):
        label = labels.get(name, "") if paper_arch else ""
        jobs.append(
            TrainingJob(
                name=name,
                build_model=_on(partial(build, config, name)),
                make_batch=make_batch,
                loss=loss,
                global_batch=config.batch_size,
                optimizer_steps=config.epochs * per_epoch,
                tokens_per_example=81,
                data=data,
                count_parameters=count_parameters,
                notes=(note,),
                paper_label=label,
                runs=config.seeds,
            )
        )
    return jobs


#: Training images of ImageNet-100 (the 100-class subset of CMC, Tian et al. 2020).
IMAGENET100_TRAIN_IMAGES = 126_689
#: Mean masking ratio of U[0, 0.4].
MEAN_MASK_RATIO = 0.2


def hyperset_mim_jobs(config: Any) -> list[TrainingJob]:
    """Every model of ``hyperset-mim``; one run each."""
    from hopfield.data.images import DIGITS_TRAIN_SIZE
    from hopfield.experiments.hyperset_mim import build
    from hopfield.nn.hyperset import count_parameters

    paper = config.dataset == "imagenet100"
    images = IMAGENET100_TRAIN_IMAGES if paper else _image_shape(config.dataset)[3]["train"]
    if config.dataset == "digits":
        images = DIGITS_TRAIN_SIZE
    per_epoch = steps_per_epoch(images, config.batch_size)
    tokens = config.grid**2
    masked = max(1, round(MEAN_MASK_RATIO * config.max_mask_ratio / 0.4 * tokens))
    data: tuple[DataNeed, ...] = ()
    notes = [
        f"hyperset-mim {config.dataset}: {images:,} training images, {per_epoch} steps per epoch, "
        f"{config.epochs} epochs; the loss over {masked} masked tokens of {tokens} (the mean "
        "masking ratio)."
    ]
    if paper:
        data = (
            DataNeed(
                "ImageNet-100 and the MaskGIT VQGAN tokenizer",
                note="the experiment has no pipeline for them: its paper preset stops with "
                "DataNotFoundError; priced as specified",
            ),
        )
        notes.append(
            "hyperset-mim: ImageNet-100 assumed to hold 126,689 training images (CMC subset); "
            "the paper's Transformer has 8.85M parameters against 8,654,848 here (unresolved, "
            "spec hyperset.md §4.5)."
        )
    counts = {"hyperset": "3.94 M", "hyperset-2x-8d": "8.07 M", "transformer": "8.85 M"}

    def make_batch(n: int, device: torch.device) -> Batch:
        return torch.randint(config.codebook_size, (n, tokens), device=device)

    def loss(model: nn.Module, codes: Tensor) -> Tensor:
        # masked_token_loss(logits, codes, mask) with the first `masked` positions masked: the
        # same cross-entropy over as many tokens, without boolean indexing (shape-dependent).
        logits = model(codes)
        return F.cross_entropy(
            logits[:, :masked].reshape(-1, logits.shape[-1]), codes[:, :masked].reshape(-1)
        )

    jobs = []
    for name in config.models:
        label = counts.get(name, "") if paper and config.d_model == 768 else ""
        jobs.append(
            TrainingJob(
                name=name,
                build_model=_on(partial(build, config, name)),
                make_batch=make_batch,
                loss=loss,
                global_batch=config.batch_size,
                optimizer_steps=config.epochs * per_epoch,
                tokens_per_example=tokens,
                data=data,
                count_parameters=count_parameters,
                notes=tuple(notes),
                paper_label=label,
            )
        )
    return jobs


# --- the tables ---------------------------------------------------------------------------------

JOBS: dict[str, Callable[[Any], list[TrainingJob]]] = {
    "convergence": convergence_jobs,
    "hyperset-images": hyperset_images_jobs,
    "hyperset-mim": hyperset_mim_jobs,
    "hyperset-sudoku": hyperset_sudoku_jobs,
    "mil-benchmark": mil_benchmark_jobs,
    "mil-bit-pattern": mil_bit_pattern_jobs,
    "mil-mnist-bags": mil_mnist_bags_jobs,
    "outlier-benchmark": outlier_benchmark_jobs,
    "outlier-formation": outlier_formation_jobs,
    "outliers": outliers_jobs,
    "outliers-bert": outliers_jobs,
    "outliers-opt": outliers_jobs,
    "outliers-vit": outliers_jobs,
    "stanhop-outliers": stanhop_outliers_jobs,
    "timeseries-hopfield": timeseries_hopfield_jobs,
}
"""Experiment name -> ``jobs(config) -> list[TrainingJob]``."""

NOT_TRAINED: dict[str, str] = {
    "efficiency": "it times forward passes and measures the peak memory and FLOPs of the dense, "
    "sparse, top-K, random, window, linear and random-feature Hopfield models as the memory "
    "grows (generated data; seconds to minutes on one device)",
    "memory-capacity": "static Hopfield memories (stored patterns, no learned weights) retrieve "
    "image patterns; it measures retrieval success against the number of stored patterns",
    "noise-robustness": "static Hopfield memories retrieve image patterns from queries with "
    "Gaussian noise; it measures retrieval success against the noise level",
    "outlier-cost": "it times a few hundred interleaved training steps (forward, backward, "
    "optimiser) of vanilla Softmax and OutEffHop attention in BERT, OPT, ViT and STanHop-Net on "
    "one synthetic batch each and measures their peak memory, training no model to the end "
    "(minutes on one GPU at the paper preset)",
    "retrieval-demo": "scikit-learn digits are stored in a static Hopfield memory and retrieved "
    "from half-masked and noisy queries with Softmax, Softmax_1 and Sparsemax",
    "theory": "numeric checks of the OutEffHop and nonparametric Hopfield statements (energies, "
    "fixed points, bounds, Jacobians) on generated patterns, pass or fail with margins",
}
"""Experiment name -> what it computes instead of training."""


def jobs_of(name: str, config: Any) -> list[TrainingJob]:
    """The training jobs of experiment ``name`` under ``config`` (a preset's configuration).

    Raises:
        ValueError: ``name`` has no entry in :data:`JOBS`.
    """
    if name not in JOBS:
        raise ValueError(
            f"no plan for experiment {name!r}: hopfield.plan.jobs.JOBS has "
            f"{', '.join(sorted(JOBS))}; NOT_TRAINED has {', '.join(sorted(NOT_TRAINED))}"
        )
    jobs = JOBS[name](config)
    if not jobs:
        raise ValueError(f"{name}: the configuration trains no model")
    return jobs


def untrained_data(name: str, config: Any) -> list[DataNeed]:
    """Datasets a non-training experiment reads under ``config``."""
    if name in ("memory-capacity", "noise-robustness"):
        return [
            DataNeed(n.label, file=n.file, note="optional: skipped when absent" if i else "")
            for i, dataset in enumerate(config.datasets)
            for n in _image_needs(dataset, (config.split,))
        ]
    return []

"""Nonparametric Hopfield forecasters on ETTh1, ETTm1, WTH, ECL and Traffic (Table 6 and Figure 5
of Hu et al.).

One :class:`~hopfield.models.forecasting.HopfieldForecaster` per model family (dense, sparse, top-K
20/50/80 %, window, random features, linear, plus OutEffHop), univariate setting (target column
in and out), input length = horizon, 70/10/20 split with train-only standardisation. Reports the
test MSE and MAE of the best-validation epoch, averaged over seeds, beside the paper's numbers,
and the training time per epoch (Figure 5).

The paper's Table 6 lost its dataset labels in extraction; blocks A to E are read as ETTh1,
ETTm1, WTH, ECL, Traffic (the order of the text), which is unverified.

ECL and Traffic are user-supplied files (:attr:`hopfield.data.timeseries.SeriesSpec.user_supplied`,
not shipped with the project): where one is absent from the data directory, its runs are skipped
and the report lists it (expected file, where to get it) in a table "Skipped datasets"; the other
datasets run as without it. An absent shipped file (ETTh1, ETTm1, WTH) still stops the run with
:class:`~hopfield.data.DataNotFoundError`, and ``--stand-in-data`` replaces any absent file by
random values of its shape.

Training goes through :class:`hopfield.training.Trainer`
(:func:`hopfield.experiments.forecasting_common.train_forecaster`: per-epoch schedule, early
stopping, best epoch restored; see there for what differs from the earlier hand-written loop:
the last incomplete batch of each pass is dropped and biases are not decayed). ``batch_size`` is
the global batch. Each (dataset, horizon, model, seed) trains in ``runs/<key>/`` with a checkpoint
after every epoch, so a stopped run resumes there; finished runs are kept in ``runs.json`` and not
trained again. Under ``torchrun`` every process trains its share of each batch and evaluates the
whole validation and test sets (identical numbers); only the main process writes. With
``hopfield run --stand-in-data`` an absent dataset file is replaced by random values of its shape
(with a note).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from hopfield.data.files import DataNotFoundError
from hopfield.data.timeseries import DATASETS, ForecastSplits
from hopfield.experiments.checks import (
    check_choice,
    check_int_items,
    check_ints,
    check_reals,
    check_subset,
)
from hopfield.experiments.forecasting_common import (
    ForecastRecipe,
    evaluate,
    load_splits,
    reusable,
    save_run,
    train_forecaster,
)
from hopfield.experiments.registry import ConfigError, Experiment, register
from hopfield.experiments.results import Results, RunContext, Table, mean_std
from hopfield.functional import Separation, Softmax, SoftmaxN, Sparsemax
from hopfield.functional.structures import Dense, Structure
from hopfield.models.forecasting import HopfieldForecaster

MODELS = (
    "dense",
    "sparse",
    "top20",
    "top50",
    "top80",
    "window",
    "random_features",
    "linear",
    "outeffhop",
)

#: Window half-widths of the paper for each input length (other lengths use round(sqrt(L))).
WINDOW_SIZES = {96: 8, 192: 12, 336: 14, 720: 16}

_PAPER_COLUMNS = (
    "dense",
    "sparse",
    "top20",
    "top50",
    "top80",
    "window",
    "random_features",
    "linear",
)
# Table 6 (MSE, MAE) per dataset and horizon, columns in _PAPER_COLUMNS order.
_PAPER_ROWS: dict[tuple[str, int], str] = {
    (
        "ETTh1",
        96,
    ): ".137 .307 .144 .314 .148 .319 .153 .321 .147 .318 1.043 .881 .147 .312 .149 .320",
    (
        "ETTh1",
        192,
    ): ".153 .326 .152 .325 .146 .318 .161 .333 .150 .320 1.003 .870 .158 .332 .141 .313",
    (
        "ETTh1",
        336,
    ): ".148 .319 .146 .319 .156 .327 .122 .286 .160 .333 .889 .767 .151 .322 .138 .307",
    (
        "ETTh1",
        720,
    ): ".169 .331 .148 .314 .184 .345 .161 .327 .123 .287 .756 .761 .141 .271 .171 .333",
    (
        "ETTm1",
        96,
    ): ".148 .301 .147 .301 .144 .311 .151 .310 .142 .310 .943 .854 .151 .314 .155 .319",
    (
        "ETTm1",
        192,
    ): ".189 .350 .187 .340 .191 .347 .185 .338 .188 .341 1.054 .893 .190 .347 .192 .348",
    (
        "ETTm1",
        336,
    ): ".163 .320 .165 .322 .168 .331 .161 .312 .169 .330 .873 .334 .175 .333 .176 .337",
    (
        "ETTm1",
        720,
    ): ".159 .300 .161 .303 .165 .313 .167 .313 .169 .320 .764 .731 .162 .309 .165 .310",
    ("WTH", 96): ".378 .371 .373 .370 .384 .382 .386 .386 .383 .376 .989 .854 .390 .403 .365 .378",
    (
        "WTH",
        192,
    ): ".486 .426 .535 .507 .502 .427 .501 .464 .519 .481 1.000 .843 .543 .438 .549 .464",
    (
        "WTH",
        336,
    ): ".748 .693 .760 .688 .650 .549 .674 .571 .638 .545 1.012 .849 .767 .588 .672 .578",
    (
        "WTH",
        720,
    ): ".961 .711 .993 .758 1.145 .843 1.166 .847 1.211 .872 1.061 .865 1.362 .896 1.052 .770",
    ("ECL", 96): ".347 .474 .347 .477 .348 .474 .348 .474 .356 .479 .952 .819 .345 .470 .355 .476",
    ("ECL", 192): ".399 .505 .386 .497 .360 .482 .370 .490 .361 .482 .977 .828 .368 .487 .354 .478",
    ("ECL", 336): ".407 .512 .387 .501 .376 .489 .397 .503 .403 .505 .931 .808 .392 .504 .407 .514",
    ("ECL", 720): ".669 .631 .632 .623 .590 .604 .569 .593 .618 .618 .564 .595 .564 .595 .747 .676",
    (
        "Traffic",
        96,
    ): "1.466 .654 1.489 .638 1.483 .645 1.517 .630 1.477 .638 1.520 .625 1.515 .635 1.489 .644",
    (
        "Traffic",
        192,
    ): "1.551 .654 1.550 .657 1.557 .649 1.548 .657 1.551 .652 1.570 .637 1.551 .654 1.551 .653",
    (
        "Traffic",
        336,
    ): "1.595 .663 1.595 .662 1.599 .663 1.592 .665 1.604 .657 1.612 .646 1.613 .646 1.614 .646",
    (
        "Traffic",
        720,
    ): "1.660 .681 1.671 .671 1.664 .674 1.676 .663 1.682 .661 1.683 .661 1.682 .661 1.681 .660",
}


def paper_value(dataset: str, horizon: int, model: str) -> tuple[float | None, float | None]:
    """The paper's ``(MSE, MAE)`` for a setting, or ``(None, None)`` where it has none."""
    row = _PAPER_ROWS.get((dataset, horizon))
    if row is None or model not in _PAPER_COLUMNS:
        return None, None
    numbers = [float(v) for v in row.split()]
    i = 2 * _PAPER_COLUMNS.index(model)
    return numbers[i], numbers[i + 1]


@dataclass
class Config:
    """Configuration of ``timeseries-hopfield``.

    Attributes:
        seed: first seed; runs use ``seed, seed + 1, …`` (``seeds`` of them).
        seeds: number of seeds averaged (paper: 5).
        datasets: ``"ETTh1"``, ``"ETTm1"``, ``"WTH"``, ``"ECL"``, ``"Traffic"`` or ``"synthetic"``
            (ECL and Traffic are skipped, and listed, where their files are absent).
        horizons: horizons (= input lengths).
        models: a subset of :data:`MODELS`.
        features: ``"S"`` (univariate, the paper) or ``"M"``.
        max_rows: use only the first rows of each series (``None``: all).
        d_model, num_heads, scale, dropout: the model (paper code: 64, 4, β = 0.1, 0).
        epochs, batch_size, lr, optimizer, weight_decay, schedule, patience, grad_clip: training
            (paper code: AdamW lr 1e-3, batch 128, cosine, clip 5; epochs are not stated);
            ``batch_size`` is the global batch (all processes).
        max_train_batches, max_eval_batches: caps per epoch / evaluation (``None``: all).
        random_features: features of the random-feature model (``None``: ``int(E ln E)``).
        device: ``"auto"`` (the accelerator's device: this process's GPU where there is one) or
            ``"cpu"``.
    """

    seed: int = 0
    seeds: int = 5
    datasets: tuple[str, ...] = ("ETTh1", "ETTm1", "WTH", "ECL", "Traffic")
    horizons: tuple[int, ...] = (96, 192, 336, 720)
    models: tuple[str, ...] = MODELS
    features: str = "S"
    max_rows: int | None = None
    d_model: int = 64
    num_heads: int = 4
    scale: float = 0.1
    dropout: float = 0.0
    epochs: int = 20
    batch_size: int = 128
    lr: float = 1e-3
    optimizer: str = "adamw"
    weight_decay: float = 0.01
    schedule: str = "cosine"
    patience: int = 3
    grad_clip: float = 5.0
    max_train_batches: int | None = None
    max_eval_batches: int | None = None
    random_features: int | None = None
    device: str = "auto"


PRESETS = {
    "tiny": Config(
        seeds=1,
        datasets=("synthetic",),
        horizons=(24,),
        max_rows=300,
        d_model=16,
        epochs=1,
        batch_size=32,
        max_train_batches=2,
        max_eval_batches=2,
    ),
    "small": Config(
        seeds=1,
        datasets=("ETTh1",),
        horizons=(96,),
        epochs=3,
        max_train_batches=30,
        max_eval_batches=10,
    ),
    "paper": Config(),
}


def window_size(length: int) -> int:
    """The window half-width for input length ``length`` (paper: 8, 12, 14, 16)."""
    return WINDOW_SIZES.get(length, max(1, round(math.sqrt(length))))


def build_model(
    name: str, in_len: int, out_len: int, num_inputs: int, config: Config
) -> HopfieldForecaster:
    """The forecaster of model family ``name`` (see :data:`MODELS`)."""
    from hopfield.functional.efficient import TopK, Window

    separation: Separation = Softmax()
    structure: Structure = Dense()
    pooling_structure: Structure | None = None
    if name == "sparse":
        separation = Sparsemax()
    elif name == "outeffhop":
        separation = SoftmaxN(1.0)
    elif name in ("top20", "top50", "top80"):
        structure = TopK(fraction=int(name[3:]) / 100)
    elif name == "window":
        structure = Window(window_size(in_len))
        pooling_structure = Dense()  # a window needs aligned queries; the paper pools densely
    elif name in ("linear", "random_features"):
        from hopfield.functional.efficient_kernel import Linear, RandomFeatures

        structure = Linear() if name == "linear" else RandomFeatures(config.random_features)
    elif name != "dense":
        raise ValueError(f"model must be one of {MODELS}, got {name!r}")
    return HopfieldForecaster(
        out_len,
        num_inputs=num_inputs,
        d_model=config.d_model,
        num_heads=config.num_heads,
        separation=separation,
        structure=structure,
        pooling_structure=pooling_structure,
        scale=config.scale,
        dropout=config.dropout,
    )


#: Config fields that do not change a single training run (the loops over runs).
_LOOP_FIELDS = ("seed", "seeds", "datasets", "horizons", "models", "device")


def recipe(config: Config) -> ForecastRecipe:
    """The training recipe of ``config``."""
    return ForecastRecipe(
        epochs=config.epochs,
        batch_size=config.batch_size,
        lr=config.lr,
        optimizer=config.optimizer,
        weight_decay=config.weight_decay,
        schedule=config.schedule,
        patience=config.patience,
        grad_clip=config.grad_clip,
        max_train_batches=config.max_train_batches,
        max_eval_batches=config.max_eval_batches,
    )


def check_config(config: Config) -> None:
    """:class:`ConfigError` naming the first field ``config`` cannot run with."""
    check_subset("models", config.models, MODELS)
    check_choice("device", config.device, ("auto", "cpu"))
    check_subset("datasets", config.datasets, (*DATASETS, "synthetic"))
    check_choice("features", config.features, ("S", "M", "MS"))
    check_int_items("horizons", config.horizons)
    check_ints(config, "seeds", "d_model", "num_heads")
    check_ints(config, "max_rows", minimum=3, optional=True)
    check_ints(config, "random_features", optional=True)
    check_reals(config, "scale", low=0.0, low_open=True)
    check_reals(config, "dropout", low=0.0, high=1.0, high_open=True)
    if config.d_model % config.num_heads:
        raise ConfigError(
            f"d_model ({config.d_model}) must be divisible by num_heads ({config.num_heads})"
        )
    recipe(config)  # ConfigError for the training fields


def run(config: Config, ctx: RunContext) -> Results:
    """Train every (dataset, horizon, model, seed); resumable (``runs.json``, run folders)."""
    check_config(config)
    runs: dict[str, Any] = ctx.load_json("runs.json") or {}
    settings = [
        (d, h, m, config.seed + s)
        for d in config.datasets
        for h in config.horizons
        for m in config.models
        for s in range(config.seeds)
    ]
    fixed = {k: v for k, v in asdict(config).items() if k not in _LOOP_FIELDS}
    loaded: dict[tuple[str, int], tuple[ForecastSplits, str]] = {}
    sources: set[str] = set()
    skipped: dict[str, str] = {}
    warmed = False
    for dataset, horizon, model_name, seed in ctx.track(settings, len(settings), "runs"):
        if dataset in skipped:
            continue
        if (dataset, horizon) not in loaded:
            loaded.clear()
            try:
                loaded[(dataset, horizon)] = load_splits(
                    ctx,
                    dataset,
                    horizon,
                    horizon,
                    features=config.features,
                    max_rows=config.max_rows,
                )
            except DataNotFoundError as missing:
                if not user_supplied(dataset):
                    raise
                skipped[dataset] = str(missing)
                continue
        splits, source = loaded[(dataset, horizon)]
        sources.add(source)
        key = f"{dataset}|{horizon}|{model_name}|{seed}"
        identity = {**fixed, "run": key, "data": source}
        if reusable(runs.get(key), identity, ctx):
            continue
        if not warmed:
            _warm_up()
            warmed = True
        _train(config, ctx, runs, (key, horizon, model_name, seed), splits, identity)
    results = summarise(config, runs, ctx, skipped)
    results.notes.extend(sorted(s for s in sources if s.startswith("STAND-IN")))
    return results


def user_supplied(dataset: str) -> bool:
    """Whether ``dataset`` is read from a file the project does not ship (ECL, Traffic): the
    experiment skips it when the file is absent."""
    return dataset in DATASETS and DATASETS[dataset].user_supplied


def _skipped_table(skipped: dict[str, str]) -> Table:
    """The datasets whose user-supplied files are absent, where each goes and where to get it."""
    return Table(
        name="Skipped datasets (user-supplied files absent)",
        columns=["dataset", "expected file (below the data directory)", "original"],
        rows=[[d, DATASETS[d].file.relative_path, DATASETS[d].file.url] for d in skipped],
        caption=(
            "Not shipped with the project. Put the file there (--data-dir DIR or $HOPFIELD_DATA) "
            "and run the same command again: the finished runs of the other datasets are reused."
        ),
    )


def _train(
    config: Config,
    ctx: RunContext,
    runs: dict[str, Any],
    job: tuple[str, int, str, int],
    splits: ForecastSplits,
    identity: dict[str, Any],
) -> None:
    """Train and evaluate ``job = (key, horizon, model, seed)`` and record it as ``runs[key]``."""
    key, horizon, model_name, seed = job
    folder = "runs/" + key.replace("|", "-")
    torch.manual_seed(seed)
    model = build_model(model_name, horizon, horizon, splits.num_inputs, config)
    training = recipe(config)
    fitted = train_forecaster(
        model,
        splits,
        training,
        ctx,
        folder,
        seed=seed,
        identity=identity,
        cpu=config.device == "cpu",
    )
    batch, limit = training.eval_batch, config.max_eval_batches
    record = {
        **fitted.to_dict(),
        "val": evaluate(model, splits.val, batch, limit),
        "test": evaluate(model, splits.test, batch, limit),
    }
    save_run(ctx, runs, key, record, identity=identity, folder=folder, finished=fitted.finished)


def _warm_up() -> None:
    """One throwaway forward, backward and AdamW step on a small model (nothing is kept), so
    that one-time library set-up is not timed as the first epoch of the first run."""
    model = HopfieldForecaster(2, d_model=8, num_heads=2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(2, 4, 1)).square().mean().backward()
    optimizer.step()


def summarise(
    config: Config, runs: dict[str, Any], ctx: RunContext, skipped: dict[str, str] | None = None
) -> Results:
    """Tables (Table 6, Figure 5), metrics and the timing figure from the finished runs.

    ``skipped`` maps the datasets whose files were absent to the error saying so: they have no
    rows, and a table lists them.
    """
    skipped = skipped or {}
    datasets = [d for d in config.datasets if d not in skipped]
    rows: list[list[Any]] = []
    metrics: dict[str, float] = {}
    timing: dict[tuple[str, int, str], float] = {}
    wall: dict[tuple[str, int, str], float] = {}
    for dataset in datasets:
        for horizon in config.horizons:
            for model in config.models:
                found = [
                    runs[f"{dataset}|{horizon}|{model}|{config.seed + s}"]
                    for s in range(config.seeds)
                ]
                mse, mse_std = mean_std([r["test"]["mse"] for r in found])
                mae, _ = mean_std([r["test"]["mae"] for r in found])
                seconds, _ = mean_std([r["seconds_per_epoch"] for r in found])
                cpu, _ = mean_std([r["cpu_seconds_per_epoch"] for r in found])
                paper_mse, paper_mae = paper_value(dataset, horizon, model)
                rows.append(
                    [dataset, horizon, model, mse, mse_std, mae, paper_mse, paper_mae, seconds, cpu]
                )
                prefix = f"{dataset}/{horizon}/{model}"
                metrics.update({f"{prefix}/mse": mse, f"{prefix}/mae": mae})
                timing[(dataset, horizon, model)] = cpu
                wall[(dataset, horizon, model)] = seconds
    table6 = Table(
        name="Table 6: univariate forecasting, test MSE / MAE",
        columns=[
            "dataset",
            "H",
            "model",
            "MSE",
            "MSE std",
            "MAE",
            "paper MSE",
            "paper MAE",
            "s/epoch",
            "CPU s/epoch",
        ],
        rows=rows,
        caption=(
            f"Mean over {config.seeds} seed(s), input length = horizon, best-validation epoch. "
            "Paper blocks A/B/C read as ETTh1/ETTm1/WTH (unverified)."
        ),
    )
    tables = [table6]
    figures = []
    if datasets:
        first = datasets[0]
        tables.append(
            Table(
                name=f"Figure 5: training seconds per epoch on {first}",
                columns=[
                    "model",
                    *[f"H={h} {kind}" for h in config.horizons for kind in ("CPU s", "wall s")],
                ],
                rows=[
                    [m, *[t[(first, h, m)] for h in config.horizons for t in (timing, wall)]]
                    for m in config.models
                ],
                caption=(
                    "CPU time (summed over the processes) and wall time of the training part of "
                    "one epoch (mean over seeds and epochs)."
                ),
            )
        )
        figures.append(_plot_timing(config, first, timing, ctx))
    notes = [
        "Window uses half-widths 8/12/14/16 for L = 96/192/336/720 and dense pooling.",
        "Top-K keeps int(fraction · L) memories with -inf elsewhere (not the code's 0-fill).",
    ]
    if {"ECL", "Traffic"} & set(datasets):
        notes.append("Paper blocks D/E read as ECL/Traffic (unverified, as A/B/C).")
    if skipped:
        tables.append(_skipped_table(skipped))
        notes.extend(f"{d} skipped: {message}" for d, message in skipped.items())
    return Results(tables=tables, metrics=metrics, figures=figures, notes=notes)


def _plot_timing(
    config: Config, first: str, timing: dict[tuple[str, int, str], float], ctx: RunContext
) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for model in config.models:
        ax.plot(
            config.horizons, [timing[(first, h, model)] for h in config.horizons], "o-", label=model
        )
    ax.set_xlabel("input length = horizon")
    ax.set_ylabel("CPU seconds per training epoch")
    ax.set_title(f"{first}: training time per epoch")
    ax.legend(fontsize=7)
    fig.tight_layout()
    name = "timeseries_time_per_epoch.png"
    ctx.save_figure(fig, name, dpi=120)
    return name


register(
    Experiment(
        name="timeseries-hopfield",
        summary="Hopfield forecasters (dense, sparse, top-K, window, RF, linear, OutEffHop) on ETT/WTH",
        presets=PRESETS,
        run=run,
        check=check_config,
        paper="Table 6 and Figure 5 of Hu et al., Nonparametric Modern Hopfield Models (ICML 2025)",
        tags=("timeseries",),
    )
)

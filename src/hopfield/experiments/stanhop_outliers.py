"""STanHop-Net with Hopfield, sparse, GSH, OutEffHop, clipped and gated associations (OutEffHop Table 2).

For every setting (dataset, horizon, input length, segment length, learning rate, batch) of the
OutEffHop scripts and every association kind, STanHop-Net is trained with early stopping on the
validation MSE (STanHop/Crossformer month splits, train-only standardisation, all series in and
out); the best checkpoint is evaluated once on the test windows:

* MSE and MAE on the standardised scale;
* average Pearson kurtosis and maximum infinity norm of the decoder layers' outputs (per-sample
  statistics averaged over the test windows, :class:`hopfield.outliers.ActivationRecorder`);
* the MSE after W8A8 fake quantization (:func:`hopfield.outliers.quantize_w8a8`, INT8 weights
  and activations of every Linear, LayerNorm and GELU, calibrated on validation batches).

It also recomputes the paper's claim that OutEffHop ranks first or second among the four Table 2
models in 25 of 30 (setting, outlier metric) pairs, on our numbers.

**Figure 2(d)** (the training curves): while each run trains, ``max |x|`` of every decoder
layer's output on the current training batch is recorded at up to :data:`CURVE_POINTS` evenly
spaced steps per epoch (:class:`hopfield.experiments.forecasting_common.TrainingCurve`: read-only
hooks, so training and every other number are unchanged). The run's ``curve`` in ``runs.json``
holds all points; the report shows, for the first setting, the mean over seeds of the paper's
layer (:func:`figure_layer`) and of the maximum over the decoder layers, as a table and as
``figure2d_stanhop.png`` (one panel per pair: vanilla / clipped / gated against its OutEffHop
variant).

Training goes through :class:`hopfield.training.Trainer`
(:func:`hopfield.experiments.forecasting_common.train_forecaster`: Adam, the per-epoch ``type1``
schedule, gradient clipping, early stopping, best epoch restored; the last incomplete batch of
each pass is now dropped). The batch of a setting is the global batch. Each (setting, model,
seed) trains in ``runs/<key>/`` with a checkpoint after every epoch, so a stopped run resumes
there; finished runs are kept in ``runs.json`` and not trained again. Under ``torchrun`` every
process trains its share of each batch and measures the whole test set (identical numbers); only
the main process writes. With ``hopfield run --stand-in-data`` an absent dataset file is replaced
by random values of its shape (with a note).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from hopfield.data.timeseries import DATASETS, ForecastSplits
from hopfield.experiments.checks import (
    check_choice,
    check_int_items,
    check_ints,
    check_reals,
    check_subset,
    config_errors,
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
from hopfield.models.stanhop import ASSOCIATION_KINDS, Association, STanHopNet, figure_layer
from hopfield.outliers import ActivationRecorder, quantize_w8a8

#: (dataset, horizon, in_len, seg_len, learning rate, batch size).
Setting = tuple[str, int, int, int, float, int]

#: The settings of the OutEffHop scripts (``submit_STHM.sh``).
PAPER_SETTINGS: tuple[Setting, ...] = (
    ("ETTh1", 24, 168, 6, 1e-4, 128),
    ("ETTh1", 48, 168, 6, 1e-4, 128),
    ("ETTh1", 168, 720, 24, 1e-5, 128),
    ("ETTh1", 336, 720, 24, 1e-5, 128),
    ("ETTh1", 720, 720, 24, 1e-5, 128),
    ("ETTm1", 24, 288, 12, 1e-4, 64),
    ("ETTm1", 48, 288, 6, 1e-4, 64),
    ("ETTm1", 96, 672, 12, 1e-4, 64),
    ("ETTm1", 288, 672, 24, 1e-5, 64),
    ("ETTm1", 672, 672, 12, 1e-5, 64),
    ("WTH", 24, 48, 4, 1e-4, 64),
    ("WTH", 48, 48, 4, 1e-4, 64),
    ("WTH", 168, 336, 24, 1e-5, 64),
    ("WTH", 336, 336, 24, 1e-5, 64),
    ("WTH", 720, 720, 24, 1e-5, 64),
)

#: The four models of Table 2, in its column order.
TABLE2_MODELS = ("dense", "sparse", "gsh", "outeffhop")

# Table 2: per (dataset, horizon), per model in TABLE2_MODELS order: MSE MAE kurtosis inf-norm.
_TABLE2 = {
    (
        "ETTh1",
        24,
    ): "0.360 0.401 2.954 5.048 0.388 0.411 3.311 4.954 0.395 0.415 3.269 4.947 0.361 0.397 2.897 4.565",
    (
        "ETTh1",
        48,
    ): "0.405 0.424 2.968 4.969 0.466 0.452 3.295 4.749 0.458 0.448 3.271 4.644 0.409 0.426 2.965 4.570",
    (
        "ETTh1",
        168,
    ): "0.881 0.710 2.545 3.923 1.422 0.921 3.149 4.348 1.422 0.926 3.093 4.160 0.872 0.704 2.526 3.865",
    (
        "ETTh1",
        336,
    ): "0.755 0.648 2.436 3.536 1.223 0.851 3.071 4.156 1.381 0.909 3.043 4.248 0.780 0.658 2.433 3.416",
    (
        "ETTh1",
        720,
    ): "0.852 0.709 2.443 3.266 1.134 0.824 3.030 4.179 1.360 0.904 3.062 4.238 0.894 0.788 2.450 3.218",
    (
        "ETTm1",
        24,
    ): "0.272 0.339 3.617 4.717 0.265 0.331 3.357 4.334 0.261 0.328 3.547 4.696 0.347 0.429 3.584 4.212",
    (
        "ETTm1",
        48,
    ): "0.352 0.387 4.211 5.603 0.304 0.355 4.280 6.296 0.328 0.367 4.384 5.557 0.375 0.409 3.967 5.816",
    (
        "ETTm1",
        96,
    ): "0.396 0.412 3.102 4.534 0.345 0.383 3.568 4.441 0.344 0.375 3.609 4.618 0.529 0.487 3.014 4.333",
    (
        "ETTm1",
        288,
    ): "0.600 0.540 2.643 3.179 0.500 0.471 2.783 3.172 0.515 0.483 2.803 3.228 0.572 0.513 2.498 3.151",
    (
        "ETTm1",
        672,
    ): "0.784 0.627 2.674 3.740 0.537 0.495 3.429 3.875 0.571 0.519 3.427 3.439 0.752 0.607 2.553 3.641",
    (
        "WTH",
        24,
    ): "0.357 0.404 3.616 6.668 0.378 0.429 3.656 5.609 0.370 0.394 3.726 9.126 0.378 0.423 3.711 5.428",
    (
        "WTH",
        48,
    ): "0.441 0.464 3.904 6.481 0.441 0.474 3.957 7.409 0.472 0.500 3.911 6.730 0.464 0.480 3.663 6.649",
    (
        "WTH",
        168,
    ): "0.549 0.562 2.617 3.028 0.575 0.575 2.835 3.364 0.561 0.565 2.712 3.087 0.562 0.561 2.552 2.931",
    (
        "WTH",
        336,
    ): "0.572 0.579 2.565 3.185 0.598 0.593 2.849 3.640 0.552 0.557 2.710 3.087 0.613 0.604 2.516 3.383",
    (
        "WTH",
        720,
    ): "0.727 0.670 2.578 3.617 0.591 0.587 2.737 3.228 0.571 0.573 2.737 3.219 0.794 0.710 2.543 3.524",
}

# Table 1, STanHop-Net rows (ETTh1, horizon 24): kurtosis, inf norm, FP16 MSE, W8A8 MSE.
_TABLE1 = {
    "dense": (2.954, 5.048, 0.360, 0.362),
    "outeffhop": (2.897, 4.565, 0.360, 0.355),
    "clipped": (2.995, 4.890, 0.553, 0.591),
    "clipped_outeffhop": (2.864, 4.145, 0.506, 0.517),
    "gated": (2.487, 4.277, 0.380, 0.375),
    "gated_outeffhop": (2.459, 4.240, 0.376, 0.367),
}

_METRICS = ("mse", "mae", "avg_kurtosis", "max_inf_norm")

#: The decoder-layer outputs whose outliers are measured and whose training curve is recorded.
DECODER_LAYERS = r"decoder\.\d+"

#: Training-curve points per epoch at most (every ``max(1, steps per epoch // CURVE_POINTS)``-th
#: step).
CURVE_POINTS = 10

#: The panels of Figure 2(d), left to right: (counterpart, its OutEffHop variant).
FIGURE2_PAIRS: tuple[tuple[str, str], ...] = (
    ("dense", "outeffhop"),
    ("clipped", "clipped_outeffhop"),
    ("gated", "gated_outeffhop"),
)

#: Rows per model of the Figure 2(d) table at most (evenly spaced points, the last included).
_CURVE_ROWS = 12


def paper_table2(dataset: str, horizon: int, model: str) -> dict[str, float] | None:
    """The paper's Table 2 entry ``{mse, mae, avg_kurtosis, max_inf_norm}``, or ``None``."""
    row = _TABLE2.get((dataset, horizon))
    if row is None or model not in TABLE2_MODELS:
        return None
    values = [float(v) for v in row.split()]
    i = 4 * TABLE2_MODELS.index(model)
    return dict(zip(_METRICS, values[i : i + 4], strict=True))


def top_two_count(
    entries: dict[tuple[str, int], dict[str, dict[str, float]]],
) -> tuple[int, int]:
    """How often OutEffHop is first or second (lowest) among the Table 2 models.

    Args:
        entries: ``{(dataset, horizon): {model: {"avg_kurtosis": ., "max_inf_norm": .}}}``;
            settings that lack one of the four models are skipped.

    Returns:
        ``(count, pairs)`` over (setting, metric) pairs for kurtosis and infinity norm.
    """
    count = pairs = 0
    for models in entries.values():
        if not all(m in models for m in TABLE2_MODELS):
            continue
        for metric in ("avg_kurtosis", "max_inf_norm"):
            ours = models["outeffhop"][metric]
            better = sum(models[m][metric] < ours for m in TABLE2_MODELS if m != "outeffhop")
            count += better <= 1
            pairs += 1
    return count, pairs


@dataclass
class Config:
    """Configuration of ``stanhop-outliers``.

    Attributes:
        seed: first seed; ``seeds`` runs per setting and model (paper: 10 repeats).
        settings: ``(dataset, horizon, in_len, seg_len, lr, batch)`` tuples (:data:`PAPER_SETTINGS`).
        models: association kinds (:data:`hopfield.models.stanhop.ASSOCIATION_KINDS`).
        max_rows: use only the first rows of each series (then a 70/10/20 split).
        d_model, d_ff, num_heads, e_layers, factor, win_size, dropout: STanHop-Net (paper runs:
            256, 512, 4, 11, 10, 1, 0.5 — 35.13M parameters without the position tables).
        gsh_alpha, clip_gamma, clip_zeta, gate_init: association parameters.
        epochs, patience, schedule, grad_clip: training (Adam, type1 halving, early stopping).
        max_train_batches, max_eval_batches: caps per epoch / evaluation (``None``: all).
        eval_batch_size: windows per evaluation and calibration batch (``None``: the setting's
            training batch).
        quantize: also report the W8A8 MSE.
        calibration_batches: validation batches for the W8A8 activation ranges.
        device: ``"auto"`` (the accelerator's device: this process's GPU where there is one) or
            ``"cpu"``.
    """

    seed: int = 0
    seeds: int = 10
    settings: tuple[Setting, ...] = PAPER_SETTINGS
    models: tuple[str, ...] = ASSOCIATION_KINDS
    max_rows: int | None = None
    d_model: int = 256
    d_ff: int = 512
    num_heads: int = 4
    e_layers: int = 11
    factor: int = 10
    win_size: int = 1
    dropout: float = 0.5
    gsh_alpha: float = 1.5
    clip_gamma: float = -0.1
    clip_zeta: float = 1.1
    gate_init: float = 0.25
    epochs: int = 100
    patience: int = 5
    schedule: str = "type1"
    grad_clip: float = 5.0
    max_train_batches: int | None = None
    max_eval_batches: int | None = None
    eval_batch_size: int | None = None
    quantize: bool = True
    calibration_batches: int = 16
    device: str = "auto"


PRESETS = {
    "tiny": Config(
        seeds=1,
        settings=(("synthetic", 8, 24, 4, 1e-3, 16),),
        max_rows=300,
        d_model=16,
        d_ff=32,
        num_heads=2,
        e_layers=1,
        factor=2,
        dropout=0.1,
        epochs=1,
        max_train_batches=2,
        max_eval_batches=2,
        calibration_batches=2,
    ),
    "small": Config(
        seeds=1,
        settings=(("ETTh1", 24, 168, 6, 1e-3, 16),),
        d_model=32,
        d_ff=64,
        num_heads=4,
        e_layers=2,
        factor=4,
        dropout=0.1,
        epochs=3,
        patience=2,
        max_train_batches=25,
        max_eval_batches=10,
        calibration_batches=4,
    ),
    "paper": Config(),
}


def build_model(
    config: Config, num_series: int, in_len: int, out_len: int, seg_len: int, kind: str
) -> STanHopNet:
    """STanHop-Net of ``config`` with association ``kind``."""
    association = Association(
        kind,
        alpha=config.gsh_alpha,
        clip_gamma=config.clip_gamma,
        clip_zeta=config.clip_zeta,
        gate_init=config.gate_init,
    )
    return STanHopNet(
        num_series,
        in_len,
        out_len,
        seg_len,
        win_size=config.win_size,
        factor=config.factor,
        d_model=config.d_model,
        d_ff=config.d_ff,
        num_heads=config.num_heads,
        e_layers=config.e_layers,
        dropout=config.dropout,
        association=association,
    )


def measure(
    model: STanHopNet, splits: ForecastSplits, config: Config, batch: int
) -> dict[str, Any]:
    """Test MSE/MAE, decoder-layer outlier metrics and (optionally) the W8A8 test MSE/MAE."""
    with ActivationRecorder(model, [DECODER_LAYERS]) as recorder:
        test = evaluate(model, splits.test, batch, config.max_eval_batches)
    summary = recorder.summary()
    record: dict[str, Any] = {
        **test,
        "avg_kurtosis": summary["avg_kurtosis"],
        "max_inf_norm": summary["max_inf_norm"],
        "alphas": model.alphas(),
        **{f"params_{k}": v for k, v in model.parameter_counts().items()},
    }
    if config.quantize:
        device = next(model.parameters()).device
        calibration = (x.to(device) for x, _ in splits.val.batches(batch))
        quantized = quantize_w8a8(model, calibration, num_batches=config.calibration_batches)
        w8a8 = evaluate(quantized, splits.test, batch, config.max_eval_batches)
        record.update(w8a8_mse=w8a8["mse"], w8a8_mae=w8a8["mae"])
    return record


def parse_setting(raw: Sequence[Any]) -> Setting:
    """A ``settings`` entry as its typed tuple ``(dataset, horizon, in_len, seg_len, lr, batch)``
    (JSON overrides give lists); a wrong length is a :class:`ConfigError`."""
    if len(raw) != 6:
        raise ConfigError(
            f"settings: each entry needs 6 fields (dataset, horizon, in_len, seg_len, lr, batch), "
            f"got {raw!r}"
        )
    dataset, horizon, in_len, seg_len, lr, batch = raw
    return str(dataset), int(horizon), int(in_len), int(seg_len), float(lr), int(batch)


#: Config fields that do not change a single training run (the loops over runs).
_LOOP_FIELDS = ("seed", "seeds", "settings", "models", "device")


def recipe(config: Config, lr: float, batch: int) -> ForecastRecipe:
    """The training recipe of ``config`` for a setting's learning rate and batch."""
    return ForecastRecipe(
        epochs=config.epochs,
        batch_size=batch,
        lr=lr,
        optimizer="adam",
        schedule=config.schedule,
        patience=config.patience,
        grad_clip=config.grad_clip,
        max_train_batches=config.max_train_batches,
        max_eval_batches=config.max_eval_batches,
        eval_batch_size=config.eval_batch_size,
    )


def check_config(config: Config) -> None:
    """:class:`ConfigError` naming the first field ``config`` cannot run with."""
    check_subset("models", config.models, ASSOCIATION_KINDS)
    check_choice("device", config.device, ("auto", "cpu"))
    check_ints(config, "seeds", "calibration_batches", "d_model", "d_ff", "num_heads", "e_layers")
    check_ints(config, "factor", "win_size")
    check_reals(config, "dropout", low=0.0, high=1.0, high_open=True)
    if config.d_model % config.num_heads:
        raise ConfigError(
            f"d_model ({config.d_model}) must be divisible by num_heads ({config.num_heads})"
        )
    check_ints(config, "max_rows", minimum=3, optional=True)
    if not config.settings:
        raise ConfigError("settings must hold at least one (dataset, horizon, ...) entry")
    recipe(config, 1e-3, 1)  # the training fields every setting shares
    settings = [parse_setting(raw) for raw in config.settings]
    for i, (dataset, horizon, in_len, seg_len, lr, batch) in enumerate(settings):
        check_choice(f"settings[{i}] dataset", dataset, (*DATASETS, "synthetic"))
        check_int_items(f"settings[{i}] horizon, in_len, seg_len", (horizon, in_len, seg_len))
        with config_errors(f"settings[{i}] (its lr and batch): "):
            recipe(config, lr, batch)


def run(config: Config, ctx: RunContext) -> Results:
    """Train and measure every (setting, model, seed); resumable (``runs.json``, run folders)."""
    check_config(config)
    runs: dict[str, Any] = ctx.load_json("runs.json") or {}
    jobs = [
        (parse_setting(setting), model, config.seed + s)
        for setting in config.settings
        for model in config.models
        for s in range(config.seeds)
    ]
    fixed = {k: v for k, v in asdict(config).items() if k not in _LOOP_FIELDS}
    cached: tuple[Setting, ForecastSplits, str] | None = None
    sources: set[str] = set()
    for setting, kind, seed in ctx.track(jobs, len(jobs), "runs"):
        dataset, horizon, in_len, *_ = setting
        if cached is None or cached[0] != setting:
            protocol = "ratio" if config.max_rows else "stanhop"
            splits, source = load_splits(
                ctx, dataset, in_len, horizon, protocol=protocol, max_rows=config.max_rows
            )
            cached = (setting, splits, source)
        splits, source = cached[1], cached[2]
        sources.add(source)
        key = f"{dataset}|{horizon}|{kind}|{seed}"
        identity = {**fixed, "run": key, "setting": list(setting), "data": source}
        if not reusable(runs.get(key), identity, ctx):
            _train(config, ctx, runs, (key, setting, kind, seed), splits, identity)
    results = summarise(config, runs)
    results.notes.extend(sorted(s for s in sources if s.startswith("STAND-IN")))
    figure = plot_figure2d(config, runs, ctx)
    if figure is not None:
        results.figures.append(figure)
    return results


def _train(
    config: Config,
    ctx: RunContext,
    runs: dict[str, Any],
    job: tuple[str, Setting, str, int],
    splits: ForecastSplits,
    identity: dict[str, Any],
) -> None:
    """Train and measure ``job = (key, setting, kind, seed)`` and record it as ``runs[key]``."""
    key, (_, horizon, in_len, seg_len, lr, batch), kind, seed = job
    folder = "runs/" + key.replace("|", "-")
    torch.manual_seed(seed)
    model = build_model(config, splits.num_inputs, in_len, horizon, seg_len, kind)
    training = recipe(config, lr, batch)
    fitted = train_forecaster(
        model,
        splits,
        training,
        ctx,
        folder,
        seed=seed,
        identity=identity,
        cpu=config.device == "cpu",
        monitor=[DECODER_LAYERS],
        points_per_epoch=CURVE_POINTS,
    )
    record = measure(model, splits, config, training.eval_batch)
    record.update(fitted.to_dict())
    save_run(ctx, runs, key, record, identity=identity, folder=folder, finished=fitted.finished)


@dataclass
class Curve:
    """The training curve of one model, averaged over its runs (Figure 2(d)).

    Attributes:
        steps: the optimiser steps that every averaged run recorded.
        layer: mean over the runs of ``max |x|`` of the :func:`figure_layer` output.
        top: mean over the runs of the maximum over the decoder layers.
        runs: how many runs are averaged.
    """

    steps: list[int]
    layer: list[float]
    top: list[float]
    runs: int


def mean_curve(found: Sequence[dict[str, Any]], layer: int) -> Curve | None:
    """The :class:`Curve` of the runs in ``found`` that recorded one (``None`` if none did)."""
    curves = [{p["step"]: p["max_abs"] for p in r["curve"]} for r in found if r.get("curve")]
    if not curves:
        return None
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    name = f"decoder.{layer}"
    return Curve(
        steps,
        [sum(c[s][name] for c in curves) / len(curves) for s in steps],
        [sum(max(c[s].values()) for c in curves) / len(curves) for s in steps],
        len(curves),
    )


def _curves(config: Config, runs: dict[str, Any]) -> tuple[dict[str, Curve], int]:
    """The first setting's curve per model, and how many of its runs recorded none."""
    dataset, horizon, *_ = parse_setting(config.settings[0])
    curves: dict[str, Curve] = {}
    missing = 0
    for model in config.models:
        found = [
            runs[f"{dataset}|{horizon}|{model}|{config.seed + s}"] for s in range(config.seeds)
        ]
        missing += sum(not r.get("curve") for r in found)
        curve = mean_curve(found, figure_layer(config.e_layers))
        if curve is not None:
            curves[model] = curve
    return curves, missing


def _spaced(n: int, most: int) -> list[int]:
    """At most ``most`` (>= 2) evenly spaced indices of ``range(n)``, the first and last included."""
    if n <= most:
        return list(range(n))
    return sorted({round(i * (n - 1) / (most - 1)) for i in range(most)})


def figure2d(config: Config, runs: dict[str, Any]) -> tuple[Table, dict[str, float], list[str]]:
    """The Figure 2(d) table, its metrics and notes, for the first setting.

    Metrics: ``figure2d/<model>/mean_max_abs`` (the curve's mean over its steps, figure layer)
    and, per pair of :data:`FIGURE2_PAIRS`, ``figure2d/<new>_below_<old>``: the share of the
    steps both curves recorded at which the OutEffHop variant's is lower.
    """
    dataset, horizon, *_ = parse_setting(config.settings[0])
    k = figure_layer(config.e_layers)
    curves, missing = _curves(config, runs)
    rows = [
        [model, c.steps[i], c.runs, c.layer[i], c.top[i]]
        for model, c in curves.items()
        for i in _spaced(len(c.steps), _CURVE_ROWS)
    ]
    metrics = {f"figure2d/{m}/mean_max_abs": sum(c.layer) / len(c.layer) for m, c in curves.items()}
    notes = []
    for old, new in FIGURE2_PAIRS:
        a, b = curves.get(old), curves.get(new)
        common = sorted(set(a.steps) & set(b.steps)) if a and b else []
        if a is None or b is None or not common:
            continue
        below = sum(b.layer[b.steps.index(s)] < a.layer[a.steps.index(s)] for s in common)
        metrics[f"figure2d/{new}_below_{old}"] = below / len(common)
        notes.append(
            f"Figure 2(d), {new} against {old}: lower max |x| (decoder layer {k}) at {below} of "
            f"{len(common)} recorded steps; mean over the steps {metrics[f'figure2d/{new}/mean_max_abs']:.4g} "
            f"vs {metrics[f'figure2d/{old}/mean_max_abs']:.4g}."
        )
    if missing:
        notes.append(
            f"Figure 2(d): {missing} run(s) of {dataset}/{horizon} have no training curve "
            "(recorded before curves were kept); run again with --overwrite to draw them."
        )
    table = Table(
        name=f"Figure 2(d): max |x| of the decoder layers on training batches, {dataset}, "
        f"horizon {horizon}",
        columns=["model", "step", "runs", f"decoder layer {k}", "max over decoder layers"],
        rows=rows,
        caption=(
            f"max |x| of the layer outputs on the step's training batch, mean over runs; layer "
            f"{k} of {config.e_layers + 1} stands for the paper's layer 9 of 12. At most "
            f"{_CURVE_ROWS} evenly spaced steps per model (runs.json → curve holds every point)."
        ),
    )
    return table, metrics, notes


def plot_figure2d(config: Config, runs: dict[str, Any], ctx: RunContext) -> str | None:
    """Draw Figure 2(d) (one panel per pair of :data:`FIGURE2_PAIRS` with curves) as
    ``figure2d_stanhop.png``; its name, or ``None`` when no pair has curves."""
    curves, _ = _curves(config, runs)
    pairs = [(a, b) for a, b in FIGURE2_PAIRS if a in curves and b in curves]
    if not pairs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = figure_layer(config.e_layers)
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.5 * len(pairs), 3.4), squeeze=False)
    for ax, pair in zip(axes[0], pairs, strict=True):
        for model, color in zip(pair, ("0.5", "tab:red"), strict=True):
            c = curves[model]
            ax.plot(c.steps, c.layer, color=color, marker=".", label=f"{model}, layer {k}")
            ax.plot(c.steps, c.top, color=color, linestyle="--", label=f"{model}, all layers")
        ax.set_title(f"{pair[0]} vs {pair[1]}")
        ax.set_xlabel("step")
        ax.set_ylabel("max |x| on the training batch")
        ax.legend(fontsize=7)
    dataset, horizon, *_ = parse_setting(config.settings[0])
    fig.suptitle(f"Figure 2(d), STanHop-Net, {dataset}/{horizon}: decoder ||x||∞ during training")
    fig.tight_layout()
    return ctx.save_figure(fig, "figure2d_stanhop.png", dpi=110)


def _mean(found: list[dict[str, Any]], metric: str) -> float | None:
    values = [r[metric] for r in found if metric in r]
    return mean_std(values)[0] if values else None


def summarise(config: Config, runs: dict[str, Any]) -> Results:
    """Table 2, the Table 1 rows, the top-two count and metrics from the finished runs."""
    rows: list[list[Any]] = []
    metrics: dict[str, float] = {}
    entries: dict[tuple[str, int], dict[str, dict[str, float]]] = {}
    table1_rows: list[list[Any]] = []
    for dataset, horizon, *_ in config.settings:
        for model in config.models:
            found = [
                runs[f"{dataset}|{horizon}|{model}|{config.seed + s}"] for s in range(config.seeds)
            ]
            ours = {m: _mean(found, m) for m in (*_METRICS, "w8a8_mse")}
            kurt_std = mean_std([r["avg_kurtosis"] for r in found])[1]
            paper = paper_table2(dataset, horizon, model) or {}
            rows.append(
                [
                    dataset,
                    horizon,
                    model,
                    ours["mse"],
                    ours["mae"],
                    ours["avg_kurtosis"],
                    kurt_std,
                    ours["max_inf_norm"],
                    ours["w8a8_mse"],
                    *[paper.get(m) for m in _METRICS],
                ]
            )
            entries.setdefault((dataset, horizon), {})[model] = {
                m: v for m, v in ours.items() if v is not None
            }
            for m, v in ours.items():
                if v is not None:
                    metrics[f"{dataset}/{horizon}/{model}/{m}"] = v
            if (dataset, horizon) == (config.settings[0][0], config.settings[0][1]):
                p1 = (
                    _TABLE1.get(model, (None,) * 4)
                    if (dataset, horizon) == ("ETTh1", 24)
                    else (None,) * 4
                )
                table1_rows.append(
                    [
                        model,
                        ours["avg_kurtosis"],
                        ours["max_inf_norm"],
                        ours["mse"],
                        ours["w8a8_mse"],
                        found[0]["params_total"],
                        found[0]["params_without_position_tables"],
                        *p1,
                    ]
                )
    count, pairs = top_two_count(entries)
    paper_entries = {
        key: {m: p for m in TABLE2_MODELS if (p := paper_table2(*key, m)) is not None}
        for key in _TABLE2
    }
    paper_count, paper_pairs = top_two_count(paper_entries)
    metrics.update(outeffhop_top_two=count, outeffhop_top_two_pairs=pairs)
    curve_table, curve_metrics, curve_notes = figure2d(config, runs)
    metrics.update(curve_metrics)
    first = config.settings[0]
    return Results(
        tables=[
            Table(
                name="Table 2: STanHop-Net with each association (test split)",
                columns=[
                    "dataset",
                    "H",
                    "model",
                    "MSE",
                    "MAE",
                    "avg kurtosis",
                    "kurtosis std",
                    "max inf norm",
                    "W8A8 MSE",
                    "paper MSE",
                    "paper MAE",
                    "paper kurtosis",
                    "paper inf norm",
                ],
                rows=rows,
                caption=(
                    f"Mean over {config.seeds} seed(s); kurtosis and inf norm over the "
                    f"{config.e_layers + 1} decoder-layer outputs."
                ),
            ),
            Table(
                name=f"Table 1 (STanHop-Net rows): {first[0]}, horizon {first[1]}",
                columns=[
                    "model",
                    "avg kurtosis",
                    "max inf norm",
                    "FP32 MSE",
                    "W8A8 MSE",
                    "params",
                    "params w/o position tables",
                    "paper kurtosis",
                    "paper inf norm",
                    "paper FP16 MSE",
                    "paper W8A8 MSE",
                ],
                rows=table1_rows,
                caption="Paper: 35.13M (35.15M gated) parameters, i.e. without the position tables.",
            ),
            Table(
                name="OutEffHop first or second among Hopfield/Sparse/GSH/OutEffHop",
                columns=["source", "top-two (setting, metric) pairs", "pairs"],
                rows=[
                    ["ours", count, pairs],
                    ["paper Table 2 (recounted)", paper_count, paper_pairs],
                ],
                caption="Metrics: average kurtosis and max inf norm; lower ranks first.",
            ),
            curve_table,
        ],
        metrics=metrics,
        notes=[
            "Cross-series stage: router form (learned queries pool the series); heads concatenated "
            "per position; see docs/timeseries.md for the deviations from the authors' code.",
            "W8A8: INT8 weights and activations of Linear, LayerNorm and GELU modules; association "
            "scores and weights stay in floating point.",
            *curve_notes,
        ],
    )


register(
    Experiment(
        name="stanhop-outliers",
        summary="STanHop-Net with dense/sparse/GSH/OutEffHop/clipped/gated associations: MSE, outliers, W8A8",
        presets=PRESETS,
        run=run,
        check=check_config,
        paper="Table 2 and the STanHop-Net rows of Table 1 of Hu et al., OutEffHop (ICML 2024)",
        tags=("timeseries", "outliers"),
    )
)

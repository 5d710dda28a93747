"""Search for the cheapest training recipe under which a vanilla transformer forms attention outliers.

Why: small OPT/BERT-style models trained for a few thousand steps on 2 CPU cores form no outliers
(average kurtosis ≈ 3.3, max inf norm ≤ 12, W8A8 costing < 0.3 % perplexity; spec §7.4), so
OutEffHop's central claim (Softmax_1 removes the outliers that break 8-bit quantization) can be
neither confirmed nor refuted there. Bondarenko et al. (2023) trace outliers to heads that learn to
"do nothing" by attending to low-information tokens (spec §1.8).

What it does:

1. **Search.** A grid (``Config.grid``: config field -> values, documented in
   ``docs/outlier-formation.md``) over the knobs that favour no-op heads and outlier growth:
   dropout off, higher learning rates, longer training, wider FFN, more layers, weight decay on or
   off the LayerNorm gains, pre-LN vs post-LN, delimiter frequency. Grid points are tried in
   increasing estimated training cost (:func:`training_gflop`; ties in the order the grid lists
   its values), training only the **vanilla** (softmax) model: a small OPT-style causal LM
   (:func:`hopfield.integrations.build_model` ``"opt"``, ``do_layer_norm_before`` = pre-LN) on the
   synthetic streams of :mod:`hopfield.data.synthetic_text`, with the
   :class:`hopfield.training.Trainer`. Each point is judged by :func:`judge`; the search stops at
   the first success (``stop_at_first``). Points whose predicted training time exceeds
   ``budget_s`` (from the measured seconds per GFLOP so far) are recorded as skipped.
2. **Comparison.** Under the recipe found (or, with ``compare_best_if_none``, under the most
   outlier-prone point tried, clearly labelled as such) the six variants of OutEffHop Table 1 are
   trained over ``seeds``: avg kurtosis, max inf norm, FP and W8A8 perplexity with 95 % t
   confidence intervals, the OutEffHop-vs-softmax reductions per pair with seed agreement, and the
   training curves of ``max |x|`` (the Figure 2 quantity).

Every point tried is reported with its kurtosis, norms and W8A8 gap, so a null result is data.

Resuming: ``search.json`` and ``compare.json`` keep the evaluated runs (reused only under the same
``hopfield run --max-steps`` limit), and each run folder's ``run.json`` records the recipe,
variant and seed its checkpoints belong to (another recipe in the same folder starts over).
Several processes (``torchrun``): every process trains and evaluates each run together (the
batch is global), worker pools are off, and only the main process writes files.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import multiprocessing
import shutil
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from operator import itemgetter
from typing import Any

import torch
from torch import Tensor, nn

from hopfield.data.synthetic_text import SyntheticSample, SyntheticText, generate
from hopfield.experiments.checks import check_choice, check_ints, check_subset, config_errors
from hopfield.experiments.registry import ConfigError, Experiment, register
from hopfield.experiments.results import Results, RunContext, Table, with_threads
from hopfield.stats import compare_paired

__all__ = [
    "PAPER_OPT",
    "PRESETS",
    "VARIANT_NAMES",
    "Config",
    "Criterion",
    "GridPoint",
    "Verdict",
    "build",
    "check_config",
    "confidence_interval",
    "evaluate",
    "grid_points",
    "judge",
    "run",
    "split_sentences",
    "train_and_evaluate",
    "training_gflop",
]

#: Display names of the attention variants (OutEffHop Table 1 rows).
VARIANT_NAMES: dict[str, str] = {
    "softmax": "Vanilla",
    "softmax1": "OutEffHop",
    "clipped": "Clipped Softmax",
    "clipped_softmax1": "Clipped OutEffHop",
    "gated": "Gated Attention",
    "gated_softmax1": "Gated OutEffHop",
}

#: OutEffHop Table 1, OPT rows: avg kurtosis, max inf norm, FP16 perplexity, W8A8 perplexity.
PAPER_OPT: dict[str, tuple[float, float, float, float]] = {
    "softmax": (23341.513, 92.786, 15.974, 42.012),
    "softmax1": (21.542, 13.302, 15.916, 16.429),
    "clipped": (9731.110, 43.803, 16.042, 30.825),
    "clipped_softmax1": (24127.332, 67.602, 16.118, 29.269),
    "gated": (90.321, 13.704, 15.677, 16.236),
    "gated_softmax1": (11.449, 7.568, 15.751, 16.148),
}

#: The (softmax, OutEffHop) pairs whose reductions the paper averages (spec §4.5).
PAIRS: tuple[tuple[str, str], ...] = (
    ("softmax", "softmax1"),
    ("clipped", "clipped_softmax1"),
    ("gated", "gated_softmax1"),
)

#: The positive control of the comparison: gated attention (Bondarenko et al.) against vanilla
#: attention, which should lower attention-made outliers as Softmax_1 should.
CONTROL_PAIR: tuple[str, str] = ("softmax", "gated")


# --------------------------------------------------------------------------------------------
# success criterion


@dataclass(frozen=True)
class Criterion:
    """When a vanilla model counts as having formed real outliers.

    ``(avg_kurtosis >= kurtosis or max_inf_norm >= norm_ratio × median_scale)`` **and** the W8A8
    degradation ``>= degradation`` (relative: ``(W8A8 - FP) / FP`` for perplexity,
    ``(FP - W8A8) / FP`` for accuracy) **and** training took at most ``budget_s`` seconds
    (``None`` = no limit).
    """

    kurtosis: float = 20.0
    norm_ratio: float = 10.0
    degradation: float = 0.05
    budget_s: float | None = 1800.0


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`judge`.

    Attributes:
        outliers: the kurtosis or the norm-ratio condition holds.
        quantization_hurts: the W8A8 degradation reaches the threshold.
        within_budget: training time within the budget.
        success: all three.
        degradation: relative W8A8 degradation (positive = worse after quantization).
        norm_ratio: ``max_inf_norm / median_scale``.
        reason: a one-line explanation.
    """

    outliers: bool
    quantization_hurts: bool
    within_budget: bool
    success: bool
    degradation: float
    norm_ratio: float
    reason: str


def judge(
    avg_kurtosis: float,
    max_inf_norm: float,
    median_scale: float,
    fp_metric: float,
    w8a8_metric: float,
    *,
    higher_is_better: bool = False,
    train_seconds: float | None = None,
    criterion: Criterion = Criterion(),
) -> Verdict:
    """Apply the success criterion (see :class:`Criterion`) to one trained vanilla model.

    Args:
        avg_kurtosis: average Pearson kurtosis of the selected activations (3 = Gaussian).
        max_inf_norm: maximum over the selected tensors of the mean per-sample ``max |x|``.
        median_scale: median over the selected tensors of their RMS (the typical activation size).
        fp_metric, w8a8_metric: task metric before and after W8A8 quantization (perplexity, or
            accuracy with ``higher_is_better``).
        train_seconds: training time (checked against ``criterion.budget_s``); the experiment
            passes CPU seconds per thread, which on a shared machine is the time on dedicated
            cores.
        criterion: the thresholds.
    """
    values = {
        "avg_kurtosis": avg_kurtosis,
        "max_inf_norm": max_inf_norm,
        "median_scale": median_scale,
        "fp_metric": fp_metric,
        "w8a8_metric": w8a8_metric,
    }
    for name, value in values.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not median_scale > 0:
        raise ValueError(f"median_scale must be positive, got {median_scale}")
    if not fp_metric > 0:
        raise ValueError(f"fp_metric must be positive, got {fp_metric}")
    if not isinstance(criterion, Criterion):
        raise TypeError(f"criterion must be a Criterion, got {type(criterion).__name__}")
    ratio = max_inf_norm / median_scale
    gap = (fp_metric - w8a8_metric) if higher_is_better else (w8a8_metric - fp_metric)
    degradation = gap / fp_metric if math.isfinite(gap) else math.inf
    kurtotic = avg_kurtosis >= criterion.kurtosis
    wide = ratio >= criterion.norm_ratio
    outliers = kurtotic or wide
    hurts = degradation >= criterion.degradation
    within = (
        criterion.budget_s is None or train_seconds is None or train_seconds <= criterion.budget_s
    )
    parts = [
        f"kurtosis {avg_kurtosis:.3g} {'>=' if kurtotic else '<'} {criterion.kurtosis:g}",
        f"max|x|/scale {ratio:.3g} {'>=' if wide else '<'} {criterion.norm_ratio:g}",
        f"W8A8 degradation {100 * degradation:.3g}% {'>=' if hurts else '<'} "
        f"{100 * criterion.degradation:g}%",
    ]
    if not within:
        parts.append(f"training {train_seconds:.0f} s > budget {criterion.budget_s:g} s")
    return Verdict(
        outliers=outliers,
        quantization_hurts=hurts,
        within_budget=within,
        success=outliers and hurts and within,
        degradation=degradation,
        norm_ratio=ratio,
        reason="; ".join(parts),
    )


def confidence_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the two-sided Student-t confidence interval (0 for one value)."""
    if len(values) == 0:
        raise ValueError("values must not be empty")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    from scipy.stats import t

    half = float(t.ppf(0.5 + level / 2, len(values) - 1)) * statistics.stdev(values)
    return mean, half / math.sqrt(len(values))


# --------------------------------------------------------------------------------------------
# configuration and grid


def _six() -> tuple[str, ...]:
    return tuple(VARIANT_NAMES)


@dataclass
class Config:
    """One training recipe plus the search grid around it.

    Data: ``data = "synthetic"`` (:class:`hopfield.data.synthetic_text.SyntheticText`:
    ``vocab_size``, ``seq_len``, ``delimiter_rate``, ``filler_rate``, ``recall_rate``,
    ``branching``; data seeds 1 and 2, grammar seed 0) or ``"wikitext-2"`` (the project's
    WikiText-2 files through :mod:`hopfield.data.text`: a byte-level BPE tokenizer of
    ``vocab_size`` tokens trained offline, OPT's ``</s>`` before every line, or before every
    sentence with ``sentence_separators``; ``text_max_lines`` > 0 keeps the first lines of each
    split); ``train_sequences`` and ``val_sequences`` blocks of ``seq_len`` tokens.

    Model (OPT-style causal LM): ``hidden_size``, ``num_heads``, ``num_layers``, ``ffn_dim``,
    ``pre_ln`` (``False`` = post-LN), ``dropout`` (hidden, attention and activation), ``init_std``,
    ``clip_gamma`` (clipped variants; ``None`` = the OPT default ``-12 / seq_len``).

    Optimisation (:class:`hopfield.training.TrainingConfig`): ``steps``, ``batch_size``, ``lr``,
    ``schedule`` (after a linear warm-up of ``warmup_fraction · steps``: ``"linear"`` or
    ``"cosine"`` decay to ``min_lr_ratio · lr``, or ``"constant"``), ``weight_decay``,
    ``ln_weight_decay`` (also decay LayerNorm gains, OPT's ``--wd_LN_gamma``), ``grad_clip``.

    Evaluation: ``eval_batch_size``, ``calibration_batches`` (W8A8 ranges, training batches),
    ``percentile`` (``None`` = running min–max ranges), ``extra_percentile`` (also evaluate W8A8
    with this percentile calibration, ``None`` = no), ``ablation`` (also run
    :func:`hopfield.outliers.quantizer_ablation` on the W8A8 model).

    Search: ``grid`` (config field -> list of values), ``strategy`` (``"grid"``: the whole
    product in cost order, :func:`grid_points`; ``"ladder"``: the cost-neutral axes at the
    cheapest size first, then the size/length axes with the most outlier-prone setting,
    :func:`ladder_points`), ``max_configs`` (0 = all), ``budget_s``
    (training seconds allowed per point: CPU seconds per thread when ``threads`` is set, else
    wall time), ``stop_at_first``, and the :class:`Criterion`
    thresholds ``kurtosis_threshold``, ``norm_ratio_threshold``, ``degradation_threshold``.

    Comparison: ``variants``, ``seeds`` (training seeds: initialisation and data order),
    ``compare_best_if_none`` (compare at the most outlier-prone point when no recipe succeeded),
    ``compare`` (``False`` = search only).

    Decisive test (:mod:`hopfield.experiments.outlier_decisive`): ``arms`` (arm name -> config
    overrides; non-empty = no search: every arm's variants are compared over ``seeds`` and judged
    by the pre-registered protocol), ``gate_first`` (train vanilla and gated attention of an arm
    first and its Softmax_1 variants only if the arm passes the validity gate).

    Machine: ``threads`` (``torch.set_num_threads`` during the run, 0 = leave), ``workers``
    (comparison runs trained at once, each in its own process with ``threads`` threads; the
    search stays sequential because it stops at the first success), ``cpu`` (force the CPU),
    ``log_every`` (steps between ``max |x|`` log records), ``checkpoint_every`` (steps between
    trainer checkpoints; 0 = only at the end), ``keep_checkpoints`` (keep them after the
    evaluation).
    """

    seed: int = 0
    data: str = "synthetic"
    sentence_separators: bool = True
    text_max_lines: int = 0
    vocab_size: int = 64
    seq_len: int = 64
    delimiter_rate: float = 0.15
    filler_rate: float = 0.1
    recall_rate: float = 0.5
    branching: int = 3
    train_sequences: int = 4096
    val_sequences: int = 256
    hidden_size: int = 128
    num_heads: int = 4
    num_layers: int = 4
    ffn_dim: int = 512
    pre_ln: bool = True
    dropout: float = 0.0
    init_std: float = 0.02
    clip_gamma: float | None = None
    steps: int = 2000
    batch_size: int = 32
    lr: float = 1e-3
    schedule: str = "linear"
    warmup_fraction: float = 0.05
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.1
    ln_weight_decay: bool = True
    grad_clip: float = 1.0
    eval_batch_size: int = 64
    calibration_batches: int = 16
    percentile: float | None = None
    extra_percentile: float | None = None
    ablation: bool = False
    grid: dict[str, list[Any]] = field(default_factory=dict)
    strategy: str = "grid"
    max_configs: int = 0
    budget_s: float = 1800.0
    stop_at_first: bool = True
    kurtosis_threshold: float = 20.0
    norm_ratio_threshold: float = 10.0
    degradation_threshold: float = 0.05
    variants: tuple[str, ...] = field(default_factory=_six)
    seeds: tuple[int, ...] = (0, 1, 2)
    compare: bool = True
    compare_best_if_none: bool = True
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)
    gate_first: bool = True
    threads: int = 1
    workers: int = 1
    cpu: bool = True
    log_every: int = 50
    checkpoint_every: int = 500
    keep_checkpoints: bool = False

    @property
    def criterion(self) -> Criterion:
        """The success thresholds of this config."""
        return Criterion(
            kurtosis=self.kurtosis_threshold,
            norm_ratio=self.norm_ratio_threshold,
            degradation=self.degradation_threshold,
            budget_s=self.budget_s,
        )

    @property
    def grammar(self) -> SyntheticText:
        """The synthetic data of this config."""
        return SyntheticText(
            vocab_size=self.vocab_size,
            seq_len=self.seq_len,
            delimiter_rate=self.delimiter_rate,
            filler_rate=self.filler_rate,
            recall_rate=self.recall_rate,
            branching=self.branching,
        )


#: Fields a grid may vary (everything that changes the trained vanilla model).
GRID_FIELDS = (
    "steps",
    "num_layers",
    "ffn_dim",
    "hidden_size",
    "num_heads",
    "batch_size",
    "seq_len",
    "vocab_size",
    "branching",
    "pre_ln",
    "dropout",
    "lr",
    "schedule",
    "weight_decay",
    "ln_weight_decay",
    "delimiter_rate",
    "filler_rate",
    "recall_rate",
    "init_std",
    "warmup_fraction",
)


def training_gflop(config: Config) -> float:
    """Estimated training cost in GFLOP: ``6 × steps × batch × T × (per-token forward MACs)``.

    Per token and layer ``4 d²`` (Q, K, V, output projections) ``+ 2 d f`` (FFN) ``+ 2 T d``
    (scores and context), plus ``d V`` for the LM head; the factor 6 counts multiply-adds of the
    forward and backward pass.
    """
    d, f, t = config.hidden_size, config.ffn_dim, config.seq_len
    per_token = config.num_layers * (4 * d * d + 2 * d * f + 2 * t * d) + d * config.vocab_size
    return 6.0 * config.steps * config.batch_size * t * per_token / 1e9


@dataclass(frozen=True)
class GridPoint:
    """One configuration of the search: its name (the varied fields), overrides and config."""

    name: str
    overrides: dict[str, Any]
    config: Config

    @property
    def gflop(self) -> float:
        """:func:`training_gflop` of the point's config."""
        return training_gflop(self.config)


def grid_points(config: Config) -> list[GridPoint]:
    """The grid of ``config`` in search order: increasing :func:`training_gflop`, ties in the
    order of the grid's product (first axis slowest, each axis in its listed order).

    An empty grid gives the config itself. ``max_configs > 0`` keeps the cheapest that many.
    """
    for key, values in config.grid.items():
        if key not in GRID_FIELDS:
            raise ValueError(f"grid: {key!r} is not a grid field; choose from {GRID_FIELDS}")
        if not isinstance(values, list | tuple) or not values:
            raise ValueError(f"grid: {key!r} needs a non-empty list of values, got {values!r}")
    keys = list(config.grid)
    points = []
    for combo in itertools.product(*(config.grid[k] for k in keys)):
        overrides = dict(zip(keys, combo, strict=True))
        name = ",".join(f"{k}={v}" for k, v in overrides.items()) or "base"
        points.append(GridPoint(name, overrides, replace(config, grid={}, **overrides)))
    points = sorted(points, key=lambda p: p.gflop)  # stable: ties keep the product order
    return points[: config.max_configs] if config.max_configs > 0 else points


#: Grid fields that change the training cost (:func:`training_gflop` grows with each).
COST_FIELDS = (
    "steps",
    "num_layers",
    "ffn_dim",
    "hidden_size",
    "batch_size",
    "seq_len",
    "vocab_size",
)

STRATEGIES = ("grid", "ladder")


def ladder_points(config: Config, best: Mapping[str, Any] | None = None) -> list[GridPoint]:
    """The two stages of the ``"ladder"`` search.

    Stage 1 (``best=None``): every combination of the cost-neutral axes (pre/post-LN, dropout,
    learning rate, weight decay, LayerNorm-gain decay, data rates, ...) with every cost axis
    (:data:`COST_FIELDS`) at its cheapest value. Stage 2 (``best`` = the overrides of the most
    outlier-prone stage-1 point): the cost axes' product in cost order with the cost-neutral
    axes fixed at ``best``. Point names list every grid axis in the grid's order, so the stage-1
    point that stage 2 repeats has the same name (and is not trained twice).
    """
    grid = dict(config.grid)
    if best is None:
        stage = {k: ([min(v)] if k in COST_FIELDS else list(v)) for k, v in grid.items()}
    else:
        stage = {k: (list(v) if k in COST_FIELDS else [best[k]]) for k, v in grid.items()}
    return grid_points(replace(config, grid=stage, max_configs=0))


def _point_stream(
    config: Config, entries: list[dict[str, Any]], criterion: Criterion
) -> Iterator[GridPoint]:
    """The points of the search in order; the ladder's second stage is chosen from ``entries``
    (the results so far) once the first is done."""
    if config.strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {config.strategy!r}")
    if config.strategy == "grid":
        yield from grid_points(config)
        return
    first = ladder_points(config)
    limit = config.max_configs or math.inf
    count = 0
    for point in first:
        if count >= limit:
            return
        count += 1
        yield point
    trained = [e for e in entries if e["status"] == "trained"]
    if not trained:
        return
    best = max(trained, key=lambda e: _outlier_score(e, criterion))
    seen = {e["name"] for e in entries}
    for point in ladder_points(config, best["overrides"]):
        if point.name in seen:
            continue
        if count >= limit:
            return
        count += 1
        yield point


# --------------------------------------------------------------------------------------------
# model, training and evaluation


def build(config: Config, variant: str = "softmax") -> nn.Module:
    """The OPT-style causal LM of ``config`` with attention ``variant`` (random initialisation)."""
    from hopfield.integrations import build_model

    pad, bos, eos = _token_roles(config)
    options: dict[str, Any] = {}
    if "clipped" in variant and config.clip_gamma is not None:
        options["gamma"] = config.clip_gamma
    return build_model(
        "opt",
        variant,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        word_embed_proj_dim=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        ffn_dim=config.ffn_dim,
        max_position_embeddings=config.seq_len,
        do_layer_norm_before=config.pre_ln,
        dropout=config.dropout,
        attention_dropout=config.dropout,
        activation_dropout=config.dropout,
        init_std=config.init_std,
        pad_token_id=pad,
        bos_token_id=bos,
        eos_token_id=eos,
        **options,
    )


def _batches(sample: SyntheticSample, size: int) -> Iterator[tuple[dict[str, Tensor], Tensor]]:
    """``({"input_ids", "labels"}, special (B, T))`` slices of a sample, in order."""
    tokens = sample.tokens
    for start in range(0, tokens.shape[0], size):
        ids = tokens[start : start + size]
        yield {"input_ids": ids, "labels": ids}, sample.special[start : start + size]


def _perplexity(model: nn.Module, sample: SyntheticSample, batch_size: int) -> float:
    """exp(mean next-token cross-entropy) over all predicted positions of ``sample``."""
    total, count = 0.0, 0
    with torch.no_grad():
        for batch, _ in _batches(sample, batch_size):
            ids = batch["input_ids"]
            n = ids.shape[0] * (ids.shape[1] - 1)
            total += float(model(**batch).loss) * n
            count += n
    return math.exp(total / count)


class _ScaleRecorder:
    """RMS of the outputs of named modules (the "activation scale" of :func:`judge`)."""

    def __init__(self, model: nn.Module, names: Sequence[str]) -> None:
        modules = dict(model.named_modules())
        self.squares = {n: 0.0 for n in names}
        self.counts = {n: 0 for n in names}
        self.handles = [modules[n].register_forward_hook(self._hook(n)) for n in names]

    def _hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            x = output[0] if isinstance(output, tuple) else output
            self.squares[name] += float(x.detach().double().pow(2).sum())
            self.counts[name] += x.numel()

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def rms(self) -> dict[str, float]:
        """RMS of every recorded module's outputs (modules that never ran are left out)."""
        return {n: math.sqrt(self.squares[n] / c) for n, c in self.counts.items() if c}

    def median_rms(self) -> float:
        return statistics.median(self.rms().values())


def evaluate(
    model: nn.Module,
    val: SyntheticSample,
    calibration: SyntheticSample,
    config: Config,
) -> dict[str, Any]:
    """FP and W8A8 perplexity, OPT-convention outlier metrics and attention diagnostics.

    Returns ``fp_ppl``, ``w8a8_ppl``, ``avg_kurtosis``, ``max_inf_norm``, ``max_ffn_inf_norm``,
    ``max_layer_inf_norm`` (spec §4.2, OPT selection), ``median_scale`` (median RMS of the same
    tensors), ``special_mass`` (mean attention mass on BOS/delimiter/filler keys) and ``row_sum``
    (mean attention row sum; < 1 where Softmax_1 heads abstain), averaged over layers and heads;
    ``tensors`` (recorded tensor name -> its mean per-sample ``kurtosis``, mean per-sample
    ``inf_norm`` and ``rms``), ``w8a8_ppl_extra`` (W8A8 calibrated with
    ``config.extra_percentile``, if set) and ``ablation`` (:func:`quantizer_ablation`
    perplexities, if ``config.ablation``).
    """
    from hopfield.outliers import (
        ActivationRecorder,
        AttentionRecorder,
        quantize_w8a8,
        quantizer_ablation,
    )

    model.eval()
    recorder = ActivationRecorder(model, "opt")
    scales = _ScaleRecorder(model, recorder.names)
    try:
        fp_ppl = _perplexity(model, val, config.eval_batch_size)
    finally:
        recorder.remove()
        scales.remove()
    stats = recorder.summary()
    rms = scales.rms()
    tensors = {
        name: {"kurtosis": run.mean_kurtosis, "inf_norm": run.mean_inf_norm, "rms": rms[name]}
        for name, run in recorder.stats.items()
        if name in rms
    }
    attention = AttentionRecorder(model)
    try:
        with torch.no_grad():
            for batch, special in _batches(val, config.eval_batch_size):
                attention.special_mask = special
                model(**batch)
    finally:
        attention.remove()
    layers = attention.per_layer().values()
    calib = [b for b, _ in _batches(calibration, config.eval_batch_size)]

    def w8a8(percentile: float | None) -> nn.Module:
        return quantize_w8a8(
            model,
            calib,
            num_batches=config.calibration_batches,
            percentile=percentile,
            keep_fp=("lm_head",),
        )

    def perplexity(m: nn.Module) -> float:
        return _perplexity(m, val, config.eval_batch_size)

    quantized = w8a8(config.percentile)
    extra: dict[str, Any] = {}
    if config.ablation:
        extra["ablation"] = quantizer_ablation(quantized, perplexity)
    if config.extra_percentile is not None:
        extra["w8a8_ppl_extra"] = perplexity(w8a8(config.extra_percentile))
    return {
        "fp_ppl": fp_ppl,
        "w8a8_ppl": perplexity(quantized),
        "avg_kurtosis": stats["avg_kurtosis"],
        "max_inf_norm": stats["max_inf_norm"],
        "max_ffn_inf_norm": stats["max_ffn_inf_norm"],
        "max_layer_inf_norm": stats["max_layer_inf_norm"],
        "median_scale": scales.median_rms(),
        "special_mass": statistics.fmean(v["special_mass"] for v in layers),
        "row_sum": statistics.fmean(v["row_sum"] for v in layers),
        "tensors": tensors,
        **extra,
    }


DATA_SOURCES = ("synthetic", "wikitext-2")

#: OPT's ids of ``<s> <pad> </s> <unk>`` in the byte-level BPE tokenizers of hopfield.data.text.
_OPT_PAD, _OPT_EOS = 1, 2


def _token_roles(config: Config) -> tuple[int, int, int]:
    """``(pad, bos, eos)`` ids of the config's data."""
    from hopfield.data.synthetic_text import BOS, DELIM, PAD

    if config.data == "synthetic":
        return PAD, BOS, DELIM
    return _OPT_PAD, _OPT_EOS, _OPT_EOS  # OPT: </s> is both BOS and EOS


@dataclass
class _Data:
    train: SyntheticSample
    val: SyntheticSample


_DATA_CACHE: dict[tuple[Any, ...], _Data] = {}


def split_sentences(lines: Sequence[str]) -> list[str]:
    """WikiText lines cut after every `` . `` (the tokenized full stop): one sentence per line."""
    out = []
    for line in lines:
        parts = line.strip().split(" . ")
        for i, part in enumerate(parts):
            if part.strip():
                out.append(part.strip() + (" ." if i < len(parts) - 1 else ""))
    return out


def _text_sample(
    tokenizer: Any, lines: Sequence[str], config: Config, blocks: int
) -> SyntheticSample:
    from hopfield.data.text import token_blocks

    tokens = token_blocks(tokenizer, lines, "bpe", config.seq_len, max_blocks=blocks)
    low_information = [_OPT_EOS] + [
        i for t in ("Ġ.", "Ġ,", "Ġ@-@", "Ġ;") if (i := tokenizer.token_to_id(t)) is not None
    ]
    special = torch.isin(tokens, torch.tensor(low_information))
    return SyntheticSample(tokens, special, torch.zeros_like(special))


def _wikitext(config: Config, data_dir: Any) -> _Data:
    from hopfield.data.text import load_text, train_tokenizer

    if config.vocab_size < 300:
        raise ValueError(
            f"vocab_size must be >= 300 for the byte-level BPE of wikitext-2, got {config.vocab_size}"
        )
    from hopfield.experiments.outliers_tasks import main_process_first

    splits = load_text("wikitext-2", data_dir, max_lines=config.text_max_lines or None)
    cut = split_sentences if config.sentence_separators else list
    train, val = cut(splits.train), cut(splits.validation)
    tokenizer = main_process_first(lambda: train_tokenizer("bpe", splits.train, config.vocab_size))
    return _Data(
        train=_text_sample(tokenizer, train, config, config.train_sequences),
        val=_text_sample(tokenizer, val, config, config.val_sequences),
    )


def _data(config: Config, data_dir: Any = None) -> _Data:
    """The training and validation sequences of ``config`` (cached: one data set at a time)."""
    if config.data not in DATA_SOURCES:
        raise ValueError(f"data must be one of {DATA_SOURCES}, got {config.data!r}")
    if config.data == "synthetic":
        key: tuple[Any, ...] = (config.grammar, config.train_sequences, config.val_sequences)
    else:
        key = (
            config.data,
            str(data_dir),
            config.vocab_size,
            config.seq_len,
            config.sentence_separators,
            config.text_max_lines,
            config.train_sequences,
            config.val_sequences,
        )
    if key not in _DATA_CACHE:
        _DATA_CACHE.clear()
        if config.data == "synthetic":
            data = _Data(
                train=generate(config.grammar, config.train_sequences, seed=1),
                val=generate(config.grammar, config.val_sequences, seed=2),
            )
        else:
            data = _wikitext(config, data_dir)
        _DATA_CACHE[key] = data
    return _DATA_CACHE[key]


def _monitor_patterns() -> list[str]:
    return [r"model\.decoder\.layers\.\d+", r"model\.decoder\.layers\.\d+\.fc2"]


def train_and_evaluate(
    config: Config, variant: str, seed: int, ctx: RunContext, tag: str
) -> dict[str, Any]:
    """Train ``variant`` under ``config`` with training seed ``seed`` and evaluate it.

    Uses :class:`hopfield.training.Trainer` (resuming from ``ctx.out_dir/runs/<tag>`` when a
    previous run of the same recipe, variant and seed stopped there); returns :func:`evaluate`'s
    metrics plus ``train_s``, ``params``, ``steps``, ``processes`` (that trained it) and
    ``curve`` (``[(step, {module: max |x|})]`` from the training log).
    """
    from hopfield.data.synthetic_text import SyntheticTextDataset
    from hopfield.experiments.outliers_tasks import same_run
    from hopfield.experiments.runner import seed_everything
    from hopfield.training import Trainer

    identity = {"recipe": _recipe(config), "variant": variant, "seed": seed}
    resume = same_run(ctx, f"runs/{tag}/run.json", identity) == "same"
    data = _data(config, ctx.data_dir)
    dataset = SyntheticTextDataset(data.train)
    seed_everything(seed)
    model = build(config, variant)
    training = ctx.training_config(
        max_steps=config.steps,
        batch_size=config.batch_size,
        lr=config.lr,
        weight_decay=config.weight_decay,
        schedule=config.schedule,
        warmup_steps=int(config.warmup_fraction * config.steps),
        min_lr_ratio=config.min_lr_ratio,
        grad_clip=config.grad_clip or None,
        decay_norm_weights=config.ln_weight_decay,
        seed=seed,
        checkpoint_every=config.checkpoint_every,
        log_every=max(1, min(config.log_every, config.steps)),
        cpu=config.cpu,
    )
    run_dir = ctx.path("runs") / tag
    trainer = Trainer(
        model,
        dataset,
        lambda m, batch: m(**batch).loss,
        training,
        run_dir,
        monitor=_monitor_patterns(),
        progress=ctx.progress,
    )
    start, start_cpu = time.perf_counter(), time.process_time()
    try:
        result = trainer.fit(resume=resume)
    finally:
        trainer.close()
    train_s, train_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
    trained = trainer.unwrapped.cpu()
    metrics: dict[str, Any] = evaluate(trained, data.val, data.train, config)
    metrics.update(
        train_s=train_s,
        train_cpu_s=train_cpu_s,
        resumed_from=result.resumed_from,
        params=sum(p.numel() for p in trained.parameters()),
        steps=result.step,
        processes=result.processes,
        curve=[(r["step"], r["max_abs"]) for r in result.log],
    )
    if not config.keep_checkpoints and ctx.is_main_process:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return metrics


# --------------------------------------------------------------------------------------------
# the experiment


def _train_seconds(metrics: Mapping[str, Any], config: Config) -> float:
    """The training time the budget is checked against: CPU seconds per thread when the run
    pins ``threads`` (the time on dedicated cores, however busy the machine), else wall time."""
    if config.threads:
        return float(metrics["train_cpu_s"]) / config.threads
    return float(metrics["train_s"])


def _verdict(metrics: Mapping[str, Any], config: Config) -> Verdict:
    return judge(
        metrics["avg_kurtosis"],
        metrics["max_inf_norm"],
        metrics["median_scale"],
        metrics["fp_ppl"],
        metrics["w8a8_ppl"],
        train_seconds=_train_seconds(metrics, config),
        criterion=config.criterion,
    )


def _search(config: Config, ctx: RunContext) -> list[dict[str, Any]]:
    """Train the vanilla model at each search point in order (resumable via ``search.json``;
    entries made under another ``--max-steps`` limit are trained again)."""
    from hopfield.experiments.outliers_tasks import barrier

    done: list[dict[str, Any]] = ctx.load_json("search.json") or []
    barrier()  # every process has read it before the main one rewrites it
    by_name = {e["name"]: e for e in done if e.get("stop_after") == ctx.stop_after}
    entries: list[dict[str, Any]] = []
    seconds_per_gflop: float | None = None
    points = _point_stream(config, entries, config.criterion)
    for point in ctx.track(points, desc="search"):
        entry = by_name.get(point.name)
        if entry is None:
            entry = {"name": point.name, "overrides": point.overrides, "gflop": point.gflop}
            entry["stop_after"] = ctx.stop_after
            predicted = None if seconds_per_gflop is None else seconds_per_gflop * point.gflop
            if predicted is not None and predicted > config.budget_s:
                entry.update(status="skipped", predicted_s=predicted)
            else:
                metrics = train_and_evaluate(
                    point.config, "softmax", config.seed, ctx, f"search/{len(entries):03d}"
                )
                verdict = _verdict(metrics, point.config)
                entry.update(status="trained", **metrics, verdict=asdict(verdict))
        entries.append(entry)
        seen = {e["name"] for e in entries}
        ctx.save_json("search.json", entries + [e for e in done if e["name"] not in seen])
        if entry["status"] == "trained":
            rate = _train_seconds(entry, config) / max(entry["gflop"], 1e-12)
            seconds_per_gflop = rate if seconds_per_gflop is None else max(seconds_per_gflop, rate)
            if entry["verdict"]["success"] and config.stop_at_first:
                break
    return entries


def _outlier_score(entry: Mapping[str, Any], criterion: Criterion) -> float:
    """How close a trained point came to the criterion (for ``compare_best_if_none``): the
    fraction of the W8A8 threshold reached (capped at 1) plus the larger of the fractions of the
    kurtosis and norm-ratio thresholds."""
    v = entry["verdict"]
    return min(v["degradation"] / criterion.degradation, 1.0) + max(
        entry["avg_kurtosis"] / criterion.kurtosis, v["norm_ratio"] / criterion.norm_ratio
    )


def _search_table(entries: Sequence[Mapping[str, Any]]) -> Table:
    rows = []
    for e in entries:
        if e["status"] != "trained":
            rows.append([e["name"], e["gflop"], "skipped"] + [None] * 11 + [e.get("predicted_s")])
            continue
        v = e["verdict"]
        rows.append(
            [
                e["name"],
                e["gflop"],
                "yes" if v["success"] else "no",
                e["fp_ppl"],
                e["w8a8_ppl"],
                100 * v["degradation"],
                e["avg_kurtosis"],
                e["max_inf_norm"],
                e["max_layer_inf_norm"],
                e["median_scale"],
                v["norm_ratio"],
                e["special_mass"],
                e["row_sum"],
                e["train_s"],
                e["train_cpu_s"],
            ]
        )
    return Table(
        name="Search: vanilla model at every grid point tried (cheapest first)",
        columns=[
            "grid point",
            "GFLOP",
            "success",
            "FP ppl",
            "W8A8 ppl",
            "W8A8 gap %",
            "avg kurtosis",
            "max inf norm",
            "max block-out norm",
            "median RMS",
            "max norm / median RMS",
            "mass on BOS/delim/filler",
            "attention row sum",
            "train wall s",
            "train CPU s (skipped: predicted)",
        ],
        rows=rows,
        caption="Success: (avg kurtosis ≥ 20 or max inf norm ≥ 10× median RMS) and W8A8 "
        "perplexity ≥ 5 % worse, within the training budget. OPT-convention metrics (spec §4.2).",
    )


#: Config fields that change no single comparison run (resuming with other values keeps its runs).
_NOT_RECIPE = frozenset(
    {
        "grid",
        "strategy",
        "max_configs",
        "budget_s",
        "stop_at_first",
        "kurtosis_threshold",
        "norm_ratio_threshold",
        "degradation_threshold",
        "variants",
        "seeds",
        "compare",
        "compare_best_if_none",
        "arms",
        "gate_first",
        "threads",
        "workers",
        "checkpoint_every",
        "keep_checkpoints",
    }
)


def _recipe(config: Config) -> dict[str, Any]:
    """The fields of ``config`` that define a single run, as they read back from JSON."""
    recipe = {k: v for k, v in asdict(config).items() if k not in _NOT_RECIPE}
    return dict(json.loads(json.dumps(recipe)))


def _compare(config: Config, ctx: RunContext) -> dict[str, list[dict[str, Any]]]:
    """Train every variant at every seed under ``config`` (see :func:`compare_recipes`)."""
    return compare_recipes([(config, "")], ctx)[0]


def compare_recipes(
    recipes: Sequence[tuple[Config, str]], ctx: RunContext
) -> list[dict[str, list[dict[str, Any]]]]:
    """Train every variant at every seed of each ``(config, prefix)``; per recipe, ``{variant:
    [metrics per seed]}``.

    Runs are kept in ``<prefix>compare.json`` (they count only for the same recipe and
    ``--max-steps`` limit, so a stopped comparison resumes and a finished one is reused) and
    trained in ``runs/<prefix>compare/<variant>/seed<seed>``. The pending runs of all recipes go
    to one pool of ``workers`` processes (the first config's), so no worker idles between
    recipes.
    """
    records: dict[str, dict[str, Any]] = {}
    jobs: list[_Job] = []
    for config, prefix in recipes:
        done: dict[str, Any] = ctx.load_json(f"{prefix}compare.json") or {}
        recipe = _recipe(config)
        if done.get("recipe") != recipe or done.get("stop_after") != ctx.stop_after:
            done = {"recipe": recipe, "stop_after": ctx.stop_after, "runs": {}}
        records[prefix] = done
        jobs += [
            _Job(config, v, s, prefix)
            for v in config.variants
            for s in config.seeds
            if f"{v}/seed{s}" not in done["runs"]
        ]
    for job, metrics in ctx.track(_train_jobs(jobs, ctx), total=len(jobs), desc="variants"):
        records[job.prefix]["runs"][job.key] = metrics
        ctx.save_json(f"{job.prefix}compare.json", records[job.prefix])
    return [
        {
            v: [records[prefix]["runs"][f"{v}/seed{s}"] for s in config.seeds]
            for v in config.variants
        }
        for config, prefix in recipes
    ]


@dataclass(frozen=True)
class _Job:
    """One comparison run: ``variant`` at training seed ``seed`` under ``config``."""

    config: Config
    variant: str
    seed: int
    prefix: str

    @property
    def key(self) -> str:
        return f"{self.variant}/seed{self.seed}"


def _train_job(job: _Job, ctx: RunContext) -> tuple[_Job, dict[str, Any]]:
    """One comparison run (the unit of work of a worker process)."""
    if job.config.threads:
        torch.set_num_threads(job.config.threads)
    tag = f"{job.prefix}compare/{job.key}"
    return job, train_and_evaluate(job.config, job.variant, job.seed, ctx, tag)


def _train_jobs(jobs: Sequence[_Job], ctx: RunContext) -> Iterator[tuple[_Job, dict[str, Any]]]:
    """``(job, metrics)`` of every job, in order, or as they finish in ``workers`` spawned
    processes (each with ``threads`` threads; the first job's config sets both)."""
    workers = jobs[0].config.workers if jobs else 1
    if workers <= 1 or len(jobs) <= 1 or ctx.processes > 1:
        for job in jobs:
            yield _train_job(job, ctx)
        return
    quiet = dataclasses.replace(ctx, progress=False)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=spawn) as pool:
        futures = [pool.submit(_train_job, job, quiet) for job in jobs]
        for future in as_completed(futures):
            yield future.result()


def _gap_pct(metrics: Mapping[str, Any]) -> float:
    """The W8A8 perplexity cost of one run, in % of its FP perplexity."""
    return 100 * (metrics["w8a8_ppl"] - metrics["fp_ppl"]) / metrics["fp_ppl"]


#: The quantities Softmax_1 should lower (claim C-c), per run.
_PAIR_METRICS: dict[str, Callable[[Mapping[str, Any]], float]] = {
    "avg_kurtosis": itemgetter("avg_kurtosis"),
    "max_inf_norm": itemgetter("max_inf_norm"),
    "w8a8_gap_pct": _gap_pct,
}


def _paper_value(variant: str, metric: str) -> float:
    kurtosis, inf_norm, fp, w8a8 = PAPER_OPT[variant]
    return {
        "avg_kurtosis": kurtosis,
        "max_inf_norm": inf_norm,
        "w8a8_gap_pct": 100 * (w8a8 - fp) / fp,
    }[metric]


def _compare_tables(
    results: Mapping[str, list[dict[str, Any]]], where: str = "under the recipe"
) -> list[Table]:
    """Table 1 quantities of every variant (mean ± 95 % t half-width over seeds) and the
    Softmax_1 reductions per pair; ``where`` names the recipe in the table titles."""

    def cell(values: Sequence[float]) -> str:
        mean, half = confidence_interval(values)
        return f"{mean:.4g} ± {half:.2g}"

    rows = []
    for variant, runs in results.items():
        paper = PAPER_OPT.get(variant, (None,) * 4)
        gaps = [_gap_pct(r) for r in runs]
        rows.append(
            [
                VARIANT_NAMES.get(variant, variant),
                cell([r["avg_kurtosis"] for r in runs]),
                cell([r["max_inf_norm"] for r in runs]),
                cell([r["fp_ppl"] for r in runs]),
                cell([r["w8a8_ppl"] for r in runs]),
                cell(gaps),
                cell([r["special_mass"] for r in runs]),
                cell([r["row_sum"] for r in runs]),
                runs[0]["params"],
                *paper,
            ]
        )
    table = Table(
        name=f"Variants {where} (OutEffHop Table 1 quantities)",
        columns=[
            "variant",
            "avg kurtosis",
            "max inf norm",
            "FP ppl",
            "W8A8 ppl",
            "W8A8 gap %",
            "mass on BOS/delim/filler",
            "attention row sum",
            "params",
            "paper OPT avg kurtosis",
            "paper OPT max inf norm",
            "paper OPT FP16 ppl",
            "paper OPT W8A8 ppl",
        ],
        rows=rows,
        caption=f"Mean ± 95 % t-interval half-width over {len(next(iter(results.values())))} "
        "training seeds; the paper's OPT-125m numbers (Table 1) beside ours.",
    )
    pair_rows = [
        _reduction_row(base, ours, metric, value, results)
        for base, ours in (*PAIRS, CONTROL_PAIR)
        if base in results and ours in results
        for metric, value in _PAIR_METRICS.items()
    ]
    pairs = Table(
        name=f"Reductions by Softmax_1 {where} (claim C-c)",
        columns=[
            "pair",
            "metric",
            "reduction %",
            "seeds where lower",
            "paper OPT reduction %",
            "difference [95 % CI]",
            "paired t p",
        ],
        rows=pair_rows,
        caption="Reduction: 1 − mean(new) / mean(base); difference: mean over seeds of new − "
        "base with its 95 % t interval and the two-sided paired t-test (seeds pair the "
        "variants: same initial weights and data order). The last pair is the positive "
        "control: gated against vanilla attention.",
    )
    return [table, pairs]


def _reduction_row(
    base: str,
    ours: str,
    metric: str,
    value: Callable[[Mapping[str, Any]], float],
    results: Mapping[str, list[dict[str, Any]]],
) -> list[Any]:
    """One row of the reductions table: ``ours`` against ``base`` on ``metric``, paired over
    the training seeds."""
    a = [value(r) for r in results[base]]
    b = [value(r) for r in results[ours]]
    wins = sum(y < x for x, y in zip(a, b, strict=True))
    paired = compare_paired(b, a, direction="higher")
    low, high = paired.interval
    interval = (
        "–" if math.isnan(low) else f"{paired.mean_difference:+.4g} [{low:+.4g}, {high:+.4g}]"
    )
    return [
        f"{VARIANT_NAMES[base]} → {VARIANT_NAMES[ours]}",
        metric,
        100 * (1 - statistics.fmean(b) / statistics.fmean(a)),
        f"{wins}/{len(a)}",
        100 * (1 - _paper_value(ours, metric) / _paper_value(base, metric)),
        interval,
        "–" if math.isnan(paired.p_t) else float(f"{paired.p_t:.3g}"),
    ]


def _seed_robustness(
    vanilla: Sequence[Mapping[str, Any]], recipe: Config, metrics: dict[str, float]
) -> str:
    """How many training seeds of the vanilla model meet the criterion under the recipe (the
    search judged one seed); records ``vanilla_seeds_meeting_criterion``."""
    verdicts = [_verdict(run, recipe) for run in vanilla]
    met = sum(v.success for v in verdicts)
    metrics["vanilla_seeds_meeting_criterion"] = float(met)
    gaps = ", ".join(f"{100 * v.degradation:.2f}" for v in verdicts)
    return (
        f"Vanilla under the recipe meets the criterion in {met} of {len(verdicts)} training "
        f"seeds (W8A8 gaps {gaps} %)."
    )


def _curve_figure(
    results: Mapping[str, list[dict[str, Any]]], config: Config, ctx: RunContext
) -> str:
    """Figure 2 analogue: max |x| of block L−2's output during training, one panel per pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layer = max(config.num_layers - 2, 0)
    module = f"model.decoder.layers.{layer}"
    pairs = [p for p in PAIRS if p[0] in results and p[1] in results]
    pairs = pairs or [(v, v) for v in list(results)[:1]]  # no pair: one panel
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.2 * len(pairs), 3.2), squeeze=False)
    for ax, pair in zip(axes[0], pairs, strict=True):
        for variant in dict.fromkeys(pair):
            for i, run_ in enumerate(results[variant]):
                steps = [s for s, values in run_["curve"] if module in values]
                values = [values[module] for _, values in run_["curve"] if module in values]
                ax.plot(
                    steps,
                    values,
                    color="C0" if variant == pair[0] else "C1",
                    linestyle="-" if variant == pair[0] else "--",
                    alpha=0.8,
                    label=VARIANT_NAMES.get(variant, variant) if i == 0 else None,
                )
        ax.set_xlabel("training step")
        ax.set_ylabel(f"max |x|, block {layer} output")
        ax.legend(fontsize=8)
    fig.tight_layout()
    name = "max_abs_curves.png"
    ctx.save_figure(fig, name, dpi=120)
    return name


def run(config: Config, ctx: RunContext) -> Results:
    """Search the grid, then compare the variants under the recipe (see the module docstring)."""
    return with_threads(config.threads, lambda: _run(config, ctx))


def check_config(config: Config) -> None:
    """:class:`~hopfield.experiments.registry.ConfigError` naming the field for a configuration
    the experiment cannot run (before any data is read or anything trains); each decisive arm
    and each grid point is checked as well."""
    check_subset("variants", config.variants, VARIANT_NAMES)
    if not config.seeds:
        raise ConfigError("seeds must not be empty")
    check_ints(config, "workers")
    check_ints(config, "threads", minimum=0)
    check_choice("strategy", config.strategy, STRATEGIES)
    check_choice("data", config.data, DATA_SOURCES)
    if config.data == "wikitext-2" and config.vocab_size < 300:
        raise ConfigError(
            f"vocab_size must be >= 300 for the byte-level BPE of wikitext-2, got {config.vocab_size}"
        )
    if config.arms:
        from hopfield.experiments.outlier_decisive import REQUIRED_VARIANTS, arm_config

        missing = [v for v in REQUIRED_VARIANTS if v not in config.variants]
        if missing:
            raise ConfigError(
                f"variants: the decisive test needs {list(REQUIRED_VARIANTS)}, missing {missing}"
            )
        if not isinstance(config.arms, Mapping):
            raise ConfigError(f"arms must map arm names to overrides, got {config.arms!r}")
        for name, overrides in config.arms.items():
            with config_errors(f"arms: {name}: "):
                check_config(arm_config(config, overrides))
        return
    if config.grid:
        with config_errors():
            points = grid_points(config)
        for point in points:
            check_config(point.config)


def _run(config: Config, ctx: RunContext) -> Results:
    check_config(config)
    if config.arms:
        from hopfield.experiments.outlier_decisive import run_arms

        return run_arms(config, ctx)
    _data(config, ctx.data_dir)  # data errors (e.g. DataNotFoundError) before any training
    entries = _search(config, ctx)
    trained = [e for e in entries if e["status"] == "trained"]
    winners = [e for e in trained if e["verdict"]["success"]]
    device = "GPU" if torch.cuda.is_available() and not config.cpu else "CPU"
    results = Results(tables=[_search_table(entries)])
    results.notes.append(
        f"Trained on {device} with {torch.get_num_threads()} thread(s) per run and "
        f"{config.workers} worker process(es)"
        + ("; no GPU was available in this session." if not torch.cuda.is_available() else ".")
    )
    results.metrics.update(
        configs_tried=float(len(trained)),
        configs_skipped=float(len(entries) - len(trained)),
        recipe_found=float(bool(winners)),
        max_vanilla_kurtosis=max((e["avg_kurtosis"] for e in trained), default=math.nan),
        max_vanilla_w8a8_gap_pct=max(
            (100 * e["verdict"]["degradation"] for e in trained), default=math.nan
        ),
    )
    chosen = winners[0] if winners else None
    if chosen is not None:
        results.notes.append(f"Recipe found: {chosen['name']} ({chosen['verdict']['reason']}).")
    else:
        results.notes.append(
            f"No grid point formed outliers by the criterion ({len(trained)} trained): a null "
            "result at this budget; every point tried is in the search table."
        )
        if trained:
            best = max(trained, key=lambda e: _outlier_score(e, config.criterion))
            results.notes.append(f"Most outlier-prone point tried: {best['name']}.")
            if config.compare_best_if_none and config.compare:
                chosen = best
                results.notes.append(
                    f"The comparison below uses {best['name']}, which did NOT meet the criterion."
                )
    if chosen is None or not config.compare:
        return results
    recipe = replace(config, grid={}, **chosen["overrides"])
    compared = _compare(recipe, ctx)
    if "softmax" in compared:
        results.notes.append(_seed_robustness(compared["softmax"], recipe, results.metrics))
    results.tables.extend(_compare_tables(compared))
    if recipe.ablation:
        from hopfield.experiments.outlier_decisive import ablation_table

        results.tables.append(ablation_table({"the recipe": compared}))
    results.figures.append(_curve_figure(compared, recipe, ctx))
    results.metrics["recipe_gflop"] = training_gflop(recipe)
    return results


#: The ``paper`` search: the knobs of the issue at the paper-like size (d = 128, FFN 512).
_PAPER_GRID: dict[str, list[Any]] = {
    "steps": [10_000, 30_000, 100_000],
    "num_layers": [6, 12],
    "ffn_dim": [512, 1024],
    "pre_ln": [True, False],
    "lr": [1e-3, 3e-3],
    "ln_weight_decay": [True, False],
    "delimiter_rate": [0.15, 0.3],
}

#: The ``small`` search's fixed settings: what the CPU pilot runs of docs/outlier-formation.md
#: found outlier-prone (d = 64, no LayerNorm-gain decay, constant learning rate, many
#: delimiters, 8 successors per content token) ...
_SMALL_BASE: dict[str, Any] = dict(
    hidden_size=64,
    num_heads=4,
    ffn_dim=256,
    branching=8,
    delimiter_rate=0.3,
    ln_weight_decay=False,
    schedule="constant",
    lr=1e-2,
    steps=2500,
    log_every=100,
)
#: ... and its axes: LN placement and learning rate at the cheapest size (ladder stage 1), then
#: depth and vocabulary (the two that moved the W8A8 gap in the pilots) in cost order.
_SMALL_GRID: dict[str, list[Any]] = {
    "pre_ln": [True, False],
    "lr": [1e-2, 3e-3],
    "num_layers": [4, 6],
    "vocab_size": [64, 512],
}

#: Training steps of every decisive run (sized so that the whole preset fits 2.5 h on 2 cores).
DECISIVE_STEPS = 2000

#: The decisive test's model: the ``small`` recipe (pre-LN, 6 layers, d 64, 4 heads, FFN 256,
#: T 64, vocabulary 512, no dropout) ...
_DECISIVE_MODEL: dict[str, Any] = dict(
    hidden_size=64,
    num_heads=4,
    num_layers=6,
    ffn_dim=256,
    vocab_size=512,
    pre_ln=True,
    steps=DECISIVE_STEPS,
    log_every=100,
)
#: ... its data: synthetic streams where the token after a delimiter is certain, or WikiText-2
#: with BPE and ``</s>`` between sentences ...
_DECISIVE_DATA: dict[str, dict[str, Any]] = {
    "synthetic": dict(delimiter_rate=0.3, branching=8, recall_rate=1.0),
    "wikitext": dict(data="wikitext-2", sentence_separators=True),
}
#: ... and its optimiser regimes: paper-like (AdamW, 5 % warm-up, cosine to 10 %, weight decay
#: 0.1 on the LayerNorm gains too) and the ``small`` recipe's constant 1e-2 as a stress arm.
_DECISIVE_REGIMES: dict[str, dict[str, Any]] = {
    "paper-like": dict(lr=3e-3, schedule="cosine", min_lr_ratio=0.1, ln_weight_decay=True),
    "stress": dict(lr=1e-2, schedule="constant", ln_weight_decay=False),
}

PRESETS = {
    "tiny": Config(
        vocab_size=24,
        seq_len=16,
        train_sequences=64,
        val_sequences=16,
        hidden_size=16,
        num_heads=2,
        num_layers=2,
        ffn_dim=32,
        steps=4,
        batch_size=8,
        eval_batch_size=16,
        calibration_batches=2,
        grid={"steps": [4, 2], "pre_ln": [False]},
        budget_s=600.0,
        variants=tuple(VARIANT_NAMES),
        seeds=(0, 1),
        log_every=2,
        checkpoint_every=0,
    ),
    "small": Config(**_SMALL_BASE, grid=_SMALL_GRID, strategy="ladder", budget_s=1800.0),
    "decisive": Config(
        **_DECISIVE_MODEL,
        arms={
            f"{data}/{regime}": {**_DECISIVE_DATA[data], **_DECISIVE_REGIMES[regime]}
            for data in _DECISIVE_DATA
            for regime in _DECISIVE_REGIMES
        },
        variants=("softmax", "gated", "softmax1", "gated_softmax1"),
        seeds=tuple(range(6)),
        extra_percentile=99.999,
        ablation=True,
        workers=2,
    ),
    "paper": Config(
        grid=_PAPER_GRID,
        strategy="ladder",
        budget_s=36_000.0,
        threads=0,
        cpu=False,
    ),
}

register(
    Experiment(
        name="outlier-formation",
        summary="Search for the cheapest recipe under which vanilla attention forms outliers; "
        "compare the six attention variants under it",
        presets=PRESETS,
        run=run,
        check=check_config,
        paper="OutEffHop Table 1 / Figure 2 setting (Hu et al. 2024), mechanism of Bondarenko et al. 2023",
        in_reproduce=False,
    )
)

"""``outlier-cost``: training time and memory of vanilla Softmax vs OutEffHop (Softmax_1)
attention (OutEffHop Table 4 and Fig. 8, App. D.3).

The paper reports the pre-training time (hours) and the average RAM use (GB) of each model of
its outlier study trained with vanilla Softmax and with OutEffHop. This experiment measures the
same comparison per **training step**, for each family of the study:

* BERT, OPT, ViT: :data:`hopfield.experiments.outliers.SETTINGS` of the preset's scale (model
  built by :func:`hopfield.integrations.build_model` with the attention ``softmax`` or
  ``softmax1``, AdamW with the study's parameter groups, gradient clipping);
* STanHop-Net: the first setting of :data:`hopfield.experiments.stanhop_outliers.PRESETS` of the
  scale (ETTh1, horizon 24 at ``small`` and ``paper``: Table 1's row), built by
  :func:`hopfield.experiments.stanhop_outliers.build_model` with the ``dense`` or ``outeffhop``
  association, Adam with the recipe's settings.

One training step is forward, loss, backward, gradient clipping, optimiser step and
``zero_grad(set_to_none=True)`` on one fixed synthetic batch of the preset's shape (one
micro-batch: token ids ``(B, T)`` that are also the labels, images ``(B, C, S, S)`` with labels
``(B,)``, windows ``x (B, T, C)`` and ``y (B, τ, C)``), in float32 and training mode (dropout
on). Both models start from the same seed.

* **Time**, interleaved: in each of ``rounds`` rounds, each variant runs ``warmup`` untimed
  steps and then ``steps`` timed steps; the variant that goes first alternates from round to
  round, so both see the same load of the machine. A round records the median step time per
  variant, on the process CPU clock (``clock="cpu"``: leaves out the time spent waiting for a
  core on a shared machine) and on the wall clock; ``clock`` picks the one the tables and the
  claims use (``"wall"`` on a GPU, where the CPU clock does not see the device's work). The
  rounds are the replicates: the time ratio OutEffHop/vanilla is the geometric mean of the
  rounds' ratios, with a 95 % t interval over the rounds.
* **Peak memory**, once per round and variant, after the timing: the largest sum of live
  allocations made during one more training step (:func:`hopfield.experiments.measure.peak_bytes`:
  activations, gradients, the optimiser's temporaries). Parameters, the batch and the
  optimiser state, which exist before the step, are excluded for both variants alike.

Records: ``measurements.json`` (per family: shape, parameters and every round's medians and
peaks, the ledger's evidence) beside ``results.json`` (the Table 4 comparison with the paper's
numbers and ratios). A family whose measurements are in ``measurements.json`` under the same
configuration is not measured again.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hopfield.experiments import outliers, stanhop_outliers
from hopfield.experiments.checks import check_choice, check_ints, check_subset
from hopfield.experiments.measure import peak_bytes, timings
from hopfield.experiments.registry import ConfigError, Experiment, register
from hopfield.experiments.results import Results, RunContext, Table
from hopfield.stats import compare_paired

__all__ = [
    "CLOCKS",
    "FAMILIES",
    "PAPER_TABLE4",
    "PRESETS",
    "VARIANTS",
    "Config",
    "Workload",
    "check_config",
    "measure_family",
    "run",
    "training_step",
    "workload",
]

FAMILIES = ("bert", "opt", "vit", "stanhop")
DISPLAY = {"bert": "BERT", "opt": "OPT", "vit": "ViT", "stanhop": "STanHop-Net"}
#: The compared attentions: vanilla Softmax and OutEffHop (Softmax_1).
VARIANTS = ("softmax", "softmax1")
LABELS = {"softmax": "Vanilla", "softmax1": "OutEffHop"}
#: STanHop-Net's association of each variant.
STANHOP_KINDS = {"softmax": "dense", "softmax1": "outeffhop"}
CLOCKS = ("cpu", "wall")

#: Table 4: per family and variant, (pre-training time in hours, average memory in GB).
PAPER_TABLE4: dict[str, dict[str, tuple[float, float]]] = {
    "vit": {"softmax": (77.167, 47.47), "softmax1": (82.977, 49.69)},
    "bert": {"softmax": (14.82, 7.56), "softmax1": (17.05, 7.20)},
    "opt": {"softmax": (28.13, 3.75), "softmax1": (43.47, 3.75)},
    "stanhop": {"softmax": (1.3, 5.30), "softmax1": (1.43, 5.28)},
}


def paper_ratio(family: str, column: int) -> float:
    """Table 4's OutEffHop / vanilla ratio of ``family`` (``column`` 0: time, 1: memory)."""
    table = PAPER_TABLE4[family]
    return table["softmax1"][column] / table["softmax"][column]


@dataclass
class Config:
    """Settings of ``outlier-cost``.

    Attributes:
        families: model families, of :data:`FAMILIES`.
        scale: ``"tiny"``, ``"small"`` or ``"paper"``: the outlier study's model settings
            (:data:`hopfield.experiments.outliers.SETTINGS`) and the STanHop-Net preset
            (:data:`hopfield.experiments.stanhop_outliers.PRESETS`) of that name.
        rounds: timing rounds, the replicates (fixed before a run).
        steps: timed steps per variant and round (the round records their median).
        warmup: untimed steps per variant before each round's timed steps.
        clock: ``"cpu"`` (process CPU time) or ``"wall"``: the time the tables and claims use
            (both are recorded).
        threads: ``torch.set_num_threads`` during the measurements (``None``: leave it).
        device: ``"auto"`` (CUDA where available) or ``"cpu"``.
        seed: seed of the initial weights (the same for both variants) and of the batch.
    """

    families: tuple[str, ...] = FAMILIES
    scale: str = "small"
    rounds: int = 7
    steps: int = 5
    warmup: int = 1
    clock: str = "cpu"
    threads: int | None = 1
    device: str = "auto"
    seed: int = 0


PRESETS = {
    "tiny": Config(scale="tiny", rounds=3, steps=2, warmup=1),
    # rounds fixed before the committed run (docs/outliers.md); 5 timed steps after 1 warm-up
    # keep a round of BERT (the largest) under a minute on 2 busy CPU cores
    "small": Config(scale="small", rounds=7, steps=5, warmup=1),
    "paper": Config(
        scale="paper", rounds=7, steps=20, warmup=5, clock="wall", threads=None, device="auto"
    ),
}


def check_config(config: Config) -> None:
    """:class:`ConfigError` naming the first field ``config`` cannot run with."""
    check_subset("families", config.families, FAMILIES)
    check_choice("scale", config.scale, ("tiny", "small", "paper"))
    check_ints(config, "rounds", "steps")
    check_ints(config, "warmup", "seed", minimum=0)
    check_ints(config, "threads", optional=True)
    check_choice("clock", config.clock, CLOCKS)
    check_choice("device", config.device, ("auto", "cpu"))
    if "stanhop" in config.families:
        stanhop_outliers.check_config(stanhop_outliers.PRESETS[config.scale])
    transformers = [f for f in config.families if f != "stanhop"]
    for family in transformers:
        if family not in outliers.SETTINGS[config.scale]:
            raise ConfigError(f"families: scale {config.scale!r} has no settings for {family!r}")


# ------------------------------------------------------------------------------------------------
# Workloads: one family's model, batch, loss and optimiser
# ------------------------------------------------------------------------------------------------


@dataclass
class Workload:
    """One family's training step, the same for both variants but for the attention.

    Attributes:
        family: a name of :data:`FAMILIES`.
        build: ``build(variant) -> model`` (training mode, on the device, float32).
        batch: the fixed synthetic batch, as ``loss`` takes it (on the device).
        loss: ``loss(model, batch) -> scalar Tensor``.
        training: the optimiser settings of the study (a
            :class:`hopfield.training.TrainingConfig`).
        shape: the batch in words, for the report.
    """

    family: str
    build: Callable[[str], nn.Module]
    batch: Any
    loss: Callable[[nn.Module, Any], Tensor]
    training: Any
    shape: str


def _model_output_loss(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """The ``transformers`` model's own loss of ``batch`` (its inputs and ``labels``)."""
    loss: Tensor = model(**batch).loss
    return loss


def _mse_loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    """Forecast MSE of windows ``x (B, T, C)`` against targets ``y (B, τ, C)``."""
    x, y = batch
    return F.mse_loss(model(x), y)


def _transformer_workload(
    settings: outliers.ModelSettings, device: torch.device, generator: torch.Generator
) -> Workload:
    """BERT, OPT or ViT of the study's ``settings`` on one micro-batch: token ids ``(B, T)``
    (also the labels; BERT's loss then covers every position, as a masked one computes the
    same logits) or images ``(B, C, S, S)`` in ``[0, 1)`` with labels ``(B,)``."""
    from hopfield.data.images import STAND_IN_SHAPES
    from hopfield.experiments.outliers_tasks import stand_in_model_config
    from hopfield.integrations import build_model
    from hopfield.training import TrainingConfig

    n = settings.micro_batch_size or settings.batch_size
    if settings.family == "vit":
        channels, side, classes, _ = STAND_IN_SHAPES[settings.dataset]
        side = settings.image_size if settings.dataset == "imagenet" else side
        model_config: dict[str, Any] = {
            "image_size": side,
            "patch_size": settings.patch_size,
            "num_channels": channels,
            "num_labels": classes,
        }
        batch = {
            "pixel_values": torch.rand(n, channels, side, side, generator=generator),
            "labels": torch.randint(classes, (n,), generator=generator),
        }
        tokens = (side // settings.patch_size) ** 2 + 1
        shape = f"{n} images {channels}×{side}×{side} ({tokens} tokens)"
    else:
        model_config = stand_in_model_config(settings)
        ids = torch.randint(settings.vocab_size, (n, settings.seq_len), generator=generator)
        batch = {"input_ids": ids, "labels": ids}
        shape = f"{n} × {settings.seq_len} tokens"
    arch = outliers.architecture(settings)

    def build(variant: str) -> nn.Module:
        model = build_model(settings.family, variant, **model_config, **arch)
        return model.to(device).train()

    return Workload(
        family=settings.family,
        build=build,
        batch={k: v.to(device) for k, v in batch.items()},
        loss=_model_output_loss,
        training=TrainingConfig(max_steps=settings.steps, **outliers.optimiser_settings(settings)),
        shape=f"{shape}, {settings.layers} layers, d {settings.hidden}",
    )


def _stanhop_workload(
    config: stanhop_outliers.Config, device: torch.device, generator: torch.Generator
) -> Workload:
    """STanHop-Net of ``config``'s first setting on one batch of random windows."""
    from hopfield.data.timeseries import series_count
    from hopfield.training import TrainingConfig

    dataset, horizon, in_len, seg_len, lr, n = stanhop_outliers.parse_setting(config.settings[0])
    series = series_count(dataset)
    windows = (
        torch.randn(n, in_len, series, generator=generator).to(device),
        torch.randn(n, horizon, series, generator=generator).to(device),
    )

    def build(variant: str) -> nn.Module:
        kind = STANHOP_KINDS[variant]
        model = stanhop_outliers.build_model(config, series, in_len, horizon, seg_len, kind)
        return model.to(device).train()

    recipe = stanhop_outliers.recipe(config, lr, n)
    return Workload(
        family="stanhop",
        build=build,
        batch=windows,
        loss=_mse_loss,
        training=TrainingConfig(max_steps=1, **recipe.optimiser_settings()),
        shape=f"{n} windows {in_len}→{horizon} of {series} series ({dataset}), "
        f"{config.e_layers} layers, d {config.d_model}",
    )


def workload(family: str, scale: str, device: torch.device, seed: int) -> Workload:
    """The :class:`Workload` of ``family`` at ``scale`` (its batch drawn from ``seed``)."""
    generator = torch.Generator().manual_seed(seed)
    if family == "stanhop":
        return _stanhop_workload(stanhop_outliers.PRESETS[scale], device, generator)
    return _transformer_workload(outliers.SETTINGS[scale][family], device, generator)


# ------------------------------------------------------------------------------------------------
# Measurements
# ------------------------------------------------------------------------------------------------


def training_step(model: nn.Module, work: Workload, device: torch.device) -> Callable[[], None]:
    """One training step of ``model`` on ``work.batch``: loss, backward, gradient clipping,
    optimiser step (the study's optimiser, :func:`hopfield.training.build_optimizer`) and
    ``zero_grad(set_to_none=True)``, waiting for the device at the end."""
    from hopfield.training import build_optimizer

    optimizer = build_optimizer(model, work.training)
    clip = work.training.grad_clip

    def step() -> None:
        work.loss(model, work.batch).backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return step


def measure_family(work: Workload, config: Config, device: torch.device) -> dict[str, Any]:
    """Interleaved rounds of both variants' training steps (see the module docstring).

    Returns:
        ``{"shape", "parameters": {variant: n}, "rounds": [{"first": variant, variant:
        {"wall", "cpu", "peak_bytes"}}, ...]}``: per round the median wall and CPU seconds of a
        step and the peak bytes of one step.
    """
    steps, parameters = {}, {}
    for variant in VARIANTS:
        torch.manual_seed(config.seed)  # the same initial weights for both variants
        model = work.build(variant)
        parameters[variant] = sum(p.numel() for p in model.parameters())
        steps[variant] = training_step(model, work, device)
    rounds: list[dict[str, Any]] = []
    for index in range(config.rounds):
        order = VARIANTS if index % 2 == 0 else VARIANTS[::-1]
        entry: dict[str, Any] = {"first": order[0]}
        for variant in order:
            wall, cpu = timings(steps[variant], config.steps, config.warmup)
            entry[variant] = {"wall": statistics.median(wall), "cpu": statistics.median(cpu)}
        for variant in order:
            entry[variant]["peak_bytes"] = peak_bytes(steps[variant], device)
        rounds.append(entry)
    return {"shape": work.shape, "parameters": parameters, "rounds": rounds}


def _device(config: Config) -> torch.device:
    cuda = config.device == "auto" and torch.cuda.is_available()
    return torch.device("cuda" if cuda else "cpu")


def measure(config: Config, ctx: RunContext) -> dict[str, dict[str, Any]]:
    """Every family's measurements, resumed from and saved to ``measurements.json`` after each
    family (a family measured under another configuration is measured again)."""
    saved = ctx.load_json("measurements.json") or {}
    settings = json.loads(json.dumps(asdict(config)))  # as JSON gives it back: lists, not tuples
    same = saved.get("config") == settings
    families: dict[str, dict[str, Any]] = saved.get("families", {}) if same else {}
    device = _device(config)
    threads = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        for family in ctx.track(config.families, len(config.families), "outlier-cost"):
            if family not in families:
                work = workload(family, config.scale, device, config.seed)
                families[family] = measure_family(work, config, device)
                families[family]["threads"] = torch.get_num_threads()
                families[family]["device"] = str(device)
                ctx.save_json("measurements.json", {"config": settings, "families": families})
    finally:
        torch.set_num_threads(threads)
    return families


# ------------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------------


def time_ratio(rounds: list[dict[str, Any]], clock: str) -> tuple[float, float, float]:
    """Geometric mean over the rounds of the step-time ratio OutEffHop / vanilla and its 95 %
    t interval (``nan`` ends with one round)."""
    ours = [math.log(r["softmax1"][clock]) for r in rounds]
    vanilla = [math.log(r["softmax"][clock]) for r in rounds]
    result = compare_paired(ours, vanilla)
    low, high = result.interval
    return math.exp(result.mean_difference), math.exp(low), math.exp(high)


def memory_ratios(rounds: list[dict[str, Any]]) -> list[float]:
    """Each round's peak-memory ratio OutEffHop / vanilla."""
    return [r["softmax1"]["peak_bytes"] / r["softmax"]["peak_bytes"] for r in rounds]


def _median(rounds: list[dict[str, Any]], variant: str, key: str) -> float:
    return statistics.median(r[variant][key] for r in rounds)


def summarise(config: Config, families: dict[str, dict[str, Any]]) -> Results:
    """The Table 4 comparison, metrics and notes from the measurements."""
    rows: list[list[Any]] = []
    metrics: dict[str, float] = {}
    for family in config.families:
        measured = families[family]
        rounds = measured["rounds"]
        ratio, low, high = time_ratio(rounds, config.clock)
        memory = memory_ratios(rounds)
        ms = {v: 1e3 * _median(rounds, v, config.clock) for v in VARIANTS}
        mib = {v: _median(rounds, v, "peak_bytes") / 2**20 for v in VARIANTS}
        paper = PAPER_TABLE4[family]
        rows.append(
            [
                DISPLAY[family],
                measured["shape"],
                ms["softmax"],
                ms["softmax1"],
                ratio,
                f"[{low:.3f}, {high:.3f}]",
                f"{paper['softmax'][0]:g} → {paper['softmax1'][0]:g}",
                paper_ratio(family, 0),
                mib["softmax"],
                mib["softmax1"],
                statistics.median(memory),
                f"[{min(memory):.4f}, {max(memory):.4f}]",
                f"{paper['softmax'][1]:g} → {paper['softmax1'][1]:g}",
                paper_ratio(family, 1),
            ]
        )
        metrics.update(
            {
                f"{family}/time_ratio": ratio,
                f"{family}/memory_ratio": statistics.median(memory),
                f"{family}/threads": float(measured["threads"]),
                **{f"{family}/{v}/ms_per_step": ms[v] for v in VARIANTS},
                **{f"{family}/{v}/peak_mib": mib[v] for v in VARIANTS},
            }
        )
    clock = "process CPU time" if config.clock == "cpu" else "wall time"
    table = Table(
        "Table 4: training-step time and memory, OutEffHop vs vanilla",
        [
            "model",
            "batch (one step)",
            "vanilla ms/step",
            "OutEffHop ms/step",
            "time ratio",
            "95% interval",
            "paper time (h)",
            "paper time ratio",
            "vanilla peak MiB",
            "OutEffHop peak MiB",
            "memory ratio",
            "memory ratio range",
            "paper memory (GB)",
            "paper memory ratio",
        ],
        rows,
        caption=(
            f"Ours: one float32 training step at the {config.scale} settings, {clock}; medians "
            f"over {config.rounds} interleaved rounds of {config.steps} timed steps (after "
            f"{config.warmup} warm-up) per variant. Time ratio: geometric mean of the rounds' "
            "OutEffHop/vanilla ratios with its 95 % t interval; peak memory: allocations during "
            "one step (parameters, batch and optimiser state excluded), ratio the median and "
            "range over the rounds. Paper: Table 4, whole pre-training runs (hours) and average "
            "RAM (GB) on two A100s; its ratios are OutEffHop/vanilla."
        ),
    )
    devices = sorted({families[f]["device"] for f in config.families})
    threads = sorted({families[f]["threads"] for f in config.families})
    notes = [
        f"torch {torch.__version__} on {', '.join(devices)}, torch.get_num_threads() = "
        f"{', '.join(map(str, threads))}. Both variants take the same fast path of "
        "hopfield.functional.associate (scaled_dot_product_attention; Softmax_1 appends one "
        "zero key and value), so the time ratio measures that extra key, not a slower "
        "implementation of Softmax_1.",
        "The paper measured whole pre-training runs (fp16 for BERT, OPT and ViT) and the "
        "average RAM of the machine (Wandb, system logs); ours are single float32 steps on one "
        "batch and the peak allocations of a step: compare the ratios, not the units.",
    ]
    return Results(tables=[table], metrics=metrics, notes=notes)


def _check_run_options(ctx: RunContext) -> None:
    """:class:`ConfigError` for run options this experiment would otherwise ignore: it times
    float32 steps of the preset's own micro-batch."""
    if ctx.mixed_precision not in (None, "no"):
        raise ConfigError(
            f"--mixed-precision {ctx.mixed_precision}: outlier-cost times float32 training "
            "steps only; leave the option out"
        )
    if ctx.micro_batch_size is not None:
        raise ConfigError(
            "--micro-batch-size: outlier-cost times one step of the preset's own batch; "
            "leave the option out"
        )


def run(config: Config, ctx: RunContext) -> Results:
    """Measure every family (resuming), then tabulate."""
    check_config(config)
    _check_run_options(ctx)
    return summarise(config, measure(config, ctx))


register(
    Experiment(
        name="outlier-cost",
        summary="training-step time and peak memory of vanilla Softmax vs OutEffHop attention "
        "in BERT, OPT, ViT and STanHop-Net",
        presets=PRESETS,
        run=run,
        check=check_config,
        paper="OutEffHop (Hu et al., 2024) Table 4 / Fig. 8 (App. D.3)",
        tags=("outliers",),
        single_process=True,
    )
)

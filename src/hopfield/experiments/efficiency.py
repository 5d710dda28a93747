"""``efficiency``: forward time, peak memory and FLOPs versus memory size (nonparametric Figs. 6–7).

Protocol (Hu et al., ICML 2025, Appendix G.5; spec nonparametric §9.5): self-association of a
random batch ``x (B, L, d)`` (memory size ``L = S``), batch 4, for each model of the efficient
family. Two modes:

* ``association``: one Hopfield retrieval ``Sep(β q kᵀ) v`` with ``q = k = v = x`` viewed as one
  head ``(B, 1, L, d)`` (β = 1/√d): the retrieval op alone;
* ``layer``: the full :class:`hopfield.nn.Hopfield` layer with its projections
  (``layer_heads`` heads, head size ``d / layer_heads``), the paper's measurement.

Each point is the median wall time of ``repeats`` forward passes (``torch.no_grad``) after
``warmup`` passes, with ``torch.set_num_threads(threads)`` recorded; peak memory is the largest
sum of live allocations during one extra forward pass (from the PyTorch profiler's memory
events, inputs and parameters excluded); FLOPs are analytic counts of the algorithm
(:func:`analytic_flops`). Slopes are least-squares fits of ``log time`` against ``log L`` (over
all sizes and over the upper half). A model stops growing once its predicted next time
exceeds ``max_seconds`` (CPU time) or its predicted peak memory ``max_bytes``.

Models: ``dense`` (softmax), ``sparsemax``, ``topk`` (``topk_fraction`` of the memories kept),
``random-p`` for each mask probability ``p`` (the share masked *out*, the paper's "probability"),
``window-sqrt`` (w = ⌊√L⌋), ``window-<w>`` (fixed w), ``window-paper`` (the paper's w per L,
√L elsewhere), ``linear`` (elu+1), ``rf`` (FAVOR+ positive random features) and ``rf-relu``
(the generalized ReLU features the official code ran).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from hopfield.experiments.checks import (
    check_int_items,
    check_ints,
    check_real_items,
    check_reals,
    check_subset,
)
from hopfield.experiments.measure import peak_bytes, timings
from hopfield.experiments.registry import ConfigError, Experiment, register
from hopfield.experiments.results import Results, RunContext, Table
from hopfield.functional import Softmax, Sparsemax, associate
from hopfield.functional.efficient import RandomMask, TopK, Window
from hopfield.functional.efficient_kernel import Linear, RandomFeatures
from hopfield.functional.separation import Separation
from hopfield.functional.structures import Dense, Structure
from hopfield.nn import Hopfield
from hopfield.stats import fit_slope

# Window sizes of the official efficiency script (the paper text uses 16 for L = 720).
PAPER_WINDOWS = {24: 4, 48: 6, 96: 8, 192: 12, 336: 14, 720: 18, 1440: 30, 2880: 48}
PAPER_SIZES = tuple(PAPER_WINDOWS)
QUADRATIC = ("dense", "sparsemax", "topk", "random")
# What the paper reports (its figures carry no numbers).
PAPER_CLAIMS = {
    "dense": "quadratic; same FLOPs as sparsemax",
    "sparsemax": "slightly faster than dense (Fig. 6); same FLOPs",
    "topk": "not measured (quadratic by construction, Remark 3.6)",
    "random": "no speed-up with torch.sparse; time grows with mask probability",
    "window": "significantly faster than sparsemax; FLOPs between dense and linear",
    "linear": "low overhead, far fewer FLOPs; converges with RF at large L",
    "rf": "low overhead, far fewer FLOPs; same FLOPs as linear",
}


@dataclass
class Config:
    """Settings of the efficiency experiment.

    Attributes:
        sizes: memory sizes ``L`` (= number of queries, self-association).
        dims: pattern dimensions ``d`` (association) / input sizes (layer).
        modes: ``"association"`` and/or ``"layer"``.
        models: model names (see the module docstring); ``"random"`` expands to one model per
            entry of ``mask_probabilities``.
        mask_probabilities: random-mask probabilities ``p`` (share of memories masked out).
        topk_fraction: share of memories Top-K keeps.
        fixed_window: the one-sided window of ``window-fixed``.
        batch: batch size.
        layer_heads: heads of the layer mode.
        repeats: timed forward passes per point (the median is reported).
        warmup: untimed passes before timing.
        threads: ``torch.set_num_threads`` during the measurements.
        max_seconds: stop growing a model once its predicted CPU time per pass exceeds this.
        max_bytes: stop growing a model once its predicted peak memory exceeds this.
        measure_memory: also record the peak memory (one extra profiled pass per point).
        seed: seed of the inputs and of the random structures.
    """

    sizes: list[int] = field(default_factory=lambda: [256, 512, 1024])
    dims: list[int] = field(default_factory=lambda: [16])
    modes: list[str] = field(default_factory=lambda: ["association"])
    models: list[str] = field(
        default_factory=lambda: [
            "dense",
            "sparsemax",
            "topk",
            "random",
            "window-sqrt",
            "window-fixed",
            "linear",
            "rf",
            "rf-relu",
        ]
    )
    mask_probabilities: list[float] = field(default_factory=lambda: [0.1, 0.5, 0.9])
    topk_fraction: float = 0.2
    fixed_window: int = 16
    batch: int = 4
    layer_heads: int = 4
    repeats: int = 5
    warmup: int = 1
    threads: int = 1
    max_seconds: float = 10.0
    max_bytes: float = 6e9
    measure_memory: bool = True
    seed: int = 0


PRESETS = {
    "tiny": Config(
        sizes=[32, 64],
        dims=[16],
        modes=["association", "layer"],
        models=[
            "dense",
            "sparsemax",
            "topk",
            "random",
            "window-sqrt",
            "window-fixed",
            "linear",
            "rf",
            "rf-relu",
        ],
        mask_probabilities=[0.5],
        fixed_window=8,
        repeats=1,
        warmup=1,
        max_seconds=2.0,
    ),
    "small": Config(
        sizes=[256, 512, 1024, 2048, 4096, 8192, 16384],
        dims=[16, 64],
        modes=["association", "layer"],
        mask_probabilities=[0.1, 0.5, 0.9],
        repeats=3,
        warmup=1,
        max_seconds=3.0,
    ),
    "paper": Config(
        sizes=[*PAPER_SIZES, 5760, 11520, 23040],
        dims=[16, 64],
        modes=["association", "layer"],
        models=[
            "dense",
            "sparsemax",
            "topk",
            "random",
            "window-paper",
            "window-sqrt",
            "window-fixed",
            "linear",
            "rf",
            "rf-relu",
        ],
        mask_probabilities=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
        repeats=10,
        warmup=2,
        max_seconds=30.0,
    ),
}


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------


def model_names(config: Config) -> list[str]:
    """The configured models with ``random`` and ``window-fixed`` made concrete."""
    names: list[str] = []
    for name in config.models:
        if name == "random":
            names.extend(f"random-{p:g}" for p in config.mask_probabilities)
        elif name == "window-fixed":
            names.append(f"window-{config.fixed_window}")
        else:
            names.append(name)
    return names


def window_size(name: str, length: int) -> int:
    """The one-sided window of a ``window-*`` model at memory size ``length``."""
    kind = name.split("-", 1)[1]
    if kind == "sqrt":
        return max(1, math.isqrt(length))
    if kind == "paper":
        return PAPER_WINDOWS.get(length, max(1, math.isqrt(length)))
    return int(kind)


def make_model(name: str, length: int, config: Config) -> tuple[Separation, Structure]:
    """Separation and structure of model ``name`` at memory size ``length``."""
    if name == "dense":
        return Softmax(), Dense()
    if name == "sparsemax":
        return Sparsemax(), Dense()
    if name == "topk":
        return Softmax(), TopK(fraction=config.topk_fraction)
    if name.startswith("random-"):
        p = float(name.split("-", 1)[1])
        if not 0.0 <= p < 1.0:
            raise ValueError(f"mask probability must lie in [0, 1), got {p}")
        return Softmax(), RandomMask(fraction=1.0 - p, seed=config.seed).eval()
    if name.startswith("window-"):
        return Softmax(), Window(window_size(name, length))
    if name == "linear":
        return Softmax(), Linear()
    if name == "rf":
        return Softmax(), RandomFeatures(seed=config.seed)
    if name == "rf-relu":
        return Softmax(), RandomFeatures(kernel="relu", seed=config.seed)
    raise ValueError(f"unknown model {name!r}")


def family(name: str) -> str:
    """``random-0.5`` -> ``random``, ``window-16`` -> ``window``, ``rf-relu`` -> ``rf``."""
    return name.split("-", 1)[0]


def matrix_product_flops(
    name: str, batch: int, heads: int, length: int, dim: int, config: Config
) -> float:
    """The matrix products of :func:`analytic_flops` alone (multiply-add = 2), what fvcore,
    which the nonparametric paper's Figure 7 used, counts: scores and weighted sums ``4·L·n·d``
    for ``n`` memories per query (Top-K: the full score matrix ``2·L·S·d``, then ``2·L·K·d``),
    linear ``φ(K)ᵀV`` and ``φ(Q)·state`` ``4·L·d·d``, random features their projections
    ``4·L·m·d`` and the linear terms with ``m`` in place of ``d``; no separation, sort,
    selection or feature-map element-wise work."""
    n_all = length
    if name in ("dense", "sparsemax"):
        per_head = 4 * length * n_all * dim
    elif name == "topk":
        kept = max(1, int(config.topk_fraction * n_all))
        per_head = 2 * length * n_all * dim + 2 * length * kept * dim
    elif name.startswith("random-"):
        kept = max(1, int((1 - float(name.split("-", 1)[1])) * n_all))
        per_head = 4 * length * kept * dim
    elif name.startswith("window-"):
        per_head = 4 * length * min(2 * window_size(name, length) + 1, n_all) * dim
    elif name == "linear":
        per_head = 4 * length * dim * dim
    elif name in ("rf", "rf-relu"):
        per_head = 8 * length * RandomFeatures().features_for(dim) * dim
    else:
        raise ValueError(f"unknown model {name!r}")
    return float(batch * heads * per_head)


def analytic_flops(
    name: str, batch: int, heads: int, length: int, dim: int, config: Config
) -> float:
    """FLOPs of one association (multiply-add = 2), ``heads`` heads of size ``dim``, ``L = S``.

    Scores ``2·L·n·d`` and weighted sums ``2·L·n·d`` for ``n`` memories per query, plus the
    separation (softmax ``3·L·n``; sparsemax ``L·n·(log2 n + 4)`` for its sort); Top-K adds a
    selection of ``L·S·log2 K``; the window counts its ideal band ``n = 2w + 1``. Linear:
    ``φ`` on ``2·L·d`` entries, ``φ(K)ᵀV`` and ``φ(Q)·state`` ``2·2·L·d·d``, normaliser
    ``4·L·d``. Random features (``m`` features): projections ``2·2·L·m·d``, ``exp`` ``4·L·m``,
    then the linear terms with ``m`` in place of ``d``.
    """
    n_all = length
    if name in ("dense", "sparsemax"):
        sep = 3 * length * n_all if name == "dense" else length * n_all * (math.log2(n_all) + 4)
        per_head = 4 * length * n_all * dim + sep
    elif name == "topk":
        kept = max(1, int(config.topk_fraction * n_all))
        per_head = 2 * length * n_all * dim + length * n_all * math.log2(max(kept, 2))
        per_head += 2 * length * kept * dim + 3 * length * kept
    elif name.startswith("random-"):
        kept = max(1, int((1 - float(name.split("-", 1)[1])) * n_all))
        per_head = 4 * length * kept * dim + 3 * length * kept
    elif name.startswith("window-"):
        band = min(2 * window_size(name, length) + 1, n_all)
        per_head = 4 * length * band * dim + 3 * length * band
    elif name == "linear":
        per_head = 2 * length * dim + 4 * length * dim * dim + 4 * length * dim
    elif name in ("rf", "rf-relu"):
        m = RandomFeatures().features_for(dim)
        per_head = 4 * length * m * dim + 4 * length * m + 4 * length * m * dim + 4 * length * m
    else:
        raise ValueError(f"unknown model {name!r}")
    return float(batch * heads * per_head)


def layer_flops(
    name: str,
    batch: int,
    length: int,
    dim: int,
    heads: int,
    config: Config,
    count: Callable[..., float] = analytic_flops,
) -> float:
    """FLOPs of the Hopfield layer: four ``d × d`` projections plus the association per head,
    counted by ``count`` (:func:`analytic_flops` or :func:`matrix_product_flops`)."""
    projections = 4 * 2 * batch * length * dim * dim
    return projections + count(name, batch, heads, length, dim // heads, config)


# ------------------------------------------------------------------------------------------------
# Measurements
# ------------------------------------------------------------------------------------------------


def forward_function(
    mode: str, name: str, length: int, dim: int, config: Config, generator: torch.Generator
) -> Callable[[], Tensor]:
    """A no-grad forward pass of model ``name`` on a fresh random batch ``(B, L, d)``."""
    separation, structure = make_model(name, length, config)
    x = torch.randn(config.batch, length, dim, generator=generator)
    if mode == "association":
        patterns = x.unsqueeze(1)

        def association() -> Tensor:
            with torch.no_grad():
                out = associate(
                    patterns, patterns, patterns, separation=separation, structure=structure
                )
            assert isinstance(out, Tensor)
            return out

        return association
    if mode == "layer":
        if dim % config.layer_heads:
            raise ConfigError(f"dims must be divisible by layer_heads={config.layer_heads}")
        layer: nn.Module = Hopfield(
            dim, num_heads=config.layer_heads, separation=separation, structure=structure
        ).eval()

        def full_layer() -> Tensor:
            with torch.no_grad():
                out = layer(x)
            assert isinstance(out, Tensor)
            return out

        return full_layer
    raise ValueError(f"mode must be 'association' or 'layer', got {mode!r}")


def _key(mode: str, dim: int, name: str, length: int) -> str:
    return f"{mode}|{dim}|{name}|{length}"


def measure(config: Config, ctx: RunContext) -> dict[str, dict[str, Any]]:
    """All points ``{key: {"seconds", "cpu_seconds", "peak_bytes", "flops", "skipped"}}`` (wall
    and CPU medians), resumed from and saved
    to ``measurements.json`` in ``ctx.out_dir`` after every point."""
    saved = ctx.load_json("measurements.json") or {}
    points: dict[str, dict[str, Any]] = (
        saved.get("points", {}) if saved.get("config") == asdict(config) else {}
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    names = model_names(config)
    cases = [(m, d, n) for m in config.modes for d in config.dims for n in names]
    try:
        for mode, dim, name in ctx.track(cases, total=len(cases), desc="efficiency"):
            previous: tuple[int, float, float] | None = None
            for length in sorted(config.sizes):
                key = _key(mode, dim, name, length)
                if key in points:
                    point = points[key]
                else:
                    point = _measure_point(mode, name, length, dim, config, previous)
                    points[key] = point
                    ctx.save_json("measurements.json", {"config": asdict(config), "points": points})
                if point["seconds"] is not None:
                    # The guard uses CPU time: on a shared machine wall time overstates the work.
                    spent = point.get("cpu_seconds", point["seconds"])
                    previous = (length, spent, point["peak_bytes"] or 0.0)
    finally:
        torch.set_num_threads(threads)
    return points


def _measure_point(
    mode: str,
    name: str,
    length: int,
    dim: int,
    config: Config,
    previous: tuple[int, float, float] | None,
) -> dict[str, Any]:
    heads = 1 if mode == "association" else config.layer_heads

    def flops(count: Callable[..., float]) -> float:
        if mode == "association":
            return count(name, config.batch, 1, length, dim, config)
        return layer_flops(name, config.batch, length, dim, heads, config, count)

    point: dict[str, Any] = {
        "seconds": None,
        "peak_bytes": None,
        "flops": flops(analytic_flops),
        "matrix_flops": flops(matrix_product_flops),
        "skipped": "",
    }
    if previous is not None:
        last_length, last_seconds, last_bytes = previous
        growth = (length / last_length) ** (2 if family(name) in QUADRATIC else 1.5)
        if last_seconds * growth > config.max_seconds:
            point["skipped"] = f"predicted {last_seconds * growth:.1f} CPU s > max_seconds"
            return point
        if last_bytes * growth > config.max_bytes:
            point["skipped"] = f"predicted {last_bytes * growth / 2**30:.1f} GiB > max_bytes"
            return point
    generator = torch.Generator().manual_seed(config.seed + length)
    forward = forward_function(mode, name, length, dim, config, generator)
    wall, cpu = timings(forward, config.repeats, config.warmup)
    point["seconds"] = statistics.median(wall)
    point["cpu_seconds"] = statistics.median(cpu)
    point["cpu_samples"] = cpu  # the repeats: the replicates the claims ledger tests on
    if config.measure_memory:
        point["peak_bytes"] = peak_bytes(forward)
    return point


# ------------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------------


def _upper_slope(measured: list[tuple[int, float]]) -> float | None:
    """Slope over the larger half of the measured sizes (all of them below four points)."""
    upper = measured[len(measured) // 2 :] if len(measured) >= 4 else measured
    return fit_slope([n for n, _ in upper], [s for _, s in upper])


def _series(row: list[dict[str, Any]], sizes: list[int], field: str) -> list[tuple[int, float]]:
    return [(n, p[field]) for n, p in zip(sizes, row, strict=True) if p.get(field) is not None]


def _speedup(
    own: list[tuple[int, float]], dense: list[tuple[int, float]]
) -> tuple[int | None, float | None]:
    """Dense time over own time at the largest size both were measured."""
    dense_at = dict(dense)
    both = [(n, dense_at[n] / t) for n, t in own if n in dense_at and t > 0]
    return both[-1] if both else (None, None)


def summarise(config: Config, points: dict[str, dict[str, Any]]) -> Results:
    """Tables (slopes, wall and CPU time, memory, FLOPs), metrics and notes from the points."""
    names = model_names(config)
    sizes = sorted(config.sizes)
    size_cols = [f"L={n}" for n in sizes]
    slope_rows: list[list[Any]] = []
    rows: dict[str, list[list[Any]]] = {
        "seconds": [],
        "cpu_seconds": [],
        "peak_bytes": [],
        "flops": [],
        "matrix_flops": [],
    }
    scale = {
        "seconds": 1e3,
        "cpu_seconds": 1e3,
        "peak_bytes": 2.0**-20,
        "flops": 1.0,
        "matrix_flops": 1.0,
    }
    metrics: dict[str, float] = {}
    for mode in config.modes:
        for dim in config.dims:
            dense_row = [points.get(_key(mode, dim, "dense", n), {}) for n in sizes]
            for name in names:
                row = [points.get(_key(mode, dim, name, n), {}) for n in sizes]
                label = [mode, dim, name]
                for field_name, table_rows in rows.items():
                    table_rows.append(
                        label
                        + [
                            None if p.get(field_name) is None else p[field_name] * scale[field_name]
                            for p in row
                        ]
                    )
                wall, cpu = _series(row, sizes, "seconds"), _series(row, sizes, "cpu_seconds")
                slopes = [
                    fit_slope([n for n, _ in wall], [t for _, t in wall]),
                    _upper_slope(wall),
                    fit_slope([n for n, _ in cpu], [t for _, t in cpu]),
                    _upper_slope(cpu),
                ]
                at_wall, speed_wall = _speedup(wall, _series(dense_row, sizes, "seconds"))
                _, speed_cpu = _speedup(cpu, _series(dense_row, sizes, "cpu_seconds"))
                largest = wall[-1][0] if wall else None
                slope_rows.append(
                    [
                        *label,
                        *slopes,
                        largest,
                        at_wall,
                        speed_wall,
                        speed_cpu,
                        PAPER_CLAIMS[family(name)],
                    ]
                )
                tag = f"{mode}_d{dim}_{name}"
                for key, value in (
                    (f"slope_wall_{tag}", slopes[1]),
                    (f"slope_cpu_{tag}", slopes[3]),
                    (f"speedup_vs_dense_wall_{tag}", speed_wall),
                    (f"speedup_vs_dense_cpu_{tag}", speed_cpu),
                ):
                    if value is not None:
                        metrics[key] = value
    head = ["mode", "d", "model"]
    timing = (
        f"batch {config.batch}, torch.set_num_threads({config.threads}), median of "
        f"{config.repeats} no-grad passes after {config.warmup} warm-up; – = skipped"
    )
    tables = [
        Table(
            "Slopes and speed-ups",
            [
                *head,
                "slope wall (all)",
                "slope wall (upper half)",
                "slope CPU (all)",
                "slope CPU (upper half)",
                "largest L",
                "L for speed-up",
                "dense / model (wall)",
                "dense / model (CPU)",
                "paper (Figs. 6-7)",
            ],
            slope_rows,
            caption="Least-squares log-log slopes of forward time vs memory size, from wall time "
            "and from process CPU time (which leaves out waiting for a core on a shared "
            "machine); the upper half is the larger half of the measured sizes (all of them "
            "below four); speed-ups over dense at the largest size both were measured.",
        ),
        Table(
            "Forward wall time (ms, median)",
            head + size_cols,
            rows["seconds"],
            caption=timing + ".",
        ),
        Table(
            "Forward CPU time (ms, median)",
            head + size_cols,
            rows["cpu_seconds"],
            caption=timing + "; process CPU time.",
        ),
        Table(
            "Peak memory (MiB)",
            head + size_cols,
            rows["peak_bytes"],
            caption="Largest live allocations during one forward pass (inputs excluded).",
        ),
        Table(
            "Analytic FLOPs",
            head + size_cols,
            rows["flops"],
            caption="Algorithmic counts (see analytic_flops); dense and sparsemax differ only "
            "in the separation, linear and RF only in the feature map.",
        ),
        Table(
            "Matrix-product FLOPs",
            head + size_cols,
            rows["matrix_flops"],
            caption="The matrix products alone (see matrix_product_flops), what fvcore counts "
            "and the paper's Figure 7 shows; the claims ledger judges the figure on these.",
        ),
    ]
    skipped = [f"{k}: {p['skipped']}" for k, p in points.items() if p.get("skipped")]
    notes = [
        f"torch {torch.__version__}, torch.set_num_threads({config.threads}). Wall times on a "
        "CPU shared with other jobs are inflated and noisy for long passes; CPU times are not.",
        ("Skipped points: " + "; ".join(skipped)) if skipped else "No point was skipped.",
    ]
    return Results(tables=tables, metrics=metrics, notes=notes)


def _draw(
    ax: Any, series: dict[str, tuple[list[int], list[float]]], title: str, ylabel: str
) -> None:
    from matplotlib import colormaps
    from matplotlib.ticker import NullFormatter

    ax.set_prop_cycle(color=[colormaps["tab20"](i / 19) for i in range(20)])  # 20 distinct lines
    for name, (xs, ys) in series.items():
        slope = fit_slope(xs, ys)
        label = f"{name} ({slope:.2f})" if slope is not None else name
        ax.loglog(xs, ys, marker="o", markersize=3, label=label)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("memory size L")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=6)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_minor_formatter(NullFormatter())  # keep only the decade labels


def plot(config: Config, points: dict[str, dict[str, Any]], ctx: RunContext) -> list[str]:
    """Figure 6 (CPU time; random mask apart) and Figure 7 (FLOPs; peak memory) as PNG files.

    Legends give the fitted log-log slope of each line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = model_names(config)
    sizes = sorted(config.sizes)
    panels = [(m, d) for m in config.modes for d in config.dims]

    def series(mode: str, dim: int, quantity: str, chosen: list[str]) -> dict:
        out = {}
        for name in chosen:
            xs = [n for n in sizes if points.get(_key(mode, dim, name, n), {}).get(quantity)]
            if xs:
                out[name] = (xs, [points[_key(mode, dim, name, n)][quantity] for n in xs])
        return out

    plain = [n for n in names if family(n) != "random"]
    random = [n for n in names if family(n) == "random"] + (["dense"] if "dense" in names else [])
    figures = (
        (
            "efficiency_time.png",
            [
                ("cpu_seconds", "forward CPU time (s)", plain),
                ("cpu_seconds", "forward CPU time (s), random mask", random),
            ],
        ),
        (
            "efficiency_flops_memory.png",
            [("flops", "analytic FLOPs", names), ("peak_bytes", "peak memory (bytes)", names)],
        ),
    )
    for filename, rows in figures:
        fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 7.5), squeeze=False)
        for column, (mode, dim) in enumerate(panels):
            for row, (quantity, label, chosen) in enumerate(rows):
                _draw(
                    axes[row][column],
                    series(mode, dim, quantity, chosen),
                    f"{mode}, d={dim}",
                    label,
                )
        fig.tight_layout()
        ctx.save_figure(fig, filename, dpi=90)
    return [filename for filename, _ in figures]


#: Modes of :func:`forward_function`.
MODES = ("association", "layer")

#: Model names of ``Config.models`` besides ``window-<w>`` (a fixed one-sided window ``w``) and
#: ``random-<p>`` (one mask probability ``p``).
MODEL_NAMES = (
    "dense",
    "sparsemax",
    "topk",
    "random",
    "window-sqrt",
    "window-paper",
    "window-fixed",
    "linear",
    "rf",
    "rf-relu",
)


def check_config(config: Config) -> None:
    """:class:`ConfigError` naming the first field ``config`` cannot run with."""
    check_int_items("sizes", config.sizes, minimum=2)
    check_int_items("dims", config.dims)
    check_subset("modes", config.modes, MODES)
    known = f"choose from {', '.join(MODEL_NAMES)}, window-<w> (w >= 1) or random-<p> (0 <= p < 1)"
    if not config.models:
        raise ConfigError(f"models must name at least one model; {known}")
    if "random" in config.models:
        check_real_items("mask_probabilities", config.mask_probabilities, low=0.0, high=1.0,
                         high_open=True)  # fmt: skip
    check_reals(config, "topk_fraction", low=0.0, high=1.0, low_open=True)
    check_ints(config, "fixed_window", "batch", "layer_heads", "repeats", "threads")
    check_ints(config, "warmup", minimum=0)
    check_reals(config, "max_seconds", "max_bytes", low=0.0, low_open=True)
    if "layer" in config.modes:
        uneven = [d for d in config.dims if d % config.layer_heads]
        if uneven:
            raise ConfigError(
                f"dims {uneven} must be divisible by layer_heads={config.layer_heads} (mode "
                "'layer')"
            )
    for name in model_names(config):
        window = name.startswith("window-") and name not in MODEL_NAMES
        try:
            if window and window_size(name, max(config.sizes)) < 1:
                raise ValueError(f"window {name!r} is below 1")
            make_model(name, max(config.sizes), config)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"models: {name!r} is not a model ({error}); {known}") from None


def run(config: Config, ctx: RunContext) -> Results:
    """Measure every point (resuming), then tabulate and plot."""
    check_config(config)
    points = measure(config, ctx)
    results = summarise(config, points)
    results.figures = plot(config, points, ctx)
    return results


register(
    Experiment(
        name="efficiency",
        summary="forward time, peak memory and FLOPs vs memory size for dense, sparsemax, top-K, "
        "random-mask, window, linear and random-feature Hopfield models",
        presets=PRESETS,
        run=run,
        check=check_config,
        paper="Nonparametric Hopfield (Hu et al., ICML 2025) Figs. 6-7 (App. G.5)",
        single_process=True,
    )
)

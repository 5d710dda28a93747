"""``retrieval-demo``: store scikit-learn digits in a static Hopfield memory and retrieve them.

The quick start's experiment: what an associative memory does, in seconds.

**Patterns.** ``num_memories`` distinct 8 × 8 digits, centred (the average digit subtracted) and
scaled to norm ``√64 = 8`` (mean square 1 per pixel), so no digit wins a retrieval by having
more ink, and scores ``β ξᵀ x`` compare shapes only.

**Queries.** Each stored digit with its lower half unknown (set to the average digit: 0 after
centring), and each with Gaussian noise of standard deviation ``noise_std`` per pixel added.

**Retrieval.** :func:`hopfield.memory.retrieve`, the update ``x ← Ξᵀ sep(β Ξ x)`` with Softmax,
Softmax_1 and Sparsemax, after 1 and after 3 steps, for every β of a sweep from the regime
where every query ends at the same blend of all digits (small β), through metastable blends of a
few similar digits, to the regime where each query lands on one stored digit (large β). A query
is retrieved when the result is nearer its own digit than any other and within ``tolerance``
relative error of it.

**Outputs.** Success rate vs β per map and step count (half-masked and noisy queries), the mean
number of digits the result still mixes (the participation ratio ``(Σp)² / Σp²`` of its
weights ``p = sep(β Ξ x)``: 1 for a single digit, ``num_memories`` for a uniform blend), and a
figure: queries, what a small and a large β retrieve from them, the targets, and the curves.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from hopfield.experiments.registry import ConfigError, Experiment, register
from hopfield.experiments.results import Results, RunContext, Table, with_threads
from hopfield.functional import Separation, Softmax, SoftmaxN, Sparsemax
from hopfield.memory import retrieve

SEPARATIONS: dict[str, Callable[[], Separation]] = {
    "softmax": Softmax,
    "softmax1": lambda: SoftmaxN(1.0),
    "sparsemax": Sparsemax,
}
LABELS = {"softmax": "Softmax", "softmax1": "Softmax_1", "sparsemax": "Sparsemax"}
QUERIES = ("half-masked", "noisy")
SIDE = 8  # the digits are 8 x 8


@dataclass
class Config:
    """Settings of the retrieval demo.

    Attributes:
        num_memories: stored digits (at most the 1797 of scikit-learn's set).
        betas: the β sweep (positive, increasing).
        steps: numbers of update steps to report (positive).
        noise_std: standard deviation of the noise per pixel (the patterns have mean square 1).
        tolerance: largest relative error of a retrieval that counts.
        separations: maps to compare (``softmax``, ``softmax1``, ``sparsemax``).
        grid_betas: the small and the large β of the figure's rows (from ``betas``).
        grid_examples: digits shown in the figure.
        threads: ``torch.set_num_threads`` during the run (the matrices are a few hundred
            rows: one thread is the fastest, and many are slow on a busy machine); 0 leaves it.
    """

    num_memories: int = 200
    betas: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
    steps: tuple[int, ...] = (1, 3)
    noise_std: float = 1.0
    tolerance: float = 0.2
    separations: tuple[str, ...] = ("softmax", "softmax1", "sparsemax")
    grid_betas: tuple[float, ...] = (0.2, 5.0)
    grid_examples: int = 10
    threads: int = 1
    seed: int = 0
    figure: bool = True


PRESETS = {
    "tiny": Config(num_memories=20, betas=(0.1, 1.0), grid_betas=(0.1, 1.0), grid_examples=4),
    "small": Config(),
    "paper": Config(
        num_memories=1797,
        betas=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0),
        steps=(1, 3, 10),
    ),
}


def check_config(config: Config) -> None:
    """:class:`ConfigError` naming the first field ``config`` cannot run with."""
    if not 1 <= config.num_memories <= 1797:
        raise ConfigError(f"num_memories must lie in [1, 1797], got {config.num_memories}")
    if not config.betas or not all(math.isfinite(b) and b > 0 for b in config.betas):
        raise ConfigError(f"betas must be positive finite numbers, got {config.betas}")
    if list(config.betas) != sorted(set(config.betas)):
        raise ConfigError(f"betas must increase, got {config.betas}")
    if not config.steps or any(s < 1 for s in config.steps):
        raise ConfigError(f"steps must be positive, got {config.steps}")
    unknown = [s for s in config.separations if s not in SEPARATIONS]
    if unknown or not config.separations:
        raise ConfigError(
            f"separations must be a non-empty subset of {sorted(SEPARATIONS)}, got "
            f"{config.separations}"
        )
    if not set(config.grid_betas) <= set(config.betas) or not config.grid_betas:
        raise ConfigError(f"grid_betas must be taken from betas, got {config.grid_betas}")
    if not 1 <= config.grid_examples <= config.num_memories:
        raise ConfigError(
            f"grid_examples must lie in [1, num_memories], got {config.grid_examples}"
        )
    if not (config.noise_std >= 0 and config.tolerance > 0 and config.threads >= 0):
        raise ConfigError("noise_std must be >= 0, tolerance > 0 and threads >= 0")


def make_separation(name: str) -> Separation:
    """The separation called ``name`` (``softmax``, ``softmax1``, ``sparsemax``)."""
    if name not in SEPARATIONS:
        raise ValueError(f"separation must be one of {sorted(SEPARATIONS)}, got {name!r}")
    return SEPARATIONS[name]()


def digit_patterns(count: int, generator: torch.Generator) -> Tensor:
    """``count`` distinct scikit-learn digits as pixels in [-1, 1], shape ``(count, 64)``."""
    from sklearn.datasets import load_digits

    images = torch.as_tensor(load_digits().data, dtype=torch.float64)
    if not 1 <= count <= images.shape[0]:
        raise ValueError(f"num_memories must lie in [1, {images.shape[0]}], got {count}")
    chosen = torch.randperm(images.shape[0], generator=generator)[:count]
    return images[chosen] / 8.0 - 1.0


def centre_and_scale(pixels: Tensor) -> tuple[Tensor, Tensor, float]:
    """``(patterns, mean, spread)``: ``pixels - mean`` scaled to norm ``√d`` per row (rows equal
    to the mean stay 0), the mean digit, and the mean root-mean-square pixel deviation from it,
    which maps patterns back to pixels for display (``mean + spread · pattern``)."""
    mean = pixels.mean(dim=0)
    centred = pixels - mean
    rms = centred.norm(dim=1, keepdim=True) / math.sqrt(pixels.shape[1])
    patterns = centred / rms.clamp_min(torch.finfo(pixels.dtype).tiny)
    return patterns, mean, rms.mean().item()


def make_queries(
    memories: Tensor, noise_std: float, generator: torch.Generator
) -> dict[str, Tensor]:
    """Half-masked (lower half set to the average digit, 0 after centring) and noisy versions
    of the memories."""
    masked = memories.clone().view(-1, SIDE, SIDE)
    masked[:, SIDE // 2 :, :] = 0.0
    noise = torch.randn(memories.shape, generator=generator, dtype=memories.dtype) * noise_std
    return {"half-masked": masked.view(-1, SIDE * SIDE), "noisy": memories + noise}


def success(retrieved: Tensor, memories: Tensor, tolerance: float) -> Tensor:
    """Per query ``i``: memory ``i`` is the nearest and the relative error ``<= tolerance``."""
    distances = torch.cdist(retrieved, memories)
    own = torch.arange(memories.shape[0])
    nearest = distances.argmin(dim=1) == own
    relative = distances[own, own] / memories.norm(dim=1)
    return nearest & (relative <= tolerance)


def mixed_patterns(state: Tensor, memories: Tensor, separation: Separation, beta: float) -> Tensor:
    """Per state: how many memories its weights ``p = sep(β Ξ x)`` mix, ``(Σp)² / Σp²``."""
    weights = separation(beta * state @ memories.T)
    return weights.sum(dim=1) ** 2 / (weights**2).sum(dim=1)


def sweep(
    memories: Tensor, queries: Tensor, separation: Separation, beta: float, steps: tuple[int, ...]
) -> dict[int, Tensor]:
    """``{s: the queries after s update steps}`` for every ``s`` of ``steps`` (the later counts
    continue from the earlier results)."""
    out: dict[int, Tensor] = {}
    state, done = queries, 0
    for count in sorted(steps):
        state = retrieve(state, memories, separation, beta=beta, steps=count - done).patterns
        out[count], done = state, count
    return out


def run(config: Config, ctx: RunContext) -> Results:
    check_config(config)
    return with_threads(config.threads, lambda: _run(config, ctx))


def _run(config: Config, ctx: RunContext) -> Results:
    generator = torch.Generator().manual_seed(config.seed)
    pixels = digit_patterns(config.num_memories, generator)
    memories, mean, spread = centre_and_scale(pixels)
    queries = make_queries(memories, config.noise_std, generator)
    steps = tuple(sorted(set(config.steps)))
    rate: dict[tuple[str, str, int, float], float] = {}
    mixed: dict[tuple[str, str, int, float], float] = {}
    shown: dict[float, tuple[Tensor, Tensor]] = {}
    gamma = math.inf
    grid_map = "softmax" if "softmax" in config.separations else config.separations[0]
    cases = [(k, n, b) for k in QUERIES for n in config.separations for b in config.betas]
    for kind, name, beta in ctx.track(cases, total=len(cases), desc="retrieval-demo"):
        separation = make_separation(name)
        for count, out in sweep(memories, queries[kind], separation, beta, steps).items():
            ok = success(out, memories, config.tolerance)
            rate[kind, name, count, beta] = ok.sum().item() / ok.numel()
            mixed[kind, name, count, beta] = (
                mixed_patterns(out, memories, separation, beta).mean().item()
            )
            if name == "softmax1":
                gamma = min(gamma, separation(beta * out @ memories.T).sum(dim=1).min().item())
            if (kind, name, count) == (
                "half-masked",
                grid_map,
                steps[-1],
            ) and beta in config.grid_betas:
                shown[beta] = (out[: config.grid_examples], ok[: config.grid_examples])
    beta_columns = [f"β={b:g}" for b in config.betas]

    def table(title: str, values: dict[tuple[str, str, int, float], float], kind: str) -> Table:
        rows: list[list[object]] = [
            [LABELS[n], s, *(values[kind, n, s, b] for b in config.betas)]
            for n in config.separations
            for s in steps
        ]
        return Table(title, ["map", "steps", *beta_columns], rows, caption=_caption(config, kind))

    tables = [
        table("Half-masked digits: success rate vs beta", rate, "half-masked"),
        table("Noisy digits: success rate vs beta", rate, "noisy"),
        table("Half-masked digits: stored digits mixed vs beta", mixed, "half-masked"),
    ]
    metrics = {
        f"best success/{kind}/{name}": max(
            rate[kind, name, s, b] for s in steps for b in config.betas
        )
        for kind in QUERIES
        for name in config.separations
    }
    own = torch.arange(config.num_memories)
    for kind in QUERIES:  # what β → ∞ returns: the digit of the highest score
        top = (queries[kind] @ memories.T).argmax(dim=1) == own
        metrics[f"highest score is the own digit/{kind}"] = top.sum().item() / top.numel()
    notes = [
        "Patterns: digits centred by the average digit and scaled to norm 8 (mean square 1 per "
        "pixel); the unknown lower half of a half-masked query is the average digit (0).",
        "Small β: every query ends at one blend of all stored digits (the average digit); "
        "β in between: metastable blends of a few similar digits; large β: one stored digit, "
        "the one of the highest score (its own in the fraction 'highest score is the own "
        "digit', the ceiling of large β). "
        "The 'mixed' table counts the digits a result blends, (Σp)²/Σp² of its weights.",
    ]
    if "softmax1" in config.separations:
        metrics["softmax1 smallest weight sum"] = gamma
        notes.append(
            f"Softmax_1 = γ(x) · softmax with γ = Σexp/(1 + Σexp) ≥ {gamma:.4f} here: with "
            f"{config.num_memories} stored digits the extra 1 hardly matters, so its numbers "
            "equal softmax's (it differs where no memory matches, its outlier use)."
        )
    figures = []
    if config.figure and ctx.is_main_process:
        n = config.grid_examples
        small, large = min(config.grid_betas), max(config.grid_betas)
        draw_figure(
            str(ctx.path(FIGURE)),
            config,
            rows={
                "query\n(lower half\nunknown)": (queries["half-masked"][:n], None),
                f"β = {small:g}": shown[small],
                f"β = {large:g}": shown[large],
                "target": (memories[:n], None),
            },
            pixels=(mean, spread),
            rate=rate,
            mixed=mixed,
            steps=steps,
            grid_map=grid_map,
        )
        figures.append(FIGURE)
    return Results(tables=tables, metrics=metrics, figures=figures, notes=notes)


FIGURE = "retrieval_demo.png"


def _caption(config: Config, kind: str) -> str:
    query = (
        "lower half unknown"
        if kind == "half-masked"
        else f"Gaussian noise of std {config.noise_std:g} per pixel"
    )
    return (
        f"{config.num_memories} digits stored (centred, norm 8); queries: the stored digits with "
        f"{query}; retrieved = nearest to its own digit and relative error <= "
        f"{config.tolerance:g}."
    )


def draw_figure(
    path: str,
    config: Config,
    *,
    rows: dict[str, tuple[Tensor, Tensor | None]],
    pixels: tuple[Tensor, float],
    rate: dict[tuple[str, str, int, float], float],
    mixed: dict[tuple[str, str, int, float], float],
    steps: tuple[int, ...],
    grid_map: str,
) -> None:
    """The demo's figure: digits on top (one row per entry of ``rows``, patterns shown in pixels
    as ``mean + spread · pattern`` from ``pixels = (mean, spread)``, a green or red frame where
    ``ok`` says retrieved or not), success vs β for both query kinds and the digits mixed
    below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    cols = next(iter(rows.values()))[0].shape[0]
    fig = plt.figure(figsize=(10.0, 0.95 * len(rows) + 3.6))
    grid = fig.add_gridspec(2, 1, height_ratios=[0.95 * len(rows), 2.6], hspace=0.22, top=0.9)
    top = grid[0].subgridspec(len(rows), cols, wspace=0.08, hspace=0.12)
    mean, spread = pixels
    for r, (name, (patterns, ok)) in enumerate(rows.items()):
        for c in range(cols):
            ax = fig.add_subplot(top[r, c])
            image = (mean + spread * patterns[c]).view(SIDE, SIDE)
            ax.imshow(image.clamp(-1, 1).numpy(), cmap="gray_r", vmin=-1, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if ok is not None:
                colour = "tab:green" if bool(ok[c]) else "tab:red"
                for spine in ax.spines.values():
                    spine.set_color(colour)
                    spine.set_linewidth(2.5)
            if c == 0:
                ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=9)
    fig.suptitle(
        f"{config.num_memories} digits stored; {LABELS[grid_map]}, {steps[-1]} steps; "
        "frame green = retrieved, red = not",
        fontsize=10,
        y=0.95,
    )
    bottom = grid[1].subgridspec(1, 3, wspace=0.28)
    styles = {"softmax": ("tab:blue", "o", 6), "softmax1": ("tab:orange", "x", 5)}
    styles["sparsemax"] = ("tab:green", "s", 4)
    panels = [
        ("half-masked", rate, "retrieved, lower half unknown"),
        ("noisy", rate, f"retrieved, noise std {config.noise_std:g} per pixel"),
        ("half-masked", mixed, "digits blended in the result"),
    ]
    for i, (kind, values, title) in enumerate(panels):
        ax = fig.add_subplot(bottom[0, i])
        for name in config.separations:
            colour, marker, size = styles.get(name, ("black", ".", 4))
            for count in steps:
                line = "-" if count == steps[-1] else "--"
                ys = [values[kind, name, count, b] for b in config.betas]
                label = f"{LABELS[name]}, {count} step{'s' if count > 1 else ''}"
                ax.plot(config.betas, ys, line, color=colour, marker=marker, ms=size, label=label)
        ax.set_xscale("log")
        if values is mixed:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_ylim(-0.03, 1.03)
        for beta in config.grid_betas:
            ax.axvline(beta, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("β (dotted: the rows above)", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(("fraction retrieved", "", "stored digits")[i], fontsize=8)
        ax.tick_params(labelsize=8)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels) // 2, fontsize=8,
               bbox_to_anchor=(0.5, -0.01), frameon=False)  # fmt: skip
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


register(
    Experiment(
        name="retrieval-demo",
        summary="store scikit-learn digits in a static Hopfield memory, retrieve from partial/noisy "
        "queries across β",
        presets=PRESETS,
        run=run,
        check=check_config,
        paper="illustration of the retrieval dynamics (OutEffHop §2, nonparametric §2)",
        single_process=True,
    )
)

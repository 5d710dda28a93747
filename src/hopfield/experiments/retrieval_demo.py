"""``retrieval-demo``: store scikit-learn digits in a static Hopfield memory and retrieve them.

Queries are stored digits with their lower half blanked out, or with Gaussian noise added.
Retrieval is one (or more) static update ``x <- Ξ sep(beta Ξᵀ x)`` with Softmax, Softmax_1 and
Sparsemax. A query counts as retrieved when the output is closer to its own stored pattern than
to any other and lies within ``tolerance`` (relative L2 error) of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from hopfield.experiments.registry import Experiment, register
from hopfield.experiments.results import Results, RunContext, Table
from hopfield.functional import Separation, Softmax, SoftmaxN, Sparsemax
from hopfield.nn import Hopfield

SEPARATIONS: dict[str, Callable[[], Separation]] = {
    "softmax": Softmax,
    "softmax1": lambda: SoftmaxN(1.0),
    "sparsemax": Sparsemax,
}


@dataclass
class Config:
    """Settings of the retrieval demo."""

    num_memories: int = 100
    betas: tuple[float, ...] = (0.1, 1.0, 5.0)
    noise_std: float = 0.5
    update_steps: int = 1
    tolerance: float = 0.2
    separations: tuple[str, ...] = ("softmax", "softmax1", "sparsemax")
    grid_examples: int = 6
    seed: int = 0
    figure: bool = True


PRESETS = {
    "tiny": Config(num_memories=20, betas=(1.0,), grid_examples=4),
    "small": Config(num_memories=200, betas=(0.1, 1.0, 5.0)),
    "paper": Config(num_memories=1797, betas=(0.01, 0.1, 1.0, 5.0, 20.0)),
}


def make_separation(name: str) -> Separation:
    """The separation called ``name`` (``softmax``, ``softmax1``, ``sparsemax``)."""
    if name not in SEPARATIONS:
        raise ValueError(f"separation must be one of {sorted(SEPARATIONS)}, got {name!r}")
    return SEPARATIONS[name]()


def digit_patterns(count: int, generator: torch.Generator) -> Tensor:
    """``count`` distinct scikit-learn digits as patterns in [-1, 1]^64, shape ``(count, 64)``."""
    from sklearn.datasets import load_digits

    images = torch.as_tensor(load_digits().data, dtype=torch.float64)
    if not 1 <= count <= images.shape[0]:
        raise ValueError(f"num_memories must lie in [1, {images.shape[0]}], got {count}")
    chosen = torch.randperm(images.shape[0], generator=generator)[:count]
    return images[chosen] / 8.0 - 1.0


def make_queries(
    memories: Tensor, noise_std: float, generator: torch.Generator
) -> dict[str, Tensor]:
    """Half-masked (lower half set to -1, the background) and noisy versions of the memories."""
    masked = memories.clone().view(-1, 8, 8)
    masked[:, 4:, :] = -1.0
    noise = torch.randn(memories.shape, generator=generator, dtype=memories.dtype) * noise_std
    return {"half-masked": masked.view(-1, 64), "noisy": memories + noise}


def retrieve(
    memories: Tensor, queries: Tensor, separation: Separation, beta: float, steps: int
) -> Tensor:
    """Static Hopfield retrieval of ``queries (N, d)`` from ``memories (M, d)``."""
    layer = Hopfield(
        memories.shape[1],
        static=True,
        separation=separation,
        scale=beta,
        update_steps=steps,
        dtype=memories.dtype,
    )
    with torch.no_grad():
        out = layer((memories[None], queries[None], memories[None]))
    return out[0]


def success(retrieved: Tensor, memories: Tensor, tolerance: float) -> Tensor:
    """Per query: nearest stored pattern is its own and relative error ``<= tolerance``."""
    distances = torch.cdist(retrieved, memories)
    own = torch.arange(memories.shape[0])
    nearest = distances.argmin(dim=1) == own
    relative = distances[own, own] / memories.norm(dim=1)
    return nearest & (relative <= tolerance)


def draw_grid(path: str, rows: dict[str, Tensor]) -> None:
    """Save an image grid: one row per entry of ``rows`` (patterns ``(n, 64)`` in [-1, 1])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    cols = rows[names[0]].shape[0]
    fig, axes = plt.subplots(
        len(names), cols, figsize=(1.2 * cols, 1.3 * len(names)), squeeze=False
    )
    for r, name in enumerate(names):
        for c in range(cols):
            ax = axes[r][c]
            ax.imshow(rows[name][c].view(8, 8).clamp(-1, 1).numpy(), cmap="gray_r", vmin=-1, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def run(config: Config, ctx: RunContext) -> Results:
    generator = torch.Generator().manual_seed(config.seed)
    memories = digit_patterns(config.num_memories, generator)
    queries = make_queries(memories, config.noise_std, generator)
    rows: list[list[object]] = []
    metrics: dict[str, float] = {}
    grid_beta = config.betas[len(config.betas) // 2]
    grid: dict[str, Tensor] = {}
    cases = [(k, b, s) for k in queries for b in config.betas for s in config.separations]
    for kind, beta, name in ctx.track(cases, total=len(cases), desc="retrieval-demo"):
        out = retrieve(memories, queries[kind], make_separation(name), beta, config.update_steps)
        ok = success(out, memories, config.tolerance)
        error = ((out - memories).norm(dim=1) / memories.norm(dim=1)).mean().item()
        rows.append([kind, beta, name, ok.float().mean().item(), error])
        best = f"best success/{kind}/{name}"
        metrics[best] = max(metrics.get(best, 0.0), ok.float().mean().item())
        if kind == "half-masked" and beta == grid_beta:
            grid[name] = out[: config.grid_examples]
    table = Table(
        "Retrieval of stored digits",
        ["query", "beta", "separation", "success rate", "mean relative error"],
        rows,
        caption=f"{config.num_memories} digits stored, {config.update_steps} update step(s), "
        f"success = nearest pattern is the target and relative error <= {config.tolerance}.",
    )
    figures = []
    if config.figure and ctx.is_main_process:
        n = config.grid_examples
        draw_grid(
            str(ctx.path("retrieval_grid.png")),
            {"query": queries["half-masked"][:n], **grid, "target": memories[:n]},
        )
        figures.append("retrieval_grid.png")
    return Results(
        tables=[table],
        metrics=metrics,
        figures=figures,
        notes=["One Softmax_1 step is gamma(x) times the softmax step (same direction, shorter)."],
    )


register(
    Experiment(
        name="retrieval-demo",
        summary="store scikit-learn digits in a static Hopfield memory, retrieve from partial/noisy queries",
        presets=PRESETS,
        run=run,
        paper="illustration of the retrieval dynamics (OutEffHop §2, nonparametric §2)",
    )
)

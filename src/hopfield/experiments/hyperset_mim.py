"""``hyperset-mim``: a toy stand-in for Hyper-SET's masked image modelling (§5.3, Table 2).

NOT a reproduction of the paper's numbers: those need ImageNet-100 and the pretrained MaskGIT
VQGAN tokenizer, neither of which is available offline. This runs the same pipeline at toy
scale: a discrete tokenizer made by k-means on image patches (scikit-learn digits, 2×2-pixel
patches → a 4×4 code map), masking ratios drawn from U[0, 0.4] with the mask token, the loss on
masked tokens only, and AdamW (0.9, 0.95), weight decay 0.1, gradient clipping 3.0 (Table 13).
It compares the weight-shared Transformer (MLP 4d), Hyper-SET (M = d, the MIM step-size network
without time MLP, conditioned on X_0) and Hyper-SET with 2× iterations and M = 8d, by masked-token
accuracy and PSNR of one-shot reconstructions at 40 % masking, and draws the toy analogue of
Fig. 8 (``mim_reconstructions.png``): a few test images, their tokenized and masked versions and
each model's one-shot reconstruction.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from hopfield.data import DataNotFoundError
from hopfield.data.images import IMAGE_DATASETS, STAND_IN_SHAPES, load_image_dataset
from hopfield.experiments.checks import check_choice, check_ints, check_reals, check_subset
from hopfield.experiments.hyperset_common import (
    device_of,
    run_identity,
    threads_limited,
    train_model,
    train_or_reuse,
)
from hopfield.experiments.registry import ConfigError, Experiment, register
from hopfield.experiments.results import Results, RunContext, Table
from hopfield.models.hyperset import (
    MaskedTokenModel,
    masked_token_loss,
    masked_token_model,
    patchify,
)
from hopfield.nn.hyperset import count_parameters

# Table 2 (ImageNet-100, 40 % masked): params (M), PSNR, SSIM, MS-SSIM, LPIPS, FID.
PAPER_TABLE2 = {
    "transformer": (8.85, 15.953, 0.417, 0.599, 0.327, 43.428),
    "hyperset": (3.94, 15.713, 0.411, 0.576, 0.358, 59.841),
    "hyperset-2x-8d": (8.07, 15.955, 0.417, 0.596, 0.332, 45.174),
}


@dataclass
class Config:
    """Settings of the toy masked-token-modelling experiment."""

    seed: int = 0
    dataset: str = "digits"  # "imagenet100" (the paper's) is not available offline
    grid: int = 4
    codebook_size: int = 32
    kmeans_iterations: int = 25
    d_model: int = 64
    num_heads: int = 4
    iterations: int = 12
    epochs: int = 30
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.1
    grad_clip: float = 3.0
    max_mask_ratio: float = 0.4
    eval_mask_ratio: float = 0.4
    models: tuple[str, ...] = ("transformer", "hyperset", "hyperset-2x-8d")
    threads: int = 1


PRESETS = {
    "tiny": Config(codebook_size=8, kmeans_iterations=5, d_model=16, num_heads=2, iterations=2,
                   epochs=1, batch_size=256),
    "small": Config(epochs=15),
    "paper": Config(dataset="imagenet100", grid=16, codebook_size=1024, d_model=768,
                    num_heads=12, iterations=12, epochs=300, batch_size=256, lr=1e-4, threads=0),
}  # fmt: skip


def kmeans(points: Tensor, k: int, iterations: int, generator: torch.Generator) -> Tensor:
    """Lloyd's k-means with k-means++ seeding: centroids ``(k, f)`` of points ``(n, f)``."""
    if not 1 <= k <= len(points):
        raise ValueError(f"k must be in 1..{len(points)}, got {k}")
    first = int(torch.randint(len(points), (1,), generator=generator))
    centroids = points[first : first + 1]
    while len(centroids) < k:
        distance = torch.cdist(points, centroids).min(dim=1).values.square()
        if float(distance.sum()) == 0.0:
            pick = int(torch.randint(len(points), (1,), generator=generator))
        else:
            pick = int(torch.multinomial(distance, 1, generator=generator))
        centroids = torch.cat([centroids, points[pick : pick + 1]])
    for _ in range(iterations):
        assign = torch.cdist(points, centroids).argmin(dim=1)
        for j in range(k):
            members = points[assign == j]
            if len(members):
                centroids[j] = members.mean(dim=0)
    return centroids


def tokenize(images: Tensor, centroids: Tensor, grid: int) -> Tensor:
    """Codes ``(B, grid²)``: the nearest centroid of each patch."""
    patches = patchify(images, grid)
    flat = patches.reshape(-1, patches.shape[-1])
    return torch.cdist(flat, centroids).argmin(dim=1).reshape(patches.shape[:2])


def decode(codes: Tensor, centroids: Tensor, grid: int, channels: int, size: int) -> Tensor:
    """Images ``(B, C, H, W)`` from codes (inverse of :func:`~hopfield.models.hyperset.patchify`)."""
    p = size // grid
    patches = centroids[codes].reshape(-1, grid, grid, channels, p, p)
    return patches.permute(0, 3, 1, 4, 2, 5).reshape(-1, channels, size, size)


def random_mask(
    shape: tuple[int, int], max_ratio: float, generator: torch.Generator | None = None
) -> Tensor:
    """Boolean mask ``(B, S)``: per row ``round(r·S)`` random positions, ``r ~ U[0, max_ratio]``
    (randomness from ``generator``, default the global torch RNG)."""
    b, s = shape
    counts = torch.round(torch.rand(b, generator=generator) * max_ratio * s).long()
    ranks = torch.rand(b, s, generator=generator).argsort(dim=1).argsort(dim=1)
    return ranks < counts[:, None]


def fixed_mask(shape: tuple[int, int], ratio: float, generator: torch.Generator) -> Tensor:
    """Boolean mask ``(B, S)`` with exactly ``round(ratio·S)`` random positions per row."""
    b, s = shape
    ranks = torch.rand(b, s, generator=generator).argsort(dim=1).argsort(dim=1)
    return ranks < round(ratio * s)


def psnr(a: Tensor, b: Tensor) -> float:
    """Mean PSNR (dB) of images in [0, 1]."""
    mse = (a - b).square().flatten(1).mean(dim=1).clamp_min(1e-10)
    return float((10 * torch.log10(1.0 / mse)).mean())


def _masked(codes: Tensor, mask_id: int, max_ratio: float, rows: Tensor) -> tuple[Tensor, ...]:
    """The training micro-batch of ``rows``: inputs with random positions replaced by
    ``mask_id`` (:func:`random_mask` from the global RNG), the codes and the mask."""
    target = codes[rows]
    masked = random_mask((target.shape[0], target.shape[1]), max_ratio)
    return torch.where(masked, mask_id, target), target, masked


def _loss(model: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
    inputs, target, masked = batch
    return masked_token_loss(model(inputs), target, masked)


def build(config: Config, name: str) -> MaskedTokenModel:
    """``"transformer"``, ``"hyperset"`` (M = d) or ``"hyperset-2x-8d"`` (2L, M = 8d)."""
    common: dict[str, Any] = {
        "codebook_size": config.codebook_size,
        "grid": config.grid,
        "d_model": config.d_model,
        "num_heads": config.num_heads,
    }
    if name == "transformer":
        return masked_token_model("transformer", iterations=config.iterations, **common)
    if name == "hyperset":
        return masked_token_model("hyperset", iterations=config.iterations, **common)
    if name == "hyperset-2x-8d":
        return masked_token_model(
            "hyperset", iterations=2 * config.iterations, ff_ratio=8.0, **common
        )
    raise ValueError(f"unknown model {name!r}")


def check_config(config: Config) -> None:
    """:class:`ConfigError` naming the first field ``config`` cannot run with."""
    check_choice("dataset", config.dataset, (*IMAGE_DATASETS, "imagenet100"))
    check_subset("models", config.models, tuple(PAPER_TABLE2))
    check_ints(config, "grid", "d_model", "num_heads", "iterations", "epochs", "batch_size")
    check_ints(config, "codebook_size", minimum=2)
    check_ints(config, "kmeans_iterations", "threads", minimum=0)
    check_reals(config, "lr", low=0.0, low_open=True)
    check_reals(config, "weight_decay", "grad_clip", low=0.0)
    check_reals(config, "max_mask_ratio", "eval_mask_ratio", low=0.0, high=1.0)
    if config.d_model % config.num_heads or config.d_model % 2 or config.d_model < 4:
        raise ConfigError(
            f"d_model ({config.d_model}) must be even, >= 4 and divisible by num_heads "
            f"({config.num_heads})"
        )
    if config.dataset in IMAGE_DATASETS:
        _, side, _, counts = STAND_IN_SHAPES[config.dataset]
        if side % config.grid:
            raise ConfigError(
                f"grid ({config.grid}) must divide the {side}-pixel images of {config.dataset}"
            )
        patches = counts["train"] * config.grid**2
        if config.codebook_size > patches:
            raise ConfigError(
                f"codebook_size ({config.codebook_size}) exceeds the {patches} training patches "
                f"of {config.dataset}"
            )


def run(config: Config, ctx: RunContext) -> Results:
    """Tokenize, train each model on masked tokens, evaluate at the fixed masking ratio."""
    check_config(config)
    with threads_limited(config.threads):
        return _run(config, ctx)


#: Training and test images of the stand-in codes (``--stand-in-data``, the paper preset).
STAND_IN_IMAGES = (1024, 8)

#: Config fields that only say which models to train (or how many threads): not part of a run.
LOOPS = ("models", "threads")


#: Test images in the reconstruction figure (the toy analogue of Fig. 8).
FIGURE_IMAGES = 6

#: Grey level of a masked patch in the figure (images are in [0, 1]).
MASK_GREY = 0.5


@dataclass
class _Pixels:
    """The test images ``(n, C, H, W)`` in [0, 1] and the tokenizer's ``centroids`` ``(K, C·p²)``
    on a ``grid × grid`` patch grid, which decode codes back to images."""

    images: Tensor
    centroids: Tensor
    grid: int

    def decode(self, codes: Tensor) -> Tensor:
        """Images ``(B, C, H, W)`` of codes ``(B, grid²)``."""
        _, channels, size, _ = self.images.shape
        return decode(codes, self.centroids, self.grid, channels, size)


@dataclass
class _Tokens:
    """Code sequences ``(n, grid²)`` to train and test on, and the test images they come from
    (``pixels``; ``None`` for stand-in codes)."""

    train: Tensor
    test: Tensor
    pixels: _Pixels | None
    notes: list[str]
    metrics: dict[str, float]


def _scores(tokens: _Tokens, codes: Tensor) -> tuple[float | None, float | None]:
    """PSNR of the test codes ``codes`` ``(n, grid²)`` decoded, vs the images and vs the
    tokenized images (``None`` without images)."""
    if tokens.pixels is None:
        return None, None
    recon = tokens.pixels.decode(codes)
    return psnr(recon, tokens.pixels.images), psnr(recon, tokens.pixels.decode(tokens.test))


def evaluation_mask(config: Config, codes: Tensor) -> Tensor:
    """The fixed test mask ``(n, S)`` of test codes ``(n, S)``: ``round(eval_mask_ratio·S)``
    positions per row from a generator seeded ``seed + 1`` (the global RNG is not used)."""
    generator = torch.Generator().manual_seed(config.seed + 1)
    return fixed_mask((codes.shape[0], codes.shape[1]), config.eval_mask_ratio, generator)


def figure_images(config: Config, count: int) -> Tensor:
    """Sorted indices ``(min(FIGURE_IMAGES, count),)`` of the test images in the figure, from a
    generator of their own (seeded ``seed + 2``), so the global RNG is not used."""
    generator = torch.Generator().manual_seed(config.seed + 2)
    return torch.randperm(count, generator=generator)[:FIGURE_IMAGES].sort().values


def grey_masked(images: Tensor, mask: Tensor, grid: int) -> Tensor:
    """``images`` ``(B, C, H, W)`` with the patches where ``mask`` ``(B, grid²)`` is true set to
    :data:`MASK_GREY` (the masked input of the figure)."""
    p = images.shape[-1] // grid
    pixels = mask.reshape(-1, 1, grid, grid).repeat_interleave(p, 2).repeat_interleave(p, 3)
    return torch.where(pixels, MASK_GREY, images)


def _stand_in_tokens(config: Config, missing: DataNotFoundError) -> _Tokens:
    generator = torch.Generator().manual_seed(config.seed)
    train, test = (
        torch.randint(config.codebook_size, (n, config.grid**2), generator=generator)
        for n in STAND_IN_IMAGES
    )
    note = (
        f"STAND-IN random codes in place of the tokenized images ({missing}); numbers mean nothing."
    )
    return _Tokens(train, test, None, [note], {})


def _tokens(config: Config, ctx: RunContext) -> _Tokens:
    """k-means patch codes of ``config.dataset``'s images (or stand-ins, see the module)."""
    if config.dataset == "imagenet100":
        missing = DataNotFoundError(
            "the paper's MIM needs ImageNet-100 and the pretrained MaskGIT VQGAN tokenizer "
            "(https://github.com/valeoai/Maskgit-pytorch); neither is available offline. Run "
            "the toy version with the tiny or small preset."
        )
        if ctx.stand_in_data:
            return _stand_in_tokens(config, missing)
        raise missing
    x_train, _ = load_image_dataset(config.dataset, "train", ctx.data_dir)
    x_test, _ = load_image_dataset(config.dataset, "test", ctx.data_dir)
    patches = patchify(x_train, config.grid)
    centroids = kmeans(
        patches.reshape(-1, patches.shape[-1]),
        config.codebook_size,
        config.kmeans_iterations,
        torch.Generator().manual_seed(config.seed),
    )
    test_codes = tokenize(x_test, centroids, config.grid)
    pixels = _Pixels(x_test, centroids, config.grid)
    tokenizer_psnr = psnr(pixels.decode(test_codes), x_test)
    note = f"Tokenizer-only PSNR (decode of the true codes): {tokenizer_psnr:.2f} dB."
    return _Tokens(
        tokenize(x_train, centroids, config.grid),
        test_codes,
        pixels,
        [note],
        {"tokenizer_psnr": tokenizer_psnr},
    )


def _run(config: Config, ctx: RunContext) -> Results:
    tokens = _tokens(config, ctx)
    source = config.dataset if tokens.pixels is not None else "stand-in codes"
    results = train_or_reuse(
        ctx,
        config.models,
        lambda index, name: run_identity(config, LOOPS, ctx, model=name, index=index, data=source),
        partial(_train, config, ctx, tokens),
    )
    rows: list[list[Any]] = []
    metrics = dict(tokens.metrics)
    for name, r in results.items():
        rows.append([
            name, r["params"], r["accuracy"], r["psnr"], r["psnr_tokenized"],
            round(r["seconds"], 1), *PAPER_TABLE2[name][:2],
        ])  # fmt: skip
        metrics[f"{name}_masked_accuracy"] = r["accuracy"]
        if r["psnr"] is not None:
            metrics[f"{name}_psnr"] = r["psnr"]
    table = Table(
        "Toy masked token modelling (Table 2 layout; NOT the paper's setting)",
        [
            "model",
            "params",
            "masked-token acc %",
            "PSNR dB (vs image)",
            "PSNR dB (vs tokenized)",
            "train s",
            "params M (paper)",
            "PSNR dB (paper)",
        ],
        rows,
        f"{config.dataset}: k-means tokenizer with {config.codebook_size} codes on a "
        f"{config.grid}×{config.grid} patch grid, {int(100 * config.eval_mask_ratio)} % masked, "
        "one-shot prediction. Paper: ImageNet-100, MaskGIT VQGAN (1024 codes, 16×16), "
        "iterative decoding.",
    )
    notes = [
        "The paper's MIM numbers (Table 2, Tables 15-17) are not reproduced: ImageNet-100 and the "
        "pretrained VQGAN tokenizer are unavailable offline. This toy run exercises the same "
        "model, masking and loss; its numbers are not comparable with the paper's.",
        *tokens.notes,
    ]
    figures = _figure(config, ctx, tokens, results)
    return Results(tables=[table], metrics=metrics, figures=figures, notes=notes)


def _train(
    config: Config, ctx: RunContext, tokens: _Tokens, index: int, name: str, identity: Any
) -> dict[str, Any]:
    """Train model ``name`` (the ``index``-th) on masked codes and test it at the fixed masking
    ratio: its record for ``runs.json``."""
    torch.manual_seed(config.seed * 1000 + index)
    model = build(config, name)
    trained = train_model(
        ctx, name, model, partial(_masked, tokens.train, model.mask_id, config.max_mask_ratio),
        _loss, size=len(tokens.train), batch_size=config.batch_size, epochs=config.epochs,
        lr_at=lambda e: config.lr, seed=config.seed * 7919 + index, betas=(0.9, 0.95),
        weight_decay=config.weight_decay, grad_clip=config.grad_clip, identity=identity,
    )  # fmt: skip
    test = tokens.test
    eval_mask = evaluation_mask(config, test)
    with torch.no_grad():
        inputs = torch.where(eval_mask, model.mask_id, test).to(device_of(model))
        predicted = torch.where(eval_mask, model(inputs).cpu().argmax(-1), test)
    scores = _scores(tokens, predicted)
    shown = figure_images(config, len(test))
    return {
        "params": count_parameters(model),
        "accuracy": 100.0 * float((predicted == test)[eval_mask].float().mean()),
        "psnr": scores[0],
        "psnr_tokenized": scores[1],
        "figure": {"images": shown.tolist(), "codes": predicted[shown].tolist()},
        **trained,
    }


def figure_rows(
    config: Config, tokens: _Tokens, results: dict[str, dict[str, Any]]
) -> dict[str, Tensor]:
    """The rows of the reconstruction figure, each images ``(B, C, H, W)`` of the test images
    :func:`figure_images`: ``"original"``, ``"tokenized"`` (decoded true codes), ``"masked
    input"`` (the tokenized image with the patches of :func:`evaluation_mask` greyed) and one
    row per model whose record holds its one-shot reconstruction of those images (records made
    before the figure existed hold none). Empty for stand-in codes."""
    if tokens.pixels is None:
        return {}
    shown = figure_images(config, len(tokens.test))
    codes = tokens.test[shown]
    tokenized = tokens.pixels.decode(codes)
    rows = {
        "original": tokens.pixels.images[shown],
        "tokenized": tokenized,
        "masked input": grey_masked(
            tokenized, evaluation_mask(config, tokens.test)[shown], config.grid
        ),
    }
    for name, record in results.items():
        figure = record.get("figure")
        if figure is not None and figure["images"] == shown.tolist():
            rows[name] = tokens.pixels.decode(torch.tensor(figure["codes"]))
    return rows


def _figure(
    config: Config, ctx: RunContext, tokens: _Tokens, results: dict[str, dict[str, Any]]
) -> list[str]:
    """Draw ``mim_reconstructions.png`` (the rows of :func:`figure_rows` as an image grid, one
    column per test image); the file names (none for stand-in codes or when no record holds a
    reconstruction)."""
    rows = figure_rows(config, tokens, results)
    if not any(name in rows for name in results):
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = len(rows["original"])
    fig, axes = plt.subplots(
        len(rows), columns, figsize=(1.2 * columns + 1.4, 1.2 * len(rows) + 0.9), squeeze=False
    )
    for line, (label, images) in enumerate(rows.items()):
        for column, image in enumerate(images):
            ax = axes[line][column]
            ax.imshow(
                image.permute(1, 2, 0).squeeze(-1).clamp(0, 1).numpy(), cmap="gray", vmin=0, vmax=1
            )
            ax.set_xticks([])
            ax.set_yticks([])
        axes[line][0].set_ylabel(label, fontsize=7)
    fig.suptitle(
        f"Toy analogue of Hyper-SET Fig. 8 (NOT the paper's ImageNet 256×256 setting):\n"
        f"{config.dataset}, k-means codes ({config.codebook_size}) on a {config.grid}×{config.grid} "
        f"patch grid, {round(100 * config.eval_mask_ratio)} % masked, one-shot prediction",
        fontsize=8,
    )
    fig.tight_layout()
    return [ctx.save_figure(fig, "mim_reconstructions.png", dpi=120)]


register(
    Experiment(
        name="hyperset-mim",
        summary="Toy masked token modelling (k-means patch codes on digits) with Hyper-SET vs "
        "Transformer; the paper's ImageNet-100 MIM is not reproducible offline",
        presets=PRESETS,
        run=run,
        check=check_config,
        paper="Hyper-SET §5.3, Table 2 (toy stand-in only)",
        tags=("hyperset",),
    )
)

"""Hyper-SET task models (Sudoku, image classification, masked token modelling) and builders.

Each task model wraps an encoder — :class:`~hopfield.nn.hyperset.HyperSETEncoder` or the
weight-shared :class:`~hopfield.nn.hyperset.SharedTransformerEncoder` — with the paper's
embedding and read-out (spec §4), so both architectures see identical inputs and heads. The
builders :func:`sudoku_model`, :func:`image_classifier` and :func:`masked_token_model` give the
paper configurations; with the paper's sizes their parameter counts are exactly those of spec
§4.5 (5,195,584 / 7,156,992 for Sudoku, 962,218 / 1,794,826 for CIFAR-10 Small, ...).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hopfield.nn.hyperset import HyperSETEncoder, SharedTransformerEncoder, WeightSharedEncoder
from hopfield.nn.hyperset_energy import sinusoidal_positions, sinusoidal_positions_2d

Encoder = HyperSETEncoder | WeightSharedEncoder
ARCHITECTURES = ("hyperset", "transformer", "crate", "crate-t")

__all__ = [
    "ARCHITECTURES",
    "ImageClassifier",
    "MaskedTokenModel",
    "SudokuModel",
    "image_classifier",
    "masked_token_loss",
    "masked_token_model",
    "patchify",
    "sudoku_model",
]


def _check_encoder(encoder: object) -> Encoder:
    if not isinstance(encoder, HyperSETEncoder | WeightSharedEncoder):
        raise TypeError(
            f"encoder must be a HyperSETEncoder or a WeightSharedEncoder (e.g. "
            f"SharedTransformerEncoder, EnergyTransformerEncoder), got "
            f"{type(encoder).__name__}"
        )
    return encoder


def _encode(
    encoder: Encoder, x0: Tensor, iterations: int | None, return_states: bool
) -> tuple[Tensor, list[Tensor]]:
    out = encoder(x0, iterations, return_states=return_states)
    if return_states:
        x, states = out
        return x, states
    return out, []


class SudokuModel(nn.Module):
    """Sudoku solver: 81 cell tokens (0 = blank, 1-9 = given) -> logits over the digits 1-9.

    ``X_0 = Dropout(tok_emb + pos_emb)`` with a learnable positional embedding; read-out
    ``Linear(RMSNorm(X_L))`` per cell (no bias). Linear and embedding weights ``N(0, 0.02²)``.

    Args:
        encoder: the iterated layer(s).
        embedding_dropout: dropout on ``X_0`` (0.1 in the paper's code).
    """

    def __init__(
        self,
        encoder: Encoder,
        *,
        embedding_dropout: float = 0.1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.encoder = _check_encoder(encoder)
        d = encoder.d_model
        self.token_embedding = nn.Embedding(10, d, device=device, dtype=dtype)
        self.position_embedding = nn.Parameter(torch.empty(1, 81, d, device=device, dtype=dtype))
        self.dropout = nn.Dropout(embedding_dropout)
        self.norm = nn.RMSNorm(d, device=device, dtype=dtype)
        self.head = nn.Linear(d, 9, bias=False, device=device, dtype=dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``N(0, 0.02²)`` embeddings and head, unit gains; the encoder keeps its own scheme."""
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.position_embedding, std=0.02)
        nn.init.normal_(self.head.weight, std=0.02)
        self.norm.reset_parameters()

    def embed(self, puzzles: Tensor) -> Tensor:
        """``X_0`` ``(B, 81, d)`` of puzzles ``(B, 81)`` (long, 0 = blank)."""
        if not isinstance(puzzles, Tensor) or puzzles.dtype != torch.long:
            raise TypeError("puzzles must be a long tensor")
        if puzzles.dim() != 2 or puzzles.shape[1] != 81:
            raise ValueError(f"puzzles must have shape (B, 81), got {tuple(puzzles.shape)}")
        if puzzles.min() < 0 or puzzles.max() > 9:
            raise ValueError("puzzles must hold values in 0..9")
        return self.dropout(self.token_embedding(puzzles) + self.position_embedding)

    def readout(self, x: Tensor) -> Tensor:
        """Logits ``(B, 81, 9)`` (class c is digit c + 1)."""
        return self.head(self.norm(x))

    def forward(
        self, puzzles: Tensor, iterations: int | None = None, *, return_states: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Logits ``(B, 81, 9)``, or ``(logits, [X_1..X_L])`` with ``return_states``."""
        x, states = _encode(self.encoder, self.embed(puzzles), iterations, return_states)
        logits = self.readout(x)
        return (logits, states) if return_states else logits


def patchify(images: Tensor, grid: int) -> Tensor:
    """``(B, C, H, W) -> (B, grid², C·(H/grid)·(W/grid))``; the paper's "patch size" is ``grid``."""
    if not isinstance(images, Tensor) or images.dim() != 4:
        raise ValueError("images must be a (B, C, H, W) tensor")
    b, c, h, w = images.shape
    if h % grid or w % grid:
        raise ValueError(f"grid={grid} must divide the image size {h}x{w}")
    ph, pw = h // grid, w // grid
    patches = images.reshape(b, c, grid, ph, grid, pw).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(b, grid * grid, c * ph * pw)


class ImageClassifier(nn.Module):
    """Patch-grid classifier with a CLS token (spec §4.2).

    Patch embedding ``LayerNorm(f) -> Linear(f, d) -> LayerNorm(d)`` (``patch_norm=True``,
    Hyper-SET) or ``Linear(f, d)`` (baselines); a learnable CLS token (``N(0, 1)``); fixed 1-D
    sinusoidal positions over all ``grid² + 1`` tokens; read-out ``Linear(LayerNorm(X_L[:, 0]))``.

    Args:
        encoder: the iterated layer(s).
        image_size: H (= W) in pixels; in_channels: C; grid: patches per side.
        num_classes: number of classes.
        patch_norm: the two LayerNorms around the patch Linear.
    """

    positions: Tensor

    def __init__(
        self,
        encoder: Encoder,
        *,
        image_size: int,
        in_channels: int,
        grid: int,
        num_classes: int,
        patch_norm: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.encoder = _check_encoder(encoder)
        if image_size % grid:
            raise ValueError(f"grid={grid} must divide image_size={image_size}")
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        d = encoder.d_model
        self.grid, self.image_size, self.in_channels = grid, image_size, in_channels
        features = in_channels * (image_size // grid) ** 2
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.patch_norm_in = nn.LayerNorm(features, **factory) if patch_norm else None
        self.patch_linear = nn.Linear(features, d, **factory)
        self.patch_norm_out = nn.LayerNorm(d, **factory) if patch_norm else None
        self.cls = nn.Parameter(torch.empty(1, 1, d, **factory))
        positions = sinusoidal_positions(grid * grid + 1, d).to(
            device=device, dtype=dtype or torch.get_default_dtype()
        )
        self.register_buffer("positions", positions, persistent=False)
        self.norm = nn.LayerNorm(d, **factory)
        self.head = nn.Linear(d, num_classes, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch defaults; CLS ``N(0, 1)``."""
        for module in (self.patch_norm_in, self.patch_linear, self.patch_norm_out, self.norm):
            if module is not None:
                module.reset_parameters()
        self.head.reset_parameters()
        nn.init.normal_(self.cls)

    def embed(self, images: Tensor) -> Tensor:
        """``X_0`` ``(B, grid² + 1, d)`` of images ``(B, C, H, W)``."""
        if images.dim() != 4 or images.shape[1:] != (
            self.in_channels,
            self.image_size,
            self.image_size,
        ):
            raise ValueError(
                f"images must have shape (B, {self.in_channels}, {self.image_size}, "
                f"{self.image_size}), got {tuple(images.shape)}"
            )
        x = patchify(images, self.grid)
        if self.patch_norm_in is not None:
            x = self.patch_norm_in(x)
        x = self.patch_linear(x)
        if self.patch_norm_out is not None:
            x = self.patch_norm_out(x)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        return x + self.positions

    def readout(self, x: Tensor) -> Tensor:
        """Logits ``(B, num_classes)`` from the CLS token."""
        return self.head(self.norm(x[:, 0]))

    def forward(
        self, images: Tensor, iterations: int | None = None, *, return_states: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Logits ``(B, num_classes)`` (and the states with ``return_states``)."""
        x, states = _encode(self.encoder, self.embed(images), iterations, return_states)
        logits = self.readout(x)
        return (logits, states) if return_states else logits


class MaskedTokenModel(nn.Module):
    """Masked token modelling on a ``grid × grid`` code map (MaskGIT-style, spec §4.3).

    ``Embedding(codebook + 1, d)`` (id ``codebook`` is [MASK]) plus fixed 2-D sin-cos positions;
    read-out ``Linear(RMSNorm(X_L), codebook)`` with bias.
    """

    positions: Tensor

    def __init__(
        self,
        encoder: Encoder,
        *,
        codebook_size: int,
        grid: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.encoder = _check_encoder(encoder)
        if codebook_size < 2:
            raise ValueError(f"codebook_size must be >= 2, got {codebook_size}")
        d = encoder.d_model
        self.codebook_size, self.grid = codebook_size, grid
        self.mask_id = codebook_size
        self.token_embedding = nn.Embedding(codebook_size + 1, d, device=device, dtype=dtype)
        positions = sinusoidal_positions_2d(grid, grid, d).to(
            device=device, dtype=dtype or torch.get_default_dtype()
        )
        self.register_buffer("positions", positions, persistent=False)
        self.norm = nn.RMSNorm(d, device=device, dtype=dtype)
        self.head = nn.Linear(d, codebook_size, device=device, dtype=dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``N(0, 0.02²)`` embedding, default head."""
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        self.norm.reset_parameters()
        self.head.reset_parameters()

    def forward(self, codes: Tensor, iterations: int | None = None) -> Tensor:
        """Logits ``(B, grid², codebook)`` for codes ``(B, grid²)`` (``mask_id`` where masked)."""
        if codes.dtype != torch.long or codes.dim() != 2 or codes.shape[1] != self.grid**2:
            raise ValueError(f"codes must be a long (B, {self.grid**2}) tensor")
        x0 = self.token_embedding(codes) + self.positions
        x, _ = _encode(self.encoder, x0, iterations, False)
        return self.head(self.norm(x))


def _arch(arch: str) -> str:
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {ARCHITECTURES}, got {arch!r}")
    return arch


def sudoku_model(
    arch: str = "hyperset",
    *,
    d_model: int = 768,
    num_heads: int = 12,
    ff_ratio: float = 4.0,
    iterations: int = 24,
    time_frequency: int = 512,
    embedding_dropout: float = 0.1,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    **encoder_options: Any,
) -> SudokuModel:
    """The paper's Sudoku model (Table 7 defaults: 5,195,584 / 7,156,992 parameters).

    Hyper-SET: one shared norm, ReLU FF of width ``ff_ratio·d``, step sizes conditioned on
    ``X_0`` (``"plain"`` style); Transformer: pre-RMSNorm, MLP ``4d``. Both ``N(0, 0.02²)``.
    ``encoder_options`` go to the encoder (e.g. ``attention``, ``step_size``, ``num_layers``).
    """
    if _arch(arch) == "hyperset":
        encoder: Encoder = HyperSETEncoder(
            d_model,
            num_heads,
            round(ff_ratio * d_model),
            iterations=iterations,
            time_frequency=time_frequency,
            step_style="plain",
            condition="input",
            init_std=0.02,
            device=device,
            dtype=dtype,
            **encoder_options,
        )
    else:
        encoder = SharedTransformerEncoder(
            d_model,
            num_heads,
            ff_ratio,
            iterations=iterations,
            norm="rms",
            init_std=0.02,
            kind=arch,
            device=device,
            dtype=dtype,
            **encoder_options,
        )
    return SudokuModel(encoder, embedding_dropout=embedding_dropout, device=device, dtype=dtype)


def image_classifier(
    arch: str = "hyperset",
    *,
    num_classes: int = 10,
    image_size: int = 32,
    in_channels: int = 3,
    grid: int = 8,
    d_model: int = 384,
    num_heads: int = 6,
    ff_ratio: float | None = None,
    iterations: int = 12,
    time_frequency: int = 512,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    **encoder_options: Any,
) -> ImageClassifier:
    """The paper's classifier (Tables 9, 11, 12 defaults: CIFAR-10 Small, 962,218 parameters).

    Hyper-SET (classification code): three Q/K/V norms, GELU FF of width ``d`` (``ff_ratio``
    1), step sizes conditioned on ``X_t`` (``"normed"`` style), patch LayerNorms. Transformer:
    pre-LayerNorm, MLP ``4d``, plain patch Linear (1,794,826 parameters for CIFAR-10 Small).
    ``"crate"`` / ``"crate-t"``: CRATE layers (468,106 / 320,266 parameters).
    """
    if _arch(arch) == "hyperset":
        options: dict[str, Any] = {
            "separate_qkv_norms": True,
            "feedforward": "gelu",
            "step_style": "normed",
            "condition": "state",
            "time_frequency": time_frequency,
        }
        options.update(encoder_options)
        encoder: Encoder = HyperSETEncoder(
            d_model,
            num_heads,
            round((1.0 if ff_ratio is None else ff_ratio) * d_model),
            iterations=iterations,
            device=device,
            dtype=dtype,
            **options,
        )
    else:
        encoder = SharedTransformerEncoder(
            d_model,
            num_heads,
            4.0 if ff_ratio is None else ff_ratio,
            iterations=iterations,
            norm="layer",
            kind=arch,
            device=device,
            dtype=dtype,
            **encoder_options,
        )
    return ImageClassifier(
        encoder,
        image_size=image_size,
        in_channels=in_channels,
        grid=grid,
        num_classes=num_classes,
        patch_norm=arch == "hyperset",
        device=device,
        dtype=dtype,
    )


def masked_token_model(
    arch: str = "hyperset",
    *,
    codebook_size: int = 1024,
    grid: int = 16,
    d_model: int = 768,
    num_heads: int = 12,
    ff_ratio: float | None = None,
    iterations: int = 12,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    **encoder_options: Any,
) -> MaskedTokenModel:
    """The paper's MIM model (Table 14 defaults: 3,937,856 parameters; 8,072,000 with M = 8d).

    Hyper-SET: shared norm, ReLU FF of width ``d``, step sizes ``"direct"`` (no time MLP,
    ``F = d``) conditioned on ``X_0``. Transformer: pre-RMSNorm, MLP ``4d``.
    """
    if _arch(arch) == "hyperset":
        encoder: Encoder = HyperSETEncoder(
            d_model,
            num_heads,
            round((1.0 if ff_ratio is None else ff_ratio) * d_model),
            iterations=iterations,
            step_style="direct",
            condition="input",
            time_frequency=d_model,
            device=device,
            dtype=dtype,
            **encoder_options,
        )
    else:
        encoder = SharedTransformerEncoder(
            d_model,
            num_heads,
            4.0 if ff_ratio is None else ff_ratio,
            iterations=iterations,
            norm="rms",
            kind=arch,
            device=device,
            dtype=dtype,
            **encoder_options,
        )
    return MaskedTokenModel(
        encoder, codebook_size=codebook_size, grid=grid, device=device, dtype=dtype
    )


def masked_token_loss(logits: Tensor, targets: Tensor, masked: Tensor) -> Tensor:
    """Cross-entropy over masked positions only: logits ``(B, S, K)``, targets/masked ``(B, S)``."""
    if not masked.any():
        return logits.sum() * 0.0
    return F.cross_entropy(logits[masked], targets[masked])

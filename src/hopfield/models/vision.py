"""A small Vision Transformer whose attention is a pluggable Hopfield layer.

This is the backbone of OutEffHop's "faster convergence" study (Figure 7 of the ICML/arXiv
version, Table 3 hyper-parameters): a ViT in which every self-attention is a
:class:`hopfield.nn.Hopfield` layer with a chosen separation map (Dense = softmax, Sparse =
sparsemax, OutEffHop = Softmax_1). The layout follows the authors' ``ThreeLayerViH``:

* :class:`PatchEmbedding`: a convolution with kernel = stride = ``patch_size`` (images whose side
  is not a multiple of the patch size are zero-padded on the right and bottom);
* a learned class token and learned position embeddings, dropout;
* ``depth`` pre-LN :class:`HopfieldBlock` s: ``x + drop(Hopfield(LN(x)))`` then
  ``x + drop(MLP(LN(x)))`` with a GELU MLP ``d -> mlp_dim -> d``;
* the head: class token -> ReLU -> LayerNorm -> Linear.

Example::

    from hopfield.functional import SoftmaxN
    from hopfield.models.vision import VisionHopfield

    model = VisionHopfield(image_size=28, in_channels=1, num_classes=10, patch_size=7,
                           embed_dim=64, num_heads=4, mlp_dim=128, depth=3,
                           separation=SoftmaxN(1.0))
    logits = model(images)          # images (B, 1, 28, 28) -> logits (B, 10)
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from hopfield._validation import check_int
from hopfield.functional import Separation
from hopfield.nn.hopfield import Hopfield

__all__ = [
    "HopfieldBlock",
    "PatchEmbedding",
    "VisionHopfield",
    "num_patches",
    "vision_hopfield_parameters",
]


def _dropout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"dropout must be a real number, got {type(value).__name__}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"dropout must lie in [0, 1), got {value}")
    return float(value)


def num_patches(image_size: int, patch_size: int) -> int:
    """Patches per image: ``ceil(image_size / patch_size) ** 2`` (the image is zero-padded)."""
    return math.ceil(image_size / patch_size) ** 2


class PatchEmbedding(nn.Module):
    """Cut an image into ``patch_size`` squares and embed each linearly.

    Args:
        image_size: side of the (square) images.
        in_channels: image channels ``C``.
        patch_size: side of a patch; an image whose side is no multiple of it is zero-padded.
        embed_dim: embedding size ``d``.

    Input ``(B, C, image_size, image_size)``, output ``(B, num_patches, d)``.
    """

    def __init__(
        self,
        image_size: int,
        in_channels: int,
        patch_size: int,
        embed_dim: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.image_size = check_int("image_size", image_size)
        self.in_channels = check_int("in_channels", in_channels)
        self.patch_size = check_int("patch_size", patch_size)
        self.embed_dim = check_int("embed_dim", embed_dim)
        self.num_patches = num_patches(image_size, patch_size)
        self.pad = -image_size % patch_size
        self.proj = nn.Conv2d(
            in_channels, embed_dim, patch_size, stride=patch_size, device=device, dtype=dtype
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform kernel (as a linear map of the flattened patch), zero bias."""
        nn.init.xavier_uniform_(self.proj.weight.view(self.embed_dim, -1))
        if self.proj.bias is not None:
            nn.init.zeros_(self.proj.bias)

    def forward(self, images: Tensor) -> Tensor:
        """``(B, C, H, W)`` with ``H = W = image_size`` -> ``(B, num_patches, embed_dim)``."""
        expected = (self.in_channels, self.image_size, self.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(
                f"images must have shape (B, {', '.join(map(str, expected))}), "
                f"got {tuple(images.shape)}"
            )
        if self.pad:
            images = F.pad(images, (0, self.pad, 0, self.pad))
        return self.proj(images).flatten(2).transpose(1, 2)


class HopfieldBlock(nn.Module):
    """A pre-LN transformer block whose self-attention is a Hopfield layer.

    ``x <- x + drop(Hopfield(LN(x)))``; ``x <- x + drop(W2 drop(GELU(W1 LN(x))))``.

    Args:
        embed_dim: token size ``d``.
        num_heads: Hopfield heads (``d`` must be divisible by it).
        mlp_dim: hidden size of the feed-forward network.
        separation: the Hopfield layer's separation map (Softmax, Sparsemax, SoftmaxN(1), ...).
        dropout: dropout after the Hopfield layer, inside and after the MLP.

    Input and output ``(B, N, d)``.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        mlp_dim: int,
        separation: Separation,
        dropout: float = 0.0,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        check_int("embed_dim", embed_dim)
        check_int("num_heads", num_heads)
        check_int("mlp_dim", mlp_dim)
        if not isinstance(separation, Separation):
            raise TypeError(f"separation must be a Separation, got {type(separation).__name__}")
        self.norm1 = nn.LayerNorm(embed_dim, **factory)
        self.hopfield = Hopfield(embed_dim, num_heads, separation=separation, **factory)
        self.norm2 = nn.LayerNorm(embed_dim, **factory)
        self.fc1 = nn.Linear(embed_dim, mlp_dim, **factory)
        self.fc2 = nn.Linear(mlp_dim, embed_dim, **factory)
        self.drop = nn.Dropout(_dropout(dropout))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Unit LayerNorms, the Hopfield layer's own reset, Xavier-uniform MLP with zero biases."""
        self.norm1.reset_parameters()
        self.norm2.reset_parameters()
        self.hopfield.reset_parameters()
        for fc in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.zeros_(fc.bias)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, d) -> (B, N, d)``."""
        attended = self.hopfield(self.norm1(x))
        assert isinstance(attended, Tensor)
        x = x + self.drop(attended)
        hidden = self.drop(F.gelu(self.fc1(self.norm2(x))))
        return x + self.drop(self.fc2(hidden))


class VisionHopfield(nn.Module):
    """A ViT classifier with Hopfield layers as attention (see the module docstring).

    Args:
        image_size: side of the square input images.
        in_channels: image channels.
        num_classes: number of classes.
        patch_size: side of a patch.
        embed_dim: token size ``d``.
        num_heads: Hopfield heads per block.
        mlp_dim: feed-forward hidden size.
        depth: number of blocks.
        separation: separation map of every block's Hopfield layer; each block gets its own
            deep copy (so learnable maps, e.g. an entmax alpha, are learned per block).
        dropout: dropout on the embeddings and in every block.

    Input ``(B, C, image_size, image_size)``, output logits ``(B, num_classes)``.
    """

    def __init__(
        self,
        image_size: int,
        in_channels: int,
        num_classes: int,
        *,
        patch_size: int,
        embed_dim: int,
        num_heads: int,
        mlp_dim: int,
        depth: int,
        separation: Separation,
        dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.num_classes = check_int("num_classes", num_classes)
        check_int("depth", depth)
        if not isinstance(separation, Separation):
            raise TypeError(f"separation must be a Separation, got {type(separation).__name__}")
        self.patches = PatchEmbedding(image_size, in_channels, patch_size, embed_dim, **factory)
        self.cls_token = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
        self.pos_embed = nn.Parameter(
            torch.empty(1, self.patches.num_patches + 1, embed_dim, **factory)
        )
        self.drop = nn.Dropout(_dropout(dropout))
        self.blocks = nn.ModuleList(
            HopfieldBlock(
                embed_dim, num_heads, mlp_dim, copy.deepcopy(separation), dropout, **factory
            )
            for _ in range(depth)
        )
        self.head_norm = nn.LayerNorm(embed_dim, **factory)
        self.head = nn.Linear(embed_dim, num_classes, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal (std 0.02, cut at ±2 std) class token and positions; every part resets itself."""
        nn.init.trunc_normal_(self.cls_token, std=0.02, a=-0.04, b=0.04)
        nn.init.trunc_normal_(self.pos_embed, std=0.02, a=-0.04, b=0.04)
        self.patches.reset_parameters()
        for block in self.blocks:
            assert isinstance(block, HopfieldBlock)
            block.reset_parameters()
        self.head_norm.reset_parameters()
        nn.init.xavier_uniform_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, images: Tensor) -> Tensor:
        """``(B, C, H, W) -> (B, num_classes)`` logits."""
        tokens = self.patches(images)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        x = self.drop(torch.cat([cls, tokens], dim=1) + self.pos_embed)
        for block in self.blocks:
            x = block(x)
        return self.head(self.head_norm(F.relu(x[:, 0])))


def vision_hopfield_parameters(
    image_size: int,
    in_channels: int,
    num_classes: int,
    *,
    patch_size: int,
    embed_dim: int,
    mlp_dim: int,
    depth: int,
) -> int:
    """The number of parameters of a :class:`VisionHopfield` with a parameter-free separation.

    Patch embedding ``C p² d + d``; class token and positions ``(n + 2) d``; per block two
    LayerNorms ``4d``, the Hopfield projections ``4(d² + d)`` and the MLP
    ``2 d m + m + d``; the head ``2d + d k + k``.
    """
    d, m, k = embed_dim, mlp_dim, num_classes
    n = num_patches(image_size, patch_size)
    embedding = in_channels * patch_size**2 * d + d + (n + 2) * d
    block = 4 * d + 4 * (d * d + d) + 2 * d * m + m + d
    return embedding + depth * block + 2 * d + d * k + k

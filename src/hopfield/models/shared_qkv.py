"""A weight-shared Transformer with one shared query/key/value projection (Hyper-SET App. F.3).

The Hyper-SET paper (Figs. 13-14) contrasts its token dynamics with a vanilla pre-LayerNorm
Transformer whose queries, keys and values come from one projection ``W`` (Kowsher et al. 2025),
and with the same model with the attention update's sign reversed, "similar to the design in
(9)". One iteration (tokens are rows, ``x`` ``(B, N, d)``, ``z_h = split_heads(LN₁(x) Wᵀ)``)::

    a = merge_h(softmax(z_h z_hᵀ / √p) z_h) Oᵀ        # attn(LN(x)), output projection O
    x ← x + a          (reverse_attention=False)   or   x ← x − a   (reverse_attention=True)
    x ← x + ReLU(LN₂(x) W₁ᵀ) W₂ᵀ                   # MLP of width mlp_ratio·d, no biases

:class:`SharedQKVTransformerEncoder` applies K layers, each ``L/K`` times (a
:class:`~hopfield.nn.hyperset.WeightSharedEncoder`), so the Hyper-SET task models take it;
:meth:`SharedQKVTransformerLayer.subspace_tokens` gives the per-head tokens the attention sees
(gain-free RMS-normalised, as Hyper-SET's), for the effective rank and angle of Figs. 13-14.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hopfield._validation import check_bool, check_int, check_real
from hopfield.models.hyperset import ImageClassifier
from hopfield.nn.hyperset import WeightSharedEncoder
from hopfield.nn.hyperset_energy import merge_heads, split_heads

__all__ = [
    "SharedQKVTransformerEncoder",
    "SharedQKVTransformerLayer",
    "shared_qkv_image_classifier",
]


class SharedQKVTransformerLayer(nn.Module):
    """Pre-LayerNorm Transformer layer with ``Q = K = V = LN(x) Wᵀ`` and no biases.

    Args:
        d_model: token width d.
        num_heads: H (must divide d; head width ``p = d/H``, scores scaled by ``1/√p``).
        mlp_ratio: MLP width ``mlp_ratio·d`` (ReLU).
        reverse_attention: ``x ← x − attn(LN(x))`` instead of ``x ← x + attn(LN(x))``.

    Attributes:
        qkv: ``Linear(d, d, bias=False)``, the shared projection ``W`` (all heads).
        out: ``Linear(d, d, bias=False)``, the output projection ``O``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        *,
        reverse_attention: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model)
        self.num_heads = check_int("num_heads", num_heads)
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        check_real("mlp_ratio", mlp_ratio, low=0.0, low_open=True)
        self.reverse_attention = check_bool("reverse_attention", reverse_attention)
        self.head_size = d_model // num_heads
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        hidden = max(1, round(mlp_ratio * d_model))
        self.norm1 = nn.LayerNorm(d_model, **factory)
        self.norm2 = nn.LayerNorm(d_model, **factory)
        self.qkv = nn.Linear(d_model, d_model, bias=False, **factory)
        self.out = nn.Linear(d_model, d_model, bias=False, **factory)
        self.fc1 = nn.Linear(d_model, hidden, bias=False, **factory)
        self.fc2 = nn.Linear(hidden, d_model, bias=False, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch defaults (as the classification Transformer)."""
        for module in (self.norm1, self.norm2, self.qkv, self.out, self.fc1, self.fc2):
            module.reset_parameters()

    def _check_input(self, x: Tensor) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (B, N, {self.d_model}), got {tuple(x.shape)}")

    def _heads(self, x: Tensor) -> Tensor:
        """The shared projections ``split_heads(LN₁(x) Wᵀ)`` ``(B, H, N, p)``."""
        return split_heads(self.qkv(self.norm1(x)), self.num_heads)

    def attention(self, x: Tensor) -> Tensor:
        """``attn(LN(x))`` ``(B, N, d)``: softmax attention with ``Q = K = V``, then ``O``."""
        self._check_input(x)
        z = self._heads(x)
        return self.out(merge_heads(F.scaled_dot_product_attention(z, z, z)))

    def forward(self, x: Tensor) -> Tensor:
        """One iteration ``(B, N, d) -> (B, N, d)`` (attention sub-step signed, then the MLP)."""
        update = self.attention(x)
        x = x - update if self.reverse_attention else x + update
        return x + self.fc2(F.relu(self.fc1(self.norm2(x))))

    @torch.no_grad()
    def subspace_tokens(self, x: Tensor) -> Tensor:
        """The per-head tokens the attention sees, gain-free RMS-normalised ``(B, H, N, p)``."""
        self._check_input(x)
        return F.rms_norm(self._heads(x), (self.head_size,))

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, "
            f"reverse_attention={self.reverse_attention}"
        )


class SharedQKVTransformerEncoder(WeightSharedEncoder):
    """K :class:`SharedQKVTransformerLayer` s each applied ``L/K`` times (K = 1 in the paper).

    The iteration loop and interface (``forward(x0, iterations, return_states=...)``) are those
    of :class:`~hopfield.nn.hyperset.WeightSharedEncoder`, so the Hyper-SET task models accept it.

    Args:
        d_model, num_heads, mlp_ratio, reverse_attention: as in :class:`SharedQKVTransformerLayer`.
        iterations: L; num_layers: K.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        *,
        iterations: int = 12,
        num_layers: int = 1,
        reverse_attention: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(d_model, iterations=iterations, num_layers=num_layers)
        self.kind = "shared-qkv-reversed" if reverse_attention else "shared-qkv"
        self.layers = nn.ModuleList(
            SharedQKVTransformerLayer(
                d_model, num_heads, mlp_ratio, reverse_attention=reverse_attention,
                device=device, dtype=dtype,
            )
            for _ in range(num_layers)
        )  # fmt: skip

    def shared_layers(self) -> list[SharedQKVTransformerLayer]:
        """The distinct layers, in order."""
        return [layer for layer in self.layers if isinstance(layer, SharedQKVTransformerLayer)]

    def reset_parameters(self) -> None:
        """Every layer's defaults."""
        for layer in self.shared_layers():
            layer.reset_parameters()

    def layer_at(self, index: int, iterations: int | None = None) -> SharedQKVTransformerLayer:
        """The layer used at (0-based) iteration ``index`` of a run of ``iterations`` (L)."""
        total = self.iterations if iterations is None else iterations
        per_layer = total // self.num_layers
        return self.shared_layers()[min(index // per_layer, self.num_layers - 1)]


def shared_qkv_image_classifier(
    *,
    num_classes: int = 10,
    image_size: int = 32,
    in_channels: int = 3,
    grid: int = 8,
    d_model: int = 384,
    num_heads: int = 6,
    mlp_ratio: float = 4.0,
    iterations: int = 12,
    num_layers: int = 1,
    reverse_attention: bool = False,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> ImageClassifier:
    """The shared-QKV Transformer classifier of Figs. 13-14 (the baselines' patch ``Linear``
    without LayerNorms, CLS token, sinusoidal positions, ``LayerNorm`` + ``Linear`` read-out)."""
    encoder = SharedQKVTransformerEncoder(
        d_model, num_heads, mlp_ratio, iterations=iterations, num_layers=num_layers,
        reverse_attention=reverse_attention, device=device, dtype=dtype,
    )  # fmt: skip
    return ImageClassifier(
        encoder, image_size=image_size, in_channels=in_channels, grid=grid,
        num_classes=num_classes, patch_norm=False, device=device, dtype=dtype,
    )  # fmt: skip

"""The Energy Transformer (Hoover et al. 2023), the Hyper-SET paper's energy-based baseline.

One recurrent layer of parameters defines a scalar energy of the normalised tokens
``g = EnergyLayerNorm(x)`` (spec §4.4, tokens are rows, ``g`` ``(B, N, d)``)::

    E(g) = -(1/β) Σ_h Σ_i logsumexp_j(β q_hi·k_hj)  -  ½ Σ_i Σ_μ ReLU(ξ_μ·g_i)²
           └──────── attention (attractive) ──────┘   └──── Hopfield network ────┘

with ``q_hi = W^Q_h g_i``, ``k_hj = W^K_h g_j`` (``W^Q_h``, ``W^K_h`` ``(p, d)``, ``p = d/H``,
``β = 1/√p``) and memories ``ξ`` ``(M, d)``, ``M = 4d``. Each iteration is one gradient step with
the fixed step size 1: ``x ← x − ∇_g E(g)``. The attention energy carries a minus sign (it pulls
tokens together), unlike Hyper-SET's repulsive ``E_ATTN`` (spec §2.2).

:class:`EnergyTransformerLayer` computes the gradient in closed form; its float64 agreement with
autograd is tested. :class:`EnergyTransformerEncoder` applies the layer ``L`` times (a
:class:`~hopfield.nn.hyperset.WeightSharedEncoder`), so the Hyper-SET task models take it as
their encoder: :func:`energy_image_classifier` (patch ``Linear`` without LayerNorms, as the paper's
baselines; 908,939 parameters for CIFAR-10 Small) and :func:`energy_sudoku_model`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from hopfield._scalars import OneElementScalars
from hopfield._validation import check_int, check_real
from hopfield.models.hyperset import ImageClassifier, SudokuModel
from hopfield.nn.hyperset import WeightSharedEncoder

__all__ = [
    "EnergyLayerNorm",
    "EnergyTransformerEncoder",
    "EnergyTransformerLayer",
    "energy_image_classifier",
    "energy_sudoku_model",
]

#: Standard deviation of the query and key weights at initialisation (the paper's code).
QK_INIT_STD = 0.002


class EnergyLayerNorm(OneElementScalars):
    """``g = γ (x − mean(x)) / sqrt(var(x) + eps) + δ`` over the last dimension.

    The gain ``γ`` is one scalar (so ``g`` is the gradient of a convex Lagrangian and the energy
    descends for small steps; kept as a ``(1,)`` parameter, which FSDP2 can shard), the bias
    ``δ`` a ``(d,)`` vector.
    """

    one_element_scalars = ("gain",)

    def __init__(
        self,
        d_model: int,
        *,
        eps: float = 1e-5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model)
        self.eps = check_real("eps", eps, low=0.0, low_open=True)
        self.gain = nn.Parameter(torch.empty(1, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(d_model, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``γ = 1``, ``δ = 0``."""
        nn.init.ones_(self.gain)
        nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        """``(..., d) -> (..., d)``."""
        centred = x - x.mean(-1, keepdim=True)
        scale = torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.gain * centred * scale + self.bias


class EnergyTransformerLayer(nn.Module):
    """One Energy Transformer block: ``x ← x − step_size · ∇_g E(g)``, ``g = EnergyLayerNorm(x)``.

    Args:
        d_model: token width d.
        num_heads: H (must divide d; head width ``p = d/H``, ``β = 1/√p``).
        memory_ratio: number of Hopfield memories ``M = memory_ratio · d`` (4 in the paper).
        step_size: the fixed gradient step (1 in the paper).
        eps: of the energy LayerNorm.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        memory_ratio: float = 4.0,
        *,
        step_size: float = 1.0,
        eps: float = 1e-5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model)
        self.num_heads = check_int("num_heads", num_heads)
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        check_real("memory_ratio", memory_ratio, low=0.0, low_open=True)
        self.memories = max(1, round(memory_ratio * d_model))
        self.step_size = check_real("step_size", step_size, low=0.0, low_open=True)
        self.head_dim = d_model // num_heads
        self.beta = 1.0 / math.sqrt(self.head_dim)
        shape = (num_heads, self.head_dim, d_model)
        self.norm = EnergyLayerNorm(d_model, eps=eps, device=device, dtype=dtype)
        self.query = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        self.key = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        self.memory = nn.Linear(d_model, self.memories, bias=False, device=device, dtype=dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Queries and keys ``N(0, 0.002²)``; memories PyTorch's ``Linear`` default; unit gain."""
        nn.init.normal_(self.query, std=QK_INIT_STD)
        nn.init.normal_(self.key, std=QK_INIT_STD)
        self.memory.reset_parameters()
        self.norm.reset_parameters()

    def _check_input(self, x: Tensor) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (B, N, {self.d_model}), got {tuple(x.shape)}")

    def _scores(self, g: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys ``(B, H, N, p)`` and scores ``β Q Kᵀ`` ``(B, H, N, N)`` of ``g``."""
        q = torch.einsum("bnd,hpd->bhnp", g, self.query)
        k = torch.einsum("bnd,hpd->bhnp", g, self.key)
        return q, k, self.beta * q @ k.transpose(-1, -2)

    def energy(self, g: Tensor) -> Tensor:
        """``E(g)`` per sample ``(B,)`` of normalised tokens ``g`` ``(B, N, d)``."""
        self._check_input(g)
        _, _, scores = self._scores(g)
        attention = -torch.logsumexp(scores, dim=-1).sum((1, 2)) / self.beta
        hopfield = -0.5 * torch.relu(self.memory(g)).pow(2).sum((1, 2))
        return attention + hopfield

    def energy_gradient(self, g: Tensor) -> Tensor:
        """``∇_g E`` ``(B, N, d)`` in closed form::

            −∇_g E = Σ_h [softmax(A_h) K_h W^Q_h + softmax(A_h)ᵀ Q_h W^K_h] + ReLU(g ξᵀ) ξ

        with ``A_h = β Q_h K_hᵀ`` and the softmax over keys (the last dimension).
        """
        self._check_input(g)
        q, k, scores = self._scores(g)
        weights = torch.softmax(scores, dim=-1)
        from_queries = torch.einsum("bhnp,hpd->bnd", weights @ k, self.query)
        from_keys = torch.einsum("bhnp,hpd->bnd", weights.transpose(-1, -2) @ q, self.key)
        hopfield = torch.relu(self.memory(g)) @ self.memory.weight
        return -(from_queries + from_keys + hopfield)

    def state_energy(self, x: Tensor) -> Tensor:
        """``E(EnergyLayerNorm(x))`` per sample ``(B,)`` of tokens ``x`` ``(B, N, d)``."""
        self._check_input(x)
        return self.energy(self.norm(x))

    def forward(self, x: Tensor) -> Tensor:
        """One step ``(B, N, d) -> (B, N, d)``: ``x − step_size · ∇_g E(EnergyLayerNorm(x))``."""
        self._check_input(x)
        return x - self.step_size * self.energy_gradient(self.norm(x))

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, memories={self.memories}, "
            f"step_size={self.step_size:g}"
        )


class EnergyTransformerEncoder(WeightSharedEncoder):
    """K :class:`EnergyTransformerLayer` s each applied ``L/K`` times (K = 1 in the paper).

    The iteration loop and interface (``forward(x0, iterations, return_states=...)``) are those
    of :class:`~hopfield.nn.hyperset.WeightSharedEncoder`, so the Hyper-SET task models accept it.

    Args:
        d_model, num_heads, memory_ratio, step_size: as in :class:`EnergyTransformerLayer`.
        iterations: L; num_layers: K.
        init_std: ``N(0, init_std²)`` memories (the Sudoku code's scheme for every ``Linear``),
            or PyTorch's default; queries and keys are always ``N(0, 0.002²)``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        memory_ratio: float = 4.0,
        *,
        iterations: int = 12,
        num_layers: int = 1,
        step_size: float = 1.0,
        init_std: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(d_model, iterations=iterations, num_layers=num_layers)
        self.kind = "et"
        self.init_std = None if init_std is None else check_real("init_std", init_std, low=0.0)
        self.layers = nn.ModuleList(
            EnergyTransformerLayer(
                d_model, num_heads, memory_ratio, step_size=step_size, device=device, dtype=dtype
            )
            for _ in range(num_layers)
        )
        self.reset_parameters()

    def energy_layers(self) -> list[EnergyTransformerLayer]:
        """The distinct layers, in order."""
        return [layer for layer in self.layers if isinstance(layer, EnergyTransformerLayer)]

    def reset_parameters(self) -> None:
        """Layer defaults, then ``N(0, init_std²)`` memories when ``init_std`` is set."""
        for layer in self.energy_layers():
            layer.reset_parameters()
            if self.init_std is not None:
                nn.init.normal_(layer.memory.weight, std=self.init_std)


def energy_image_classifier(
    *,
    num_classes: int = 10,
    image_size: int = 32,
    in_channels: int = 3,
    grid: int = 8,
    d_model: int = 384,
    num_heads: int = 6,
    memory_ratio: float = 4.0,
    iterations: int = 12,
    num_layers: int = 1,
    step_size: float = 1.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> ImageClassifier:
    """The paper's Energy Transformer classifier (CIFAR-10 Small: 908,939 parameters).

    Patch ``Linear(f, d)`` without LayerNorms, CLS token, fixed sinusoidal positions and the
    ``LayerNorm`` + ``Linear`` read-out of :class:`~hopfield.models.hyperset.ImageClassifier`.
    """
    encoder = EnergyTransformerEncoder(
        d_model, num_heads, memory_ratio, iterations=iterations, num_layers=num_layers,
        step_size=step_size, device=device, dtype=dtype,
    )  # fmt: skip
    return ImageClassifier(
        encoder, image_size=image_size, in_channels=in_channels, grid=grid,
        num_classes=num_classes, patch_norm=False, device=device, dtype=dtype,
    )  # fmt: skip


def energy_sudoku_model(
    *,
    d_model: int = 768,
    num_heads: int = 12,
    memory_ratio: float = 4.0,
    iterations: int = 24,
    step_size: float = 1.0,
    embedding_dropout: float = 0.1,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> SudokuModel:
    """The Energy Transformer on Sudoku: the embedding and read-out of
    :class:`~hopfield.models.hyperset.SudokuModel`, memories ``N(0, 0.02²)`` as every ``Linear``
    of the Sudoku code."""
    encoder = EnergyTransformerEncoder(
        d_model, num_heads, memory_ratio, iterations=iterations, step_size=step_size,
        init_std=0.02, device=device, dtype=dtype,
    )  # fmt: skip
    return SudokuModel(encoder, embedding_dropout=embedding_dropout, device=device, dtype=dtype)

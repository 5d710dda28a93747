"""The Hopfield forecaster of the nonparametric paper's time-series experiment.

:class:`HopfieldForecaster` is the nonparametric paper's "simplest possible" model (Appendix G.4):
a value embedding of every time step, one Hopfield layer over the steps (any separation and
structure: dense, sparse, top-k, window, linear, random features, OutEffHop), Hopfield pooling of
all steps into one vector, and a linear head to the whole horizon.

It is trained by :func:`hopfield.experiments.forecasting_common.train_forecaster` (through
:class:`hopfield.training.Trainer`); this module holds no training loop.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from hopfield.functional import Separation
from hopfield.functional.structures import Structure
from hopfield.nn.hopfield import Hopfield, HopfieldPooling

__all__ = ["HopfieldForecaster"]


class HopfieldForecaster(nn.Module):
    """Embedding → Hopfield layer → Hopfield pooling → linear head (nonparametric paper, G.4).

    Every time step is one pattern: ``Linear(C_in → d) + LayerNorm``; one self-associating
    :class:`~hopfield.nn.Hopfield` layer (values tied to keys, ``V = Y W_K W_V``, as in the
    paper's layer (F.2)); GELU and LayerNorm; :class:`~hopfield.nn.HopfieldPooling` with one learned
    query over all steps, then LayerNorm; ``Linear(d → τ·C_out)``.

    Args:
        out_len: horizon ``τ``.
        num_inputs: input channels ``C_in`` (1 in the paper's univariate setting).
        num_targets: output channels ``C_out`` (``num_inputs`` by default).
        d_model: hidden size ``d``.
        num_heads: heads of both Hopfield layers (``d`` must be divisible by it).
        separation, structure: of the Hopfield layer (softmax and dense by default).
        pooling_separation, pooling_structure: of the pooling layer (the layer's by default).
        scale: ``β`` of both layers (``None``: ``1/sqrt(d/num_heads)``).
        dropout: dropout on the association weights.
    """

    def __init__(
        self,
        out_len: int,
        num_inputs: int = 1,
        num_targets: int | None = None,
        d_model: int = 64,
        num_heads: int = 4,
        separation: Separation | None = None,
        structure: Structure | None = None,
        pooling_separation: Separation | None = None,
        pooling_structure: Structure | None = None,
        scale: float | None = None,
        dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if out_len < 1 or num_inputs < 1:
            raise ValueError(f"out_len and num_inputs must be >= 1, got {out_len}, {num_inputs}")
        if d_model < 1 or num_heads < 1 or d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        self.out_len = out_len
        self.num_inputs = num_inputs
        self.num_targets = num_inputs if num_targets is None else num_targets
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        head = d_model // num_heads
        common: dict[str, Any] = {
            "num_heads": num_heads,
            "hidden_size": head,
            "pattern_size": head,
            "output_size": d_model,
            "scale": scale,
            "tie_values_to_keys": True,
            "dropout": dropout,
            **factory,
        }
        self.embedding = nn.Linear(num_inputs, d_model, **factory)
        self.embedding_norm = nn.LayerNorm(d_model, **factory)
        layer_kwargs: dict[str, Any] = {}
        if separation is not None:
            layer_kwargs["separation"] = separation
        if structure is not None:
            layer_kwargs["structure"] = structure
        self.hopfield = Hopfield(d_model, **common, **layer_kwargs)
        self.hopfield_norm = nn.LayerNorm(d_model, **factory)
        pool_separation = separation if pooling_separation is None else pooling_separation
        pool_structure = structure if pooling_structure is None else pooling_structure
        pool_kwargs: dict[str, Any] = {}
        if pool_separation is not None:
            pool_kwargs["separation"] = copy.deepcopy(pool_separation)
        if pool_structure is not None:
            pool_kwargs["structure"] = copy.deepcopy(pool_structure)
        self.pooling = HopfieldPooling(d_model, quantity=1, **common, **pool_kwargs)
        self.pooling_norm = nn.LayerNorm(d_model, **factory)
        self.head = nn.Linear(d_model, out_len * self.num_targets, **factory)

    def reset_parameters(self) -> None:
        """Re-initialise every sub-module."""
        for module in (self.embedding, self.embedding_norm, self.hopfield_norm, self.pooling_norm):
            module.reset_parameters()
        self.hopfield.reset_parameters()
        self.pooling.reset_parameters()
        self.head.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        """Forecast ``(B, τ, C_out)`` from the window ``x (B, T, C_in)``."""
        if x.dim() != 3 or x.shape[-1] != self.num_inputs:
            raise ValueError(f"x must be (B, T, {self.num_inputs}), got {tuple(x.shape)}")
        h = self.embedding_norm(self.embedding(x))  # (B, T, d)
        h = self.hopfield_norm(nn.functional.gelu(self.hopfield(h)))  # (B, T, d)
        pooled = self.pooling_norm(self.pooling(h)).flatten(1)  # (B, d)
        return self.head(pooled).view(x.shape[0], self.out_len, self.num_targets)

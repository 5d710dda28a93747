"""Structures: which memories take part in an association (or which kernel stands in for the scores).

A structure receives normalised arguments from :func:`hopfield.functional.associate`:

* ``q`` ``(B, H, L, E)``, ``k`` ``(B, H, S, E)``, ``v`` ``(B, H, S, Ev)``;
* ``scale``: a float, or a tensor broadcastable to ``(B, H, L, S)`` (e.g. ``(H, 1, 1)`` per head);
* ``mask``: ``None`` or a 4-D tensor broadcastable to ``(B, H, L, S)``: boolean (``True`` = the key
  may take part, as in :func:`torch.nn.functional.scaled_dot_product_attention`) or additive float;
* ``causal``: query ``i`` sees keys ``j <= i + S - L``;
* ``dropout``: the dropout probability on the association weights (already 0 in eval mode).

It returns ``(output (B, H, L, Ev), weights (B, H, L, S) or None)``; weights are returned only when
asked for and when the structure has them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor, nn

from hopfield.functional.separation import Separation

Scale = float | Tensor


class Structure(nn.Module, ABC):
    """Base class of structures. Subclasses implement :meth:`forward`."""

    @abstractmethod
    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        separation: Separation,
        scale: Scale,
        mask: Tensor | None,
        causal: bool,
        dropout: float,
        return_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Associate queries with memories; see the module docstring for shapes."""


def causal_mask(length: int, size: int, device: torch.device | None = None) -> Tensor:
    """Boolean ``(L, S)`` mask, ``True`` where query ``i`` may see key ``j`` (``j <= i + S - L``)."""
    rows = torch.arange(length, device=device)[:, None]
    cols = torch.arange(size, device=device)[None, :]
    return cols <= rows + (size - length)

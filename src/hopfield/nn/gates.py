"""Gated attention (Bondarenko et al., 2023): a sigmoid gate on each head's retrieved patterns."""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

import torch
from torch import Tensor, nn

from hopfield._validation import check_patterns

GATE_KINDS = ("per_head", "conditional_per_head", "conditional_per_token")


class GatedAttention(nn.Module):
    """Per-head gates ``sigmoid(G_h(x_h))`` that scale each head's output before the out-projection.

    ``x`` is the layer's input hidden state ``(B, L, input_size)``; ``x_h`` its ``h``-th contiguous
    chunk of size ``input_size / num_heads``. ``G_h`` is a per-head linear map to one logit, or a
    small MLP (``hidden`` units, ReLU) when ``hidden`` is given.

    Args:
        input_size: size of the conditioning hidden state.
        num_heads: number of heads ``H``.
        kind: ``"conditional_per_token"`` (a gate per head and token, the paper's choice),
            ``"conditional_per_head"`` (the token mean of the per-token logits), or ``"per_head"``
            (one learned logit per head, no conditioning).
        hidden: hidden width of the MLP gate (``None``: linear gate).
        pi_init: initial gate probability; the output bias starts at ``logit(pi_init)``
            (``None``: PyTorch's default initialisation, and 0 for ``"per_head"``).
    """

    def __init__(
        self,
        input_size: int,
        num_heads: int,
        kind: str = "conditional_per_token",
        hidden: int | None = None,
        pi_init: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if kind not in GATE_KINDS:
            raise ValueError(f"kind must be one of {GATE_KINDS}, got {kind!r}")
        if num_heads < 1 or input_size % num_heads:
            raise ValueError(
                f"input_size ({input_size}) must be divisible by num_heads ({num_heads})"
            )
        if hidden is not None and hidden < 1:
            raise ValueError(f"hidden must be a positive int or None, got {hidden}")
        if pi_init is not None and not 0 < pi_init < 1:
            raise ValueError(f"pi_init must lie in (0, 1), got {pi_init}")
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.input_size, self.num_heads, self.kind = input_size, num_heads, kind
        self.hidden, self.pi_init = hidden, pi_init
        head_size = input_size // num_heads
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        if kind == "per_head":
            self.biases.append(nn.Parameter(torch.empty(num_heads, 1, **factory)))
        else:
            sizes = [head_size, 1] if hidden is None else [head_size, hidden, 1]
            for fan_in, fan_out in pairwise(sizes):
                self.weights.append(
                    nn.Parameter(torch.empty(num_heads, fan_in, fan_out, **factory))
                )
                self.biases.append(nn.Parameter(torch.empty(num_heads, fan_out, **factory)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Per-head ``nn.Linear`` initialisation; the last bias at ``logit(pi_init)`` if given."""
        for weight, bias in zip(self.weights, self.biases, strict=False):
            bound = 1 / math.sqrt(weight.shape[1])
            nn.init.uniform_(weight, -bound, bound)
            nn.init.uniform_(bias, -bound, bound)
        last = self.biases[-1]
        if self.pi_init is not None:
            nn.init.constant_(last, math.log(self.pi_init / (1 - self.pi_init)))
        elif self.kind == "per_head":
            nn.init.zeros_(last)

    def probabilities(self, x: Tensor) -> Tensor:
        """Gate values in (0, 1): ``(B, H, L, 1)``, ``(B, H, 1, 1)`` or ``(1, H, 1, 1)`` by kind."""
        if self.kind == "per_head":
            return torch.sigmoid(self.biases[0]).view(1, self.num_heads, 1, 1)
        check_patterns("x", x, self.weights[0].dtype)
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            raise ValueError(f"x must be (B, L, {self.input_size}), got shape {tuple(x.shape)}")
        h = x.view(*x.shape[:2], self.num_heads, -1).transpose(1, 2)  # (B, H, L, head_size)
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = torch.einsum("bhld,hdo->bhlo", h, weight) + bias[:, None, :]
            if i < len(self.weights) - 1:
                h = torch.relu(h)
        if self.kind == "conditional_per_head":
            h = h.mean(dim=2, keepdim=True)
        return torch.sigmoid(h)

    def forward(self, x: Tensor, heads: Tensor) -> Tensor:
        """Gate ``heads (B, H, L, Ev)`` conditioned on ``x (B, L, input_size)``."""
        if heads.dim() != 4 or heads.shape[1] != self.num_heads:
            raise ValueError(
                f"heads must be (B, {self.num_heads}, L, Ev), got {tuple(heads.shape)}"
            )
        return heads * self.probabilities(x).to(heads.dtype)

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, num_heads={self.num_heads}, kind={self.kind!r}, "
            f"hidden={self.hidden}, pi_init={self.pi_init}"
        )

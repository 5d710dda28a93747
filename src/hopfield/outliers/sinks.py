"""Extreme-token measurements: attention sinks, value-state drains and residual-state peaks.

The three phenomena of Guo et al. (2024, *Active-Dormant Attention Heads*) on one designated
token (the sink, by default position 0: a fixed BOS token):

* **sink mass** (Gu et al., ICLR 2025): the mean attention weight a head puts on key ``k`` over
  the queries that can see it, ``ᾱ_k = 1/(T − k) · Σ_{i ≥ k} α_{i,k}`` (0-based positions), per
  sample and head;
* **Sink^ε rate** (Gu et al.): the fraction of (layer, head) pairs whose ``ᾱ_k`` exceeds ``ε``
  (their ε = 0.3), averaged over samples;
* **value-state drain**: the sink token's value-state norm over the median value-state norm of
  the other tokens (below 1 = drained), per sample and head;
* **residual-state peak**: the sink token's residual-state RMS over the median RMS of the other
  tokens' residual states (RMS = ℓ2 norm / √D, so the ratio is the ratio of the norms), per sample.

All functions take float tensors and return float64 tensors; they never change their inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "SINK_EPSILON",
    "residual_peak",
    "sink_mass",
    "sink_rate",
    "value_norm_ratio",
]

#: Gu et al.'s threshold of Sink^ε.
SINK_EPSILON = 0.3


def _check(name: str, x: object, dims: int, shape: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a Tensor, got {type(x).__name__}")
    if x.dim() != dims or not x.is_floating_point():
        raise ValueError(f"{name} must be a float tensor of shape {shape}, got {tuple(x.shape)}")
    return x.detach().double()


def _check_position(sink: int, length: int) -> None:
    if isinstance(sink, bool) or not isinstance(sink, int) or not 0 <= sink < length - 1:
        raise ValueError(
            f"sink must be an int position with at least one later token, in [0, {length - 2}], "
            f"got {sink!r}"
        )


def sink_mass(weights: Tensor, sink: int = 0) -> Tensor:
    """Gu et al.'s ``ᾱ_sink`` per sample and head: ``weights (B, H, T, S) -> (B, H)``.

    The mean over the queries ``i >= sink`` (those a causal mask lets see the sink key) of the
    weight on key ``sink``. Rows need not sum to 1 (Softmax_1, clipped and ReLU attention), so the
    mass a head withholds from every key counts as mass not on the sink.
    """
    w = _check("weights", weights, 4, "(B, H, T, S)")
    _check_position(sink, w.shape[-1])
    if w.shape[-2] <= sink:
        raise ValueError(f"weights has {w.shape[-2]} query rows, none at or after {sink}")
    return w[:, :, sink:, sink].mean(dim=-1)


def sink_rate(masses: Tensor, epsilon: float = SINK_EPSILON) -> float:
    """Gu et al.'s Sink^ε: the fraction of heads with sink mass above ``epsilon``.

    Args:
        masses: ``(B, L, H)`` sink masses per sample, layer and head (:func:`sink_mass`
            stacked over layers), or ``(L, H)`` for one sample.
        epsilon: the threshold, in ``(0, 1)``.
    """
    if not isinstance(masses, Tensor) or masses.dim() not in (2, 3) or masses.numel() == 0:
        raise ValueError("masses must be a non-empty tensor of shape (B, L, H) or (L, H)")
    if not 0 < epsilon < 1:
        raise ValueError(f"epsilon must lie in (0, 1), got {epsilon}")
    return float((masses.detach() > epsilon).double().mean())  # compared in their own dtype


def _others_median(norms: Tensor, sink: int) -> Tensor:
    """Median over the last dimension without position ``sink``: ``(..., S) -> (...)`` (the mean
    of the two middle values for an even count, unlike :func:`torch.median`)."""
    others = torch.cat([norms[..., :sink], norms[..., sink + 1 :]], dim=-1)
    return others.quantile(0.5, dim=-1)


def value_norm_ratio(values: Tensor, sink: int = 0) -> Tensor:
    """Value-state drain per sample and head: ``values (B, H, S, E) -> (B, H)``,
    ``‖v_sink‖ / median_{j ≠ sink} ‖v_j‖`` (ℓ2 norms; an all-zero median gives ``inf``)."""
    v = _check("values", values, 4, "(B, H, S, E)")
    _check_position(sink, v.shape[-2])
    norms = v.norm(dim=-1)  # (B, H, S)
    return norms[..., sink] / _others_median(norms, sink)


def residual_peak(hidden: Tensor, sink: int = 0) -> Tensor:
    """Residual-state peak per sample: ``hidden (B, T, D) -> (B,)``,
    ``RMS(h_sink) / median_{j ≠ sink} RMS(h_j)`` with ``RMS(h) = ‖h‖ / √D``."""
    h = _check("hidden", hidden, 3, "(B, T, D)")
    _check_position(sink, h.shape[1])
    rms = h.pow(2).mean(dim=-1).sqrt()  # (B, T)
    return rms[:, sink] / _others_median(rms, sink)

"""Energies of modern Hopfield models and their retrieval dynamics (CCCP steps).

Every energy here has the form (Ramsauer et al. 2020; Hu et al. 2023; Hu et al. 2024)

    H(x) = -β⁻¹ Φ(β Ξᵀx) + ½‖x‖²,

with ``Ξ = [ξ_1, …, ξ_M]`` the memories and ``Φ: R^M → R`` a convex *potential* of the scores.
``½‖x‖²`` is convex and ``-β⁻¹Φ(βΞᵀx)`` concave, so the concave–convex procedure (CCCP; Yuille &
Rangarajan 2003) gives the update ``∇½‖x_{t+1}‖² = ∇_x β⁻¹Φ(βΞᵀx_t)``, i.e.

    x_{t+1} = T(x_t) = Ξ ∇Φ(β Ξᵀx_t),

which never increases ``H``. ``∇Φ`` is the separation map of the model:

=========================  ==============================  ====================================
energy                     potential ``Φ(z)``              ``∇Φ`` (separation)
=========================  ==============================  ====================================
:class:`DenseEnergy`       ``log Σ exp z_μ`` (lse)         softmax
:class:`SinkEnergy`        ``log(e^s + Σ exp z_μ)``        :class:`Sink` (logit ``s``)
:class:`OutEffEnergy`      ``log(n + Σ exp z_μ)`` (lse_n)  Softmax_n (OutEffHop: n = 1)
:class:`TsallisEnergy`     ``max_p ⟨p, z⟩ - Ψ_α(p)``       α-entmax (α = 2: sparsemax)
:class:`PolynomialEnergy`  ``‖max(z, 0)‖_{n+1}``           ``max(z, 0)^n / ‖max(z, 0)‖_{n+1}^n``
=========================  ==============================  ====================================

``Ψ_α(p) = (Σ p_μ^α - 1) / (α(α - 1))`` (``p`` on the simplex Δ) is the negative Tsallis entropy;
its convex conjugate has the gradient α-entmax (Peters et al. 2019), and ``α = 2`` is the sparse
modern Hopfield model of Hu et al. (2023) (Gini entropy, sparsemax). ``OutEffEnergy(n=1)`` adds
the "no-op memory" Ω with ``⟨Ω, x⟩ = 0`` to the dense energy (OutEffHop, eq. 2.4);
:class:`SinkEnergy` generalises it to any fixed sink logit ``s`` (``s = log n``: the no-op memory
scores ``s`` against every state, so its weight ``p_s`` is the mass the update abstains with).

The polynomial energy is the Krotov–Hopfield interaction ``Σ_μ F(ξ_μᵀx)`` with the rectified power
``F(z) = max(z, 0)^{n+1}``, taken to the power ``1/(n+1)`` so that it is 1-homogeneous and balances
``½‖x‖²`` (the role the logarithm plays in lse); ``β`` cancels. Its CCCP weights are proportional to
``max(z, 0)^n`` — the direction of :class:`~hopfield.functional.Polynomial` ``(degree=n)``, whose
weights sum to one instead: ``Polynomial(z) = c(z) · ∇Φ(z)`` with ``c = ‖r‖_{n+1}^n / ‖r‖_n^n ∈
(0, 1]``, ``r = max(z, 0)``. The sum-normalised update is *not* the gradient of any potential (its
Jacobian is not symmetric), so no energy is guaranteed to decrease along it;
:meth:`PolynomialEnergy.update` is the energy-decreasing rule.

Shapes: states ``x`` are rows ``(..., L, d)`` (or a single state ``(d,)``), memories are rows
``(..., M, d)`` (that is ``Ξᵀ``) with broadcastable leading dimensions; energies are ``(..., L)``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
from torch import Tensor

from hopfield.functional.separation import (
    Entmax,
    Polynomial,
    Separation,
    Sink,
    Softmax,
    SoftmaxN,
    Sparsemax,
    entmax,
)

__all__ = [
    "DenseEnergy",
    "Energy",
    "OutEffEnergy",
    "PolynomialEnergy",
    "SinkEnergy",
    "TsallisEnergy",
    "energy_for",
    "scores_of",
]


def _check_beta(beta: float) -> float:
    if isinstance(beta, bool) or not isinstance(beta, int | float):
        raise TypeError(f"beta must be a real number, got {type(beta).__name__}")
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta must be a positive finite number, got {beta}")
    return float(beta)


def _check_pair(x: Tensor, memories: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a Tensor, got {type(x).__name__}")
    if not isinstance(memories, Tensor):
        raise TypeError(f"memories must be a Tensor, got {type(memories).__name__}")
    if not x.is_floating_point() or not memories.is_floating_point():
        raise TypeError("x and memories must be floating point")
    if x.dim() < 1 or memories.dim() < 2:
        raise ValueError(
            f"x must be (..., L, d) or (d,) and memories (..., M, d); got {tuple(x.shape)} "
            f"and {tuple(memories.shape)}"
        )
    if x.shape[-1] != memories.shape[-1]:
        raise ValueError(
            f"x and memories must share the pattern size d; got x {tuple(x.shape)}, "
            f"memories {tuple(memories.shape)}"
        )


def scores_of(x: Tensor, memories: Tensor, beta: float) -> Tensor:
    """Scores ``β Ξᵀx``: ``(..., L, M)`` for states ``(..., L, d)``; ``(M,)`` for ``x`` ``(d,)``."""
    _check_pair(x, memories)
    beta = _check_beta(beta)
    if x.dim() == 1:
        return beta * (memories @ x)
    return beta * (x @ memories.transpose(-1, -2))


class Energy(ABC):
    """``H(x) = -β⁻¹ Φ(βΞᵀx) + ½‖x‖²`` with a convex potential ``Φ``; see the module docstring."""

    @abstractmethod
    def potential(self, scores: Tensor) -> Tensor:
        """``Φ(z)`` over the last dim: ``(..., M) -> (...)``."""

    @abstractmethod
    def weights(self, scores: Tensor) -> Tensor:
        """``∇Φ(z)``: ``(..., M) -> (..., M)``."""

    @abstractmethod
    def separation(self) -> Separation:
        """The separation map whose retrieval ``Ξ sep(βΞᵀx)`` is :meth:`update`, if any."""

    def energy(self, x: Tensor, memories: Tensor, beta: float = 1.0) -> Tensor:
        """``H(x)``: ``(..., L)`` for states ``(..., L, d)``, a scalar for a state ``(d,)``."""
        beta = _check_beta(beta)
        return -self.potential(scores_of(x, memories, beta)) / beta + 0.5 * (x * x).sum(-1)

    def update(self, x: Tensor, memories: Tensor, beta: float = 1.0) -> Tensor:
        """The CCCP step ``T(x) = Ξ ∇Φ(βΞᵀx)``, same shape as ``x``."""
        return self.weights(scores_of(x, memories, beta)) @ memories

    def gradient(self, x: Tensor, memories: Tensor, beta: float = 1.0) -> Tensor:
        """``∇H(x) = x - T(x)``; zero exactly at the fixed points of :meth:`update`."""
        return x - self.update(x, memories, beta)


class SinkEnergy(Energy):
    """Energy with a sink: ``Φ(z) = log(exp(s) + Σ_μ exp z_μ)``, ``H = -β⁻¹Φ(βΞᵀx) + ½‖x‖²``.

    The sink logit ``s`` is compared with the scaled scores ``βξ_μᵀx``, as in
    :class:`~hopfield.functional.Sink` and :func:`~hopfield.functional.associate`. The update is
    ``Ξ Sink_s(βΞᵀx) = σ(lse - s) · Ξ softmax(βΞᵀx)`` (``lse`` of the scores): the abstained mass
    ``p_s = σ(s - lse)`` retrieves nothing (a zero value sink).

    Args:
        logit: the fixed sink logit ``s``, a finite float.
    """

    def __init__(self, logit: float = 0.0) -> None:
        if isinstance(logit, bool) or not isinstance(logit, int | float):
            raise TypeError(f"logit must be a real number, got {type(logit).__name__}")
        if not math.isfinite(logit):
            raise ValueError(f"logit must be finite, got {logit}")
        self.logit = float(logit)

    def potential(self, scores: Tensor) -> Tensor:
        lse = torch.logsumexp(scores, dim=-1)
        return torch.logaddexp(lse, torch.full_like(lse, self.logit))

    def weights(self, scores: Tensor) -> Tensor:
        return self.separation()(scores)

    def separation(self) -> Separation:
        return Sink(self.logit)

    def no_op_mass(self, x: Tensor, memories: Tensor, beta: float = 1.0) -> Tensor:
        """``p_s = exp(s) / (exp(s) + S)``: the weight on the sink, ``(..., L)``."""
        return 1 - self.weights(scores_of(x, memories, beta)).sum(-1)

    def __repr__(self) -> str:
        return f"SinkEnergy(logit={self.logit:g})"


class OutEffEnergy(SinkEnergy):
    """OutEffHop energy with ``lse_n(β, z) = β⁻¹ log(n + Σ_μ exp βz_μ)`` (``n`` no-op memories).

    ``n = 1`` is OutEffHop's outlier-efficient energy (eq. 2.4), ``n = 0`` the dense energy; the
    :class:`SinkEnergy` with ``s = log n``. The update is
    ``Ξ Softmax_n(βΞᵀx) = γ(x) · Ξ softmax(βΞᵀx)`` with ``γ = S / (n + S)``,
    ``S = Σ_μ exp(βξ_μᵀx)``.

    Args:
        n: number of no-op memories (the constant in the denominator), ``n >= 0``.
    """

    def __init__(self, n: float = 1.0) -> None:
        if isinstance(n, bool) or not isinstance(n, int | float):
            raise TypeError(f"n must be a real number, got {type(n).__name__}")
        if not (math.isfinite(n) and n >= 0):
            raise ValueError(f"n must be a finite number >= 0, got {n}")
        self.n = float(n)
        self.logit = math.log(self.n) if self.n > 0 else -math.inf

    def potential(self, scores: Tensor) -> Tensor:
        lse = torch.logsumexp(scores, dim=-1)
        if self.n == 0:
            return lse
        return torch.logaddexp(lse, torch.full_like(lse, math.log(self.n)))

    def separation(self) -> Separation:
        return Softmax() if self.n == 0 else SoftmaxN(self.n)

    def __repr__(self) -> str:
        return f"OutEffEnergy(n={self.n:g})"


class DenseEnergy(OutEffEnergy):
    """The dense modern Hopfield energy ``-lse(β, Ξᵀx) + ½‖x‖²`` (Ramsauer et al. 2020)."""

    def __init__(self) -> None:
        super().__init__(n=0.0)

    def __repr__(self) -> str:
        return "DenseEnergy()"


class TsallisEnergy(Energy):
    """Generalised sparse energy: ``Φ = Ψ_α*``, the conjugate of the negative Tsallis entropy.

    ``Φ(z) = ⟨p*, z⟩ - Ψ_α(p*)`` with ``p* = α-entmax(z)`` and ``Ψ_α(p) = (Σ p^α - 1)/(α(α-1))``.
    ``α = 2`` is the sparse modern Hopfield model (Hu et al. 2023): ``Φ(z) = ½‖z‖² - ½‖z - p*‖²
    + ½`` with ``p* = sparsemax(z)``.

    Args:
        alpha: the entmax parameter in ``(1, 2]``.
    """

    def __init__(self, alpha: float = 2.0) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, int | float):
            raise TypeError(f"alpha must be a real number, got {type(alpha).__name__}")
        if not 1 < alpha <= 2:
            raise ValueError(f"alpha must lie in (1, 2], got {alpha}")
        self.alpha = float(alpha)

    def negative_entropy(self, p: Tensor) -> Tensor:
        """``Ψ_α(p) = (Σ p^α - 1) / (α(α - 1))`` over the last dim, for ``p`` on the simplex."""
        a = self.alpha
        return ((p.clamp_min(0) ** a).sum(-1) - 1) / (a * (a - 1))

    def potential(self, scores: Tensor) -> Tensor:
        p = self.weights(scores)
        return (p * scores).sum(-1) - self.negative_entropy(p)

    def weights(self, scores: Tensor) -> Tensor:
        return entmax(scores, self.alpha, iterations=100)

    def separation(self) -> Separation:
        return Sparsemax() if self.alpha == 2 else Entmax(self.alpha, iterations=100)

    def __repr__(self) -> str:
        return f"TsallisEnergy(alpha={self.alpha:g})"


class PolynomialEnergy(Energy):
    """Krotov–Hopfield polynomial energy ``-‖max(Ξᵀx, 0)‖_{n+1} + ½‖x‖²`` (1-homogeneous form).

    ``β`` cancels. The CCCP weights ``r^n / ‖r‖_{n+1}^n`` (``r = max(z, 0)``) point like
    :class:`~hopfield.functional.Polynomial` ``(degree=n)``; see the module docstring.

    Args:
        degree: the interaction power ``n`` of the weights (a positive int).
    """

    def __init__(self, degree: int = 10) -> None:
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
            raise ValueError(f"degree must be a positive int, got {degree!r}")
        self.degree = degree

    def _scaled(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        r = scores.clamp_min(0)
        peak = r.detach().amax(dim=-1, keepdim=True)
        peak = torch.where(peak > 0, peak, torch.ones_like(peak))
        return r / peak, peak

    def potential(self, scores: Tensor) -> Tensor:
        u, peak = self._scaled(scores)
        p = self.degree + 1
        return peak.squeeze(-1) * (u**p).sum(-1) ** (1 / p)

    def weights(self, scores: Tensor) -> Tensor:
        u, _ = self._scaled(scores)
        n = self.degree
        norm = (u ** (n + 1)).sum(-1, keepdim=True) ** (1 / (n + 1))
        return u**n / torch.where(norm > 0, norm, torch.ones_like(norm)) ** n

    def separation(self) -> Separation:
        """:class:`Polynomial` ``(degree)``: the same direction, weights summing to 1 (not CCCP)."""
        return Polynomial(self.degree)

    def __repr__(self) -> str:
        return f"PolynomialEnergy(degree={self.degree})"


def energy_for(separation: Separation) -> Energy | None:
    """The energy whose CCCP step is the retrieval ``Ξ separation(βΞᵀx)``, or ``None``.

    Softmax → :class:`DenseEnergy`, SoftmaxN(n) → :class:`OutEffEnergy` (n), a fixed
    :class:`Sink` without a value sink → :class:`SinkEnergy`, Sparsemax →
    :class:`TsallisEnergy` (2), a fixed-alpha Entmax → :class:`TsallisEnergy` (alpha). ``None`` for
    maps that are not the gradient of a convex potential (Polynomial, ClippedSoftmax, learnable
    entmax with a tensor alpha).
    """
    if not isinstance(separation, Separation):
        raise TypeError(f"separation must be a Separation, got {type(separation).__name__}")
    if isinstance(separation, Softmax):
        return DenseEnergy()
    if type(separation) is SoftmaxN:
        return OutEffEnergy(separation.n)
    if (
        type(separation) is Sink
        and isinstance(separation.logit, float)
        and separation.value is None
    ):
        return SinkEnergy(separation.logit)
    if isinstance(separation, Sparsemax):
        return TsallisEnergy(2.0)
    if isinstance(separation, Entmax) and not isinstance(separation.alpha, Tensor):
        return TsallisEnergy(float(separation.alpha))
    return None

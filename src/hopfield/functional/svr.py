"""The nonparametric (support vector regression) view of modern Hopfield memories.

Hu et al., "Nonparametric Modern Hopfield Models" (ICML 2025), §3 and App. D.1-D.3: a memory is
a regression ``T(x) = W Φ(x)`` fitted on the pairs ``(ξ_µ + δξ_µ, ξ_µ)`` by the component-wise
ε-SVR (3.2) (no bias)::

    min ½‖W‖² + C Σ_µ ⟨1, η_µ + η̃_µ⟩
    s.t. -(ε·1 + η̃_µ) <= ξ_µ - W Φ(ξ_µ + δξ_µ) <= ε·1 + η_µ,   η_µ, η̃_µ >= 0,
         ε·1 + η_µ <= (ϵ/√d)·1,  ε·1 + η̃_µ <= (ϵ/√d)·1   (only if a retrieval error ϵ is given).

Theorem 3.1: ``w*_i = Σ_µ (α_µ[i] - α̃_µ[i]) Φ(ξ_µ + δξ_µ)``, so the retrieval map is
``T_SVR(x)[i] = Σ_µ (α_µ[i] - α̃_µ[i]) K(ξ_µ + δξ_µ, x)`` (3.3). :func:`fit_svr` solves the dual
per output component, ``min_b ½ bᵀKb - yᵀb + Σ_µ ψ(b_µ)`` with ``b = α - α̃`` and
``ψ(b) = ε|b|`` for ``|b| <= C`` (and ``ϵ/√d·|b| - (ϵ/√d - ε)C`` beyond ``C`` when the retrieval
error bounds the slacks), by exact coordinate descent, then polishes the active set (a linear
solve on the free coefficients) so the KKT conditions hold to rounding.

Lemma 3.1 / Theorem 3.2: with the exponential kernel ``K(x, y) = exp(β⟨x, y⟩)`` (whose explicit
feature map is :func:`exponential_features`) normalised by ``h(x) = Σ_{ν∈𝓜} K(ξ_ν + δξ_ν, x)``
(:class:`NormalizedKernel`) and the paper's identification of ``(α_µ - α̃_µ)/h(ξ_µ + δξ_µ)`` with
``ξ_µ``, the SVR map is ``Ξ_𝓜 Softmax(β Ξ_δ,𝓜ᵀ x)``: :func:`nonparametric_dense` builds that
memory. A fitted SVR on the same kernel only approaches it (its coefficients solve the
regression, they are not set to ``ξ_µ``); ``theory`` reports by how much.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from hopfield._validation import check_bool, check_int, check_real, check_tensor

__all__ = [
    "ExponentialKernel",
    "Kernel",
    "NormalizedKernel",
    "SVRMemory",
    "exponential_features",
    "fit_svr",
    "linear_kernel",
    "nonparametric_dense",
    "primal_objective",
]

Kernel = Callable[[Tensor, Tensor], Tensor]
"""A positive semi-definite kernel on rows: ``(N, d), (P, d) -> (N, P)``."""

POLISH_EVERY = 10  # coordinate-descent sweeps between two active-set polishes
KKT_EXACT = 1e-12  # a polished solution this close to the KKT conditions ends the fit


def linear_kernel(a: Tensor, b: Tensor) -> Tensor:
    """``K(x, y) = ⟨x, y⟩`` (feature map the identity): ``(N, d), (P, d) -> (N, P)``."""
    return a @ b.transpose(-1, -2)


class ExponentialKernel:
    """``K(x, y) = exp(β⟨x, y⟩)`` (nonparametric (D.6)); its features: :func:`exponential_features`.

    Computed directly (no log-space), so ``β⟨x, y⟩`` must stay below ~700 in float64.
    """

    def __init__(self, beta: float) -> None:
        self.beta = check_real("beta", beta, low=0.0, low_open=True)

    def __call__(self, a: Tensor, b: Tensor) -> Tensor:
        """``(N, d), (P, d) -> (N, P)``."""
        return torch.exp(self.log(a, b))

    def log(self, a: Tensor, b: Tensor) -> Tensor:
        """``log K(a, b) = β⟨a, b⟩``: ``(N, d), (P, d) -> (N, P)``."""
        return self.beta * linear_kernel(a, b)

    def __repr__(self) -> str:
        return f"ExponentialKernel(beta={self.beta:g})"


class NormalizedKernel:
    """``K̄(x, y) = K(x, y) / (h(x) h(y))`` with ``h(x) = Σ_{ν∈𝓜} K(a_ν, x)`` (nonparametric (D.4)).

    The feature map ``Φ(x)/h(x)`` of Lemma 3.1 (``mask = None``: every anchor) and Theorem 3.2
    (``mask``: the support 𝓜). Computed in log space (``log K - log h(x) - log h(y)``, with
    ``log h`` a log-sum-exp), so a query far from every anchor gives finite values, not ``0/0``.

    Args:
        kernel: the base kernel ``K`` (positive values; :class:`ExponentialKernel` uses its exact
            logarithm ``β⟨x, y⟩``).
        anchors: the contaminated memories ``ξ_ν + δξ_ν``, ``(M, d)``.
        mask: boolean ``(M,)``, ``True`` for ``ν ∈ 𝓜`` (``None``: all).
    """

    def __init__(self, kernel: Kernel, anchors: Tensor, mask: Tensor | None = None) -> None:
        if not callable(kernel):
            raise TypeError(f"kernel must be callable, got {type(kernel).__name__}")
        self.kernel = kernel
        self.anchors = _check_rows("anchors", anchors)
        self.mask = _check_support("mask", mask, anchors.shape[0], anchors.device)

    def h(self, x: Tensor) -> Tensor:
        """``h(x) = Σ_{ν∈𝓜} K(a_ν, x)``: ``(N, d) -> (N,)``."""
        return torch.exp(self.log_h(x))

    def log_h(self, x: Tensor) -> Tensor:
        """``log h(x)``: ``(N, d) -> (N,)``."""
        return torch.logsumexp(self._log_kernel(x, self.anchors[self.mask]), dim=-1)

    def __call__(self, a: Tensor, b: Tensor) -> Tensor:
        """``(N, d), (P, d) -> (N, P)``."""
        log = self._log_kernel(a, b) - self.log_h(a)[:, None] - self.log_h(b)[None, :]
        return torch.exp(log)

    def _log_kernel(self, a: Tensor, b: Tensor) -> Tensor:
        if isinstance(self.kernel, ExponentialKernel):
            return self.kernel.log(a, b)
        return torch.log(self.kernel(a, b))


def exponential_features(x: Tensor, beta: float, degree: int) -> Tensor:
    """The exponential kernel's feature map (Lemmas D.2, D.3), truncated at ``degree``.

    ``φ^(n)_D(x) = Π_j (√β x_j)^{ℓ_j} / √(ℓ_j!)`` for every multi-index ``ℓ`` with
    ``ℓ_1 + … + ℓ_d = n <= degree``, so that
    ``⟨Φ(x), Φ(y)⟩ = Σ_{n<=degree} (β⟨x, y⟩)^n / n!`` (``→ exp(β⟨x, y⟩)``).

    Args:
        x: ``(N, d)``.
        beta: β > 0.
        degree: the largest total degree ``n`` (``>= 0``).

    Returns:
        ``(N, D)`` with ``D = C(d + degree, degree)``.
    """
    x = _check_rows("x", x)
    beta = check_real("beta", beta, low=0.0, low_open=True)
    degree = check_int("degree", degree, minimum=0)
    d = x.shape[-1]
    powers = [
        np.bincount(np.array(combo, dtype=np.int64), minlength=d)
        for n in range(degree + 1)
        for combo in itertools.combinations_with_replacement(range(d), n)
    ]
    exponents = torch.from_numpy(np.stack(powers)).to(x.dtype)
    log_factorial = torch.lgamma(exponents + 1).sum(-1)
    scale = torch.exp(-0.5 * log_factorial)
    return scale * ((math.sqrt(beta) * x)[:, None, :] ** exponents).prod(-1)


@dataclass
class SVRMemory:
    """A fitted (or constructed) SVR memory ``T(x)[i] = Σ_µ coef[µ, i] K(keys_µ, x)`` (3.3).

    Attributes:
        keys: the contaminated memories ``ξ_µ + δξ_µ``, ``(M, d)``.
        targets: the memories ``ξ_µ``, ``(M, d_out)``.
        coef: the dual coefficients ``α_µ[i] - α̃_µ[i]``, ``(M, d_out)`` (zero outside the support).
        kernel: the kernel ``K``.
        support: boolean ``(M,)``: the support set 𝓜 of Definition 3.3 (all ``True``: dense).
        epsilon, C: the SVR tube ``ε`` and penalty ``C`` (``nan`` for a constructed memory).
        retrieval_error: the retrieval error ϵ bounding the slacks (``None``: unbounded).
        kkt_violation: the largest violation of the dual optimality conditions (0 when exact).
        sweeps: coordinate-descent sweeps the fit took.
    """

    keys: Tensor
    targets: Tensor
    coef: Tensor
    kernel: Kernel
    support: Tensor
    epsilon: float = math.nan
    C: float = math.nan
    retrieval_error: float | None = None
    kkt_violation: float = 0.0
    sweeps: int = 0

    @property
    def support_vectors(self) -> Tensor:
        """Indices of the memories with a nonzero coefficient in some component: ``(S,)``."""
        return torch.nonzero((self.coef != 0).any(-1)).flatten()

    def __call__(self, x: Tensor) -> Tensor:
        """The retrieval map (3.3): ``(..., d) -> (..., d_out)``."""
        x = check_tensor("x", x)
        if x.shape[-1] != self.keys.shape[-1]:
            raise ValueError(f"x must end in d={self.keys.shape[-1]}, got shape {tuple(x.shape)}")
        flat = x.reshape(-1, x.shape[-1]).to(self.coef.dtype)
        used = self.support_vectors
        out = self.kernel(flat, self.keys[used]) @ self.coef[used]
        return out.reshape(*x.shape[:-1], self.coef.shape[-1])

    def weights(self, features: Callable[[Tensor], Tensor]) -> Tensor:
        """Theorem 3.1's primal solution ``W* = Σ_µ coef_µ Φ(keys_µ)ᵀ``: ``(d_out, D_Φ)``.

        Args:
            features: the explicit feature map ``Φ: (N, d) -> (N, D_Φ)`` of the kernel.
        """
        return self.coef.transpose(0, 1) @ features(self.keys)

    def dual_objective(self) -> float:
        """The dual value ``Σ_i [-½ b_iᵀ K b_i + y_iᵀ b_i - Σ_µ ψ(b_µ[i])]`` (over the support)."""
        s = self.support
        b, y = self.coef[s], self.targets[s]
        gram = self.kernel(self.keys[s], self.keys[s])
        quadratic = (b * (gram @ b)).sum()
        penalty = _dual_penalty(b, self.epsilon, self.C, _tube(self.retrieval_error, y))
        return float(-0.5 * quadratic + (y * b).sum() - penalty)


def primal_objective(
    weights: Tensor,
    features: Tensor,
    targets: Tensor,
    *,
    epsilon: float,
    C: float,
    retrieval_error: float | None = None,
) -> float:
    """The primal value ``½‖W‖² + C Σ_µ Σ_i max(0, |ξ_µ[i] - (WΦ_µ)[i]| - ε)`` of (3.2).

    Args:
        weights: ``W``, ``(d_out, D_Φ)``.
        features: ``Φ(ξ_µ + δξ_µ)`` of the memories in the support, ``(M, D_Φ)``.
        targets: ``ξ_µ``, ``(M, d_out)``.
        epsilon, C, retrieval_error: as :func:`fit_svr`.

    Returns:
        The value; ``inf`` if a residual leaves the retrieval tube ``ϵ/√d_out`` (beyond rounding).
    """
    residual = (targets - features @ weights.transpose(0, 1)).abs()
    tube = _tube(retrieval_error, targets)
    if float(residual.max()) > tube * (1 + 1e-9) + 1e-12:
        return math.inf
    slack = (residual - epsilon).clamp_min(0).sum()
    return float(0.5 * (weights**2).sum() + C * slack)


def fit_svr(
    keys: Tensor,
    targets: Tensor,
    kernel: Kernel,
    *,
    epsilon: float = 0.0,
    C: float = 1.0,
    retrieval_error: float | None = None,
    mask: Tensor | None = None,
    tol: float = 1e-12,
    max_sweeps: int = 10_000,
    polish: bool = True,
) -> SVRMemory:
    """Fit the SVR memory (3.2) (or the masked SVR (3.6)) on ``(keys_µ, targets_µ)``.

    Every output component is an independent SVR sharing the Gram matrix ``K(keys, keys)``. The
    fit runs in float64; the returned coefficients keep the dtype of ``keys``.

    Args:
        keys: the contaminated memories ``ξ_µ + δξ_µ``, ``(M, d)``.
        targets: the memories ``ξ_µ``, ``(M, d_out)``.
        kernel: ``K`` (:func:`linear_kernel`, :class:`ExponentialKernel`,
            :class:`NormalizedKernel`, or any positive semi-definite callable on rows).
        epsilon: the component-wise tube ``ε >= 0``.
        C: the penalty ``C > 0``.
        retrieval_error: ϵ > 0: bound every component error by ``ϵ/√d_out`` (needs
            ``ε <= ϵ/√d_out``); ``None``: the plain ε-SVR. With a bound and a singular Gram
            matrix the problem can be infeasible (the fit then reports a large ``kkt_violation``).
        mask: boolean ``(M,)``, the support 𝓜 of Definition 3.3 (``None``: every memory).
        tol: stop the sweeps once no coefficient moves by more than ``tol · max(1, max|b|)``.
        max_sweeps: the most coordinate-descent sweeps.
        polish: re-solve the free coefficients on the final active set (exact KKT).

    Returns:
        The :class:`SVRMemory`.

    Raises:
        TypeError, ValueError: for bad arguments (named in the message).
    """
    keys = _check_rows("keys", keys)
    targets = _check_rows("targets", targets)
    if targets.shape[0] != keys.shape[0]:
        raise ValueError(
            f"targets must have one row per key ({keys.shape[0]}), got {targets.shape[0]}"
        )
    if not callable(kernel):
        raise TypeError(f"kernel must be callable, got {type(kernel).__name__}")
    epsilon = check_real("epsilon", epsilon, low=0.0)
    C = check_real("C", C, low=0.0, low_open=True)
    tube = _check_retrieval_error(retrieval_error, epsilon, targets.shape[-1])
    support = _check_support("mask", mask, keys.shape[0], keys.device)
    tol = check_real("tol", tol, low=0.0)
    max_sweeps = check_int("max_sweeps", max_sweeps)
    polish = check_bool("polish", polish)
    gram = kernel(keys[support], keys[support])
    if gram.shape != (int(support.sum()),) * 2:
        raise ValueError(f"kernel must map (N, d), (P, d) to (N, P), got {tuple(gram.shape)}")
    if not bool(torch.isfinite(gram).all()):
        raise ValueError(
            "kernel: the Gram matrix K(keys, keys) has NaN or inf entries (an exponential "
            "kernel overflows for a large β·⟨key, key⟩)"
        )
    problem = _Dual(  # solved on the CPU (numpy), whatever the device of the memories
        gram.detach().double().cpu().numpy(),
        targets[support].detach().double().cpu().numpy(),
        epsilon,
        C,
        tube,
    )
    b, sweeps = problem.solve(tol, max_sweeps, polish)
    coef = torch.zeros(targets.shape, dtype=keys.dtype, device=keys.device)
    coef[support] = torch.from_numpy(b).to(keys.device, keys.dtype)
    return SVRMemory(
        keys, targets, coef, kernel, support, epsilon, C, retrieval_error,
        problem.kkt_violation(b), sweeps,
    )  # fmt: skip


def nonparametric_dense(
    keys: Tensor, values: Tensor, beta: float, mask: Tensor | None = None
) -> SVRMemory:
    """The memory of Lemma 3.1 (``mask = None``) and Theorem 3.2 (support ``mask``).

    The kernel is the exponential kernel normalised over the support (:class:`NormalizedKernel`),
    and the coefficients follow the proof's identification ``(α_µ - α̃_µ) / h(ξ_µ + δξ_µ) = ξ_µ``,
    so the map is ``Ξ_𝓜 Softmax(β Ξ_δ,𝓜ᵀ x)`` (the softmax over the support only).

    Args:
        keys: ``Ξ_δ`` as rows, ``(M, d)``.
        values: ``Ξ`` as rows, ``(M, d_out)``.
        beta: β > 0.
        mask: boolean ``(M,)`` support (``None``: dense).
    """
    keys = _check_rows("keys", keys)
    values = _check_rows("values", values)
    if values.shape[0] != keys.shape[0]:
        raise ValueError(
            f"values must have one row per key ({keys.shape[0]}), got {values.shape[0]}"
        )
    kernel = NormalizedKernel(ExponentialKernel(beta), keys, mask)
    support = kernel.mask
    coef = torch.where(support[:, None], kernel.h(keys)[:, None] * values, 0.0)
    return SVRMemory(keys, values, coef, kernel, support)


# ------------------------------------------------------------------------------------------------
# The dual problem (numpy float64; one column per output component)
# ------------------------------------------------------------------------------------------------


class _Dual:
    """``min_b ½ bᵀGb - yᵀb + Σ ψ(b)`` per column of ``y (M, d_out)``; ``G (M, M)``."""

    def __init__(self, gram: np.ndarray, y: np.ndarray, epsilon: float, C: float, tube: float):
        self.gram, self.y, self.epsilon, self.C, self.tube = gram, y, epsilon, C, tube
        self.diagonal = np.diag(gram).copy()
        if (self.diagonal <= 0).any():
            raise ValueError("kernel must be positive on the diagonal (K(x, x) > 0)")

    def step(self, g: np.ndarray, k: float) -> np.ndarray:
        """The exact minimiser of ``½k t² + g t + ψ(t)`` for every entry of ``g``."""
        inner = -_soft(g, self.epsilon) / k
        outer = -_soft(g, self.tube) / k if math.isfinite(self.tube) else np.zeros_like(g)
        clipped = np.sign(inner) * self.C
        return np.where(
            np.abs(inner) <= self.C, inner, np.where(np.abs(outer) >= self.C, outer, clipped)
        )

    def solve(self, tol: float, max_sweeps: int, polish: bool) -> tuple[np.ndarray, int]:
        """Coordinate descent from ``b = 0`` in rounds of ``POLISH_EVERY`` sweeps; with ``polish``,
        each round ends with an active-set polish, and an exact (KKT) polish stops the fit.

        Returns ``b`` and the sweeps taken.
        """
        b, sweeps = np.zeros_like(self.y), 0
        while sweeps < max_sweeps:
            b, taken, settled = self.descend(b, tol, min(POLISH_EVERY, max_sweeps - sweeps))
            sweeps += taken
            if polish:
                polished = self.polish(b)
                if self.kkt_violation(polished) <= KKT_EXACT:
                    return polished, sweeps
            if settled:
                break
        return (self.polish(b) if polish else b), sweeps

    def descend(self, b: np.ndarray, tol: float, sweeps: int) -> tuple[np.ndarray, int, bool]:
        """At most ``sweeps`` cyclic coordinate-descent sweeps from ``b``; returns ``b``, the
        sweeps taken and whether no coefficient moved by more than ``tol · max(1, max|b|)``."""
        b = b.copy()
        prediction = self.gram @ b
        for sweep in range(1, sweeps + 1):
            largest = 0.0
            for mu in range(b.shape[0]):
                g = prediction[mu] - self.diagonal[mu] * b[mu] - self.y[mu]
                new = self.step(g, self.diagonal[mu])
                delta = new - b[mu]
                moved = float(np.abs(delta).max())
                if moved > 0:
                    prediction += np.outer(self.gram[:, mu], delta)
                    b[mu] = new
                    largest = max(largest, moved)
            if largest <= tol * max(1.0, float(np.abs(b).max())):
                return b, sweep, True
        return b, sweeps, False

    def polish(self, b: np.ndarray) -> np.ndarray:
        """Re-solve the free coefficients (off the kinks ``0``, ``±C``) of every column so their
        residuals ``y - Gb`` sit exactly at ``±ε`` (or ``±ϵ/√d`` beyond ``C``); columns sharing an
        active set are solved together. A column keeps the result only if it is closer to KKT."""
        magnitude = np.abs(b)
        free = (magnitude > 0) & (magnitude != self.C)
        target = self.y - np.where(magnitude < self.C, self.epsilon, self.tube) * np.sign(b)
        groups: dict[bytes, list[int]] = {}
        for i in range(b.shape[1]):
            groups.setdefault(free[:, i].tobytes(), []).append(i)
        out = b.copy()
        for columns in groups.values():
            rows = free[:, columns[0]]
            if not rows.any():
                continue
            fixed = ~rows
            rhs = (
                target[np.ix_(rows, columns)]
                - self.gram[np.ix_(rows, fixed)] @ b[np.ix_(fixed, columns)]
            )
            # Least squares: with a singular Gram matrix (e.g. the linear kernel with M > d) the
            # coefficients are not unique, the predictions are; the minimum-norm one is taken.
            solved = np.linalg.lstsq(self.gram[np.ix_(rows, rows)], rhs, rcond=None)[0]
            out[np.ix_(rows, columns)] = solved
        better = self._violations(out) <= self._violations(b)
        return np.where(better[None, :], out, b)

    def _violations(self, b: np.ndarray) -> np.ndarray:
        """The largest KKT violation of every column: ``(d_out,)``."""
        residual = self.y - self.gram @ b
        return _kkt(b, residual, self.epsilon, self.C, self.tube).max(axis=0, initial=0.0)

    def kkt_violation(self, b: np.ndarray) -> float:
        """The largest KKT violation over every coefficient, relative to ``1 + max|y|``."""
        worst = float(self._violations(b).max(initial=0.0))
        return worst / (1.0 + float(np.abs(self.y).max(initial=0.0)))


def _kkt(b: np.ndarray, residual: np.ndarray, epsilon: float, C: float, tube: float) -> np.ndarray:
    """How far each residual ``y - Gb`` is from what the coefficient's segment demands."""
    s, r, mag = np.sign(b), residual, np.abs(b)
    upper = tube if math.isfinite(tube) else np.inf
    zero = np.maximum(np.abs(r) - epsilon, 0.0)
    inside = np.abs(s * r - epsilon)
    at_c = np.maximum(epsilon - s * r, 0.0) + np.maximum(s * r - upper, 0.0)
    beyond = np.abs(s * r - tube) if math.isfinite(tube) else np.full_like(r, np.inf)
    return np.where(mag == 0, zero, np.where(mag < C, inside, np.where(mag == C, at_c, beyond)))


def _soft(g: np.ndarray, threshold: float) -> np.ndarray:
    return np.sign(g) * np.maximum(np.abs(g) - threshold, 0.0)


def _dual_penalty(b: Tensor, epsilon: float, C: float, tube: float) -> Tensor:
    """``Σ ψ(b)``: ``ε|b|`` up to ``C``, then slope ``ϵ/√d`` (or ``∞`` without a bound)."""
    mag = b.abs()
    beyond = (mag - C).clamp_min(0)
    if not math.isfinite(tube):
        return (epsilon * mag).sum() + torch.where(beyond > 0, math.inf, 0.0).sum()
    return (epsilon * mag.clamp_max(C) + tube * beyond).sum()


def _tube(retrieval_error: float | None, targets: Tensor) -> float:
    """``ϵ / √d_out`` (``inf`` without a retrieval error)."""
    if retrieval_error is None:
        return math.inf
    return retrieval_error / math.sqrt(targets.shape[-1])


def _check_retrieval_error(value: float | None, epsilon: float, d_out: int) -> float:
    if value is None:
        return math.inf
    value = check_real("retrieval_error", value, low=0.0, low_open=True)
    tube = value / math.sqrt(d_out)
    if epsilon > tube:
        raise ValueError(
            f"epsilon ({epsilon:g}) must be <= retrieval_error/√d_out ({tube:g}): "
            "the tube ε·1 + η_µ <= (ϵ/√d)·1 of (3.2) is empty otherwise"
        )
    return tube


def _check_rows(name: str, value: Tensor) -> Tensor:
    check_tensor(name, value)
    if not value.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {value.dtype}")
    if value.dim() != 2 or value.shape[0] == 0 or value.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty matrix (rows, dim), got {tuple(value.shape)}")
    finite = torch.isfinite(value).all(dim=1)
    if not bool(finite.all()):
        row = int((~finite).nonzero()[0])
        raise ValueError(f"{name} must be finite, got NaN or inf in row {row}")
    return value


def _check_support(name: str, mask: Tensor | None, size: int, device: torch.device) -> Tensor:
    """The support as a boolean ``(size,)`` tensor on ``device`` (the memories'; all ``True``
    for ``None``); never empty."""
    if mask is None:
        return torch.ones(size, dtype=torch.bool, device=device)
    check_tensor(name, mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a boolean Tensor, got {mask.dtype}")
    if mask.shape != (size,):
        raise ValueError(
            f"{name} must have shape ({size},) (one flag per memory), got {tuple(mask.shape)}"
        )
    if not bool(mask.any()):
        raise ValueError(f"{name} must keep at least one memory (the support 𝓜 is empty)")
    return mask.to(device)

"""Separation maps: how association scores become weights.

Each map is a :class:`torch.nn.Module` applied over the last dimension of a score tensor
``(..., S)``; masked entries are ``-inf``. A fully masked row (all ``-inf``) gives all zeros with
finite gradients; an empty last dimension (``S = 0``) gives an empty tensor, as in torch. NaN or
inf in unmasked scores propagate as in torch. Half-precision scores are computed in float32 and
cast back.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from hopfield._validation import check_int
from hopfield._validation import check_real as _check_real

_HALF = (torch.float16, torch.bfloat16)


def _upcast(scores: Tensor) -> Tensor:
    return scores.float() if scores.dtype in _HALF else scores


class Separation(nn.Module):
    """Base class of separation maps.

    Attributes:
        zero_keys: for the fused :func:`~torch.nn.functional.scaled_dot_product_attention` path,
            the number of all-zero keys and values whose softmax equals this map (0 for softmax,
            ``n`` for ``SoftmaxN`` with integer ``n``), or ``None`` where no such identity exists.
    """

    zero_keys: int | None = None

    def forward(self, scores: Tensor) -> Tensor:
        """Weights ``(..., S)`` for scores ``(..., S)``."""
        if not isinstance(scores, Tensor):
            raise TypeError(f"scores must be a Tensor, got {type(scores).__name__}")
        if not scores.is_floating_point():
            raise TypeError(f"scores must be floating point, got {scores.dtype}")
        if scores.shape[-1] == 0:  # no keys: no weights, as torch.softmax
            empty = scores.clone()
            for parameter in self.parameters():  # zero gradients, as nn.Linear on no rows
                empty = empty + 0 * parameter.sum()
            return empty
        return self.separate(_upcast(scores)).to(scores.dtype)

    def separate(self, scores: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


class SoftmaxN(Separation):
    """Softmax_n: ``exp(z_i) / (n + Σ_j exp(z_j))`` (OutEffHop's Softmax_1 for ``n = 1``).

    Equivalent to a softmax with ``n`` extra logits fixed at 0 ("no-op memories") whose weights
    are dropped. Computed with the shift ``m = max(0, max_j z_j)``: nothing overflows and a fully
    masked row gives zeros. ``n = 0`` is the ordinary softmax.

    Args:
        n: the constant added to the denominator, ``n >= 0``.
    """

    def __init__(self, n: float = 1.0) -> None:
        super().__init__()
        self.n = _check_real("n", n)
        if self.n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self.zero_keys = int(self.n) if self.n == int(self.n) else None

    def separate(self, scores: Tensor) -> Tensor:
        shift = scores.detach().amax(dim=-1, keepdim=True)
        if self.n > 0:
            shift = shift.clamp_min(0.0)
        # A fully masked row has shift -inf; any finite shift gives the same (zero) result.
        # NaN and +inf are left alone so that they propagate as in torch.softmax.
        shift = torch.where(shift == -math.inf, torch.zeros_like(shift), shift)
        numerator = torch.exp(scores - shift)
        denominator = numerator.sum(dim=-1, keepdim=True)
        if self.n > 0:
            denominator = denominator + self.n * torch.exp(-shift)
        return numerator / torch.where(denominator == 0, torch.ones_like(denominator), denominator)

    def extra_repr(self) -> str:
        return f"n={self.n:g}"


class Softmax(SoftmaxN):
    """The softmax ``exp(z_i) / Σ_j exp(z_j)``; a fully masked row gives zeros, not NaN."""

    def __init__(self) -> None:
        super().__init__(n=0.0)

    def extra_repr(self) -> str:
        return ""


class ClippedSoftmax(Separation):
    """Clipped softmax of Bondarenko et al.: ``clip((zeta - gamma) · base(z) + gamma, 0, 1)``.

    Weights below ``-gamma / (zeta - gamma)`` become exactly 0 and those above
    ``(1 - gamma) / (zeta - gamma)`` exactly 1, with zero gradient there. Every weight lies in
    ``[0, 1]``; a row sums to at most ``zeta - gamma``, not to 1 in general (it does for
    ``gamma = 0, zeta = 1`` with the softmax base).

    Args:
        gamma: lower stretch, ``gamma <= 0``.
        zeta: upper stretch, ``zeta >= 1``.
        base: the map that is stretched, :class:`Softmax` (default) or :class:`SoftmaxN`.
    """

    def __init__(
        self, gamma: float = 0.0, zeta: float = 1.0, base: Separation | None = None
    ) -> None:
        super().__init__()
        self.gamma = _check_real("gamma", gamma)
        self.zeta = _check_real("zeta", zeta)
        if self.gamma > 0:
            raise ValueError(f"gamma must be <= 0, got {gamma}")
        if self.zeta < 1:
            raise ValueError(f"zeta must be >= 1, got {zeta}")
        base = Softmax() if base is None else base
        if not isinstance(base, SoftmaxN):
            raise TypeError(f"base must be Softmax() or SoftmaxN(...), got {type(base).__name__}")
        self.base = base

    @classmethod
    def from_alpha(
        cls, alpha: float, length: int, zeta: float = 1.0, base: Separation | None = None
    ) -> ClippedSoftmax:
        """The parametrisation ``gamma = -alpha / length`` (``length`` = sequence length T)."""
        alpha = _check_real("alpha", alpha)
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if not isinstance(length, int) or length < 1:
            raise ValueError(f"length must be a positive int, got {length!r}")
        return cls(gamma=-alpha / length, zeta=zeta, base=base)

    def separate(self, scores: Tensor) -> Tensor:
        stretched = (self.zeta - self.gamma) * self.base.separate(scores) + self.gamma
        return stretched.clamp(0.0, 1.0)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma:g}, zeta={self.zeta:g}"


class Polynomial(Separation):
    """Krotov–Hopfield polynomial weights ``max(z_i, 0)^degree / Σ_j max(z_j, 0)^degree``.

    Rows without a positive score give zeros. Invariant to a positive scale of the scores.

    Args:
        degree: the interaction power, a positive int.
    """

    def __init__(self, degree: int = 10) -> None:
        super().__init__()
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
            raise ValueError(f"degree must be a positive int, got {degree!r}")
        self.degree = degree

    def separate(self, scores: Tensor) -> Tensor:
        positive = scores.clamp_min(0.0)
        peak = positive.detach().amax(dim=-1, keepdim=True)
        peak = torch.where(peak == 0, torch.ones_like(peak), peak)
        powered = (positive / peak) ** self.degree
        total = powered.sum(dim=-1, keepdim=True)
        return powered / torch.where(total == 0, torch.ones_like(total), total)

    def extra_repr(self) -> str:
        return f"degree={self.degree}"


# --------------------------------------------------------------------------------------------
# The alpha-entmax family: p_i = [(alpha - 1) z_i - tau]_+ ^ (1 / (alpha - 1)), sum_i p_i = 1.
# alpha = 2 is sparsemax, alpha = 1.5 has an exact sort-based threshold, any alpha in (1, 2]
# is found by bisection. One autograd function gives the gradients for all of them.
# --------------------------------------------------------------------------------------------

# After the shift by the row maximum, the threshold lies in [-1, 0): entries at -2 are always zero.
_OUTSIDE = -2.0


def _shifted(scores: Tensor, alpha: Tensor | float) -> tuple[Tensor, Tensor]:
    """``(alpha - 1) · z - max``, masked entries at -2, and the row validity ``(..., 1)``."""
    kept = scores != -math.inf  # NaN and +inf are kept: they propagate as in torch.softmax
    valid = kept.any(dim=-1, keepdim=True)
    x = torch.where(kept, scores, torch.zeros_like(scores)) * (alpha - 1)
    peak = torch.where(kept, x, torch.full_like(x, -math.inf)).amax(dim=-1, keepdim=True)
    peak = torch.where(valid, peak, torch.zeros_like(peak))
    return torch.where(kept, x - peak, torch.full_like(x, _OUTSIDE)), valid


def _sparsemax_threshold(x: Tensor) -> Tensor:
    ordered = x.sort(dim=-1, descending=True).values
    ranks = torch.arange(1, x.shape[-1] + 1, device=x.device, dtype=x.dtype)
    cumulative = ordered.cumsum(dim=-1)
    # At least one: a row with NaN (or +inf) has no support and gives NaN instead of failing.
    support = (1 + ranks * ordered > cumulative).sum(dim=-1, keepdim=True).clamp_min(1)
    return (cumulative.gather(-1, support - 1) - 1) / support.to(x.dtype)


def _entmax15_threshold(x: Tensor) -> Tensor:
    ordered = x.sort(dim=-1, descending=True).values
    ranks = torch.arange(1, x.shape[-1] + 1, device=x.device, dtype=x.dtype)
    mean = ordered.cumsum(dim=-1) / ranks
    mean_sq = (ordered**2).cumsum(dim=-1) / ranks
    delta = (1 - ranks * (mean_sq - mean**2)) / ranks
    tau = mean - delta.clamp_min(0).sqrt()
    support = (tau <= ordered).sum(dim=-1, keepdim=True).clamp_min(1)  # >= 1 as above
    return tau.gather(-1, support - 1)


def _bisect_threshold(x: Tensor, alpha: Tensor, iterations: int) -> Tensor:
    power = 1.0 / (alpha - 1)
    count = (x > _OUTSIDE).sum(dim=-1, keepdim=True).clamp_min(1).to(x.dtype)
    low = torch.full_like(x[..., :1], -1.0)
    high = -((1.0 / count) ** (alpha - 1))
    for _ in range(iterations):
        middle = (low + high) / 2
        mass = ((x - middle).clamp_min(0) ** power).sum(dim=-1, keepdim=True)
        too_much = mass >= 1
        low = torch.where(too_much, middle, low)
        high = torch.where(too_much, high, middle)
    return (low + high) / 2


class _Entmax(torch.autograd.Function):
    """alpha-entmax over the last dim, with gradients for the scores and for alpha."""

    @staticmethod
    def forward(ctx: Any, scores: Tensor, alpha: Tensor, iterations: int) -> Tensor:
        x, valid = _shifted(scores, alpha)
        if alpha.numel() == 1 and float(alpha) == 2.0:
            p = (x - _sparsemax_threshold(x)).clamp_min(0)
        elif alpha.numel() == 1 and float(alpha) == 1.5:
            p = (x - _entmax15_threshold(x)).clamp_min(0) ** 2
        else:
            p = (x - _bisect_threshold(x, alpha, iterations)).clamp_min(0) ** (1.0 / (alpha - 1))
            total = p.sum(dim=-1, keepdim=True)
            p = p / torch.where(total == 0, torch.ones_like(total), total)
        p = p * valid
        ctx.save_for_backward(p, scores, alpha)
        return p

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        p, scores, alpha = ctx.saved_tensors
        inside = p > 0
        s = torch.where(inside, p.clamp_min(torch.finfo(p.dtype).tiny) ** (2 - alpha), 0.0)
        s_total = s.sum(dim=-1, keepdim=True)
        s_total = torch.where(s_total > 0, s_total, torch.ones_like(s_total))
        grad_scores = s * (grad - (s * grad).sum(dim=-1, keepdim=True) / s_total)
        grad_alpha = None
        if ctx.needs_input_grad[1]:
            z = torch.where(inside, scores, torch.zeros_like(scores))
            p_log_p = torch.where(inside, p * p.clamp_min(torch.finfo(p.dtype).tiny).log(), 0.0)
            tau_grad = ((s * z).sum(-1, keepdim=True) - p_log_p.sum(-1, keepdim=True)) / s_total
            dp_dalpha = (-p_log_p + s * (z - tau_grad)) / (alpha - 1)
            grad_alpha = (grad * dp_dalpha).sum(dim=-1, keepdim=True).sum_to_size(alpha.shape)
        return grad_scores, grad_alpha, None


def entmax(scores: Tensor, alpha: Tensor | float = 1.5, iterations: int = 50) -> Tensor:
    """alpha-entmax of ``scores (..., S)`` over the last dim (masked entries ``-inf``).

    ``alpha`` is a float in ``(1, 2]`` or a tensor broadcastable to ``scores[..., :1]``
    (gradients flow to it). ``alpha = 2`` (sparsemax) and ``1.5`` use exact sort-based
    thresholds; other values bisection with ``iterations`` steps (a positive int).
    """
    check_int("iterations", iterations)
    alpha_t = torch.as_tensor(alpha, dtype=scores.dtype, device=scores.device)
    readable = alpha_t.device.type != "meta"  # meta tensors (cost estimates) carry no values
    if readable and not bool(((alpha_t > 1) & (alpha_t <= 2)).all()):
        raise ValueError(f"alpha must lie in (1, 2], got {alpha}")
    if scores.shape[-1] == 0:  # no keys: no weights, as torch.softmax; alpha gets a zero gradient
        return scores + 0 * alpha_t.sum()
    return _Entmax.apply(scores, alpha_t, iterations)


class Sparsemax(Separation):
    """Sparsemax (Martins & Astudillo, 2016): the Euclidean projection onto the simplex.

    Exact zeros outside its support; a fully masked row gives zeros.
    """

    def separate(self, scores: Tensor) -> Tensor:
        return entmax(scores, 2.0)


class Entmax(Separation):
    """alpha-entmax (Peters et al., 2019); ``alpha = 1.5`` exact, other alpha by bisection.

    With ``learnable=True`` the map is the "generalized sparse" separation of STanHop:
    ``alpha = 1 + sigmoid(a)`` in ``(1, 2)`` with one parameter ``a`` per head (``num_heads``),
    broadcast over scores ``(B, H, L, S)``, initialised so that ``alpha`` starts at ``alpha``.

    Args:
        alpha: the (initial) alpha, in ``(1, 2]`` (``(1, 2)`` when learnable).
        learnable: learn alpha.
        num_heads: number of heads for a per-head learnable alpha (``None``: one alpha).
        iterations: bisection steps for alpha other than 1.5 and 2, a positive int.
    """

    def __init__(
        self,
        alpha: float = 1.5,
        learnable: bool = False,
        num_heads: int | None = None,
        iterations: int = 50,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        alpha = _check_real("alpha", alpha)
        if not 1 < alpha <= 2 or (learnable and alpha == 2):
            raise ValueError(f"alpha must lie in (1, 2{')' if learnable else ']'}, got {alpha}")
        if num_heads is not None and (not learnable or num_heads < 1):
            raise ValueError("num_heads needs learnable=True and must be a positive int")
        self.initial_alpha = alpha
        self.num_heads = num_heads
        self.iterations = check_int("iterations", iterations)
        if learnable:
            shape = (num_heads, 1, 1) if num_heads is not None else ()
            self.alpha_logit: nn.Parameter | None = nn.Parameter(
                torch.empty(shape, device=device, dtype=dtype)
            )
        else:
            self.alpha_logit = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.alpha_logit is not None:
            a = self.initial_alpha - 1
            nn.init.constant_(self.alpha_logit, math.log(a / (1 - a)))

    @property
    def alpha(self) -> Tensor | float:
        """The current alpha: a float, or a tensor ``(H, 1, 1)`` / scalar when learnable."""
        if self.alpha_logit is None:
            return self.initial_alpha
        return 1 + torch.sigmoid(self.alpha_logit)

    def separate(self, scores: Tensor) -> Tensor:
        alpha = self.alpha
        if isinstance(alpha, Tensor):
            if self.num_heads is not None and (
                scores.dim() < 3 or scores.shape[-3] != self.num_heads
            ):
                raise ValueError(
                    f"scores must be (..., H={self.num_heads}, L, S) for a per-head alpha, "
                    f"got {tuple(scores.shape)}"
                )
            alpha = alpha.to(scores.dtype)
        return entmax(scores, alpha, self.iterations)

    def extra_repr(self) -> str:
        return f"alpha={self.initial_alpha:g}, learnable={self.alpha_logit is not None}"

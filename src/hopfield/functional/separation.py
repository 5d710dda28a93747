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

from hopfield._scalars import OneElementScalars
from hopfield._validation import check_int
from hopfield._validation import check_real as _check_real
from hopfield.functional.native import capturing_graph, reading_waits, transforming

#: The dtypes computed in float32 (scores, sums) and cast back.
HALF_DTYPES = (torch.float16, torch.bfloat16)


def _upcast(scores: Tensor) -> Tensor:
    return scores.float() if scores.dtype in HALF_DTYPES else scores


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


def _check_heads(heads: int | None) -> int | None:
    if heads is not None and (isinstance(heads, bool) or not isinstance(heads, int) or heads < 1):
        raise ValueError(f"heads must be a positive int or None, got {heads!r}")
    return heads


def _per_head(parameter: Tensor, scores: Tensor, name: str) -> Tensor:
    """``parameter`` ``(G, ...)`` (one row per head or key/value group) spread over the
    ``H = r · G`` query heads of ``scores (B, H, L, S)``, as ``(H, ...)``.

    Query heads are grouped consecutively by key/value head (grouped-query attention: query head
    ``h`` uses group ``h // r``), as Hugging Face's ``repeat_kv``.
    """
    groups = parameter.shape[0]
    heads = scores.shape[-3] if scores.dim() >= 3 else -1
    if heads < 1 or heads % groups:
        raise ValueError(
            f"scores must be (..., H, L, S) with H a multiple of the {groups} {name} rows "
            f"(one per head or key/value group), got {tuple(scores.shape)}"
        )
    return parameter if heads == groups else parameter.repeat_interleave(heads // groups, 0)


class Sink(OneElementScalars, Separation):
    """Softmax with a sink: ``p_i = exp(z_i) / (exp(s) + Σ_j exp(z_j))``.

    The sink is one more logit ``s`` whose weight ``p_s = exp(s) / (exp(s) + Σ_j exp(z_j))`` is
    the mass the row abstains with; it is dropped from the weights (they sum to ``1 - p_s``) and
    goes to the value sink vector ``v_s`` (zero by default): the retrieval is
    ``Σ_i p_i v_i + p_s v_s``. ``s = 0`` is Softmax_1 (OutEffHop), ``s = log n`` Softmax_n
    (:class:`SoftmaxN` is this map with a fixed ``log n``), a learnable ``s`` per head gpt-oss's
    attention sinks, and a learnable ``s`` with ``v_s`` the key/value bias of Sun et al. (2024)
    for a key whose score is the same for every query.

    Computed with the shift ``m = max(s, max_j z_j)``: nothing overflows, and a fully masked row
    gives zero weights (all its mass on the sink) with finite gradients.

    Args:
        logit: the (initial) sink logit: a finite float, or a tensor ``()`` / ``(G,)`` that is used
            as given (gradients flow to it; it is not inspected), e.g. a model's own sinks.
        learnable: own the logit as an ``nn.Parameter`` initialised to ``logit`` (a float):
            ``(G,)``, or ``(1,)`` for one logit of every head (a one-element vector, which FSDP2
            can shard; read as a scalar).
        heads: ``G``, the number of sink logits (and value sink rows): one per head, or one per
            key/value group of grouped-query attention (query head ``h`` uses row ``h // (H / G)``);
            ``None``: one for all heads.
        value: the value sink: ``None`` (zero), an int ``Ev`` (a learnable vector, ``(G, Ev)`` or
            ``(Ev,)``, initialised to zero), or a tensor ``(Ev,)`` / ``(G, Ev)`` used as given.
    """

    one_element_scalars = ("logit",)

    def __init__(
        self,
        logit: float | Tensor = 0.0,
        *,
        learnable: bool = False,
        heads: int | None = None,
        value: int | Tensor | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.heads = _check_heads(heads)
        self.learnable = bool(learnable)
        self.logit: Tensor | float
        if isinstance(logit, Tensor):
            if learnable:
                raise ValueError("learnable=True needs a float logit (its initial value)")
            self._check_rows("logit", logit, logit.dim() == 0 or logit.dim() == 1)
            self.logit = logit
        else:
            value_ = _check_real("logit", logit)
            if learnable:
                rows = (1,) if heads is None else (heads,)
                self.logit = nn.Parameter(torch.full(rows, value_, device=device, dtype=dtype))
            else:  # one fixed logit for all heads (heads then counts the value sink's rows)
                self.logit = value_
        self.value: Tensor | None
        if value is None or isinstance(value, Tensor):
            if value is not None:
                self._check_rows("value", value, value.dim() in (1, 2), dims=2)
            self.value = value
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"value must be None, a positive int (Ev) or a Tensor, got {value!r}")
        else:
            size = (value,) if heads is None else (heads, value)
            self.value = nn.Parameter(torch.zeros(size, device=device, dtype=dtype))

    def _check_rows(self, name: str, tensor: Tensor, rank_ok: bool, dims: int = 1) -> None:
        """A tensor argument's rank, and its row count against ``heads``."""
        if not tensor.is_floating_point() or not rank_ok:
            raise ValueError(
                f"{name} must be a floating-point tensor of {dims - 1} or {dims} dims, got "
                f"{tensor.dtype} {tuple(tensor.shape)}"
            )
        if tensor.dim() == dims and self.heads is not None and tensor.shape[0] != self.heads:
            raise ValueError(f"{name} must have heads={self.heads} rows, got {tuple(tensor.shape)}")
        if tensor.dim() == dims and self.heads is None:
            self.heads = tensor.shape[0]

    def sink_logit(self, scores: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """The sink logit broadcastable to ``scores[..., :1]``, in ``dtype`` (default: the
        scores'): ``()`` or ``(H, 1, 1)``."""
        dtype = scores.dtype if dtype is None else dtype
        logit = self.logit
        if not isinstance(logit, Tensor):  # filled on the device: no host-to-device copy
            return torch.full((), logit, dtype=dtype, device=scores.device)
        logit = logit.to(dtype)
        if logit.dim() == 0 or self.heads is None:  # one logit for every head (a learnable
            return logit.reshape(())  # one is kept as (1,))
        return _per_head(logit, scores, "sink logit").view(-1, 1, 1)

    def value_sink(
        self, scores: Tensor, width: int | None = None, dtype: torch.dtype | None = None
    ) -> Tensor | None:
        """The value sink broadcastable to the output ``(B, H, L, Ev)``: ``(Ev,)`` or
        ``(H, 1, Ev)``, in ``dtype`` (default: the scores'); ``None`` when it is zero. With
        ``width``, a value sink of another size than ``Ev = width`` is refused."""
        if self.value is None:
            return None
        if width is not None and self.value.shape[-1] != width:
            raise ValueError(
                f"the value sink has size {self.value.shape[-1]}, the values (B, H, S, Ev) have "
                f"Ev = {width}: they must match"
            )
        value = self.value.to(scores.dtype if dtype is None else dtype)
        if value.dim() == 1:
            return value
        return _per_head(value, scores, "value sink").unsqueeze(-2)

    def split(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        """``(weights (..., S), sink weight (..., 1))`` of scores ``(..., S)`` (computed as the
        scores' dtype, without the half-precision upcast of :meth:`forward`)."""
        sink = self.sink_logit(scores)
        peak = (
            scores.detach().amax(dim=-1, keepdim=True)
            if scores.shape[-1] > 0
            else scores.new_full((*scores.shape[:-1], 1), -math.inf)
        )
        shift = torch.maximum(peak, sink.detach())
        # Only a -inf sink and a fully masked row give -inf; any finite shift gives zeros then.
        shift = torch.where(shift == -math.inf, torch.zeros_like(shift), shift)
        numerator = torch.exp(scores - shift)
        abstained = torch.exp(sink - shift)
        denominator = numerator.sum(dim=-1, keepdim=True) + abstained
        denominator = torch.where(denominator == 0, torch.ones_like(denominator), denominator)
        return numerator / denominator, abstained / denominator

    def separate(self, scores: Tensor) -> Tensor:
        return self.split(scores)[0]

    def extra_repr(self) -> str:
        logit = self.logit if not isinstance(self.logit, Tensor) else tuple(self.logit.shape)
        value = None if self.value is None else tuple(self.value.shape)
        return f"logit={logit}, learnable={self.learnable}, heads={self.heads}, value={value}"


class SoftmaxN(Sink):
    """Softmax_n: ``exp(z_i) / (n + Σ_j exp(z_j))`` (OutEffHop's Softmax_1 for ``n = 1``).

    The :class:`Sink` with the fixed logit ``log n`` and no value sink. Equivalent to a softmax
    with ``n`` extra logits fixed at 0 ("no-op memories") whose weights are dropped. Computed with
    the shift ``m = max(0, max_j z_j)``: nothing overflows and a fully masked row gives zeros.
    ``n = 0`` is the ordinary softmax.

    Args:
        n: the constant added to the denominator, ``n >= 0``.
    """

    def __init__(self, n: float = 1.0) -> None:
        n = _check_real("n", n)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        super().__init__(0.0)
        self.n = n
        self.logit = math.log(n) if n > 0 else -math.inf
        self.zero_keys = int(self.n) if self.n == int(self.n) else None

    def split(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        shift = scores.detach().amax(dim=-1, keepdim=True)
        if self.n > 0:
            shift = shift.clamp_min(0.0)
        # A fully masked row has shift -inf; any finite shift gives the same (zero) result.
        # NaN and +inf are left alone so that they propagate as in torch.softmax.
        shift = torch.where(shift == -math.inf, torch.zeros_like(shift), shift)
        numerator = torch.exp(scores - shift)
        denominator = numerator.sum(dim=-1, keepdim=True)
        abstained = self.n * torch.exp(-shift)
        if self.n > 0:
            denominator = denominator + abstained
        denominator = torch.where(denominator == 0, torch.ones_like(denominator), denominator)
        return numerator / denominator, abstained / denominator

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

    Uniform weights ``1/T`` over ``T`` keys are clipped to 0 whenever ``gamma <= -zeta / (T - 1)``
    (the softmax base), e.g. Bondarenko et al.'s BERT setting ``gamma = -0.025`` at ``T = 128``. A
    model whose logits start nearly equal (a small width, a small initialisation) then starts
    with every weight 0 and no gradient to its queries and keys, and its attention never comes
    alive: a 4-layer BERT of width 128 did so in every run (``docs/outlier-study.md``).

    Args:
        gamma: lower stretch, ``gamma <= 0``.
        zeta: upper stretch, ``zeta >= 1``.
        base: the map that is stretched, :class:`Softmax` (default), :class:`SoftmaxN` or a
            :class:`Sink`.
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
        if not isinstance(base, Sink):
            raise TypeError(
                f"base must be Softmax(), SoftmaxN(...) or Sink(...), got {type(base).__name__}"
            )
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
# is found by Newton's method from the left (on t = (tau + 1) / (alpha - 1), see
# _newton_threshold). One autograd function gives all the gradients.
#
# Speed: the threshold only depends on the few largest scores of a row (after the shift by the
# row maximum, tau lies in [-1, 0) and the support is usually a small part of the row), so it is
# computed from a partial sort (torch.topk) of the k largest scores. The sort-based rules tell
# whether the support is smaller than k: then the threshold is exactly the one of a full sort
# (the same prefix sums of the same sorted values); rows where it may be larger are done again
# with 8k, then with a full sort, unless a row's k-th largest score says that its support will
# not fit 8k either (nearly flat rows, :func:`_flat`): then Newton's method on the whole,
# unsorted rows gives the threshold to rounding, without any further sort (flat 8192 x 1024
# rows: 0.46x the time of the sorts, 0.50x the entmax package's, loaded 2-core machine).
# The weights take three to six elementwise passes over the row.
# --------------------------------------------------------------------------------------------

# After the shift by the row maximum, the threshold lies in [-1, 0): entries at -2 are always zero.
_OUTSIDE = -2.0
# First partial sort: the k largest scores of a row, by alpha (support sizes of randn rows of
# 1024 keys: sparsemax <= 13, 1.5-entmax <= 44, 1.3-entmax <= 187); a row whose support may be
# larger is retried with _GROWTH times k, and with the whole row once 2k >= S. The sort-based
# thresholds halve k for shorter rows, down to _SMALLEST_FIRST_K, before sorting whole rows
# (1.5-entmax of randn rows of 128 keys has supports <= 25, and their top 32 cost half the
# sort of all 128); Newton takes short rows whole and unsorted, which costs less than a sort.
_FIRST_K_SPARSEMAX = 16
_FIRST_K_ENTMAX15 = 64
_SMALLEST_FIRST_K = 16
_GROWTH = 8


def _first_k(k: int, size: int) -> int:
    """The first partial sort's k for rows of ``size`` scores, from the preferred ``k`` (0: the
    whole row): halved while it covers half a row or more, and ``size`` (the whole row) where
    that would take it below ``_SMALLEST_FIRST_K``."""
    if k == 0:
        return size
    while 2 * k >= size:
        if k < 2 * _SMALLEST_FIRST_K:
            return size
        k //= 2
    return k


def _first_k_bisect(coef: Tensor) -> int:
    """The first partial sort's k for Newton thresholds (0: the whole row, unsorted)."""
    smallest = float(coef.min())  # NaN on the meta device: the whole row
    if smallest >= 0.75:
        return 32
    if smallest >= 0.45:
        return 64
    if smallest >= 0.25:
        return 256
    return 0


def _sparsemax_threshold(x: Tensor, whole: bool) -> tuple[Tensor, Tensor]:
    """``(tau, complete)`` from rows ``x (R, k)`` sorted in descending order."""
    k = x.shape[-1]
    ranks = torch.arange(1, k + 1, device=x.device, dtype=x.dtype)
    cumulative = x.cumsum(dim=-1)
    # At least one: a row with NaN (or +inf) has no support and gives NaN instead of failing.
    support = (1 + ranks * x > cumulative).sum(dim=-1, keepdim=True).clamp_min(1)
    tau = (cumulative.gather(-1, support - 1) - 1) / support.to(x.dtype)
    return tau, (support < k) | whole


def _entmax15_threshold(x: Tensor, whole: bool) -> tuple[Tensor, Tensor]:
    """``(tau, complete)`` from rows ``x (R, k)`` sorted in descending order."""
    k = x.shape[-1]
    ranks = torch.arange(1, k + 1, device=x.device, dtype=x.dtype)
    mean = x.cumsum(dim=-1) / ranks
    mean_sq = (x * x).cumsum(dim=-1) / ranks
    delta = (1 - ranks * (mean_sq - mean**2)) / ranks
    tau = mean - delta.clamp_min(0).sqrt()
    support = (tau <= x).sum(dim=-1, keepdim=True).clamp_min(1)  # >= 1 as above
    return tau.gather(-1, support - 1), (support < k) | whole


def gap_power(y: Tensor, exponent: Tensor | float) -> Tensor:
    """``(1 + y)^exponent`` for ``y`` in ``[-1, 0]``, as ``exp(exponent · log1p(y))``.

    Exact to a few ulps of ``exponent · log1p(y)``, where rounding ``1 + y`` first would lose
    ``exponent`` ulps. Results below ``e`` times the smallest normal number are raised to that
    value (torch's ``exp`` is ten to thirty times slower on subnormal or zero results): ``y = -1``
    gives that tiny value, or 1 for ``exponent = 0``; multiply by ``1 + y`` for exact zeros.
    """
    info = torch.finfo(y.dtype)
    floor = math.log(info.tiny) + 1.0
    log_gap = torch.log1p(y).clamp_min_(-info.max)  # finite: -inf * 0 would be NaN
    return log_gap.mul_(exponent).clamp_min_(floor).exp_()


def _newton_threshold(
    d: Tensor, coef: Tensor, iterations: int, whole: bool
) -> tuple[Tensor, Tensor]:
    """``(t, complete)`` for rows ``d (R, m)`` of scores minus their maximum (any order;
    ``complete`` when the row is whole or sorted in descending order with its last entry outside
    the support): the root of ``h(t) = ‖[1 + coef (d - t)]_+‖_r = 1`` (``r = 1 / coef``).

    This is the threshold ``tau = -1 + coef · t`` of the convention ``[coef · d - tau]_+^r``,
    kept as ``t`` because near ``alpha = 1`` (``r`` large) the gap ``1 + coef (d - t)`` rounded
    to the working precision would lose ``r`` ulps when raised to the power ``r``. Powers are
    taken as ``exp(r · log1p(coef (d - t)))``, exact to a few ulps of the exponent ``d - t``
    (the softmax limit ``exp(d - t)``, ``t = logsumexp(d)``, as ``coef -> 0``).

    ``h`` is convex and decreasing, so Newton's method from ``t = 0`` (where ``h >= 1``) never
    passes the root and increases monotonically; it converges quadratically (one step in the
    softmax limit). At most ``iterations`` steps; a row stops when its step no longer moves
    ``t`` by more than a few ulps.
    """
    power = 1.0 / coef
    t = torch.zeros_like(d[..., :1])
    tol = 64 * torch.finfo(d.dtype).eps
    linear = bool((coef >= 1).any())  # alpha = 2 in a tensor alpha: 0^0 = 1 outside the support
    for _ in range(iterations):
        y = (d - t).mul_(coef).clamp_min_(-1.0)  # the gap minus 1; -1 outside the support
        s = gap_power(y, power - 1)  # gap^(r - 1); ~1e-38 outside the support
        if linear:
            s = s.mul_(y > -1.0)
        g1 = s.sum(dim=-1, keepdim=True)
        g0 = s.mul_(y.add_(1.0)).sum(dim=-1, keepdim=True)  # Σ gap^r
        log_h = coef * torch.log(g0)
        h = torch.exp(log_h)
        safe = torch.where(h * g1 > 0, h * g1, torch.ones_like(g1))
        # (h - 1) / coef without cancellation; >= 0: rounding never moves t back.
        step = (torch.expm1(log_h) / coef * g0 / safe).clamp_min(0)
        t = t + step
        if not bool((step > tol * (1 + t)).any()):
            break
    if whole:
        return t, torch.full_like(t, True, dtype=torch.bool)
    return t, (d[..., -1:] - t) * coef <= -1.0


def _threshold(z: Tensor, coef: Tensor, alpha: float, iterations: int) -> tuple[Tensor, Tensor]:
    """``(peak, tau)`` of rows ``z (R, S)``: weights ``[coef · (z - peak) - tau]_+ ^ (1/coef)``.

    ``alpha`` is 2.0 or 1.5 for the exact sort-based thresholds, else NaN (Newton, with ``coef``
    a scalar or ``(R, 1)``); Newton returns ``t`` instead of ``tau``, with weights
    ``[1 + coef · (z - peak - t)]_+ ^ (1/coef)`` (see :func:`_newton_threshold`). Rows without a
    finite score get ``peak = 0`` and ``tau = +inf`` (``t = +inf``).
    """
    rows, size = z.shape
    if rows == 0:
        return z.new_zeros(0, 1), z.new_zeros(0, 1)
    exact = alpha in (2.0, 1.5)
    if reading_waits(z):  # on a device: whole rows in one pass (sorted for the exact
        # thresholds), as a partial sort's refinement reads back which rows to redo (a sync)
        k = size
    elif exact:
        k = _first_k(_FIRST_K_SPARSEMAX if alpha == 2.0 else _FIRST_K_ENTMAX15, size)
    else:  # Newton needs no order: short rows are cheaper whole than partly sorted
        k = _first_k_bisect(coef)
        k = k if k > 0 and 2 * k < size else size
    peak = z.new_empty(rows, 1)
    tau = z.new_empty(rows, 1)
    todo: Tensor | None = None  # the rows still to do (None: all of them)
    flat = False  # rows with a support too large for partial sorts: Newton on the whole rows
    while True:
        part = z if todo is None else z.index_select(0, todo)
        part_coef = coef if coef.dim() == 0 or todo is None else coef.index_select(0, todo)
        whole = k == size
        newton = not exact or (whole and flat)
        if whole and newton:  # Newton needs no order
            top = part
            top_peak = part.amax(dim=-1, keepdim=True)
        else:
            top = part.sort(dim=-1, descending=True)[0] if whole else part.topk(k, dim=-1)[0]
            top_peak = top[:, :1]
        valid = top_peak != -math.inf
        top_peak = torch.where(valid, top_peak, torch.zeros_like(top_peak))
        x = top - top_peak
        if exact and not newton:
            if alpha == 1.5:
                x = x.mul_(0.5)
            x = x.clamp_min_(_OUTSIDE)  # -inf (masked) to -2: outside any support, no inf
        if newton:  # Newton clamps its gaps itself
            part_tau, complete = _newton_threshold(x, part_coef, iterations, whole)
            if exact:  # back to the sort-based units: [coef · d - tau]_+ ^ (1 / coef)
                part_tau = part_tau.mul_(part_coef).sub_(1.0)
        elif alpha == 2.0:
            part_tau, complete = _sparsemax_threshold(x, whole)
        else:
            part_tau, complete = _entmax15_threshold(x, whole)
        part_tau = torch.where(valid, part_tau, torch.full_like(part_tau, math.inf))
        if todo is None:
            peak, tau = top_peak, part_tau
        else:
            peak.index_copy_(0, todo, top_peak)
            tau.index_copy_(0, todo, part_tau)
        if whole:
            return peak, tau
        again = ~(complete | ~valid).squeeze(-1)
        if not bool(again.any()):  # False on the meta device
            return peak, tau
        found = again.nonzero().squeeze(-1)
        todo = found if todo is None else todo.index_select(0, found)
        grown = _GROWTH * k
        flat = exact and bool(_flat(x, alpha, grown).index_select(0, found).any())
        k = size if flat or 2 * grown >= size else grown


def _flat(x: Tensor, alpha: float, grown: int) -> Tensor:
    """Rows ``(R, 1)`` of the shifted top scores ``x (R, k)`` (descending, the sort-based
    thresholds' units) whose ``k``-th largest lies above the threshold a flat support of
    ``grown`` entries would have (``-1/grown`` for sparsemax, ``-1/√grown`` for 1.5-entmax):
    their support very likely exceeds ``grown`` too: the threshold is then found by Newton's
    method on the whole, unsorted rows (one step once every entry is inside the support),
    cheaper than the sorts (the decision is about speed only; both are exact to rounding)."""
    bound = 1.0 / grown if alpha == 2.0 else grown**-0.5
    return x[:, -1:] > -bound


def _log1p_curvature(y: Tensor) -> Tensor:
    """``(y - log1p(y)) / y²`` for ``y`` in ``(-1, 0]`` (its series below ``|y| = 0.1``)."""
    small = y.abs() < 0.1
    series = torch.zeros_like(y)
    for k in range(9, 1, -1):  # 1/2 - y/3 + y²/4 - ...: error below 0.1^8
        series = series.mul_(-y).add_(1.0 / k)
    far = torch.where(small, torch.full_like(y, -0.5), y)
    return torch.where(small, series, (far - torch.log1p(far)) / (far * far))


def _alpha_curvature(p: Tensor, coef: Tensor) -> Tensor:
    """``B = u² ((1 + y) (y - log1p(y)) / y² - 1)`` on the support of ``p`` (0 elsewhere).

    ``u = z - peak - t`` is the weight's exponent (``p = (1 + y)^(1/coef)``, ``y = coef · u``,
    recovered from ``p``), so that ``dp/dalpha = s (B - B̄)`` with ``s = p^(2 - alpha)`` and ``B̄``
    the ``s``-weighted mean of ``B``. This is ``(-p log p + s (z - dtau/dalpha)) / coef`` with the
    ``O(coef)`` cancellation of that form done analytically: near ``alpha = 1`` (and for large
    scores) the direct form loses ``|z| / coef`` ulps; ``B -> -u² / 2`` in the softmax limit.
    A weight so small that ``y`` rounds to -1 takes the limit ``B = -u²`` (``(1 + y) log1p(y)
    -> 0``), not ``0 · inf``.
    """
    inside = p > 0
    y = torch.expm1(coef * torch.log(torch.where(inside, p, torch.ones_like(p))))
    u = y / coef
    bent = _log1p_curvature(torch.where(y > -1, y, torch.zeros_like(y))).mul_(y + 1).sub_(1)
    return torch.where(inside, u * u * bent, torch.zeros_like(p))


class _Entmax(torch.autograd.Function):
    """alpha-entmax over the last dim, with gradients for the scores and for alpha.

    ``exact`` is 2.0 (sparsemax) or 1.5 for the sort-based thresholds, NaN for Newton's method.
    Written for :mod:`torch.func` (``forward`` without ``ctx``, :meth:`setup_context`): under
    ``vmap`` the rows of every batch entry are thresholded together in one call (:meth:`vmap`,
    rows are independent), and the backward is made of branch-free tensor operations, so
    ``vmap(grad(...))`` (per-sample gradients) and ``create_graph=True`` go through it.
    """

    @staticmethod
    def forward(scores: Tensor, alpha: Tensor, iterations: int, exact: float) -> Tensor:
        size = scores.shape[-1]
        shape = (*scores.shape[:-1], 1)
        coef = alpha - 1
        rows_coef = coef if coef.dim() == 0 else coef.expand(shape).reshape(-1, 1)
        peak, tau = _threshold(scores.reshape(-1, size), rows_coef, exact, iterations)
        peak, tau = peak.view(shape), tau.view(shape)
        gap = torch.sub(scores, peak)  # the only new full-size tensor: the others work in place
        if exact == 2.0:
            return gap.sub_(tau).clamp_min_(0)
        if exact == 1.5:
            # (0.5 (z - peak) - tau)^2 = 0.25 ((z - peak) - 2 tau)^2, exactly (powers of 2).
            p = gap.sub_(2 * tau).clamp_min_(0)
            return p.mul_(p).mul_(0.25)
        # tau is Newton's t: [1 + coef (z - peak - t)]_+^r, as exp(r log1p(...)).
        y = gap.sub_(tau).mul_(coef).clamp_min_(-1.0)
        p = gap_power(y, 1.0 / coef - 1).mul_(y.add_(1.0))  # exactly 0 outside the support
        total = p.sum(dim=-1, keepdim=True)
        return p.div_(torch.where(total == 0, torch.ones_like(total), total))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        _, alpha, _, exact = inputs
        ctx.exact = exact
        ctx.save_for_backward(output, alpha)

    @staticmethod
    def vmap(
        info: Any, in_dims: tuple[Any, ...], scores: Tensor, alpha: Tensor, iterations: int,
        exact: float,
    ) -> tuple[Tensor, int]:  # fmt: skip
        """The batch dimension in front of the scores (and of alpha, spread over the score
        dimensions it broadcasts against): one call thresholds every row."""
        scores_dim, alpha_dim = in_dims[0], in_dims[1]
        if scores_dim is None:
            scores = scores.expand(info.batch_size, *scores.shape)
        else:
            scores = scores.movedim(scores_dim, 0)
        if alpha_dim is not None:
            alpha = alpha.movedim(alpha_dim, 0)
            alpha = alpha.reshape(
                info.batch_size, *([1] * (scores.dim() - alpha.dim())), *alpha.shape[1:]
            )
        return _Entmax.apply(scores, alpha, iterations, exact), 0

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        p, alpha = ctx.saved_tensors
        s = _entmax_slope(p, alpha, ctx.exact)
        s_total = s.sum(dim=-1, keepdim=True)
        s_total = torch.where(s_total > 0, s_total, torch.ones_like(s_total))
        s_grad = s * grad
        mean = s_grad.sum(dim=-1, keepdim=True) / s_total
        grad_alpha = None
        if ctx.needs_input_grad[1]:
            curvature = _alpha_curvature(p, alpha - 1)
            centred = curvature - (s * curvature).sum(dim=-1, keepdim=True) / s_total
            # dp/dalpha = s (B - B̄), with B̄ the s-weighted mean of B.
            grad_alpha = (s_grad * centred).sum(dim=-1, keepdim=True).sum_to_size(alpha.shape)
        if torch.is_grad_enabled():  # create_graph: s_grad is saved for the double backward
            return s_grad - s * mean, grad_alpha, None, None
        # s (grad - mean), in place in the buffer of s * grad.
        return s_grad.addcmul_(s, mean, value=-1), grad_alpha, None, None


def _entmax_slope(p: Tensor, alpha: Tensor, exact: float) -> Tensor:
    """``s = p^(2 - alpha)`` on the support of the weights ``p``, 0 elsewhere (the support
    indicator for sparsemax, ``√p`` for 1.5).

    A backward that is differentiated in turn (gradients enabled: ``create_graph=True``, every
    :mod:`torch.func` transform) or captured in a graph takes the powers of 1 off the support,
    without a branch on values: ``√p`` and ``p^(2 - alpha)`` have infinite or NaN derivatives at
    ``p = 0``, which would reach the double backward as ``0 · inf = NaN``. A first-order eager
    backward takes the plain powers (one operation fewer), masked only where some
    ``alpha = 2`` makes ``0^0 = 1``."""
    if exact == 2.0:
        return (p > 0).to(p.dtype)
    if torch.is_grad_enabled() or capturing_graph():
        support = p > 0
        safe = torch.where(support, p, 1.0)
        power = safe.sqrt() if exact == 1.5 else safe.pow(2 - alpha)
        return torch.where(support, power, 0.0)
    if exact == 1.5:
        return p.sqrt()
    power = p.pow(2 - alpha)
    return power if bool((alpha < 2).all()) else power.mul_(p > 0)


def _exact_alpha(alpha: Tensor | float, alpha_t: Tensor) -> float:
    """2.0 or 1.5 where ``alpha`` is one of them (the sort-based thresholds), else NaN (Newton's
    method). A tensor is read only outside :mod:`torch.func` transforms, where it has a value
    (inside, a learnable alpha takes Newton's method, exact for every alpha in ``(1, 2)``)."""
    if isinstance(alpha, Tensor):
        if alpha_t.numel() != 1 or alpha_t.is_meta or transforming():
            return math.nan
        alpha = float(alpha_t.detach())
    return float(alpha) if alpha in (2.0, 1.5) else math.nan


def entmax(scores: Tensor, alpha: Tensor | float = 1.5, iterations: int = 50) -> Tensor:
    """alpha-entmax of ``scores (..., S)`` over the last dim (masked entries ``-inf``).

    ``alpha`` is a float in ``(1, 2]`` or a tensor broadcastable to ``scores[..., :1]``
    (gradients flow to it). ``alpha = 2`` (sparsemax) and ``1.5`` use exact sort-based
    thresholds; other values Newton's method with at most ``iterations`` steps (a positive int;
    it stops earlier once the threshold is exact to a few ulps, usually after 3 to 8 steps).
    Half-precision scores (and alpha) are computed in float32 and the weights cast back.
    Works under :mod:`torch.func` (``grad``, ``vmap``, their compositions); inside a transform
    a tensor alpha is not checked against ``(1, 2]`` (it has no value to read there).
    """
    check_int("iterations", iterations)
    work = _upcast(scores)
    if isinstance(alpha, Tensor):
        alpha_t = alpha.to(dtype=work.dtype, device=scores.device)
        readable = not alpha_t.is_meta and not transforming()  # meta (cost estimates): no values
        if readable and not bool(((alpha_t > 1) & (alpha_t <= 2)).all()):
            raise ValueError(f"alpha must lie in (1, 2], got {alpha}")
    else:  # checked on the host and filled on the device: no synchronisation with it
        if not 1 < alpha <= 2:
            raise ValueError(f"alpha must lie in (1, 2], got {alpha}")
        alpha_t = torch.full((), alpha, dtype=work.dtype, device=scores.device)
    if scores.shape[-1] == 0:  # no keys: no weights, as torch.softmax; alpha gets a zero gradient
        return scores + 0 * alpha_t.sum()
    weights: Tensor = _Entmax.apply(work, alpha_t, iterations, _exact_alpha(alpha, alpha_t))
    return weights.to(scores.dtype)


class Sparsemax(Separation):
    """Sparsemax (Martins & Astudillo, 2016): the Euclidean projection onto the simplex.

    Exact zeros outside its support; a fully masked row gives zeros.
    """

    def separate(self, scores: Tensor) -> Tensor:
        return entmax(scores, 2.0)


class Entmax(OneElementScalars, Separation):
    """alpha-entmax (Peters et al., 2019); ``alpha = 1.5`` exact, other alpha by Newton's method.

    With ``learnable=True`` the map is the "generalized sparse" separation of STanHop:
    ``alpha = 1 + sigmoid(a)`` in ``(1, 2)`` with one parameter ``a`` per head (``num_heads``),
    broadcast over scores ``(B, H, L, S)``, initialised so that ``alpha`` starts at ``alpha``:
    ``alpha_logit`` is ``(H, 1, 1)``, or ``(1,)`` for one alpha (a one-element vector, which
    FSDP2 can shard; read as a scalar).

    Args:
        alpha: the (initial) alpha, in ``(1, 2]`` (``(1, 2)`` when learnable).
        learnable: learn alpha.
        num_heads: number of heads for a per-head learnable alpha (``None``: one alpha).
        iterations: at most this many Newton steps for alpha other than 1.5 and 2, a positive int.
    """

    one_element_scalars = ("alpha_logit",)

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
            shape = (num_heads, 1, 1) if num_heads is not None else (1,)
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
        """The current alpha: a float, or a tensor ``(H, 1, 1)`` / scalar when learnable (at
        least ``1 + eps`` of its dtype: a logit below about -16 would round ``alpha`` to 1, the
        softmax, which entmax is not; it then stays there, with no gradient)."""
        if self.alpha_logit is None:
            return self.initial_alpha
        logit = self.alpha_logit if self.num_heads is not None else self.alpha_logit.reshape(())
        return 1 + torch.sigmoid(logit).clamp_min(torch.finfo(logit.dtype).eps)

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


class EntmaxSink(Entmax):
    """alpha-entmax with a sink: the entmax of ``[z, s]`` with the sink's weight dropped.

    The sink logit ``s`` is one more entry of the simplex projection; its weight ``p_s`` is the
    mass the row abstains with (it goes to the value sink, zero by default), so a head gives
    exact zeros on keys below the threshold and abstains entirely (all weights exactly 0) when
    every score falls below it. With ``learnable=True`` alpha is learned as in :class:`Entmax`;
    the sink is a :class:`Sink` (fixed, learnable, per head or key/value group, value sink).
    Gradients flow to the scores, alpha and the sink.

    Args:
        alpha, learnable, num_heads, iterations: as :class:`Entmax`.
        logit, learnable_logit, heads, value: the sink's ``logit``, ``learnable``, ``heads`` and
            ``value``, as :class:`Sink`.
    """

    def __init__(
        self,
        alpha: float = 1.5,
        learnable: bool = False,
        num_heads: int | None = None,
        iterations: int = 50,
        *,
        logit: float | Tensor = 0.0,
        learnable_logit: bool = False,
        heads: int | None = None,
        value: int | Tensor | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(alpha, learnable, num_heads, iterations, device=device, dtype=dtype)
        self.sink = Sink(
            logit, learnable=learnable_logit, heads=heads, value=value, device=device, dtype=dtype
        )

    @property
    def value(self) -> Tensor | None:
        """The value sink, as :attr:`Sink.value`."""
        return self.sink.value

    def value_sink(
        self, scores: Tensor, width: int | None = None, dtype: torch.dtype | None = None
    ) -> Tensor | None:
        """As :meth:`Sink.value_sink`."""
        return self.sink.value_sink(scores, width, dtype)

    def split(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        """``(weights (..., S), sink weight (..., 1))`` of scores ``(..., S)``."""
        logit = self.sink.sink_logit(scores).expand(scores[..., :1].shape)
        weights = super().separate(torch.cat([scores, logit], dim=-1))
        return weights[..., :-1], weights[..., -1:]

    def separate(self, scores: Tensor) -> Tensor:
        return self.split(scores)[0]

    def extra_repr(self) -> str:
        return super().extra_repr() + ", sink"

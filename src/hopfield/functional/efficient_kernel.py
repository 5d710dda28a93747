"""Kernel structures: linear (elu+1) and positive-random-feature (FAVOR+) association.

They replace the exponential kernel of the softmax by a feature map, ``K(x, y) = ⟨φ(x), φ(y)⟩``
(nonparametric Hopfield paper, Appendix E.1 and E.3), and evaluate the retrieval in the
associative order ``φ(Q) (φ(K)ᵀ V)`` normalised by ``φ(Q) Σ_j φ(k_j)``: time and memory
``O((L + S) · D · Ev)`` instead of ``O(L · S)``. They stand in for the softmax, so they accept
only :class:`~hopfield.functional.Softmax` as separation.

Masks: only key masks (broadcastable to ``(B, H, 1, S)``) can be applied in linear time. A
boolean key mask zeroes the features of the padded keys; an additive float key mask ``m_j``
multiplies key ``j``'s kernel by ``exp(m_j)``, which is exactly what it does to the softmax.
Causal association uses prefix sums over chunks of ``chunk_size`` keys.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from hopfield._validation import check_int
from hopfield.functional.efficient import additive_bias
from hopfield.functional.native import transforming
from hopfield.functional.separation import Separation, Softmax
from hopfield.functional.structures import (
    Scale,
    Structure,
    computed_in_float32,
    kept_across_calls,
    recomputing_in_backward,
)

__all__ = ["Linear", "RandomFeatures", "kernel_association", "orthogonal_gaussian"]


def _normalise(num: Tensor, den: Tensor, eps: float) -> Tensor:
    """``num / (den + eps)`` row by row; a row whose normaliser is 0 gives 0 and zero gradients.

    ``num`` is ``(..., L, X)``, ``den`` the row sums ``(..., L, 1)`` (non-negative). A query that
    sees no key (all its keys masked, or every kernel value underflowed) has ``den + eps`` below
    the smallest normal number. Its output is 0 whatever ``num`` is, so its gradient is 0 too; a
    plain division would send it ``1 / (den + eps)`` (``1 / eps``, or ``inf`` for ``eps = 0``),
    which overflows or swamps the other rows' gradients where the backward sums them. The same
    holds for a normaliser that is all but underflowed, below ``tiny / eps`` of its dtype (about
    1.6e-31 in float32, 1e-292 in float64: random features of scores ~3e4 reach it): the
    gradients ``1 / den`` of its features overflow in the backward (``inf · 0 = NaN``), so it
    counts as empty too.
    """
    total = den + eps if eps else den
    # An empty row's normaliser becomes inf: its output ``num / inf`` is 0 (``num`` is at most
    # ``den`` times the largest value there, so finite), its gradient ``1 / inf`` too, and the
    # fill sends none to ``den``. One pass over the output, not two.
    info = torch.finfo(total.dtype)
    return num / total.masked_fill(total < info.tiny / info.eps, math.inf)


def kernel_association(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    eps: float = 0.0,
    chunk_size: int = 128,
    return_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``out_i = Σ_j ⟨φq_i, φk_j⟩ v_j / (Σ_j ⟨φq_i, φk_j⟩ + eps)``, computed as ``φQ (φKᵀ V)``.

    Args:
        phi_q: query features ``(B, H, L, D)``, non-negative.
        phi_k: key features ``(B, H, S, D)``, non-negative (zero rows for keys left out).
        v: values ``(B, H, S, Ev)``.
        causal: query ``i`` sees keys ``j <= i + S - L`` (prefix sums over chunks).
        eps: added to the normaliser.
        chunk_size: keys per chunk of the causal prefix sums.
        return_weights: also return the explicit weights ``(B, H, L, S)`` (``O(L·S)``).
    Returns:
        ``(out (B, H, L, Ev), weights or None)``.
    """
    length, size = phi_q.shape[-2], phi_k.shape[-2]
    if not causal:
        state = torch.matmul(phi_k.transpose(-1, -2), v)  # (B, H, D, Ev)
        total = phi_k.sum(dim=-2)  # (B, H, D)
        num = torch.matmul(phi_q, state)
        den = torch.matmul(phi_q, total.unsqueeze(-1))
    else:
        num, den = _causal_sums(phi_q, phi_k, v, chunk_size)
    out = _normalise(num, den, eps)
    if not return_weights:
        return out, None
    kernel = torch.matmul(phi_q, phi_k.transpose(-1, -2))
    if causal:
        rows = torch.arange(length, device=kernel.device).view(length, 1)
        cols = torch.arange(size, device=kernel.device).view(1, size)
        kernel = kernel.masked_fill(cols > rows + (size - length), 0.0)
    return out, _normalise(kernel, den, eps)


def _causal_sums(phi_q: Tensor, phi_k: Tensor, v: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    """Numerator ``(B, H, L, Ev)`` and denominator ``(B, H, L, 1)`` of causal kernel association."""
    batch, heads, length, dim = phi_q.shape
    size = phi_k.shape[-2]
    offset = size - length
    state0 = phi_k.new_zeros(batch, heads, dim, v.shape[-1])
    total0 = phi_k.new_zeros(batch, heads, dim)
    if offset >= 0:
        # Keys before the first query's position are seen by every query.
        head_k, head_v = phi_k[:, :, :offset], v[:, :, :offset]
        state0 = state0 + torch.matmul(head_k.transpose(-1, -2), head_v)
        total0 = total0 + head_k.sum(dim=-2)
        phi_k, v = phi_k[:, :, offset:], v[:, :, offset:]
    else:
        # The first -offset queries see no key: align with zero features in front.
        phi_k = F.pad(phi_k, (0, 0, -offset, 0))
        v = F.pad(v, (0, 0, -offset, 0))
    chunk = min(chunk, length)
    padded = -(-length // chunk) * chunk
    n = padded // chunk
    extra = padded - length
    qc = F.pad(phi_q, (0, 0, 0, extra)).view(batch, heads, n, chunk, dim)
    kc = F.pad(phi_k, (0, 0, 0, extra)).view(batch, heads, n, chunk, dim)
    vc = F.pad(v, (0, 0, 0, extra)).view(batch, heads, n, chunk, v.shape[-1])
    chunk_state = torch.matmul(kc.transpose(-1, -2), vc)  # (B, H, n, D, Ev)
    chunk_total = kc.sum(dim=-2)  # (B, H, n, D)
    before = _exclusive_cumsum(chunk_state) + state0.unsqueeze(2)
    before_total = _exclusive_cumsum(chunk_total) + total0.unsqueeze(2)
    inside = torch.matmul(qc, kc.transpose(-1, -2))  # (B, H, n, chunk, chunk)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=inside.device).tril()
    inside = inside.masked_fill(~lower, 0.0)
    num = torch.matmul(qc, before) + torch.matmul(inside, vc)
    den = torch.matmul(qc, before_total.unsqueeze(-1)) + inside.sum(dim=-1, keepdim=True)
    num = num.reshape(batch, heads, padded, v.shape[-1])[:, :, :length]
    den = den.reshape(batch, heads, padded, 1)[:, :, :length]
    return num, den


def _exclusive_cumsum(x: Tensor) -> Tensor:
    """Sums over the chunks before each chunk, ``(B, H, n, ...)`` -> ``(B, H, n, ...)``.

    Shifted rather than ``cumsum(x) - x``: that subtraction's backward, ``reverse_cumsum(g) - g``,
    cancels catastrophically when a chunk's own gradient ``g`` is large (queries that see only
    keys of tiny weight have a normaliser ~eps and gradients ~1/eps), losing the float32
    gradients of the other keys in that chunk.
    """
    return torch.cat([torch.zeros_like(x[:, :, :1]), torch.cumsum(x[:, :, :-1], dim=2)], dim=2)


class _KernelStructure(Structure):
    """Shared checks and mask handling of the kernel structures."""

    eps: float
    chunk_size: int

    @staticmethod
    def _key_weights(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
        """``(·, ·, S, 1)`` multipliers of the key features (0 for masked keys), or ``None``."""
        bias = additive_bias(mask, dtype)
        if bias is None:
            return None
        if bias.shape[-2] != 1:
            raise ValueError(
                "mask: linear and random-feature association accept only key masks "
                f"broadcastable to (B, H, 1, S), got shape {tuple(bias.shape)}; use causal=True "
                "for causal masking"
            )
        return torch.exp(bias).transpose(-1, -2)

    @staticmethod
    def _check(separation: Separation, dropout: float) -> None:
        if type(separation) is not Softmax:
            raise ValueError(
                f"separation: {type(separation).__name__} is not supported by kernel structures, "
                "which stand in for Softmax(); use TopK/Window/RandomMask/Dense for other maps"
            )
        if dropout > 0:
            raise ValueError(
                f"dropout={dropout}: kernel structures have no explicit weights to drop; use 0"
            )

    def _features(
        self, q: Tensor, k: Tensor, scale: Scale, key_weights: Tensor | None
    ) -> tuple[Tensor, Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    @computed_in_float32
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
        """Kernel association; returns ``(out (B, H, L, Ev), weights (B, H, L, S) or None)``."""
        self._check(separation, dropout)
        key_weights = self._key_weights(mask, q.dtype)
        phi_q, phi_k = self._features(q, k, scale, key_weights)
        if key_weights is not None:
            phi_k = phi_k * key_weights
        return kernel_association(
            phi_q,
            phi_k,
            v,
            causal=causal,
            eps=self.eps,
            chunk_size=self.chunk_size,
            return_weights=return_weights,
        )


class Linear(_KernelStructure):
    """Linear association (Katharopoulos et al. 2020; paper Proposition E.1).

    ``out_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / (φ(q_i)ᵀ Σ_j φ(k_j) + eps)`` with ``φ(x) = elu(x) + 1``.
    As in the paper, there is no inverse temperature: ``scale`` is ignored.

    Args:
        eps: added to the normaliser (1e-6 as in the official code).
        chunk_size: keys per chunk of the causal prefix sums.
    """

    def __init__(
        self, feature_map: Literal["elu+1"] = "elu+1", *, eps: float = 1e-6, chunk_size: int = 128
    ) -> None:
        super().__init__()
        if feature_map != "elu+1":
            raise ValueError(f"feature_map must be 'elu+1', got {feature_map!r}")
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        self.feature_map = feature_map
        self.eps = float(eps)
        self.chunk_size = chunk_size

    def extra_repr(self) -> str:
        return f"feature_map={self.feature_map!r}, eps={self.eps:g}"

    def _features(
        self, q: Tensor, k: Tensor, scale: Scale, key_weights: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        return F.elu(q) + 1.0, F.elu(k) + 1.0


def orthogonal_gaussian(
    rows: int,
    dim: int,
    *,
    orthogonal: bool = True,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """Random projection ``(rows, dim)`` whose rows are marginally ``N(0, I_dim)``.

    With ``orthogonal``, blocks of ``dim`` rows are exactly orthogonal (Q of a Gaussian QR with
    the sign fix that makes it Haar), each row rescaled by an independent chi(dim) norm, as in
    Performer's orthogonal random features. Drawn on the CPU (also under a default-device
    context such as ``with torch.device("meta")``), in float64.
    """
    if not orthogonal:
        return torch.randn(rows, dim, generator=generator, dtype=torch.float64, device="cpu").to(
            dtype
        )
    count = -(-rows // dim)
    gaussian = torch.randn(count, dim, dim, generator=generator, dtype=torch.float64, device="cpu")
    basis, triangle = torch.linalg.qr(gaussian)  # batched over the blocks
    basis = basis * torch.sign(torch.diagonal(triangle, dim1=-2, dim2=-1)).unsqueeze(-2)
    directions = basis.transpose(-1, -2).reshape(count * dim, dim)[:rows]
    norms = torch.randn(rows, dim, generator=generator, dtype=torch.float64, device="cpu").norm(
        dim=1, keepdim=True
    )
    return (directions * norms).to(dtype)


_FEATURE_MULTIPLE = 16
#: The fewest patterns (queries or keys) from which kernel association pads the random features
#: (:func:`_padding_count`): below it the padding's own cost (widening the projection, the fill
#: of the padding logits and, with gradients, the copy of the feature gradient its in-place fill
#: needs) outweighs the better matrix kernels. Interleaved in one process, 8 heads of 64, 2
#: threads, padded ÷ unpadded (two runs): forward 1.05–1.17 at N = 128, 0.80–1.03 at 512,
#: 0.79–0.84 at 2,048 (0.81–0.82 at head size 128); with gradients 1.11–1.19 at 128, 1.12–1.13
#: at 512, 0.94–0.97 at 2,048.
PADDED_FROM_PATTERNS = 1024


def _padding_count(count: int) -> int:
    """Zero features added to ``count`` drawn ones: up to a multiple of ``_FEATURE_MULTIPLE``
    from 128 features on (at most 12 % more work), none below (5 features would triple)."""
    return -count % _FEATURE_MULTIPLE if count >= 8 * _FEATURE_MULTIPLE else 0


_FIRST_DRAW = threading.Lock()  # the first draw of a projection, for calls from several threads
#: The step between the seeds of successive random-feature draws (the odd 64-bit golden-ratio
#: constant, taken below 2**63): draws far apart in the generator's seed space.
_SEED_STEP = 0x1E3779B97F4A7C15


class RandomFeatures(_KernelStructure):
    """Random-feature association (FAVOR+, Choromanski et al. 2021; paper Proposition E.3).

    ``kernel="softmax"`` (default): positive random features of the softmax kernel,
    ``φ(x) = exp(ωᵢᵀx' - ‖x'‖²/2) / √m`` with ``x' = √β x``, so that
    ``E[φ(q)ᵀφ(k)] = exp(β⟨q, k⟩)`` exactly. The exponent is stabilised by a per-query maximum for
    queries and one per-(batch, head) maximum over valid keys for keys; both cancel in the
    normalisation.

    ``kernel="relu"``: Performer's generalized ReLU features ``φ(x) = ReLU(Ω x') + relu_eps``, the
    model the official code ran as "Random Feature Hopfield" (with the default ``β = 1/√E``,
    ``x' = E^{-1/4} x`` as in that code).

    The projection ``Ω (m, E)`` is drawn on first use (``m = num_features``, default
    ``max(1, int(E · ln E))``), orthogonal by default, kept as a buffer (saved in the state dict) and
    redrawn every ``redraw`` training-mode calls (never when ``None``) or by :meth:`reset_parameters`.
    It is drawn from the seed on the CPU, then placed on the device and dtype of the module's
    buffers at that moment (``.to()``, ``.cuda()``, ``.double()`` and ``to_empty()`` before the
    first call carry the place of a projection not drawn yet; a module never given a device
    takes that of its layer, or of its first call's inputs). A layer draws it when it is built
    (:meth:`initialize`), so that a wrapper for several processes broadcasts it.

    Cost: a non-causal call makes about ``4·N·m·E`` multiply-adds (two projections onto ``Ω``,
    ``φ(K)ᵀV`` and ``φ(Q)(φ(K)ᵀV)``) against exact attention's ``2·N²·E``, a ratio of ``2m/N``:
    with the default ``m`` it is the cheaper one only from ``N ≈ 2m`` (532 at ``E = 64``), and no
    exact evaluation of the same approximation is cheaper at smaller ``N`` (its ``N × N`` kernel
    matrix alone takes ``N²·m``). For short sequences take exact attention
    (:class:`~hopfield.functional.structures.Dense`, the default) or fewer features.

    Args:
        num_features: number of random features ``m``.
        orthogonal: orthogonal (True) or i.i.d. Gaussian projections.
        redraw: redraw the projection every this many training-mode calls; ``None`` = never.
        kernel: ``"softmax"`` (positive random features) or ``"relu"`` (generalized).
        seed: seed of the first projection, from which every redraw's follows (``None``: one
            drawn from torch's global generator at the first draw).
        eps: added to the normaliser.
        relu_eps: the constant added to ReLU features.
        chunk_size: keys per chunk of the causal prefix sums.
        device, dtype: of the projection buffer.
    """

    projection: Tensor | None

    def __init__(
        self,
        num_features: int | None = None,
        *,
        orthogonal: bool = True,
        redraw: int | None = None,
        kernel: Literal["softmax", "relu"] = "softmax",
        seed: int | None = None,
        eps: float = 0.0,
        relu_eps: float = 1e-3,
        chunk_size: int = 128,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("num_features", num_features), ("redraw", redraw)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if kernel not in ("softmax", "relu"):
            raise ValueError(f"kernel must be 'softmax' or 'relu', got {kernel!r}")
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if not relu_eps >= 0:
            raise ValueError(f"relu_eps must be >= 0, got {relu_eps}")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        self.num_features = num_features
        self.orthogonal = bool(orthogonal)
        self.redraw = redraw
        self.kernel_name = kernel
        self.seed = seed
        self.eps = float(eps)
        self.relu_eps = float(relu_eps)
        self.chunk_size = chunk_size
        self._factory: dict[str, Any] = {
            "device": device,
            "dtype": dtype or torch.get_default_dtype(),
        }
        self._first_seed: int | None = seed  # seed=None: drawn at the first draw
        self._draws = 0  # projections drawn so far
        self._since_redraw = 0  # training-mode calls on the current projection
        self.register_buffer("projection", None)

    def extra_repr(self) -> str:
        return (
            f"num_features={self.num_features}, kernel={self.kernel_name!r}, "
            f"orthogonal={self.orthogonal}, redraw={self.redraw}"
        )

    def features_for(self, dim: int) -> int:
        """The number of features used for pattern size ``dim``."""
        if self.num_features is not None:
            return self.num_features
        return max(1, int(dim * math.log(dim))) if dim > 1 else 1

    def reset_parameters(self, dim: int | None = None) -> None:
        """Draw a new projection (for pattern size ``dim``, default: the current one's)."""
        if dim is None:
            if self.projection is None:
                return
            dim = self.projection.shape[1]
        device = self._factory["device"] if self.projection is None else self.projection.device
        dtype = self._factory["dtype"] if self.projection is None else self.projection.dtype
        generator = torch.Generator().manual_seed(self._draw_seed())
        with kept_across_calls():  # also when first used under inference mode
            drawn = orthogonal_gaussian(
                self.features_for(dim), dim, orthogonal=self.orthogonal, generator=generator
            )
            self.projection = drawn.to(device=device, dtype=dtype)
        self._draws += 1
        self._since_redraw = 0

    def _draw_seed(self) -> int:
        """The seed of the next draw: ``seed`` (with ``seed=None``, one drawn from torch's
        global generator at the first draw) for the first, a fixed mix of it with the draw's
        number after. Every projection follows from that first seed and the count of draws,
        which the state dict keeps (:meth:`get_extra_state`): a resumed run redraws what an
        uninterrupted one does, and processes that share the first seed (a layer draws when it
        is built, before the trainer gives each process its own stream) redraw alike."""
        if self._first_seed is None:
            self._first_seed = int(torch.randint(0, 2**62, (1,), device="cpu"))
        if self._draws == 0:
            return self._first_seed
        return (self._first_seed + self._draws * _SEED_STEP) % 2**63

    def get_extra_state(self) -> Tensor:
        """``[first seed known (0/1), first seed, draws made, training calls since the last]``
        (int64): with the projection, what a resumed run needs to redraw at the same calls and
        draw the same projections as an uninterrupted one."""
        seed = self._first_seed
        known = [0, 0] if seed is None else [1, seed]
        return torch.tensor([*known, self._draws, self._since_redraw], dtype=torch.int64)

    def set_extra_state(self, state: Any) -> None:
        """Restore :meth:`get_extra_state`'s counts, checked (a state dict is not trusted)."""
        if not (isinstance(state, Tensor) and state.dtype == torch.int64 and state.shape == (4,)):
            kind = (
                f"a {state.dtype} tensor of shape {tuple(state.shape)}"
                if isinstance(state, Tensor)
                else type(state).__name__
            )
            raise ValueError(
                "random features: the extra state must be an int64 tensor [first seed known, "
                f"first seed, draws, calls since the last draw] of shape (4,), got {kind}"
            )
        known, seed, draws, since = (int(v) for v in state.tolist())
        if known not in (0, 1) or draws < 0 or since < 0:
            raise ValueError(
                "random features: the extra state holds a first-seed flag other than 0/1 or a "
                f"negative count: {state.tolist()}"
            )
        self._first_seed = seed if known else None
        self._draws, self._since_redraw = draws, since

    def _apply(self, fn: Any, recurse: bool = True) -> RandomFeatures:
        """``nn.Module._apply`` (behind ``.to()``, ``.cuda()``, ``.double()``, ``to_empty()``),
        which also carries the device and dtype of a projection not drawn yet: a module moved
        or materialised before its first call draws it where its buffers now live (before 29
        Nov: on the device it was built on, e.g. a meta module's projection on meta after
        ``to_empty()``)."""
        factory = self._factory
        moved = fn(torch.empty(0, device=factory["device"], dtype=factory["dtype"]))
        self._factory = {"device": moved.device, "dtype": moved.dtype}
        return cast(RandomFeatures, super()._apply(fn, recurse))

    def initialize(self, pattern_size: int, device: torch.device | str | None = None) -> None:
        """Draw the projection for ``pattern_size`` now if there is none (see
        :meth:`Structure.initialize`), on ``device`` unless this module was built with one;
        one drawn already is kept."""
        if self.projection is None:
            with _FIRST_DRAW:
                if self.projection is None:
                    if self._factory["device"] is None and device is not None:
                        self._factory = {**self._factory, "device": torch.device(device)}
                    self.reset_parameters(check_int("pattern_size", pattern_size))

    def _projection_for(self, x: Tensor) -> Tensor:
        """The projection for patterns ``x (..., E)`` (drawn on first use, on ``x``'s device
        unless this module was built with or moved to one, and once: of several threads'
        first calls, one draws and all use its draw, the seed's first)."""
        if self.projection is None:
            self.initialize(x.shape[-1], x.device)
        projection = self.projection
        assert projection is not None
        if projection.shape[1] != x.shape[-1]:
            raise ValueError(
                f"q and k have pattern size {x.shape[-1]}, but the random projection was drawn "
                f"for {projection.shape[1]}; call reset_parameters({x.shape[-1]}) to redraw it"
            )
        return projection

    def _count_call(self, x: Tensor) -> None:
        """Redraw every ``redraw`` training-mode calls; a forward recomputed in the backward pass
        (activation checkpointing) is the call it recomputes, on the projection that call used,
        and is not counted again. ``x``: the queries ``(..., E)``."""
        self._projection_for(x)
        if not self.training or self.redraw is None or recomputing_in_backward():
            return
        if self._since_redraw >= self.redraw:
            self.reset_parameters(x.shape[-1])
        self._since_redraw += 1

    def _load_from_state_dict(
        self,
        state_dict: Mapping[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        saved = state_dict.get(prefix + "projection")
        if saved is not None and (self.projection is None or self.projection.shape != saved.shape):
            # where this module's buffers live, as load_state_dict copies into a buffer it has
            old = self.projection
            where = self._factory if old is None else {"device": old.device, "dtype": old.dtype}
            with kept_across_calls():
                self.projection = torch.empty(saved.shape, **where)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        counts = prefix + "_extra_state"
        if counts not in state_dict and counts in missing_keys:  # saved before 29 Nov: the
            missing_keys.remove(counts)  # counts of this module stand

    @staticmethod
    def _root_scale(scale: Scale) -> Scale:
        if isinstance(scale, Tensor):
            if scale.dim() >= 2 and scale.shape[-2] != 1:
                raise ValueError(
                    "scale: random features need one inverse temperature per batch and head, "
                    f"not per query; got shape {tuple(scale.shape)}"
                )
            if not transforming() and bool((scale <= 0).any()):  # no values under vmap
                raise ValueError("scale must be positive for random features")
            return scale.sqrt()
        if not scale > 0:
            raise ValueError(f"scale must be positive for random features, got {scale}")
        return math.sqrt(scale)

    def features(
        self,
        x: Tensor,
        scale: Scale,
        *,
        is_query: bool,
        stabilize: bool = True,
        key_weights: Tensor | None = None,
        padded: bool = False,
    ) -> Tensor:
        """Random features ``(B, H, N, m)`` of patterns ``x (B, H, N, E)`` at inverse temperature ``scale``.

        Without ``stabilize``, ``features(q)ᵀ features(k)`` is an unbiased estimate of
        ``exp(scale · ⟨q, k⟩)`` (softmax kernel). ``key_weights (·, ·, N, 1)`` (keys only) exclude
        zero-weight keys from the stabiliser. With ``padded``, zero features follow up to a
        multiple of 16 (from 128 features on), ``(B, H, N, m')``: the association's three
        products then have widths that suit the matrix kernels (at E = 128, m = 621 ran 1.45x
        slower than 624), and zero features add nothing to any kernel value, numerator or
        normaliser. (Kernel association pads from :data:`PADDED_FROM_PATTERNS` patterns on.)
        """
        projected, root = self._scaled_projection(x, scale)
        out = self._feature_map(x, projected, root, is_query, stabilize, key_weights)
        return out if padded else out[..., : self._count()]

    def _count(self) -> int:
        """The number of drawn features ``m`` (the projection exists)."""
        assert self.projection is not None
        return self.projection.shape[0]

    def _scaled_projection(
        self, x: Tensor, scale: Scale, widen: bool = True
    ) -> tuple[Tensor, Scale]:
        """``(Ω', √β)``: the projection in ``x``'s dtype, widened with the zero rows of the
        padding features ``(m', E)`` when ``widen``, with ``√β`` folded in when ``β`` is one
        number (the ``(m', E)`` projection scaled instead of the ``(N, E)`` patterns; unscaled for
        a tensor ``β``)."""
        projection = self._projection_for(x).to(x.dtype)
        extra = _padding_count(projection.shape[0]) if widen else 0
        widened = F.pad(projection, (0, 0, 0, extra)) if extra else projection
        root = self._root_scale(scale)
        if isinstance(root, Tensor) or root == 1.0:
            return widened, root
        return widened * root, root

    def _feature_map(
        self,
        x: Tensor,
        projected: Tensor,
        root: Scale,
        is_query: bool,
        stabilize: bool,
        key_weights: Tensor | None,
    ) -> Tensor:
        """:meth:`features` with the padding features, from :meth:`_scaled_projection`'s
        ``(projected, root)``."""
        count = self._count()
        extra = projected.shape[0] - count
        scaled: Tensor | None
        if isinstance(root, Tensor):
            scaled = x * root
            mapped = torch.matmul(scaled, projected.transpose(-1, -2))
        else:
            mapped = torch.matmul(x, projected.transpose(-1, -2))
            scaled = x if root == 1.0 else None
        # The (B, H, N, m') products are changed in place from here on (autograd needs neither
        # the product's value nor the shifted one, only the features): a fresh tensor of that
        # size costs as much as a pass over it in page faults.
        if self.kernel_name == "relu":
            out = mapped.clamp_min(0.0).add_(self.relu_eps)
            if extra:
                out[..., count:] = 0.0
        else:
            if extra:  # padding features get the logit -inf: exactly 0 after the exponential
                mapped[..., count:] = -math.inf
            out = self._exponential(
                mapped, x, root, scaled, is_query, stabilize, key_weights, count
            )
        return out

    @staticmethod
    def _exponential(
        mapped: Tensor,
        x: Tensor,
        root: Scale,
        scaled: Tensor | None,
        is_query: bool,
        stabilize: bool,
        key_weights: Tensor | None,
        count: int,
    ) -> Tensor:
        """Positive random features of ``count`` drawn directions from the products
        ``mapped = x' Ωᵀ``, computed in place."""
        # exp(logits) / √m computed as exp(logits - ln √m): one pass fewer.
        log_root_m = 0.5 * math.log(count)
        if stabilize and is_query:
            # The per-query stabiliser cancels the per-query -‖x'‖²/2 exactly: leave both out.
            with torch.no_grad():
                shift = mapped.amax(dim=-1, keepdim=True)
                shift = shift.nan_to_num_(0.0, 0.0, 0.0)  # no finite logit: no shift
            return mapped.sub_(shift + log_root_m).exp_()
        if scaled is None:
            scaled = x * root
        logits = mapped.sub_(0.5 * (scaled * scaled).sum(dim=-1, keepdim=True))
        if stabilize:
            if not is_query and key_weights is not None:
                # masked keys are left out of the shift and are exactly 0 after the exponential:
                # one may lie far above the others' maximum, where its exp would overflow to
                # inf, and inf times its weight 0 is NaN
                logits = logits.masked_fill_(key_weights == 0, -math.inf)
            with torch.no_grad():
                shift = logits.amax(dim=-1 if is_query else (-1, -2), keepdim=True)
                shift = shift.nan_to_num_(0.0, 0.0, 0.0)  # no finite logit: no shift
            return logits.sub_(shift + log_root_m).exp_()
        return logits.sub_(log_root_m).exp_()

    def kernel(self, q: Tensor, k: Tensor, scale: Scale) -> Tensor:
        """The estimated kernel matrix ``(B, H, L, S)`` (estimates ``exp(scale·⟨q, k⟩)`` for softmax)."""
        phi_q = self.features(q, scale, is_query=True, stabilize=False)
        phi_k = self.features(k, scale, is_query=False, stabilize=False)
        return torch.matmul(phi_q, phi_k.transpose(-1, -2))

    def _features(
        self, q: Tensor, k: Tensor, scale: Scale, key_weights: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        self._count_call(q)
        widen = max(q.shape[-2], k.shape[-2]) >= PADDED_FROM_PATTERNS
        projected, root = self._scaled_projection(q, scale, widen)  # once for both
        phi_k = self._feature_map(k, projected, root, False, True, key_weights)
        phi_q = self._feature_map(q, projected, root, True, True, None)
        return phi_q, phi_k

"""Efficient structures: top-K, random-masked and sliding-window association (sparse-structured).

These are the sparse-structured modern Hopfield models of Hu et al. (ICML 2025, Theorem 3.2):
``T(x) = Σ_{µ∈𝓜(x)} ξ_µ Sep(β Ξ_𝓜ᵀ x)_µ``, where the separation runs over the memories in the
support 𝓜(x) only. Excluded memories get weight exactly 0: their scores are ``-inf``, never 0.
Each structure computes only the scores it needs (gathered or block-local), so the retrieval
costs ``O(L·k·d)`` (random mask), ``O(L·w·d)`` (window) or ``O(L·S·d)`` scores plus
``O(L·K·d)`` aggregation (top-K) without an ``L × S`` matrix in memory.

The kernel structures (linear and random features) live in
:mod:`hopfield.functional.efficient_kernel`.

All structures take the normalised arguments described in :mod:`hopfield.functional.structures`:
``q (B, H, L, E)``, ``k (B, H, S, E)``, ``v (B, H, S, Ev)``, ``scale`` (float or tensor
broadcastable to ``(B, H, L, 1)``), ``mask`` (``None``, boolean with ``True`` = may take part, or
additive float; broadcastable to ``(B, H, L, S)``), ``causal`` (query ``i`` sees keys
``j <= i + S - L``), ``dropout`` and ``return_weights``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal, overload

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from hopfield.functional import native
from hopfield.functional.separation import Separation, SoftmaxN
from hopfield.functional.structures import (
    Dense,
    Scale,
    Structure,
    apply_mask,
    causal_mask,
    computed_in_float32,
    kept_across_calls,
    recomputing_in_backward,
    weigh_values,
    with_causal,
)

__all__ = ["RandomMask", "TopK", "Window"]


# ------------------------------------------------------------------------------------------------
# Shared helpers: masks as additive biases, gathering keys, the gathered association
# ------------------------------------------------------------------------------------------------


def additive_bias(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """``mask`` as a 4-D additive bias: 0 where a key may take part, ``-inf`` where it may not.

    Boolean masks (``True`` = may take part) become ``0 / -inf``; float masks are cast to ``dtype``.
    The shape stays broadcastable to ``(B, H, L, S)`` (no expansion).
    """
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        zero = torch.zeros((), dtype=dtype, device=mask.device)
        return torch.where(mask, zero, torch.full_like(zero, -math.inf))
    return mask.to(dtype)


def _grads_needed(*tensors: Tensor | float | None) -> bool:
    """Whether autograd records an operation on any of ``tensors`` (numbers and ``None`` skipped)."""
    return torch.is_grad_enabled() and any(
        isinstance(t, Tensor) and t.requires_grad for t in tensors
    )


def _as_4d(t: Tensor) -> Tensor:
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))


@overload
def _rows(t: Tensor, start: int, stop: int, length: int) -> Tensor: ...
@overload
def _rows(t: Tensor | float, start: int, stop: int, length: int) -> Tensor | float: ...
def _rows(t: Tensor | float, start: int, stop: int, length: int) -> Tensor | float:
    """Rows ``start:stop`` of a tensor broadcastable to ``(B, H, length, ·)`` (floats unchanged)."""
    if not isinstance(t, Tensor):
        return t
    t = _as_4d(t)
    return t[:, :, start:stop] if t.shape[-2] == length and length > 1 else t


@dataclass(frozen=True)
class _SupportBlock:
    """The queries ``start:stop`` of a gathered structure's association with their rows of
    the scale and the additive bias, and their support: key indices ``idx (B, H, Lc, K)``,
    the kept slots ``keep`` (``None`` when all are kept) and the selected scores ``scores``
    (``None`` when the search did not compute them)."""

    start: int
    stop: int
    scale: Tensor | float
    bias: Tensor | None
    idx: Tensor
    keep: Tensor | None
    scores: Tensor | None


def _take_columns(t: Tensor, idx: Tensor) -> Tensor:
    """Entries of ``t`` (broadcastable to ``(B, H, Lc, S)``) at the key indices ``idx (B, H, Lc, K)``."""
    if t.shape[-1] == 1:
        return t
    full = t.expand(*idx.shape[:-1], t.shape[-1])
    return torch.gather(full, -1, idx)


def kept_scores(
    scores: Tensor,
    idx: Tensor,
    keep: Tensor | None,
    bias: Tensor | None,
    *,
    start: int,
    offset: int,
    causal: bool,
) -> Tensor:
    """The scores ``(B, H, Lc, K)`` of the gathered keys ``idx`` of the queries
    ``start..start+Lc-1`` with the mask's ``bias`` (rows already restricted to the block) added
    and ``-inf`` in the slots outside the support: not in ``keep``, or (``causal``) beyond
    ``query + offset`` (``offset = S - L``)."""
    if bias is not None:
        scores = scores + _take_columns(bias, idx)
    blocked = None if keep is None else ~keep
    if causal:
        rows = idx.shape[-2]
        query = torch.arange(start, start + rows, device=idx.device).view(rows, 1)
        beyond = idx > query + offset
        blocked = beyond if blocked is None else blocked | beyond
    return scores if blocked is None else scores.masked_fill(blocked, -math.inf)


def _check_count(k: int | None, fraction: float | None) -> tuple[int | None, float | None]:
    if (k is None) == (fraction is None):
        raise ValueError("give exactly one of k and fraction")
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        return k, None
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise TypeError(f"fraction must be a float, got {type(fraction).__name__}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
    return None, float(fraction)


def _check_positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def kept_count(valid: Tensor, k: int | None, fraction: float | None) -> Tensor:
    """How many of its ``valid`` keys each row keeps: :func:`support_size`, at most all."""
    return torch.minimum(support_size(valid, k, fraction), valid)


def support_size(valid: Tensor, k: int | None, fraction: float | None) -> Tensor:
    """The support size per row: ``k`` or ``max(1, int(fraction · valid))`` (never above ``valid``
    for ``fraction``; int64, same shape as ``valid``)."""
    if k is not None:
        return torch.full_like(valid, k)
    assert fraction is not None
    kept = torch.floor(valid.to(torch.float64) * fraction).to(torch.int64)
    return kept.clamp_min(1)


def upper_count(k: int | None, fraction: float | None, size: int) -> int:
    """The largest support size over ``size`` keys: ``min(k, size)`` or ``max(1, int(fraction·size))``."""
    if k is not None:
        return min(k, size)
    assert fraction is not None
    return max(1, int(fraction * size))


# Supports of at least S / 8 keys take their scores from the block's full product (BLAS) rather
# than from gathered keys (memory-bound); both give the same scores.
_DENSE_SCORES_FROM = 8


# Up to these many keys Top-K and random masks with gradients compute the same association
# densely (:func:`dense_with_support`). Thread CPU time ÷ SDPA's, forward + backward, B1 H8
# E64 k64, one thread on the loaded 2-core CPU (27 Nov 2026): Top-K 1.67 dense vs 2.59
# gathered at N = 128, 1.85 vs 1.69 at 256; random mask 1.84 vs 3.16 at 128, 1.52 vs 1.65 at
# 256, 1.26 vs 0.86 at 512. With the supports from the kernels (native.topk_keep and
# native.sample_keep, 28 Nov 2026, ratio to SDPA, 2 threads, idle CPU) Top-K's dense path is
# 1.40 vs 2.37 gathered at 256 and 1.31 vs 0.96-1.00 at 512.
TOPK_DENSE_UNTIL = 256
RANDOM_MASK_DENSE_UNTIL = 256
# Up to these many keys, and B·H·L·S within the block budget, Top-K and random masks without
# gradients select on the full score matrix: two BLAS products around one kernel that keeps each
# query's support and, for Softmax_n, weighs it (:func:`native.topk_keep`,
# :func:`native.sample_keep`; random masks only without a mask or forced keys). Ratio to SDPA,
# forward, B1 H8 E64 k64, 2 threads, one interleaved run on the 2-core CPU (28 Nov 2026), dense
# selection vs gathered path: Top-K 2.01 vs 3.22 at N = 256, 2.09 vs 1.66 at 512, 1.69 vs 1.39
# at 1024; random mask 1.53 vs 2.27 at 256, 1.56 vs 1.38 at 512, 1.66 vs 0.72 at 1024.
TOPK_SELECT_UNTIL = 256
RANDOM_MASK_SELECT_UNTIL = 256

# Scores per piece of Top-K's support search (kept small enough to stay in cache).
_SCORE_PIECE = 1 << 21
# Keys per score chunk of Top-K's support search, with and without the native kernels.
_NATIVE_KEY_CHUNK = 2048
_KEY_CHUNK = 4096
# Gathered keys per piece of :func:`_gathered_scores` (kept small enough to stay in cache).
_GATHER_PIECE = 1 << 19


def _gathered_dot_torch(a: Tensor, table: Tensor, idx: Tensor) -> Tensor:
    """:func:`gathered_dot` in PyTorch operations, in pieces of rows whose gathered rows of
    ``table`` stay in cache (a product and a sum, not a batch of matrix-vector products)."""
    slots, dim = idx.shape[-1], a.shape[-1]
    rows_a, rows_idx = a.reshape(-1, dim), idx.reshape(-1, slots)
    step = max(1, _GATHER_PIECE // max(1, slots * dim))
    pieces = []
    for lo in range(0, rows_a.shape[0], step):
        hi = min(lo + step, rows_a.shape[0])
        gathered = table.index_select(0, rows_idx[lo:hi].reshape(-1)).view(hi - lo, slots, dim)
        pieces.append((gathered * rows_a[lo:hi].unsqueeze(-2)).sum(-1))
    out = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    return out.view(idx.shape)


class _NativeGatheredDot(torch.autograd.Function):
    """:func:`gathered_dot` on the native kernels; its gradients are a weighted sum of gathered
    rows (``embedding_bag``) for ``a`` and a scatter of outer products for ``table``."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, table: Tensor, idx: Tensor) -> Tensor:
        ctx.save_for_backward(a, table, idx)
        return native.gather_dot(a, table, idx)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        a, table, idx = ctx.saved_tensors
        da = dtable = None
        if ctx.needs_input_grad[0]:
            da = gathered_sum(idx, table, grad).view_as(a)
        if ctx.needs_input_grad[1]:
            dtable = scatter_outer(torch.zeros_like(table), idx, grad, a)
        return da, dtable, None


def gathered_dot(a: Tensor, table: Tensor, idx: Tensor) -> Tensor:
    """``out[..., j] = ⟨a[...], table[idx[..., j]]⟩``: the products ``(..., K)`` of the rows
    ``a (..., E)`` with their gathered rows of ``table (M, E)`` (``idx (..., K)``, int64), with
    gradients to ``a`` and ``table``. On CPU float32/float64 the native kernel
    (:mod:`hopfield.functional.native`) reads each gathered row once; elsewhere PyTorch
    operations in cache-sized pieces."""
    if native.available(a, table):
        out: Tensor = _NativeGatheredDot.apply(a, table, idx)
        return out
    return _gathered_dot_torch(a, table, idx)


def gathered_sum(idx: Tensor, table: Tensor, weights: Tensor) -> Tensor:
    """``out[...] = Σ_j weights[..., j] · table[idx[..., j]]``: ``(..., E)`` from
    ``idx``/``weights (..., K)`` and ``table (M, E)``, through ``embedding_bag`` (never the
    ``(..., K, E)`` gathered rows)."""
    slots = idx.shape[-1]
    out = F.embedding_bag(
        idx.reshape(-1, slots),
        table,
        per_sample_weights=weights.reshape(-1, slots).to(table.dtype),
        mode="sum",
    )
    return out.view(*idx.shape[:-1], table.shape[-1])


def scatter_outer(dst: Tensor, idx: Tensor, weights: Tensor, src: Tensor) -> Tensor:
    """``dst[idx[..., j]] += weights[..., j] · src[...]`` in place (and returned), for
    ``dst (M, E)``, ``idx``/``weights (..., K)``, ``src (..., E)``; no autograd. The native
    kernel skips zero weights; the PyTorch path adds the outer products with ``index_add_``."""
    if native.available(dst, weights, src) and dst.is_contiguous():
        return native.scatter_outer(dst, idx, weights, src)
    dim = dst.shape[-1]
    products = weights.unsqueeze(-1).to(src.dtype) * src.unsqueeze(-2)
    return dst.index_add_(0, idx.reshape(-1), products.reshape(-1, dim).to(dst.dtype))


def _check_dense_until(value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"dense_until must be a non-negative int or None, got {value!r}")
    return value


def support_bias(idx: Tensor, keep: Tensor | None, out: Tensor) -> Tensor:
    """Write ``0`` into ``out (B, H, Lc, S)`` (filled with ``-inf`` by the caller) at the key
    indices ``idx (B, H, Lc, K)`` of the kept slots ``keep`` (all when ``None``); returns
    ``out``. Slots outside ``keep`` may repeat a kept index: the largest value wins."""
    if keep is None:
        return out.scatter_(-1, idx, 0.0)
    zero = torch.zeros((), dtype=out.dtype, device=out.device)
    flags = torch.where(keep, zero, torch.full_like(zero, -math.inf))
    return out.scatter_reduce_(-1, idx, flags, reduce="amax")


def dense_with_support(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor,
    *,
    separation: Separation,
    scale: Scale,
    mask: Tensor | None,
    dropout: float,
    return_weights: bool,
) -> tuple[Tensor, Tensor | None]:
    """The association of a gathered structure computed densely: ``bias (B, H, L, S)`` is 0 on
    each query's support (which lies among the keys the mask and the causal rule allow) and
    ``-inf`` elsewhere (:func:`support_bias`); a float ``mask`` adds its finite values (and its
    gradients) and :class:`~hopfield.functional.structures.Dense` associates (the fused kernels
    for the softmax family). Keys outside the support get weight exactly 0, as in the gathered
    path; rows with an empty support give zeros."""
    if mask is not None and mask.dtype != torch.bool:
        bias = bias + mask.to(q.dtype)
    return Dense()(
        q,
        k,
        v,
        separation=separation,
        scale=scale,
        mask=bias,
        causal=False,
        dropout=dropout,
        return_weights=return_weights,
    )


class _GatheredStructure(Structure):
    """Base of structures whose support is a per-query list of key indices ``(B, H, L, K)``.

    The association of one block of queries gathers the ``K`` selected keys and values, so it costs
    ``O(Lc·K·(E + Ev))`` time and memory. Queries are processed in blocks of at most
    ``max_block_elements`` gathered elements.
    """

    max_block_elements: int
    dense_until: int | None
    k: int | None  # the support size, or
    fraction: float | None  # the share of the valid keys kept

    def _block_length(self, batch_heads: int, per_query: int, length: int) -> int:
        return max(1, min(length, self.max_block_elements // max(1, batch_heads * per_query)))

    def _dense_fits(self, q: Tensor, k: Tensor, v: Tensor, scale: Scale) -> bool:
        """Whether the association takes the dense masked path (:func:`dense_with_support`):
        gradients needed, at most ``dense_until`` keys and an ``L × S`` mask within
        ``max_block_elements``. (Without gradients the gathered path is the faster at every
        size measured.)"""
        batch, heads, length, _ = q.shape
        size = k.shape[-2]
        return (
            self.dense_until is not None
            and _grads_needed(q, k, v, scale)
            and size <= self.dense_until
            and batch * heads * length * size <= self.max_block_elements
        )

    def _attends_fused(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        separation: Separation,
        scale: Scale,
        mask: Tensor | None,
        dropout: float,
        return_weights: bool,
    ) -> bool:
        """Whether the association takes the structure's fused native kernel (``_fused``):
        :func:`_fused_applies` and what the structure's kernel needs (``_fused_ready``)."""
        return _fused_applies(
            q, k, v, separation, scale, mask, dropout, return_weights
        ) and self._fused_ready(q, k, v)

    def _fused_ready(self, q: Tensor, k: Tensor, v: Tensor) -> bool:
        """What the structure's fused kernel needs besides :func:`_fused_applies`."""
        raise NotImplementedError

    def _kernel_counts(
        self, q: Tensor, k: Tensor, mask: Tensor | None, causal: bool
    ) -> _KernelCounts:
        """Each query's keys for the fused kernels: without a mask the cached
        :func:`_query_counts`; with a per-key mask (:func:`_per_key_mask`) its additive bias
        ``(B, H, S)`` (``-inf`` where a key is masked) and per batch-head counts ``(B, H, L)``
        of the allowed keys within each query's causal prefix and of those it keeps."""
        batch, heads, length, _ = q.shape
        size = k.shape[-2]
        if mask is None:
            count, prefix = _query_counts(self.k, self.fraction, length, size, causal, q.device)
            return _KernelCounts(count, prefix, prefix)
        bias = additive_bias(mask, q.dtype)
        assert bias is not None
        counts = self._key_mask_counts(bias, (batch, heads, size), 0, length, length, causal)
        assert counts.allowed is not None
        key_bias = bias[..., 0, :].expand(batch, heads, size)
        return replace(counts, bias=key_bias.masked_fill(~counts.allowed, -math.inf))

    def _key_mask_counts(
        self,
        bias: Tensor,
        shape: tuple[int, int, int],
        start: int,
        rows: int,
        length: int,
        causal: bool,
    ) -> _KernelCounts:
        """The counts of queries ``start .. start + rows - 1`` of a call of ``length`` under a
        per-key additive ``bias`` (``(B|1, H|1, 1, S|1)``, ``shape = (B, H, S)``): the keys each
        batch-head allows (finite bias, as on every other path: ``+inf`` and NaN are masked
        too), the causal prefixes ``(rows,)`` and how many allowed keys each query sees and
        keeps ``(B, H, rows)``; its ``bias`` is left ``None``."""
        batch, heads, size = shape
        allowed = torch.isfinite(bias[..., 0, :]).expand(batch, heads, size)
        prefix = _valid_prefix(start, start + rows, length, size, causal, bias.device)
        valid = _allowed_within(allowed, prefix)
        count = kept_count(valid, self.k, self.fraction)
        return _KernelCounts(count, prefix, valid, allowed=allowed)

    def _selection_fits(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        scale: Scale,
        dropout: float,
        return_weights: bool,
        until: int,
    ) -> bool:
        """Whether a support chosen on the full score matrix fits: no gradients, dropout or
        weights, the native kernels, at most ``until`` keys and ``B·H·L·S`` within
        ``max_block_elements``."""
        batch, heads, length, _ = q.shape
        size = k.shape[-2]
        return (
            dropout == 0.0
            and not return_weights
            and not _grads_needed(q, k, v, scale)
            and native.available(q, k, v)
            and size <= until
            and batch * heads * length * size <= self.max_block_elements
        )

    def _recomputed(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        separation: Separation,
        scale: Scale,
        mask: Tensor | None,
        causal: bool,
    ) -> Tensor:
        """The association ``(B, H, L, Ev)`` that keeps only the selected key indices for the
        backward pass and recomputes their scores there
        (:func:`topk_recomputed`)."""
        return topk_recomputed(
            self,
            q,
            k,
            v,
            separation=separation,
            scale=scale,
            bias=additive_bias(mask, q.dtype),
            causal=causal,
        )

    @staticmethod
    def _associate_gathered(
        q: Tensor,
        k_flat: Tensor,
        v_flat: Tensor,
        idx: Tensor,
        keep: Tensor | None,
        scores: Tensor | None,
        *,
        size: int,
        offset: int,
        start: int,
        separation: Separation,
        scale: Tensor | float,
        bias: Tensor | None,
        causal: bool,
        dropout: float,
        return_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Association of the query block ``q (B, H, Lc, E)`` with the keys ``idx (B, H, Lc, K)``.

        ``k_flat``/``v_flat`` are the keys/values flattened to ``(B·H·S, ·)``; ``keep`` marks the
        slots that take part; ``scores`` are the selected scores when the support search already
        computed them (without gradients), else they are computed from the gathered keys;
        ``bias``/``scale`` are already restricted to the block's rows; ``offset = S - L`` and
        ``start`` (the block's first query) locate the causal boundary. The weighted sum of the
        gathered values runs through :func:`torch.nn.functional.embedding_bag` and never
        materialises the ``(Lc, K, Ev)`` values.
        """
        batch, heads, rows, slots = idx.shape
        base = torch.arange(batch * heads, device=idx.device).view(batch, heads, 1, 1) * size
        flat = base + idx
        if scores is None:
            if slots * _DENSE_SCORES_FROM >= size:
                # Many keys per query: one matrix product of the block is cheaper than a gather.
                keys = k_flat.view(batch, heads, size, k_flat.shape[-1])
                products = torch.matmul(q, keys.transpose(-1, -2)).gather(-1, idx)
            else:
                products = gathered_dot(q, k_flat, flat)
            scores = kept_scores(
                products * scale, idx, keep, bias, start=start, offset=offset, causal=causal
            )
        elif keep is not None:
            scores = scores.masked_fill(~keep, -math.inf)
        weights = separation(scores)
        dropped = F.dropout(weights, dropout) if dropout > 0 else weights
        out = gathered_sum(flat, v_flat, dropped)
        if not return_weights:
            return out, None
        dense = weights.new_zeros(batch, heads, rows, size)
        # Slots outside the support (weight 0) may repeat an index; add their zeros harmlessly.
        return out, dense.scatter_add(-1, idx, weights)

    def _associate_piece(
        self,
        q: Tensor,
        k_flat: Tensor,
        v_flat: Tensor,
        piece: _SupportBlock,
        *,
        size: int,
        reuse_scores: bool,
        separation: Separation,
        causal: bool,
        dropout: float,
        return_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """:meth:`_associate_gathered` of one query block of :meth:`_support_blocks` (all queries
        ``q (B, H, L, E)``, ``size`` keys); ``reuse_scores`` takes the scores its support search
        found."""
        length = q.shape[-2]
        return self._associate_gathered(
            q[:, :, piece.start : piece.stop],
            k_flat,
            v_flat,
            piece.idx,
            piece.keep,
            piece.scores if reuse_scores else None,
            size=size,
            offset=size - length,
            start=piece.start,
            separation=separation,
            scale=piece.scale,
            bias=piece.bias,
            causal=causal,
            dropout=dropout,
            return_weights=return_weights,
        )

    def _run(
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
        slots: int,
        extra_per_query: int,
    ) -> tuple[Tensor, Tensor | None]:
        """Run :meth:`_support` and the gathered association block by block over the queries."""
        batch, heads, length, dim = q.shape
        size = k.shape[-2]
        bias = additive_bias(mask, q.dtype)
        k_flat = k.reshape(batch * heads * size, dim)
        v_flat = v.reshape(batch * heads * size, v.shape[-1])
        # Per query: the block's scores (all S, or the gathered keys) and the support search.
        scores_per_query = size if slots * _DENSE_SCORES_FROM >= size else slots * dim
        per_query = max(scores_per_query, slots + extra_per_query)
        block = self._block_length(batch * heads, per_query, length)
        needs_grad = _grads_needed(q, k, scale, bias)
        outs: list[Tensor] = []
        weights: list[Tensor] = []
        for piece in self._support_blocks(q, k, scale=scale, bias=bias, causal=causal, block=block):
            out, w = self._associate_piece(
                q,
                k_flat,
                v_flat,
                piece,
                size=size,
                reuse_scores=not needs_grad,
                separation=separation,
                causal=causal,
                dropout=dropout,
                return_weights=return_weights,
            )
            outs.append(out)
            if w is not None:
                weights.append(w)
        out = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
        if not return_weights:
            return out, None
        return out, torch.cat(weights, dim=2) if len(weights) > 1 else weights[0]

    def _support_blocks(
        self,
        q: Tensor,
        k: Tensor,
        *,
        scale: Tensor | float,
        bias: Tensor | None,
        causal: bool,
        block: int,
    ) -> Iterator[_SupportBlock]:
        """The queries ``q (B, H, L, E)`` in blocks of ``block`` rows, each with its rows of
        ``scale`` and ``bias`` and its support (:meth:`_support`, searched without gradients)."""
        length = q.shape[-2]
        for start in range(0, length, block):
            stop = min(start + block, length)
            scale_rows = _rows(scale, start, stop, length)
            bias_rows = None if bias is None else _rows(bias, start, stop, length)
            assert not isinstance(bias_rows, float)
            with torch.no_grad():
                idx, keep, scores = self._support(
                    q[:, :, start:stop].detach(),
                    k.detach(),
                    scale=scale_rows.detach() if isinstance(scale_rows, Tensor) else scale_rows,
                    bias=bias_rows,
                    causal=causal,
                    start=start,
                    length=length,
                )
            yield _SupportBlock(start, stop, scale_rows, bias_rows, idx, keep, scores)

    def _support(
        self,
        q: Tensor,
        k: Tensor,
        *,
        scale: Tensor | float,
        bias: Tensor | None,
        causal: bool,
        start: int,
        length: int,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:  # pragma: no cover - abstract
        """Key indices ``(B, H, Lc, K)`` of the support of each query, the kept slots (or
        ``None`` when all are kept) and the selected scores when the search computed them."""
        raise NotImplementedError


def _running_top(
    best_scores: Tensor | None, best_idx: Tensor | None, scores: Tensor, count: int, offset: int
) -> tuple[Tensor, Tensor]:
    """The ``count`` largest of a running selection ``(best_scores, best_idx)`` (``(..., C)``,
    ``None`` before the first chunk) and of a chunk ``scores (..., W)`` whose columns are numbered
    from ``offset``: the chunk's top (:func:`top_scores`) merged with the selection by a second
    one. (With the native kernels, :class:`~hopfield.functional.native.RunningTopK` does this
    without the merges.)"""
    chunk_scores, chunk_idx = top_scores(scores, min(count, scores.shape[-1]))
    if offset:
        chunk_idx = chunk_idx + offset
    if best_scores is None or best_idx is None:
        return chunk_scores, chunk_idx
    merged = torch.cat([best_scores, chunk_scores], dim=-1)
    merged_idx = torch.cat([best_idx, chunk_idx], dim=-1)
    values, position = top_scores(merged, min(count, merged.shape[-1]))
    return values, merged_idx.gather(-1, position)


def _product_into(workspace: Tensor, q: Tensor, k: Tensor) -> Tensor:
    """``q kᵀ`` (``q (B, H, Lc, E)``, ``k (B', H', W, E)``, batch dimensions broadcast) written
    into the front of the flat ``workspace`` (a fresh tensor when it is too small or of another
    dtype, e.g. for queries promoted by a float64 ``scale`` in a direct structure call, or while
    a graph is captured: no ``out=`` into a buffer there)."""
    shape = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
    if (
        workspace.numel() < math.prod(shape)
        or workspace.dtype != torch.promote_types(q.dtype, k.dtype)
        or native.abstract_tensors()  # no out= into a buffer in a graph or under vmap
    ):
        return torch.matmul(q, k.transpose(-1, -2))
    return torch.matmul(q, k.transpose(-1, -2), out=workspace[: math.prod(shape)].view(shape))


def _valid_prefix(
    start: int, stop: int, length: int, size: int, causal: bool, device: torch.device
) -> Tensor:
    """Number of keys each query ``start..stop-1`` may see when only the causal rule applies."""
    rows = torch.arange(start, stop, device=device)
    if not causal:
        return torch.full_like(rows, size)
    return (rows + (size - length) + 1).clamp(0, size)


# Scores per query block of a dense selection (16 MiB in float32), a bound on its memory: smaller
# blocks measured slower (smaller products), e.g. 1.51 vs 1.30 ms with 2 blocks at N = 256.
_SELECT_BLOCK = 1 << 22


def _associate_selected(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    separation: Separation,
    scale: Scale,
    mask: Tensor | None,
    select: Callable[[Tensor, int, int], Callable[..., Tensor]],
) -> Tensor:
    """An association whose support is chosen on the full scores, in blocks of queries with at
    most :data:`_SELECT_BLOCK` scores: per block the product (a number scale is left to the
    kernel, one pass less; a tensor scale and the mask, rows ``start:stop``, are applied here),
    then ``select(scores, start, stop)``, which returns the kernel call that keeps the block's
    support in place (:func:`native.topk_keep` or :func:`native.sample_keep`, see
    :func:`_weigh_kept`), and the weighted sum. Returns ``(B, H, L, Ev)``."""
    batch, heads, length, _ = q.shape
    size = k.shape[-2]
    rows = max(1, _SELECT_BLOCK // max(1, batch * heads * size))
    outs = []
    # The kernels take q's dtype (float32 or float64): an autocast region would make the
    # products bfloat16, so it is left for this computation (as for the other float32 paths;
    # entered only when needed, since entering costs some 4 µs of a 0.3 ms call).
    autocast = torch.is_autocast_enabled(q.device.type)
    off = torch.autocast(q.device.type, enabled=False) if autocast else contextlib.nullcontext()
    with off:
        for start in range(0, length, rows):
            outs.append(_selected_block(q, k, v, separation, scale, mask, select, start, rows))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


def _selected_block(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    separation: Separation,
    scale: Scale,
    mask: Tensor | None,
    select: Callable[[Tensor, int, int], Callable[..., Tensor]],
    start: int,
    rows: int,
) -> Tensor:
    """The queries ``start:start + rows`` of :func:`_associate_selected`."""
    stop = min(q.shape[-2], start + rows)
    scores, factor = _block_scores(q, k, scale, mask, start, stop)
    return _weigh_kept(select(scores, start, stop), v, separation, factor)


def _block_scores(
    q: Tensor, k: Tensor, scale: Scale, mask: Tensor | None, start: int, stop: int
) -> tuple[Tensor, float]:
    """The contiguous scores ``(B, H, stop - start, S)`` of queries ``start:stop`` and the scale
    still to apply: a number scale is left to the kernel (one pass less), a tensor scale and
    the mask are applied here."""
    batch, heads, length, _ = q.shape
    size = k.shape[-2]
    scores = torch.matmul(q[:, :, start:stop], k.transpose(-1, -2))
    factor = 1.0
    if isinstance(scale, Tensor) or mask is not None:
        block_mask = None if mask is None else _rows(mask, start, stop, length)
        scores = apply_mask(scores * _rows(scale, start, stop, length), block_mask)
    else:
        factor = scale
    return scores.expand(batch, heads, stop - start, size).contiguous(), factor


class _SelectedSoftmax(torch.autograd.Function):
    """Softmax_n attention over a support chosen on the full scores, with its own backward: the
    forward runs the selection kernel for the weights ``W (B, H, L, S)`` (0 off the support) and
    keeps them; the backward is ``dV = Wᵀ G``, ``dS = W ⊙ (G Vᵀ - rowsum(W ⊙ G Vᵀ)) · scale``,
    ``dQ = dS K``, ``dK = dSᵀ Q`` (the support is piecewise constant in the inputs)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        scale: float,
        n: float,
        mask: Tensor | None,
        select: Callable[[Tensor, int, int], Callable[..., Tensor]],
    ) -> Tensor:
        scores, factor = _block_scores(q, k, scale, mask, 0, q.shape[-2])
        weights = select(scores, 0, q.shape[-2])(output="softmax", scale=factor, n=n)
        ctx.save_for_backward(q, k, v, weights)
        ctx.scale = scale
        return torch.matmul(weights, v)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, weights = ctx.saved_tensors
        grad_weights = torch.matmul(grad, v.transpose(-1, -2))
        dv = torch.matmul(weights.transpose(-1, -2), grad).sum_to_size(v.shape)
        inner = (grad_weights * weights).sum(-1, keepdim=True)
        grad_scores = grad_weights.sub_(inner).mul_(weights).mul_(ctx.scale)
        dq = torch.matmul(grad_scores, k).sum_to_size(q.shape)
        dk = torch.matmul(grad_scores.transpose(-1, -2), q).sum_to_size(k.shape)
        return dq, dk, dv, None, None, None, None


def _softmax_selected_applies(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    separation: Separation,
    scale: Scale,
    mask: Tensor | None,
    dropout: float,
    return_weights: bool,
) -> bool:
    """Whether a dense path with gradients can take :class:`_SelectedSoftmax`:
    :func:`_softmax_kernels_apply`, a mask without gradients, and no autocast region (whose
    products would not be float32)."""
    return (
        _softmax_kernels_apply(q, k, v, separation, scale, dropout, return_weights)
        and (mask is None or not mask.requires_grad)
        and not torch.is_autocast_enabled(q.device.type)
    )


def _softmax_kernels_apply(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    separation: Separation,
    scale: Scale,
    dropout: float,
    return_weights: bool,
) -> bool:
    """What every native Softmax_n path needs (:class:`_SelectedSoftmax`, the fused kernels):
    the native kernels, a Softmax_n separation, a number scale, no dropout and no weights."""
    return (
        native.available(q, k, v)
        and isinstance(separation, SoftmaxN)
        and not isinstance(scale, Tensor)
        and dropout == 0.0
        and not return_weights
    )


def _weigh_kept(
    keep: Callable[..., Tensor], v: Tensor, separation: Separation, factor: float
) -> Tensor:
    """The association from a selection on the full scores: ``keep(output=..., scale=...,
    n=...)`` runs :func:`native.topk_keep` or :func:`native.sample_keep` on them (in place);
    Softmax_n takes its weights from the kernel, any other separation runs over the kept scores
    (``-inf`` elsewhere). Returns ``(B, H, L, Ev)``."""
    if isinstance(separation, SoftmaxN):
        return torch.matmul(keep(output="softmax", scale=factor, n=separation.n), v)
    kept = keep(output="values", scale=factor)
    return weigh_values(kept, v, separation=separation, dropout=0.0)[0]


def _fused_applies(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    separation: Separation,
    scale: Scale,
    mask: Tensor | None,
    dropout: float,
    return_weights: bool,
) -> bool:
    """Whether an association can take a fused native kernel (:func:`native.topk_attend`,
    :func:`native.sample_attend`; with gradients :class:`_FusedSoftmax`):
    :func:`_softmax_kernels_apply`, no mask but one per key (:func:`_per_key_mask`; the causal
    rule aside), and no dispatch mode (a FLOP counter such as the plan's, a tracer), which sees
    PyTorch's operations only: the kernels' products would go uncounted."""
    return (
        not is_in_torch_dispatch_mode()
        and (mask is None or _per_key_mask(mask))
        and _softmax_kernels_apply(q, k, v, separation, scale, dropout, return_weights)
    )


def _per_key_mask(mask: Tensor) -> bool:
    """Whether a normalized mask (4-D, boolean or the queries' dtype) is the same for every
    query, ``(B|1, H|1, 1, S|1)`` (a padding mask), and has no gradient: the fused kernels'
    ``bias``."""
    return mask.shape[-2] == 1 and not mask.requires_grad


@dataclass(frozen=True)
class _KernelCounts:
    """What the fused kernels are told of each query's keys (see :meth:`_GatheredStructure.
    _kernel_counts`): ``count`` kept, ``prefix`` the keys the causal rule lets it see (``(L,)``),
    ``valid`` how many of them the mask allows, ``bias`` the mask per key ``(B, H, S)`` and
    ``allowed`` where it is finite (``None`` without a mask: then ``count`` is ``(L,)`` and
    ``valid`` is ``prefix``; ``bias`` also in the counts of
    :meth:`_GatheredStructure._key_mask_counts`)."""

    count: Tensor
    prefix: Tensor
    valid: Tensor
    bias: Tensor | None = None
    allowed: Tensor | None = None

    def allowed_keys(self) -> Tensor | None:
        """:func:`_allowed_keys` of the mask (``None`` without one)."""
        return None if self.allowed is None else _allowed_keys(self.allowed)


def _allowed_within(allowed: Tensor, prefix: Tensor) -> Tensor:
    """How many of its first ``prefix`` keys (int64 ``(Lc,)``) each query may see, given the
    keys each batch-head allows (``allowed``, boolean ``(B, H, S)``): ``(B, H, Lc)``."""
    return F.pad(allowed.cumsum(-1), (1, 0))[..., prefix]


def _allowed_keys(allowed: Tensor) -> Tensor:
    """Each batch-head's allowed keys (``allowed``, boolean ``(B, H, S)``) in increasing order,
    then the others: int64 ``(B, H, S)``; the first ``n`` allowed keys of a row are its first
    ``n`` entries."""
    return torch.argsort((~allowed).to(torch.uint8), dim=-1, stable=True)


class _FusedSoftmax(torch.autograd.Function):
    """A fused kernel's association (``attend(q, k, v, support=...)``, see
    :func:`_fused_association`) with its own backward: the forward saves each query's kept keys
    and Softmax_n weights ``(B, H, L, K)``, the backward is :func:`native.attend_backward`
    over them, ``O(L · K · (E + Ev))`` (the support is piecewise constant in the inputs)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        count: Tensor,
        scale: float,
        attend: Callable[..., Tensor],
    ) -> Tensor:
        slots = native.largest(count)
        idx = torch.empty(*q.shape[:-1], slots, dtype=torch.int64)
        weights = q.new_empty(*q.shape[:-1], slots)
        out = attend(q, k, v, support=(idx, weights))
        ctx.save_for_backward(q, k, v, idx, weights, count)
        ctx.scale = scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, idx, weights, count = ctx.saved_tensors
        dq, dk, dv = native.attend_backward(q, k, v, (idx, weights), count, grad, scale=ctx.scale)
        return dq, dk, dv, None, None, None


def _fused_association(
    q: Tensor, k: Tensor, v: Tensor, count: Tensor, scale: float, attend: Callable[..., Tensor]
) -> Tensor:
    """``attend(q, k, v)`` (a fused kernel with its counts and scale bound), through
    :class:`_FusedSoftmax` when gradients are needed."""
    if _grads_needed(q, k, v):
        out: Tensor = _FusedSoftmax.apply(q, k, v, count, scale, attend)
        return out
    return attend(q, k, v)


@functools.lru_cache(maxsize=64)
def _query_counts(
    k: int | None,
    fraction: float | None,
    length: int,
    size: int,
    causal: bool,
    device: torch.device,
) -> tuple[Tensor, Tensor]:
    """``(count, population)``, int64 ``(L,)``: the keys each query may see (the causal rule
    only) and how many of them it keeps (``k``, or ``fraction`` of them, at most all). Cached
    (four small operations a call): the kernels only read them (ordinary tensors, also when
    first asked for under inference mode: :func:`kept_across_calls`)."""
    with kept_across_calls():
        population = _valid_prefix(0, length, length, size, causal, device)
        return kept_count(population, k, fraction), population


# ------------------------------------------------------------------------------------------------
# Gathered association with recomputation (Top-K and random masks with gradients)
# ------------------------------------------------------------------------------------------------


class _TopKRecomputed(torch.autograd.Function):
    """Top-K association that saves the kept indices only and recomputes in the backward pass."""

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        scale: Tensor | None,
        float_scale: float,
        structure: Any,
        separation: Any,
        bias: Tensor | None,
        causal: bool,
    ) -> Tensor:
        batch, heads, length, dim = q.shape
        size, ev = k.shape[-2], v.shape[-1]
        scale_any: Tensor | float = float_scale if scale is None else scale
        upper = upper_count(structure.k, structure.fraction, size)
        native_kernels = native.available(q, k, v)
        # Top-K's key chunks (RandomMask, which also runs here, has none).
        key_chunk = getattr(structure, "key_chunk", None)
        chunk = upper if key_chunk is None else key_chunk(size, upper, native_kernels)
        scores_per_query = size if upper * _DENSE_SCORES_FROM >= size else upper * dim
        # The backward pass holds a few (Lc, K) tensors; without the native kernels also the
        # outer products of the scatters, (Lc, K, E).
        held = 8 * upper if native_kernels else 2 * upper * max(dim, ev)
        per_query = max(scores_per_query, 2 * upper + chunk, held)
        block = structure._block_length(batch * heads, per_query, length)
        k_flat = k.reshape(batch * heads * size, dim)
        v_flat = v.reshape(batch * heads * size, ev)
        out = q.new_empty(batch, heads, length, ev)
        supports: list[tuple[Tensor, Tensor | None]] = []
        pieces = structure._support_blocks(
            q, k, scale=scale_any, bias=bias, causal=causal, block=block
        )
        for piece in pieces:
            o, _ = structure._associate_piece(
                q,
                k_flat,
                v_flat,
                piece,
                size=size,
                reuse_scores=True,
                separation=separation,
                causal=causal,
                dropout=0.0,
                return_weights=False,
            )
            out[:, :, piece.start : piece.stop] = o
            small = piece.idx.to(torch.int32) if size < 2**31 else piece.idx
            supports.append((small, piece.keep))
        ctx.save_for_backward(q, k, v, scale, bias)
        ctx.supports, ctx.block, ctx.float_scale = supports, block, float_scale
        ctx.separation, ctx.causal = separation, causal
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, scale, bias = ctx.saved_tensors
        batch, heads, length, dim = q.shape
        size, ev = k.shape[-2], v.shape[-1]
        k_flat = k.reshape(batch * heads * size, dim)
        v_flat = v.reshape(batch * heads * size, ev)
        dq = torch.zeros_like(q)
        dk = torch.zeros_like(k_flat)
        dv = torch.zeros_like(v_flat)
        scale_leaf = None
        dscale = None
        if scale is not None:
            scale_leaf = scale.detach().requires_grad_(ctx.needs_input_grad[3])
            dscale = torch.zeros_like(scale) if ctx.needs_input_grad[3] else None
        base = torch.arange(batch * heads, device=q.device).view(batch, heads, 1, 1) * size
        grad = grad.contiguous()
        for number, start in enumerate(range(0, length, ctx.block)):
            stop = min(start + ctx.block, length)
            idx, keep = ctx.supports[number]
            idx = idx.to(torch.int64)
            flat = base + idx
            q_block, g = q[:, :, start:stop], grad[:, :, start:stop]
            # Products with the kept keys and values: (B, H, Lc, K) each.
            products = gathered_dot(q_block, k_flat, flat)
            d_weights = gathered_dot(g, v_flat, flat)
            with torch.enable_grad():
                products = products.requires_grad_()
                scale_block = _rows(
                    ctx.float_scale if scale_leaf is None else scale_leaf, start, stop, length
                )
                bias_block = None if bias is None else _rows(bias, start, stop, length)
                assert not isinstance(bias_block, float)
                scores = kept_scores(
                    products * scale_block,
                    idx,
                    keep,
                    bias_block,
                    start=start,
                    offset=size - length,
                    causal=ctx.causal,
                )
                weights = ctx.separation(scores)
                inputs = [products] + (
                    [scale_leaf] if scale_leaf is not None and dscale is not None else []
                )
                grads = torch.autograd.grad(weights, inputs, d_weights.to(weights.dtype))
            d_products = grads[0].to(q.dtype)
            dq[:, :, start:stop] = gathered_sum(flat, k_flat, d_products)
            scatter_outer(dk, flat, d_products, q_block)
            scatter_outer(dv, flat, weights.detach().to(g.dtype), g)
            if dscale is not None:
                dscale += grads[1]
        return (
            dq,
            dk.view_as(k),
            dv.view_as(v),
            dscale,
            None,
            None,
            None,
            None,
            None,
        )


def topk_recomputed(
    structure: Any,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    separation: Any,
    scale: float | Tensor,
    bias: Tensor | None,
    causal: bool,
) -> Tensor:
    """The association of a gathered structure (:class:`TopK`, :class:`RandomMask`; no
    dropout, no weights) whose backward pass recomputes the kept scores from the stored key
    indices."""
    scale_t = scale if isinstance(scale, Tensor) else None
    out: Tensor = _TopKRecomputed.apply(
        q,
        k,
        v,
        scale_t,
        0.0 if isinstance(scale, Tensor) else float(scale),
        structure,
        separation,
        bias,
        bool(causal),
    )
    return out


# ------------------------------------------------------------------------------------------------
# Top-K
# ------------------------------------------------------------------------------------------------


def _recompute_applies(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    separation: Separation,
    scale: Scale,
    mask: Tensor | None,
    dropout: float,
    return_weights: bool,
) -> bool:
    """Whether Top-K takes the recomputing path: gradients are needed, no dropout, no weights,
    a mask and a separation without gradients of their own."""
    return (
        _grads_needed(q, k, v, scale)
        and dropout == 0.0
        and not return_weights
        and (mask is None or not mask.requires_grad)
        and not any(p.requires_grad for p in separation.parameters())
    )


def top_scores(scores: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """The ``count`` largest entries of each row of ``scores (..., W)`` and their column indices
    (unsorted), as :meth:`torch.Tensor.topk` gives them, at a fraction of its cost for wide rows.

    The row is cut into ``G >= 2·count`` groups of ``g`` columns; the ``count``-th largest group
    maximum ``t`` is a lower bound of the row's ``count``-th largest entry (``count`` distinct
    entries, the group maxima, are ``>= t``), so the row's top ``count`` are among its entries
    ``>= t``. Those candidates (about ``1.5 · count`` for scores without structure) are gathered
    into a padded ``(rows, C)`` block and ranked by :meth:`~torch.Tensor.topk`. The selection
    only ever ranks ``G + C`` instead of ``W`` entries per row; rows whose candidates are too
    few (fewer than ``count`` finite entries) or too many (heavy ties) take the plain
    :meth:`~torch.Tensor.topk` of their whole row. Ties at the ``count``-th entry may keep
    other (equal-scored) columns than a plain ``topk``; the kept scores are the same.

    On CPU float32/float64 the same two passes (group maxima, then the entries above their
    bound) run fused per row in the native kernel (:func:`hopfield.functional.native.topk`).
    """
    width = scores.shape[-1]
    if count >= width:  # a copy: callers reuse the buffer of ``scores`` for the next chunk
        idx = torch.arange(width, device=scores.device).expand(scores.shape)
        return scores.clone(), idx
    if native.available(scores):
        return native.topk(scores, count)
    if width < 16 * count or native.reading_waits(scores):  # on a device the two passes
        # would read back how many candidates each row has (a sync); its topk is fast there
        values, idx = scores.topk(count, dim=-1, sorted=False)
        return values, idx
    shape = scores.shape[:-1]
    flat = scores.reshape(-1, width)
    rows = flat.shape[0]
    group = width // (2 * count)
    groups = width // group
    maxima = flat[:, : groups * group].reshape(rows, groups, group).amax(-1)
    threshold = maxima.topk(count, dim=-1, sorted=False).values.amin(-1, keepdim=True)
    where = (flat >= threshold).nonzero()
    row, col = where[:, 0], where[:, 1]
    counts = torch.bincount(row, minlength=rows)
    cap = 8 * count
    plain = (counts < count) | (counts > cap) | ~torch.isfinite(threshold.squeeze(-1))
    any_plain = bool(plain.any())
    if any_plain:
        kept = ~plain[row]
        row, col = row[kept], col[kept]
        counts = counts.masked_fill(plain, 0)
    starts = torch.cumsum(counts, 0) - counts
    position = torch.arange(row.shape[0], device=scores.device) - starts[row]
    slots = max(int(counts.max()), count) if rows else count
    candidates = flat.new_full((rows, slots), -math.inf)
    candidates[row, position] = flat[row, col]
    columns = torch.zeros(rows, slots, dtype=torch.int64, device=scores.device)
    columns[row, position] = col
    values, chosen = candidates.topk(count, dim=-1, sorted=False)
    idx = columns.gather(-1, chosen)
    if any_plain:
        redo = plain.nonzero().squeeze(-1)
        plain_values, plain_idx = flat[redo].topk(count, dim=-1, sorted=False)
        values[redo] = plain_values
        idx[redo] = plain_idx
    return values.view(*shape, count), idx.view(*shape, count)


class TopK(_GatheredStructure):
    """Each query keeps its ``K`` largest scores; the separation runs over those only (eq. 3.8).

    ``K = k``, or ``K = max(1, int(fraction · valid keys))`` per query, where the valid keys are
    those the mask (and the causal rule) allow. Exactly ``K`` keys are kept (ties at the K-th
    score keep the first tied keys, the same in every path for the scores it computes; the fused
    kernel below computes them with its own BLAS product, which may round the scores of
    duplicated keys an ulp apart); every other key has weight exactly 0.
    A ``k`` above the number of valid keys (e.g. ``k > S``) keeps them all: the dense association.
    Any separation works over the kept scores (softmax, sparsemax, entmax, ...).

    Scores are computed in chunks of ``chunk_size`` keys with a running top-K (each chunk ranked
    by :func:`top_scores`: only its entries above a group-maximum threshold), and queries in
    cache-sized blocks, so peak memory stays ``O(Lc · (K + chunk))`` however long the memory is; the
    aggregation gathers the ``K`` kept values (``O(L · K · Ev)``). Gradients flow through the
    kept scores (the selection itself is piecewise constant). When gradients are needed (no
    dropout, no ``return_weights``) only the kept indices ``(B, H, L, K)`` are stored and the
    backward pass recomputes each query block's kept scores
    (:func:`topk_recomputed`), so training memory is
    ``O(L · K)`` plus one block.

    Softmax_n with a number β and no dropout or weights, with no mask or one per key (a padding
    mask, ``(B|1, H|1, 1, S)``; the causal rule aside), runs in one
    native kernel on the CPU (:func:`native.topk_attend`: per block of queries the score product,
    each query's selection, weights and weighted sum in one parallel region, so a busy CPU does
    not stall it); with gradients it saves the kept keys and weights ``(B, H, L, K)`` and
    differentiates by hand over them (:func:`native.attend_backward`).

    Args:
        k: number of kept memories per query.
        fraction: alternatively, the fraction of valid memories kept, in ``(0, 1]``.
        chunk_size: keys per score chunk (at least ``K`` are used); ``None`` (default) takes
            2048 with the native kernels (each chunk continues the running selection in place)
            and 4096 without (where merging the running selection costs a ``topk`` per chunk).
        max_block_elements: budget of gathered elements per query block.
        dense_until: with gradients, up to this many keys (and an ``L × S`` mask within
            ``max_block_elements``) the same association is computed densely: the scores'
            top ``K`` per row (:meth:`torch.Tensor.topk`) become a mask of the dense fused kernel
            (:func:`dense_with_support`), which at small sizes costs less than the chunked search
            and gathers; ``None``: never.
    """

    def __init__(
        self,
        k: int | None = None,
        *,
        fraction: float | None = None,
        chunk_size: int | None = None,
        max_block_elements: int = 1 << 23,
        dense_until: int | None = TOPK_DENSE_UNTIL,
    ) -> None:
        super().__init__()
        self.k, self.fraction = _check_count(k, fraction)
        self.chunk_size = (
            None if chunk_size is None else _check_positive_int("chunk_size", chunk_size)
        )
        self.max_block_elements = _check_positive_int("max_block_elements", max_block_elements)
        self.dense_until = _check_dense_until(dense_until)

    def extra_repr(self) -> str:
        return f"k={self.k}" if self.k is not None else f"fraction={self.fraction:g}"

    def key_chunk(self, size: int, upper: int, native_kernels: bool) -> int:
        """Keys per score chunk for ``size`` keys and at most ``upper`` kept per query."""
        default = _NATIVE_KEY_CHUNK if native_kernels else _KEY_CHUNK
        return min(size, max(default if self.chunk_size is None else self.chunk_size, upper))

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
        """Top-K association; see the class docstring. Returns ``(out (B, H, L, Ev), weights)``."""
        if self._attends_fused(q, k, v, separation, scale, mask, dropout, return_weights):
            return self._fused(q, k, v, separation, scale, mask, causal), None
        if self._selects_densely(q, k, v, scale, dropout, return_weights):
            return self._dense_selected(q, k, v, separation, scale, mask, causal), None
        if self._dense_fits(q, k, v, scale):
            if _softmax_selected_applies(q, k, v, separation, scale, mask, dropout, return_weights):
                assert isinstance(separation, SoftmaxN) and not isinstance(scale, Tensor)
                if causal:
                    mask = with_causal(mask, q.shape[-2], k.shape[-2], q.device)
                select = self._selector(mask)
                out = _SelectedSoftmax.apply(q, k, v, scale, separation.n, mask, select)
                return out, None
            return dense_with_support(
                q,
                k,
                v,
                self._dense_support(q, k, scale, mask, causal),
                separation=separation,
                scale=scale,
                mask=mask,
                dropout=dropout,
                return_weights=return_weights,
            )
        if _recompute_applies(q, k, v, separation, scale, mask, dropout, return_weights):
            return self._recomputed(q, k, v, separation, scale, mask, causal), None
        size = k.shape[-2]
        upper = upper_count(self.k, self.fraction, size)
        chunk = self.key_chunk(size, upper, native.available(q, k))
        return self._run(
            q,
            k,
            v,
            separation=separation,
            scale=scale,
            mask=mask,
            causal=causal,
            dropout=dropout,
            return_weights=return_weights,
            slots=upper,
            extra_per_query=upper + chunk,
        )

    def _fused_ready(self, q: Tensor, k: Tensor, v: Tensor) -> bool:
        """A BLAS product for the kernel (:func:`native.attention_available`)."""
        return native.attention_available(q, k, v)

    def _fused(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        separation: Separation,
        scale: Scale,
        mask: Tensor | None,
        causal: bool,
    ) -> Tensor:
        """The association in one native kernel (:func:`native.topk_attend`): per block of
        queries the score product, each query's ``K`` largest allowed scores (the keys of
        every other path) and their Softmax_n weighted sum; with gradients through
        :class:`_FusedSoftmax`."""
        assert isinstance(separation, SoftmaxN) and not isinstance(scale, Tensor)
        size = k.shape[-2]
        counts = self._kernel_counts(q, k, mask, causal)
        chunk = self.key_chunk(size, upper_count(self.k, self.fraction, size), True)
        attend = functools.partial(
            native.topk_attend,
            count=counts.count,
            population=counts.prefix,
            bias=counts.bias,
            scale=scale,
            n=separation.n,
            chunk=chunk,
        )
        return _fused_association(q, k, v, counts.count, scale, attend)

    def _selects_densely(
        self, q: Tensor, k: Tensor, v: Tensor, scale: Scale, dropout: float, return_weights: bool
    ) -> bool:
        """Whether the association takes :meth:`_dense_selected` (:meth:`_selection_fits`
        with :data:`TOPK_SELECT_UNTIL`)."""
        return self._selection_fits(q, k, v, scale, dropout, return_weights, TOPK_SELECT_UNTIL)

    def _dense_selected(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        separation: Separation,
        scale: Scale,
        mask: Tensor | None,
        causal: bool,
    ) -> Tensor:
        """The association from the full score matrix ``(B, H, L, S)``: each row's ``K`` largest
        allowed scores kept by :func:`native.topk_keep` (the same keys as the gathered path),
        which for Softmax_n also gives the weights, in place; any other separation runs over the
        kept scores (``-inf`` elsewhere)."""
        if causal:
            mask = with_causal(mask, q.shape[-2], k.shape[-2], q.device)
        return _associate_selected(q, k, v, separation, scale, mask, self._selector(mask))

    def _selector(self, mask: Tensor | None) -> Callable[[Tensor, int, int], Callable[..., Tensor]]:
        """The selection of :func:`_associate_selected` and :class:`_SelectedSoftmax`:
        :func:`native.topk_keep` on a block of scores in place (``mask``, with the causal rule,
        is what the scores were masked with)."""

        def select(scores: Tensor, start: int, stop: int) -> Callable[..., Tensor]:
            count = self._kept_counts(scores, limited=mask is not None)
            return functools.partial(native.topk_keep, scores, count, out=scores)

        return select

    def _kept_counts(self, scores: Tensor, limited: bool) -> int | Tensor:
        """How many of each row's scores ``(..., S)`` are kept: ``min(k, S)``, or per row for
        ``fraction`` (of the finite scores when some rows are ``limited`` by a mask)."""
        size = scores.shape[-1]
        if self.fraction is None:
            assert self.k is not None
            return min(self.k, size)
        valid = (
            (scores > -math.inf).sum(-1)
            if limited
            else scores.new_full(scores.shape[:-1], size, dtype=torch.int64)
        )
        return support_size(valid, None, self.fraction)

    def _dense_support(
        self, q: Tensor, k: Tensor, scale: Scale, mask: Tensor | None, causal: bool
    ) -> Tensor:
        """The additive support bias ``(B, H, L, S)`` (:func:`support_bias`) of every query from
        its full row of scores: the ``K`` largest allowed scores (``K`` per row from the allowed
        keys for ``fraction``; :func:`native.topk_keep`, else :func:`top_scores`), no
        gradients."""
        batch, heads, length, _ = q.shape
        size = k.shape[-2]
        with torch.no_grad():
            scores = torch.matmul(q * scale, k.transpose(-1, -2))
            bias = additive_bias(mask, scores.dtype)
            if bias is not None:
                scores = scores + bias
            if causal:
                scores = scores.masked_fill(~causal_mask(length, size, q.device), -math.inf)
            scores = scores.expand(batch, heads, length, size).contiguous()
            limited = bias is not None or causal  # some rows may have fewer allowed keys
            if native.available(scores):
                count = self._kept_counts(scores, limited)
                return native.topk_keep(scores, count, output="bias", out=scores)
            slots = upper_count(self.k, self.fraction, size)
            values, idx = top_scores(scores, slots)
            keep = values > -math.inf if limited else None
            if self.fraction is not None:
                valid = (
                    (scores > -math.inf).sum(-1) if limited else torch.full_like(idx[..., 0], size)
                )
                values, order = values.sort(dim=-1, descending=True)
                idx = idx.gather(-1, order)
                ranked = torch.arange(slots, device=q.device) < support_size(
                    valid, self.k, self.fraction
                ).unsqueeze(-1)
                keep = ranked & (values > -math.inf)
            # The scores' buffer takes the bias, except in a captured graph: AOT autograd's
            # functionalization ran this fill before the topk that reads the buffer when the
            # buffer came from a no-op expand().contiguous() (an alias), and every query lost its
            # support (NaN outputs under torch.compile with gradients, torch 2.13).
            fresh = native.abstract_tensors()
            out = torch.full_like(scores, -math.inf) if fresh else scores.fill_(-math.inf)
            return support_bias(idx, keep, out)

    def _support(
        self,
        q: Tensor,
        k: Tensor,
        *,
        scale: Tensor | float,
        bias: Tensor | None,
        causal: bool,
        start: int,
        length: int,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """The support search in pieces of queries whose score block stays in cache."""
        batch, heads, rows, _ = q.shape
        size = k.shape[-2]
        upper = upper_count(self.k, self.fraction, size)
        chunk = self.key_chunk(size, upper, native.available(q, k))
        step = max(1, _SCORE_PIECE // max(1, batch * heads * chunk))
        # One buffer for every piece's scores (and one selection state): fresh ones per piece
        # cost their page faults again.
        workspace = q.new_empty(batch * heads * min(step, rows) * chunk)
        selection = None
        scores_dtype = q.dtype if not isinstance(scale, Tensor) else scale.dtype
        # One chunk of keys: a single top-K (native.topk keeps no per-row state between chunks).
        several_chunks = size > chunk
        if (
            several_chunks
            and native.available(q, k)
            and torch.promote_types(q.dtype, scores_dtype) == q.dtype
        ):
            selection = native.RunningTopK(batch * heads * min(step, rows), upper, q.dtype)
        if step >= rows:
            return self._support_piece(
                q,
                k,
                scale=scale,
                bias=bias,
                causal=causal,
                start=start,
                length=length,
                workspace=workspace,
                selection=selection,
            )
        parts = []
        q_scaled = q * scale  # once, not once a piece: each operation is a parallel region
        for lo in range(0, rows, step):
            hi = min(lo + step, rows)
            piece_bias = None if bias is None else _rows(bias, lo, hi, rows)
            assert not isinstance(piece_bias, float)
            parts.append(
                self._support_piece(
                    q_scaled[:, :, lo:hi],
                    k,
                    scale=None,
                    bias=piece_bias,
                    causal=causal,
                    start=start + lo,
                    length=length,
                    workspace=workspace,
                    selection=selection,
                )
            )
        if all(p[1] is None and p[2] is not None for p in parts):  # fixed k: equal widths
            return (
                torch.cat([p[0] for p in parts], dim=2),
                None,
                torch.cat([p[2] for p in parts if p[2] is not None], dim=2),
            )
        slots = max(p[0].shape[-1] for p in parts)
        idx = torch.cat([F.pad(p[0], (0, slots - p[0].shape[-1])) for p in parts], dim=2)
        best = torch.cat(
            [
                F.pad(p[2], (0, slots - p[2].shape[-1]), value=-math.inf)
                for p in parts
                if p[2] is not None
            ],
            dim=2,
        )
        keep = torch.cat(
            [
                F.pad(
                    torch.ones(p[0].shape, dtype=torch.bool, device=q.device)
                    if p[1] is None
                    else p[1],
                    (0, slots - p[0].shape[-1]),
                    value=False,
                )
                for p in parts
            ],
            dim=2,
        )
        return idx, (None if bool(keep.all()) else keep), best

    def _support_piece(
        self,
        q: Tensor,
        k: Tensor,
        *,
        scale: Tensor | float | None,
        bias: Tensor | None,
        causal: bool,
        start: int,
        length: int,
        workspace: Tensor,
        selection: native.RunningTopK | None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """The support of the queries ``q (B, H, Lc, E)`` (see :meth:`_support`; ``scale=None``:
        ``q`` is already scaled), each key chunk's
        scores computed into ``workspace`` (a flat buffer of at least ``B·H·Lc·chunk``) and, with
        the native kernels, ranked by ``selection`` (restarted here), else by
        :func:`_running_top`."""
        batch, heads, rows, _ = q.shape
        size = k.shape[-2]
        upper = upper_count(self.k, self.fraction, size)
        chunk = self.key_chunk(size, upper, native.available(q, k))
        # Causal: no query of the piece sees beyond this column (but keep at least ``upper``).
        end = max(min(size, start + rows + size - length), upper) if causal else size
        if causal:
            query = torch.arange(start, start + rows, device=q.device).view(rows, 1)
        best_scores: Tensor | None = None
        best_idx: Tensor | None = None
        # Valid keys per query (``fraction`` only): counted where a mask makes them
        # data-dependent. A fixed ``k`` keeps every slot (``slots = min(k, S)``), so no
        # per-row bookkeeping runs: each small operation is a parallel region of its own, which
        # a busy CPU makes expensive.
        count_valid = self.fraction is not None and bias is not None
        valid: Tensor | None = None
        if count_valid:
            valid = torch.zeros(batch, heads, rows, dtype=torch.int64, device=q.device)
        elif self.fraction is not None:
            valid = _valid_prefix(start, start + rows, length, size, causal, q.device)
            valid = valid.expand(batch, heads, rows)
        q_scaled = q if scale is None else q * scale  # (Lc, E) products, not (Lc, chunk)
        if selection is not None:
            selection.restart(batch * heads * rows)
        for lo in range(0, end, chunk):
            hi = min(lo + chunk, end)
            scores = _product_into(workspace, q_scaled, k[:, :, lo:hi])
            if bias is not None:
                piece_bias = bias if bias.shape[-1] == 1 else bias[..., lo:hi]
                if torch.broadcast_shapes(scores.shape, piece_bias.shape) == scores.shape:
                    scores.add_(piece_bias)
                else:
                    scores = scores + piece_bias
            if causal:
                cols = torch.arange(lo, hi, device=q.device).view(1, hi - lo)
                scores.masked_fill_(cols > query + (size - length), -math.inf)
            scores = scores.expand(batch, heads, rows, hi - lo)
            if valid is not None and count_valid:
                valid += torch.isfinite(scores).sum(-1)
            if selection is not None:
                selection.push(scores, offset=lo)
            else:
                best_scores, best_idx = _running_top(best_scores, best_idx, scores, upper, lo)
        if selection is not None:
            found = selection.result()
            best_scores, best_idx = (t.view(batch, heads, rows, upper) for t in found)
        assert best_idx is not None and best_scores is not None
        if valid is None:
            return best_idx, None, best_scores
        kept = support_size(valid, self.k, self.fraction)
        slots = best_idx.shape[-1]
        if bool((kept < slots).any()):
            # Rows keep different numbers of keys: order the candidates, keep a prefix per row.
            best_scores, order = best_scores.sort(dim=-1, descending=True)
            best_idx = best_idx.gather(-1, order)
            slots = int(kept.max())
            best_idx, best_scores = best_idx[..., :slots], best_scores[..., :slots]
        keep = torch.arange(slots, device=q.device) < kept.unsqueeze(-1)
        return best_idx, (None if bool(keep.all()) else keep), best_scores


# ------------------------------------------------------------------------------------------------
# Random mask
# ------------------------------------------------------------------------------------------------

EvalSampling = Literal["fixed", "resample", "dense"]


def floyd_sample(count: Tensor, n: Tensor, slots: int, rand: Tensor) -> Tensor:
    """Uniform random subsets without replacement, one per row (Floyd's algorithm, vectorised).

    Row ``r`` draws ``count[r] <= n[r]`` distinct integers from ``[0, n[r])``; the result has
    ``slots >= max(count)`` columns, the first ``count[r]`` of which hold the subset (the rest 0).

    Args:
        count: ``(R,)`` subset sizes (int64).
        n: ``(R,)`` population sizes (int64).
        slots: number of output columns.
        rand: ``(R, slots)`` uniform numbers in ``[0, 1)`` (the only randomness used).
    Returns:
        ``(R, slots)`` int64 indices. Cost ``O(R · slots²)``.
    """
    chosen = torch.zeros(n.shape[0], slots, dtype=torch.int64, device=n.device)
    for i in range(slots):
        active = i < count
        top = n - count + i  # draw from [0, top]
        pick = torch.floor(rand[:, i].to(torch.float64) * (top + 1).to(torch.float64)).to(
            torch.int64
        )
        pick = torch.minimum(pick, top)
        if i > 0:
            taken = (chosen[:, :i] == pick.unsqueeze(-1)).any(-1)
            pick = torch.where(taken, top, pick)
        chosen[:, i] = torch.where(active, pick, torch.zeros_like(pick))
    return chosen


def rejection_sample(
    count: Tensor, n: Tensor, slots: int, draw: Callable[[tuple[int, ...]], Tensor]
) -> Tensor:
    """Uniform random subsets without replacement, one per row, by redrawing repeated keys.

    Row ``r`` draws ``count[r]`` keys uniformly *with* replacement from ``[0, n[r])``; the slots
    that repeat a key held by another slot of the row are redrawn (again uniformly from all
    ``n[r]`` keys) until the row's ``count[r]`` keys are distinct. The held set is the set of the
    first ``count[r]`` distinct values of an i.i.d. uniform stream, whose law is invariant under
    relabelling the keys: a uniform ``count[r]``-subset (the law of :func:`floyd_sample`). Which
    copy of a repeated key is redrawn does not matter (the copies hold the same key), so repeats
    are found by letting every slot write its number into a per-row table at its key and
    redrawing the slots that do not read their own number back.

    A redraw repeats a held key with probability ``count / n``, so this is meant for
    ``2 · count <= n``: each round redraws at most half of the previous round's slots on average.
    Cost ``O(R · slots)`` per round; the ``R × max(n)`` table (two bytes an entry, rows in chunks
    of ``2**22`` entries) is never cleared: only entries written in the call are read.

    Args:
        count: ``(R,)`` subset sizes (int64), ``count <= n``.
        n: ``(R,)`` population sizes (int64).
        slots: number of output columns, ``>= max(count)``; columns ``>= count[r]`` hold 0.
        draw: ``draw(shape)`` returns uniform numbers in ``[0, 1)`` of that shape (the only
            randomness used).
    Returns:
        ``(R, slots)`` int64 indices.
    """
    rows = n.shape[0]
    width = max(int(n.max()), 1) if rows else 1
    chunk = max(1, (1 << 22) // width)
    if rows > chunk:
        parts = [
            rejection_sample(count[lo : lo + chunk], n[lo : lo + chunk], slots, draw)
            for lo in range(0, rows, chunk)
        ]
        return torch.cat(parts)
    device = n.device
    active = torch.arange(slots, device=device) < count.unsqueeze(-1)
    population = n.to(torch.float64).unsqueeze(-1)
    chosen = (draw((rows, slots)).to(torch.float64) * population).to(torch.int64)
    chosen = torch.minimum(chosen, (n - 1).clamp_min(0).unsqueeze(-1)).masked_fill_(~active, 0)
    id_type = torch.int16 if slots < 2**15 else torch.int32
    slot = torch.arange(slots, dtype=id_type, device=device)
    # Inactive slots write nothing (index 0 with their own id would clash): send them to a spare
    # column of their own.
    table = torch.empty(rows, width + 1, dtype=id_type, device=device)
    spare = torch.full_like(chosen, width)
    where = torch.where(active, chosen, spare)
    table.scatter_(1, where, slot.expand(rows, slots))
    repeat = (table.gather(1, where) != slot) & active
    pending = repeat.any(-1).nonzero().squeeze(-1)
    while pending.numel():
        which = repeat[pending].nonzero()
        row = pending[which[:, 0]]
        fresh = (draw((row.shape[0],)).to(torch.float64) * population[row, 0]).to(torch.int64)
        fresh = torch.minimum(fresh, n[row] - 1)
        chosen[row, which[:, 1]] = fresh
        table[row, fresh] = which[:, 1].to(id_type)
        held = torch.where(active[pending], chosen[pending], spare[pending])
        owner = table.view(-1)[held + pending.unsqueeze(-1) * (width + 1)]
        again = (owner != slot) & active[pending]
        repeat = torch.zeros_like(repeat)
        repeat[pending] = again
        pending = pending[again.any(-1)]
    return chosen


def sample_subsets(
    count: Tensor, n: Tensor, slots: int, draw: Callable[[tuple[int, ...]], Tensor]
) -> Tensor:
    """Uniform ``count[r]``-subsets of ``[0, n[r])`` per row, ``(R, slots)`` int64 (0-filled).

    Rows with ``2 · count <= n`` use :func:`rejection_sample` (about ``O(slots · log slots)`` per
    row); the others (nearly full subsets, e.g. the first queries of causal association) use
    :func:`floyd_sample` (``O(slots²)`` per row). Both draw uniform subsets. With the native
    kernels (CPU) every row takes Floyd's algorithm in C, ``O(slots)`` a row with one uniform per
    slot (:func:`hopfield.functional.native.floyd_sample`, the same subsets as
    :func:`floyd_sample` from the same uniforms).
    """
    if native.usable_on(n.device):
        return native.floyd_sample(count, n, slots, draw((n.shape[0], slots)))
    sparse = 2 * count <= n
    if bool(sparse.all()):
        return rejection_sample(count, n, slots, draw)
    chosen = torch.zeros(n.shape[0], slots, dtype=torch.int64, device=n.device)
    where = sparse.nonzero().squeeze(-1)
    if where.numel():
        chosen[where] = rejection_sample(count[where], n[where], slots, draw)
    full = (~sparse).nonzero().squeeze(-1)
    width = max(int(count[full].max()), 1)
    picked = floyd_sample(count[full], n[full], width, draw((full.shape[0], width)))
    chosen[full, :width] = picked
    return chosen


def _index_sampler_applies(upper: int, size: int, causal: bool) -> bool:
    """Whether :class:`RandomMask` samples key indices directly (:func:`sample_subsets`, no
    ``L × S`` work) rather than ranking random priorities over all keys: without a mask, when
    at most half the keys are drawn (and, causal, when the nearly full subsets of the first
    queries are small enough for Floyd's ``O(k²)`` per row)."""
    return 2 * upper <= size and (not causal or upper * upper <= 4 * size)


# Without the native kernels (GPUs, no C compiler), random masks with gradients
# take the fused dense kernel with an additive mask of the sampled subsets when
# ``S <= _MASKED_KERNEL_RATIO · k`` and the mask has at most ``_MASKED_KERNEL_ELEMENTS`` entries
# (128 MiB in float32). Measured on the 2-core CPU with PyTorch's gathers (k = 64, E = 64, B1 H8,
# ratio to plain SDPA, forward + backward): 1.6 x at S = 1k and 1.5 x at 2k against 4.3 x and
# 2.1 x for the gathered path, which wins from 4k. With the native kernels the gathered path wins
# at every size (0.55 x at 1k, 0.34 x at 2k, 27 Nov 2026). Without gradients the gathered path is as fast or
# faster and keeps its memory within the block budget, so the mask serves only the gradient path.
_MASKED_KERNEL_RATIO = 32
_MASKED_KERNEL_ELEMENTS = 1 << 25


def _masked_kernel_applies(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    separation: Separation,
    scale: Scale,
    mask: Tensor | None,
    dropout: float,
    return_weights: bool,
    upper: int,
) -> bool:
    """Whether a random-mask association takes :meth:`RandomMask._masked_kernel`: gradients
    needed, a Softmax_n separation (the fused kernels' family), no dropout, no weights, a mask
    without gradients, no native kernels and a size where the ``L × S`` mask is the cheaper
    way."""
    batch, heads, length, _ = q.shape
    size = k.shape[-2]
    return (
        not native.available(q, k, v)
        and isinstance(separation, SoftmaxN)
        and dropout == 0.0
        and not return_weights
        and (mask is None or not mask.requires_grad)
        and _grads_needed(q, k, v, scale)
        and size <= _MASKED_KERNEL_RATIO * upper
        and batch * heads * length * size <= _MASKED_KERNEL_ELEMENTS
    )


@dataclass
class _CallDraws(threading.local):
    """What one call of :class:`RandomMask` draws from: its generator and, once drawn, the seed
    of its streams (set at the call's start, cleared at its end). Not an attribute of the module
    (``nn.Module.__setattr__`` costs microseconds); one per thread, so that calls of one module
    from several threads (a model served by a thread pool) do not draw from each other's
    generator and seed. Copies and pickles start empty, as a call does."""

    generator: torch.Generator | None = None
    seed: int | None = None

    def __reduce__(self) -> tuple[type[_CallDraws], tuple[()]]:
        return type(self), ()


class RandomMask(_GatheredStructure):
    """Each query sees an exactly-``k`` uniformly random subset of the memories (paper Example 1).

    The subset is drawn per query and per call, among the keys the mask and the causal rule allow;
    its keys and values are gathered, so the association costs ``O(L · k · d)``. ``k`` is given
    directly or as ``max(1, int(fraction · valid keys))`` (``fraction`` = share *kept*; the
    paper's "mask probability" p is ``1 - fraction``).

    Sampling: on the native CPU kernels, without ``force`` and with no mask or one per key (a
    padding mask, ``(B|1, H|1, 1, S)``), each query draws Floyd's algorithm on its own random
    stream, keyed by one seed per call (from the generator below) and the query's place in the
    call (:func:`native.sample_indices`, :func:`native.sample_keep`), among the keys the mask
    allows: every path and every cut into query blocks sees the same subsets. Otherwise,
    without a mask and for ``2 k <= S`` (causal: also ``k² <= 4 S``), key indices are drawn
    directly with no ``L × S`` work (:func:`sample_subsets`: uniform draws whose repeats are
    redrawn, about ``O(L · k · log k)``; Floyd's ``O(k²)`` algorithm for the rows that keep more
    than half their keys); else uniform random priorities over the allowed keys, keeping the
    ``k`` largest, or, when most keys are kept, dropping the ``n - k`` smallest. Every path draws each query's subset uniformly among the allowed ``k``-subsets.

    Softmax_n with a number β and no ``force``, dropout or weights, with no mask or one per key,
    runs in one native kernel on the CPU (:func:`native.sample_attend`: the subsets drawn,
    scored, weighed and summed in one parallel region; with gradients the hand backward
    :func:`native.attend_backward` over the saved subsets and weights). Other separations
    without gradients, up to :data:`RANDOM_MASK_SELECT_UNTIL` keys (native kernels, no mask, no
    ``force``, no dropout, no weights), draw and weigh the subsets on the full score matrix in
    one kernel (:func:`native.sample_keep`).

    Randomness and modes:

    * training (``module.train()``, the default of a new module): a fresh subset every call, drawn
      from ``generator`` if given, else from a private generator seeded with ``seed``, else from
      torch's global generator;
    * evaluation (``module.eval()``), chosen by ``eval_sampling``: ``"fixed"`` (default) draws
      from a generator re-seeded with ``seed`` (0 if ``None``) at every call, so the same inputs
      always see the same subsets; ``"resample"`` behaves as in training; ``"dense"`` uses every
      memory (the plain dense association).

    Args:
        k: number of memories per query; a query that may see fewer (e.g. ``k > S``) sees them all.
        fraction: alternatively, the fraction of valid memories kept, in ``(0, 1]``.
        seed: seed of the private generator.
        generator: an explicit :class:`torch.Generator` (takes precedence over ``seed`` in training).
        force: optional key indices broadcastable to ``(B, H, L)`` that are always in the subset
            of their query (for the theory checks, which condition on µ ∈ 𝓜); the other ``k - 1``
            are drawn uniformly from the rest.
        eval_sampling: the evaluation-mode behaviour, see above.
        max_block_elements: budget of gathered elements per query block.
        dense_until: with gradients, up to this many keys (and an ``L × S`` mask within
            ``max_block_elements``: the subsets are drawn in one block) the sampled subsets become a mask of the dense fused
            kernel (:func:`dense_with_support`): the same association, cheaper at small sizes;
            ``None``: never.
    """

    def __init__(
        self,
        k: int | None = None,
        *,
        fraction: float | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        force: Tensor | None = None,
        eval_sampling: EvalSampling = "fixed",
        max_block_elements: int = 1 << 23,
        dense_until: int | None = RANDOM_MASK_DENSE_UNTIL,
    ) -> None:
        super().__init__()
        self.k, self.fraction = _check_count(k, fraction)
        self.dense_until = _check_dense_until(dense_until)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        if eval_sampling not in ("fixed", "resample", "dense"):
            raise ValueError(
                f"eval_sampling must be 'fixed', 'resample' or 'dense', got {eval_sampling!r}"
            )
        if force is not None and (
            not isinstance(force, Tensor)
            or force.is_floating_point()
            or force.is_complex()
            or force.dtype == torch.bool
        ):
            raise TypeError("force must be an integer Tensor of key indices or None")
        if force is not None and force.dim() > 3:
            raise ValueError(
                f"force must be broadcastable to (B, H, L) (at most 3 dims), got shape "
                f"{tuple(force.shape)}"
            )
        self.seed = seed
        self.generator = generator
        self.force = force
        self.eval_sampling: EvalSampling = eval_sampling
        self.max_block_elements = _check_positive_int("max_block_elements", max_block_elements)
        self._private: dict[str, torch.Generator] = {}
        self._call = _CallDraws()

    def extra_repr(self) -> str:
        count = f"k={self.k}" if self.k is not None else f"fraction={self.fraction:g}"
        return f"{count}, seed={self.seed}, eval_sampling={self.eval_sampling!r}"

    def _generator_for(self, device: torch.device) -> torch.Generator | None:
        if not self.training and self.eval_sampling == "fixed":
            fixed = torch.Generator(device=device)
            fixed.manual_seed(0 if self.seed is None else self.seed)
            return fixed
        if self.generator is not None:
            return self.generator
        if self.seed is None:
            return None
        key = str(device)
        private = self._private.get(key)
        if private is None:
            private = torch.Generator(device=device)
            private.manual_seed(self.seed)
            # setdefault: of two threads' first calls, both draw from the one that is kept
            private = self._private.setdefault(key, private)
        return private

    def _check_not_recomputed(self) -> None:
        """Refuse a recomputation (activation checkpointing) that would draw other subsets than
        the call it recomputes: from this module's own generator, which checkpointing does not
        rewind (its gradients would belong to other subsets than the output's, silently)."""
        generator = self._call.generator
        fixed = not self.training and self.eval_sampling == "fixed"  # re-seeded every call
        if generator is not None and not fixed and recomputing_in_backward():
            raise RuntimeError(
                "RandomMask: a forward recomputed in the backward pass (activation checkpointing) "
                "would draw other subsets than the first call from this module's own generator "
                f"(seed={self.seed!r}{', generator=...' if self.generator is not None else ''}), "
                "which checkpointing does not rewind; use seed=None and no generator (torch's "
                "global generator, whose state checkpointing restores) or do not checkpoint this "
                "module"
            )

    def _stream_seed(self) -> int:
        """The seed of this call's kernel-drawn subsets (:func:`native.sample_keep`,
        :func:`native.sample_indices`), drawn from its generator at the first use in the call:
        every block of queries and every path of the call draws from the same streams."""
        call = self._call
        if call.seed is None:
            where = call.generator.device if call.generator is not None else "cpu"
            draw = torch.randint(0, 1 << 62, (1,), generator=call.generator, device=where)
            call.seed = int(draw)
        return call.seed

    def _rand(self, shape: tuple[int, ...], device: torch.device) -> Tensor:
        generator = self._call.generator
        if generator is None:  # torch's global generator, without generator=None: passed,
            # torch.compile's symbolic shapes fail ("SymIntArrayRef expected to contain only
            # concrete integers")
            return torch.rand(shape, device=device)
        return torch.rand(shape, generator=generator, device=generator.device).to(device)

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
        """Random-subset association; see the class docstring. Returns ``(out, weights)``."""
        if not self.training and self.eval_sampling == "dense":
            return Dense()(
                q,
                k,
                v,
                separation=separation,
                scale=scale,
                mask=mask,
                causal=causal,
                dropout=dropout,
                return_weights=return_weights,
            )
        size = k.shape[-2]
        upper = upper_count(self.k, self.fraction, size)
        self._call.generator = self._generator_for(q.device)
        self._check_not_recomputed()
        try:
            if self._attends_fused(q, k, v, separation, scale, mask, dropout, return_weights):
                return self._fused(q, k, v, separation, scale, mask, causal), None
            if self._samples_densely(q, k, v, scale, mask, dropout, return_weights):
                return self._dense_sampled(q, k, v, separation, scale, causal), None
            if self._dense_fits(q, k, v, scale):
                return self._masked_kernel(
                    q, k, v, separation, scale, mask, causal, dropout, return_weights
                )
            if _masked_kernel_applies(
                q, k, v, separation, scale, mask, dropout, return_weights, upper
            ):
                return self._masked_kernel(q, k, v, separation, scale, mask, causal)
            if _recompute_applies(q, k, v, separation, scale, mask, dropout, return_weights):
                # Gradients: store the sampled indices only, recompute the scores in backward.
                return self._recomputed(q, k, v, separation, scale, mask, causal), None
            return self._run(
                q,
                k,
                v,
                separation=separation,
                scale=scale,
                mask=mask,
                causal=causal,
                dropout=dropout,
                return_weights=return_weights,
                slots=upper,
                extra_per_query=(
                    upper if mask is None and _index_sampler_applies(upper, size, causal) else size
                ),
            )
        finally:
            self._call.generator = None
            self._call.seed = None

    def _fused_ready(self, q: Tensor, k: Tensor, v: Tensor) -> bool:
        """No forced keys (the kernel draws every key of a subset)."""
        return self.force is None

    def _fused(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        separation: Separation,
        scale: Scale,
        mask: Tensor | None,
        causal: bool,
    ) -> Tensor:
        """The association in one native kernel (:func:`native.sample_attend`): each query's
        subset drawn on this call's streams among the keys its mask allows (without a mask the
        subsets of every other native path), its scores, Softmax_n weights and weighted sum;
        with gradients through :class:`_FusedSoftmax`."""
        assert isinstance(separation, SoftmaxN) and not isinstance(scale, Tensor)
        counts = self._kernel_counts(q, k, mask, causal)
        attend = functools.partial(
            native.sample_attend,
            count=counts.count,
            population=counts.valid,
            seed=self._stream_seed(),
            scale=scale,
            n=separation.n,
            bias=counts.bias,
            keys=counts.allowed_keys(),
        )
        return _fused_association(q, k, v, counts.count, scale, attend)

    def _samples_densely(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        scale: Scale,
        mask: Tensor | None,
        dropout: float,
        return_weights: bool,
    ) -> bool:
        """Whether the association takes :meth:`_dense_sampled`: no mask or forced keys, and
        :meth:`_selection_fits` with :data:`RANDOM_MASK_SELECT_UNTIL`."""
        return (
            mask is None
            and self.force is None
            and self._selection_fits(
                q, k, v, scale, dropout, return_weights, RANDOM_MASK_SELECT_UNTIL
            )
        )

    def _dense_sampled(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        separation: Separation,
        scale: Scale,
        causal: bool,
    ) -> Tensor:
        """The association from the full score matrix ``(B, H, L, S)``: each query's uniform
        subset of the keys it may see (the causal prefix) is drawn and kept by
        :func:`native.sample_keep` (Floyd's algorithm on a per-row stream seeded from this
        call's generator), which for Softmax_n also gives the weights."""
        select = self._selector(q.shape[-2], causal)
        return _associate_selected(q, k, v, separation, scale, None, select)

    def _selector(
        self, length: int, causal: bool
    ) -> Callable[[Tensor, int, int], Callable[..., Tensor]]:
        """The selection of :func:`_associate_selected` and :class:`_SelectedSoftmax`:
        :meth:`_sampler` on a block of scores of a call with ``length`` queries."""

        def select(scores: Tensor, start: int, stop: int) -> Callable[..., Tensor]:
            return self._sampler(scores, start, length, causal)

        return select

    def _sampler(
        self, scores: Tensor, start: int, length: int, causal: bool
    ) -> Callable[..., Tensor]:
        """:func:`native.sample_keep` on ``scores (B, H, rows, S)`` of the queries from ``start``
        (of ``length``) in place, for each query ``min(K, visible)`` of the keys the causal rule
        lets it see, on this call's streams (:meth:`_stream_seed`); the remaining arguments
        (``output``, ``scale``, ``n``) are the caller's."""
        size = scores.shape[-1]
        seen = _valid_prefix(start, start + scores.shape[-2], length, size, causal, scores.device)
        seen = seen.expand(scores.shape[:-1])
        count = kept_count(seen, self.k, self.fraction)
        return functools.partial(
            native.sample_keep, scores, count, seen, self._stream_seed(), start=start,
            length=length, out=scores,
        )  # fmt: skip

    def _masked_kernel(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        separation: Separation,
        scale: Scale,
        mask: Tensor | None,
        causal: bool,
        dropout: float = 0.0,
        return_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """The association as the fused dense kernel with an additive mask of the sampled
        subsets (:func:`dense_with_support`), for sizes where the ``L × S`` mask costs less
        than gathering ``k`` keys and values per query. The subsets are drawn by the same
        sampler: on the native kernels without a mask or ``force`` all at once from the call's
        streams (the gathered path's subsets); otherwise per block of queries whose support
        search holds at most ``max_block_elements`` entries (the gathered path's blocks also
        budget its gathered keys, so with several blocks the two paths may see different random
        subsets). Given the subsets, both give the same weights up to rounding."""
        batch, heads, length, _ = q.shape
        size = k.shape[-2]
        bias = additive_bias(mask, q.dtype)
        block = self._block_length(batch * heads, size, length)
        native_subsets = mask is None and self.force is None and native.available(q, k, v)
        if native_subsets and _softmax_selected_applies(
            q, k, v, separation, scale, mask, dropout, return_weights
        ):
            assert isinstance(separation, SoftmaxN) and not isinstance(scale, Tensor)
            select = self._selector(length, causal)
            return _SelectedSoftmax.apply(q, k, v, scale, separation.n, None, select), None
        with torch.no_grad():
            if native_subsets:
                # the subsets drawn in the kernel, on zeros: 0 on each subset, -inf elsewhere
                zeros = q.new_zeros(batch, heads, length, size)
                kernel_bias = self._sampler(zeros, 0, length, causal)(output="bias")
            else:
                kernel_bias = torch.full(
                    (batch, heads, length, size), -math.inf, dtype=q.dtype, device=q.device
                )
                pieces = self._support_blocks(
                    q, k, scale=scale, bias=bias, causal=causal, block=block
                )
                for piece in pieces:
                    rows = kernel_bias[:, :, piece.start : piece.stop]
                    support_bias(piece.idx, piece.keep, rows)
        return dense_with_support(
            q,
            k,
            v,
            kernel_bias,
            separation=separation,
            scale=scale,
            mask=mask,
            dropout=dropout,
            return_weights=return_weights,
        )

    def _streamed_among(
        self,
        bias: Tensor,
        shape: tuple[int, int, int, int],
        start: int,
        length: int,
        causal: bool,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """The subsets of queries ``start .. start + rows - 1`` (``shape = (B, H, rows, S)``) of
        the ``S`` keys under a per-key ``bias`` (``(B|1, H|1, 1, S|1)``): each query's draw on this
        call's streams (:func:`native.sample_indices`) among the allowed keys of its causal
        prefix, mapped to their key indices: the subsets of the fused kernel
        (:func:`native.sample_attend` with ``keys``). Returns ``(idx, keep, None)`` as
        :meth:`_support`."""
        batch, heads, rows, size = shape
        counts = self._key_mask_counts(bias, (batch, heads, size), start, rows, length, causal)
        count, in_order = counts.count, counts.allowed_keys()
        assert in_order is not None
        slots = max(native.largest(count), 1)
        drawn = native.sample_indices(
            count, counts.valid, slots, self._stream_seed(), start=start, length=length
        )
        idx = in_order.gather(-1, drawn.view(batch, heads, rows * slots))
        keep = torch.arange(slots, device=bias.device) < count.unsqueeze(-1)
        return idx.view(drawn.shape), (None if bool(keep.all()) else keep), None

    def _forced(
        self, batch: int, heads: int, start: int, stop: int, length: int, device: torch.device
    ) -> Tensor | None:
        if self.force is None:
            return None
        force = self.force.to(device=device, dtype=torch.int64)
        force = force.reshape((1,) * (3 - force.dim()) + tuple(force.shape))
        want = (batch, heads, length)
        if any(have not in (1, size) for have, size in zip(force.shape, want, strict=True)):
            raise ValueError(
                f"force must be broadcastable to (B, H, L) = {want}, got shape "
                f"{tuple(self.force.shape)}"
            )
        if force.shape[-1] == length:
            force = force[..., start:stop]
        return force.expand(batch, heads, stop - start)

    def _support(
        self,
        q: Tensor,
        k: Tensor,
        *,
        scale: Tensor | float,
        bias: Tensor | None,
        causal: bool,
        start: int,
        length: int,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        batch, heads, rows, _ = q.shape
        size = k.shape[-2]
        device = q.device
        forced = self._forced(batch, heads, start, start + rows, length, device)
        if forced is not None and bool(((forced < 0) | (forced >= size)).any()):
            raise ValueError(f"force must hold key indices in [0, {size}), got values outside")
        upper = upper_count(self.k, self.fraction, size)
        streams = forced is None and native.usable_on(device)
        if streams and bias is not None and bias.shape[-2] == 1:
            return self._streamed_among(bias, (batch, heads, rows, size), start, length, causal)
        if bias is None and (streams or _index_sampler_applies(upper, size, causal)):
            n = _valid_prefix(start, start + rows, length, size, causal, device).expand(
                batch, heads, rows
            )
            count = kept_count(n, self.k, self.fraction)
            slots = max(native.largest(count), 1)

            def draw(shape: tuple[int, ...]) -> Tensor:
                return self._rand(shape, device)

            if streams:  # the subsets of the dense paths' kernels, block by block
                idx = native.sample_indices(
                    count, n, slots, self._stream_seed(), start=start, length=length
                )
            elif forced is None:
                idx = sample_subsets(count.reshape(-1), n.reshape(-1), slots, draw)
            else:
                # The forced key first, then count - 1 others drawn from the remaining n - 1 keys.
                others = sample_subsets(
                    (count - 1).clamp_min(0).reshape(-1),
                    (n - 1).clamp_min(0).reshape(-1),
                    slots,
                    draw,
                ).view(batch, heads, rows, slots)
                target = forced.unsqueeze(-1)
                others = others + (others >= target).to(torch.int64)
                idx = torch.cat([target, others[..., : slots - 1]], dim=-1)
            idx = idx.view(batch, heads, rows, slots)
            keep = torch.arange(slots, device=device) < count.unsqueeze(-1)
            return idx, (None if bool(keep.all()) else keep), None
        allowed = torch.ones(1, 1, rows, size, dtype=torch.bool, device=device)
        if bias is not None:
            allowed = allowed & torch.isfinite(bias)
        if causal:
            query = torch.arange(start, start + rows, device=device).view(rows, 1)
            allowed = allowed & (torch.arange(size, device=device) <= query + (size - length))
        allowed = allowed.expand(batch, heads, rows, size)
        n = allowed.sum(-1)
        count = kept_count(n, self.k, self.fraction)
        slots = max(native.largest(count), 1)
        priority = self._rand((batch, heads, rows, size), device)
        excluded = n - count
        most_excluded = int(excluded.max())
        if forced is None and most_excluded < slots:
            # Most keys are kept: draw the excluded ones (the smallest priorities), a smaller top-k.
            drop = torch.zeros_like(allowed)
            if most_excluded > 0:
                low = priority.masked_fill(~allowed, 2.0).topk(most_excluded, dim=-1, largest=False)
                dropped = torch.arange(most_excluded, device=device) < excluded.unsqueeze(-1)
                drop = drop.scatter(-1, low.indices, dropped)
            kept = allowed & ~drop
            # Kept key j goes to slot (number of kept keys before j); the rest to a spare slot.
            slot = torch.where(kept, kept.cumsum(-1) - 1, torch.full_like(n, slots).unsqueeze(-1))
            keys = torch.arange(size, device=device).expand(batch, heads, rows, size)
            idx = torch.zeros(batch, heads, rows, slots + 1, dtype=torch.int64, device=device)
            idx = idx.scatter(-1, slot, keys)[..., :slots]
            keep = torch.arange(slots, device=device) < count.unsqueeze(-1)
            return idx, (None if bool(keep.all()) else keep), None
        priority = priority.masked_fill(~allowed, -1.0)
        if forced is not None:
            priority = priority.scatter(-1, forced.unsqueeze(-1), 2.0)
            count = count.clamp_min(1)
        idx = priority.topk(slots, dim=-1).indices
        keep = torch.arange(slots, device=device) < count.unsqueeze(-1)
        return idx, (None if bool(keep.all()) else keep), None


# ------------------------------------------------------------------------------------------------
# Sliding window
# ------------------------------------------------------------------------------------------------


class Window(Structure):
    """Sliding-window self-association: query ``i`` sees memories ``|i - j| <= size`` (Longformer).

    Only for self-association (``L == S``). Queries are cut into blocks of ``block`` rows; each
    block attends to its ``block + 2·size`` neighbouring keys (``block + size`` when causal, where
    query ``i`` sees ``i - size <= j <= i``), so time and memory are ``O(L · size · d)`` and no
    ``L × L`` matrix is formed. Any length works (the last block is padded internally), padding
    and attention masks are respected, ``size >= L - 1`` equals dense association.

    Args:
        size: one-sided window ``w`` (each query sees up to ``2w + 1`` memories).
        block: query rows per block (default ``max(size, 16)``).
    """

    def __init__(self, size: int, *, block: int | None = None) -> None:
        super().__init__()
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"size must be a non-negative int, got {size!r}")
        self.size = size
        self.block = None if block is None else _check_positive_int("block", block)

    def extra_repr(self) -> str:
        return f"size={self.size}" + (f", block={self.block}" if self.block is not None else "")

    @staticmethod
    def _blocks(t: Tensor, length: int, padded: int, width: int, left: int, block: int) -> Tensor:
        """A tensor broadcastable to ``(B, H, L, S)`` in block form ``(B, H, nb, block, width)``.

        Block ``n``, row ``r``, column ``c`` is the entry for query ``n·block + r`` and key
        ``n·block - left + c`` (0 outside the tensor).
        """
        t = _as_4d(t)
        nb = padded // block
        by_row, by_col = t.shape[-2] != 1, t.shape[-1] != 1
        if by_row:
            t = F.pad(t, (0, 0, 0, padded - length))
        if not by_col:
            return t.reshape(*t.shape[:2], nb, block, 1) if by_row else t.unsqueeze(-3)
        stride_cols = padded + width - block
        t = F.pad(t, (left, stride_cols - left - length))
        if not by_row:
            return t.unfold(-1, width, block).transpose(-3, -2)
        t = t.contiguous()
        s0, s1 = t.stride(0), t.stride(1)
        return t.as_strided(
            (*t.shape[:2], nb, block, width), (s0, s1, block * stride_cols + block, stride_cols, 1)
        )

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
        """Windowed association; see the class docstring. Returns ``(out (B, H, L, Ev), weights)``."""
        batch, heads, length, _ = q.shape
        size = k.shape[-2]
        if size != length:
            raise ValueError(
                f"Window is self-association: q and k must hold the same number of patterns, "
                f"got L={length} and S={size}"
            )
        w = min(self.size, length - 1)
        block = min(self.block if self.block is not None else max(w, 16), length)
        padded = -(-length // block) * block
        nb = padded // block
        right = 0 if causal else w
        width = block + w + right
        # Queries (B, H, nb, block, E); keys as overlapping blocks (B, H, nb, E, width) (a view).
        q_blocks = F.pad(q, (0, 0, 0, padded - length)).view(batch, heads, nb, block, q.shape[-1])
        k_pad = F.pad(k, (0, 0, w, padded - length + right))
        v_pad = F.pad(v, (0, 0, w, padded - length + right))
        k_blocks = k_pad.unfold(2, width, block)
        v_blocks = v_pad.unfold(2, width, block).transpose(-1, -2)
        scores = torch.matmul(q_blocks, k_blocks)
        scores = scores * (
            self._blocks(scale, length, padded, width, w, block)
            if isinstance(scale, Tensor)
            else scale
        )
        bias = additive_bias(mask, q.dtype)
        if bias is not None:
            scores = scores + self._blocks(bias, length, padded, width, w, block)
        r = torch.arange(block, device=q.device).view(block, 1)
        c = torch.arange(width, device=q.device).view(1, width)
        key = torch.arange(nb, device=q.device).view(nb, 1, 1) * block - w + c
        relative = c - w - r  # key - query
        allowed = (relative >= -w) & (relative <= right) & (key >= 0) & (key < size)
        scores = scores.masked_fill(~allowed, -math.inf)
        weights = separation(scores.reshape(batch, heads, padded, width))
        dropped = F.dropout(weights, dropout) if dropout > 0 else weights
        out = torch.matmul(dropped.view(batch, heads, nb, block, width), v_blocks)
        out = out.reshape(batch, heads, padded, v.shape[-1])[:, :, :length]
        if not return_weights:
            return out, None
        columns = (key + w).expand(nb, block, width).reshape(1, 1, padded, width)
        dense = weights.new_zeros(batch, heads, padded, padded + w + right)
        dense = dense.scatter_add(-1, columns.expand(batch, heads, padded, width), weights)
        return out, dense[:, :, :length, w : w + size]

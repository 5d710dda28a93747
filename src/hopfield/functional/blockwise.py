"""Sparse attention without an ``L × S`` matrix: blockwise sparsemax / α-entmax.

Sparsemax and α-entmax (``1 < α <= 2``) attention ``O = entmax_α(Z) V`` with ``Z = q' kᵀ + bias``
(``q' = scale · q``) is computed tile by tile: queries in blocks of ``Lq`` rows, keys in blocks of
``key_block`` columns, with ``B · H · Lq · key_block <= max_tile_elements``. Nothing larger than a
tile and the per-row state is ever held, so memory is ``O(L · (Ev + E) + tile)`` however long
the memory is. The convention is the one of :func:`hopfield.functional.separation.entmax`:

    x = (α - 1) z - max_j (α - 1) z_j,   p_j = [x_j - τ]_+^(1/(α-1)),   Σ_j p_j = 1, τ in [-1, 0).

**Threshold.** With ``r = 1/(α - 1)`` and ``h(τ) = (Σ_j [x_j - τ]_+^r)^(1/r)`` (a p-norm of
``[x - τ]_+``: convex and decreasing in τ), τ is the root of ``h(τ) = 1``. Newton's method from
the left end ``τ_0 = -1`` (where ``h >= 1``) stays left of the root and increases monotonically:

    τ ← τ + (h - 1) · G0 / (h · G1),   G0 = Σ [x - τ]_+^r,   G1 = Σ [x - τ]_+^(r-1).

For sparsemax (``r = 1``) this is Michelot's algorithm ``τ ← (Σ_{x>τ} x - 1) / |{x > τ}|``:
exact once the support ``{x > τ}`` stops changing (at most ``S`` steps, usually a handful).
For α < 2 the steps stop when the support is unchanged and ``(h - 1) / (α - 1) <= tol`` (Newton
converges quadratically once the support is found); the weights are then normalised by ``G0``,
as the explicit path does.

As in :func:`hopfield.functional.separation.entmax`, the iterate is kept as
``t = (τ + 1) / (α - 1)`` (so ``x_j - τ = 1 + y_j`` with ``y_j = (α - 1)(z_j - max z - t)``) and
the powers are taken as ``exp(r · log1p(y))``: near α = 1 the gap ``1 + y`` rounded to float32
would lose ``r`` ulps in its ``r``-th power, and ``h - 1 = (α - 1) log G0`` would pass the
tolerance with ``G0`` still far from 1. Each step is one streaming pass over the key blocks that
accumulates ``G0``, ``G1``, the support size and ``Σ_j w_j v_j`` at the current τ, so the pass
that detects convergence also yields the output. A first pass finds the row maxima.

**Backward** (a custom :class:`torch.autograd.Function`, scores recomputed tile by tile): with
``s_ij = p_ij^(2-α)`` (the indicator of the support for sparsemax) and the forward's per-row
``v̄_i = Σ_j s_ij v_j / Σ_j s_ij``, the score gradient is
``dZ_ij = s_ij (dO_i·v_j - dO_i·v̄_i)``; then ``dV = Pᵀ dO``, ``dq' = dZ k``, ``dk = dZᵀ q'``,
all accumulated in one pass over the tiles.

(Top-K without an ``L × S`` matrix, with its recomputing backward pass, is
:class:`~hopfield.functional.efficient.TopK`.)
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from hopfield.functional.separation import HALF_DTYPES, gap_power

__all__ = ["blockwise_entmax_attention"]

# Per-row Newton steps for α < 2 (sparsemax has its own exact stop and no cap is needed).
_MAX_NEWTON_STEPS = 100


def _rows(t: Tensor | None, start: int, stop: int, length: int) -> Tensor | None:
    if t is None:
        return None
    return t[:, :, start:stop] if t.shape[-2] == length and length > 1 else t


def _cols(t: Tensor | None, start: int, stop: int) -> Tensor | None:
    if t is None:
        return None
    return t[..., start:stop] if t.shape[-1] > 1 else t


class _Tiles:
    """The score tiles ``z = q' kᵀ + bias`` (causal entries ``-inf``) of one block of queries."""

    def __init__(
        self,
        q: Tensor,
        k: Tensor,
        bias: Tensor | None,
        causal: bool,
        start: int,
        length: int,
        key_block: int,
    ) -> None:
        self.q, self.k, self.bias, self.causal = q, k, bias, causal
        self.start, self.length, self.key_block = start, length, key_block
        self.size = k.shape[-2]
        rows = q.shape[-2]
        self.offset = self.size - length
        self.query = torch.arange(start, start + rows, device=q.device).view(rows, 1)
        # Causal: keys beyond the last query's limit are never seen by this block.
        self.stop = min(self.size, start + rows + self.offset) if causal else self.size

    def __iter__(self) -> Any:
        for lo in range(0, max(self.stop, 0), self.key_block):
            hi = min(lo + self.key_block, self.stop)
            z = torch.matmul(self.q, self.k[:, :, lo:hi].transpose(-1, -2))
            bias = _cols(self.bias, lo, hi)
            if bias is not None:
                z.add_(bias)
            if self.causal:
                cols = torch.arange(lo, hi, device=z.device).view(1, hi - lo)
                z.masked_fill_(cols > self.query + self.offset, -math.inf)
            yield lo, hi, z


def _gap(z: Tensor, coef: float, peak: Tensor, t: Tensor) -> Tensor:
    """``y = (α - 1)(z - peak - t)`` clamped at -1, in place on the fresh score tile ``z``.

    ``1 + y`` is the gap ``[(α - 1) z - m - τ]_+`` with ``τ = -1 + (α - 1) t`` (``t`` instead of
    ``τ`` for the precision near α = 1, see :func:`hopfield.functional.separation.gap_power`).
    """
    z.sub_(peak).sub_(t)
    if coef != 1.0:
        z.mul_(coef)
    return z.clamp_min_(-1.0)


def _gap_power(y: Tensor, exponent: float) -> Tensor:
    """``(1 + y)^exponent`` (a new tensor): exactly ``1 + y`` for α = 1.5, else
    :func:`~hopfield.functional.separation.gap_power` (``~1e-38`` for ``y = -1``)."""
    return y + 1.0 if exponent == 1.0 else gap_power(y, exponent)


def _query_rows(batch_heads: int, length: int, key_block: int, max_tile_elements: int) -> int:
    return max(1, min(length, max_tile_elements // max(1, batch_heads * key_block)))


def _solve_block(
    tiles: _Tiles, v: Tensor, alpha: float, need_mean: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """Threshold and output of one query block.

    Returns ``(out, peak, t, norm, vbar)``: the output ``(B, H, Lq, Ev)``, the row maximum
    ``peak`` (0 for rows without keys), the threshold ``t = (τ + 1) / (α - 1)`` (``+inf`` for rows
    without keys),
    the normaliser ``G0`` (1 for sparsemax) and, when ``need_mean``, ``v̄``.
    """
    sparsemax = alpha == 2.0
    coef = alpha - 1.0
    power = 1.0 / coef
    shape = (*tiles.q.shape[:-1], 1)
    peak = tiles.q.new_full(shape, -math.inf)
    for _, _, z in tiles:
        peak = torch.maximum(peak, z.amax(dim=-1, keepdim=True).expand(shape))
    valid = peak > -math.inf
    peak = torch.where(valid, peak, torch.zeros_like(peak))
    t = torch.where(valid, torch.zeros_like(peak), torch.full_like(peak, math.inf))
    done = ~valid
    previous: Tensor | None = None
    tol = 64 * torch.finfo(tiles.q.dtype).eps
    ev = v.shape[-1]
    step = 0
    while True:
        step += 1
        g0 = torch.zeros_like(peak)
        g1 = torch.zeros_like(peak)
        count = torch.zeros_like(peak)
        out = tiles.q.new_zeros(*shape[:-1], ev)
        mean = tiles.q.new_zeros(*shape[:-1], ev) if need_mean else None
        for lo, hi, z in tiles:
            y = _gap(z, coef, peak, t)
            inside = y > -1.0
            count += inside.sum(dim=-1, keepdim=True)
            v_block = v[:, :, lo:hi]
            if sparsemax:
                if mean is not None:
                    mean += torch.matmul(inside.to(y.dtype), v_block)
                w = y.add_(1.0)
            else:
                s = _gap_power(y, power - 1)  # ~1e-38 outside the support: negligible in sums
                g1 += s.sum(dim=-1, keepdim=True)
                if mean is not None:
                    mean += torch.matmul(s, v_block)
                w = s.mul_(y.add_(1.0))  # exactly 0 outside the support
                del s
            g0 += w.sum(dim=-1, keepdim=True)
            out += torch.matmul(w, v_block)
        if sparsemax:
            g1 = count
        stable = count == previous if previous is not None else torch.zeros_like(done)
        if sparsemax:
            converged = stable
        else:
            log_h = coef * torch.log(g0)  # h = g0 ** (1 / power)
            h = torch.exp(log_h)
            excess = torch.expm1(log_h) / coef  # (h - 1) / (α - 1) without cancellation
            converged = stable & (excess <= tol)
        done = done | converged
        if bool(done.all()) or (not sparsemax and step >= _MAX_NEWTON_STEPS):
            break
        safe_g1 = torch.where(g1 > 0, g1, torch.ones_like(g1))
        if sparsemax:
            proposal = t + (g0 - 1) / safe_g1
        else:
            safe_h = torch.where(h > 0, h, torch.ones_like(h))
            proposal = t + excess * g0 / (safe_h * safe_g1)
        t = torch.where(done, t, torch.maximum(t, proposal))
        previous = count
    norm = torch.ones_like(g0) if sparsemax else torch.where(g0 > 0, g0, torch.ones_like(g0))
    if not sparsemax:
        out = out / norm
    vbar = None
    if mean is not None:
        vbar = mean / torch.where(g1 > 0, g1, torch.ones_like(g1))
    return out, peak, t, norm, vbar


class _BlockwiseEntmax(torch.autograd.Function):
    """α-entmax attention over key tiles; the backward pass recomputes the tiles."""

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        bias: Tensor | None,
        causal: bool,
        alpha: float,
        key_block: int,
        max_tile_elements: int,
    ) -> Tensor:
        batch, heads, length, _ = q.shape
        need_grad = any(ctx.needs_input_grad[:3])
        rows = _query_rows(batch * heads, length, key_block, max_tile_elements)
        out = q.new_zeros(batch, heads, length, v.shape[-1])
        state = q.new_zeros(batch, heads, length, 3)  # peak, t, norm
        vbar = q.new_zeros(batch, heads, length, v.shape[-1]) if need_grad else None
        for start in range(0, length, rows):
            stop = min(start + rows, length)
            tiles = _Tiles(
                q[:, :, start:stop],
                k,
                _rows(bias, start, stop, length),
                causal,
                start,
                length,
                key_block,
            )
            o, peak, t, norm, mean = _solve_block(tiles, v, alpha, need_grad)
            out[:, :, start:stop] = o
            state[:, :, start:stop] = torch.cat([peak, t, norm], dim=-1)
            if vbar is not None and mean is not None:
                vbar[:, :, start:stop] = mean
        ctx.save_for_backward(q, k, v, bias, state, vbar)
        ctx.causal, ctx.alpha, ctx.key_block, ctx.rows = causal, alpha, key_block, rows
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, bias, state, vbar = ctx.saved_tensors
        alpha: float = ctx.alpha
        sparsemax = alpha == 2.0
        coef = alpha - 1.0
        power = 1.0 / coef
        length = q.shape[-2]
        grad = grad.contiguous()
        dq = torch.zeros_like(q)
        dk = torch.zeros_like(k)
        dv = torch.zeros_like(v)
        for start in range(0, length, ctx.rows):
            stop = min(start + ctx.rows, length)
            q_block = q[:, :, start:stop]
            tiles = _Tiles(
                q_block,
                k,
                _rows(bias, start, stop, length),
                ctx.causal,
                start,
                length,
                ctx.key_block,
            )
            peak, t, norm = state[:, :, start:stop].split(1, dim=-1)
            g = grad[:, :, start:stop]
            centre = (g * vbar[:, :, start:stop]).sum(dim=-1, keepdim=True)
            # s = p^(2-α) = gap^(r-1) / norm^(2-α) with the normalised p = gap^r / norm.
            s_scale = norm ** (alpha - 2.0)
            dq_block = torch.zeros_like(q_block)
            for lo, hi, z in tiles:
                y = _gap(z, coef, peak, t)
                inside = y > -1.0
                v_block = v[:, :, lo:hi]
                dz = torch.matmul(g, v_block.transpose(-1, -2)).sub_(centre)
                if sparsemax:
                    dz.mul_(inside)
                    p = y.add_(1.0)
                else:
                    s = _gap_power(y, power - 1).mul_(inside)
                    dz.mul_(s).mul_(s_scale)
                    p = s.mul_(y.add_(1.0)).div_(norm)
                    del s
                dq_block += torch.matmul(dz, k[:, :, lo:hi])
                dk[:, :, lo:hi] += torch.matmul(dz.transpose(-1, -2), q_block)
                dv[:, :, lo:hi] += torch.matmul(p.transpose(-1, -2), g)
            dq[:, :, start:stop] = dq_block
        return dq, dk, dv, None, None, None, None, None


def blockwise_entmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    alpha: float = 2.0,
    scale: float | Tensor = 1.0,
    bias: Tensor | None = None,
    causal: bool = False,
    key_block: int = 512,
    max_tile_elements: int = 1 << 21,
) -> Tensor:
    """``entmax_α(scale · q kᵀ + bias) v`` without an ``L × S`` matrix (see the module docstring).

    Args:
        q: queries ``(B, H, L, E)``; k: keys ``(B, H, S, E)``; v: values ``(B, H, S, Ev)``.
        alpha: a float in ``(1, 2]`` (2 is sparsemax).
        scale: a float or a tensor broadcastable to ``(B, H, L, 1)`` (gradients flow to it).
        bias: ``None`` or an additive mask broadcastable to ``(B, H, L, S)`` (``-inf`` = masked;
            no gradient flows to it).
        causal: query ``i`` sees only keys ``j <= i + S - L``.
        key_block: keys per tile.
        max_tile_elements: bound on ``B · H · Lq · key_block`` (the query rows per tile follow).

    Rows without any visible key give zeros (with zero gradients). Half-precision inputs are
    computed in float32.
    """
    if not 1.0 < alpha <= 2.0:
        raise ValueError(f"alpha must lie in (1, 2], got {alpha}")
    if key_block < 1 or max_tile_elements < 1:
        raise ValueError("key_block and max_tile_elements must be positive")
    if bias is not None and bias.requires_grad:
        raise ValueError("the blockwise path gives no gradient to the mask; use the explicit path")
    dtype = q.dtype
    if dtype in HALF_DTYPES:
        q, k, v = q.float(), k.float(), v.float()
        if isinstance(scale, Tensor):
            scale = scale.float()
    if bias is not None:
        bias = bias.to(q.dtype)
    out: Tensor = _BlockwiseEntmax.apply(
        q * scale, k, v, bias, bool(causal), float(alpha), int(key_block), int(max_tile_elements)
    )
    return out.to(dtype)

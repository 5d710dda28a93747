"""float64 reference formulas for the separation maps, written from the definitions (numpy only).

Shared by test_separation.py and test_properties.py. Each ``ref_*`` takes unmasked scores
``(..., S)`` and returns the weights; :func:`ref_masked` applies one to rows with ``-inf`` entries.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

RowMap = Callable[[np.ndarray], np.ndarray]


def ref_softmax_n(z: np.ndarray, n: float) -> np.ndarray:
    e = np.exp(z.astype(np.float64))
    return e / (n + e.sum(-1, keepdims=True))


def ref_sparsemax(z: np.ndarray) -> np.ndarray:
    """Projection onto the simplex by the sort-based rule of Martins & Astudillo."""
    out = np.zeros_like(z, dtype=np.float64)
    for idx in np.ndindex(z.shape[:-1]):
        row = z[idx].astype(np.float64)
        srt = np.sort(row)[::-1]
        k = np.arange(1, row.size + 1)
        support = 1 + k * srt > np.cumsum(srt)
        kz = k[support].max()
        tau = (srt[:kz].sum() - 1) / kz
        out[idx] = np.maximum(row - tau, 0)
    return out


def ref_entmax(z: np.ndarray, alpha: float) -> np.ndarray:
    """alpha-entmax by high-precision bisection on tau (independent of the code's algorithms)."""
    out = np.zeros_like(z, dtype=np.float64)
    for idx in np.ndindex(z.shape[:-1]):
        x = (alpha - 1) * z[idx].astype(np.float64)
        lo, hi = x.max() - 1, x.max()
        for _ in range(200):
            mid = (lo + hi) / 2
            mass = (np.maximum(x - mid, 0) ** (1 / (alpha - 1))).sum()
            lo, hi = (mid, hi) if mass > 1 else (lo, mid)
        p = np.maximum(x - (lo + hi) / 2, 0) ** (1 / (alpha - 1))
        out[idx] = p / p.sum()
    return out


def ref_clipped_softmax(z: np.ndarray, gamma: float, zeta: float, n: float = 0.0) -> np.ndarray:
    """``clip((zeta - gamma) · softmax_n(z) + gamma, 0, 1)`` (Bondarenko et al.)."""
    return np.clip((zeta - gamma) * ref_softmax_n(z, n) + gamma, 0.0, 1.0)


def ref_polynomial(z: np.ndarray, degree: int) -> np.ndarray:
    """``max(z, 0)^degree`` normalised per row; rows without a positive score give zeros."""
    powered = np.maximum(z.astype(np.float64), 0.0) ** degree
    total = powered.sum(-1, keepdims=True)
    return np.divide(powered, total, out=np.zeros_like(powered), where=total > 0)


def ref_masked(ref: RowMap, z: np.ndarray) -> np.ndarray:
    """``ref`` over the finite entries of each row of ``z``: ``-inf`` entries, fully masked rows
    and empty rows get weight 0 (the contract of every map in ``hopfield.functional``)."""
    out = np.zeros(z.shape, dtype=np.float64)
    for idx in np.ndindex(z.shape[:-1]):
        finite = np.isfinite(z[idx])
        if finite.any():
            out[idx][finite] = ref(z[idx][finite].astype(np.float64))
    return out

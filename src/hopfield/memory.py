"""Pure associative memory: iterated retrieval ``x_{t+1} = Ξ sep(β Ξᵀ x_t)`` with energy traces.

:func:`retrieve` runs the update of a modern Hopfield model for a batch of queries against stored
patterns (no projections: keys = values = memories), with any separation map (softmax,
Softmax_1, sparsemax, entmax, polynomial, ...) and any structure (dense, top-K, random masks,
linear or random-feature kernels) of :mod:`hopfield.functional`. Each query stops on its own once
an update moves it by at most ``tol``. On request (``track_energy=True``, or an ``energy``), the
energy of the model (where the pair separation / structure has one, see
:func:`hopfield.functional.energy.energy_for`) is recorded after every step; by default it is not,
so a step costs what ``sep(β X Ξᵀ) Ξ`` costs.

Example::

    >>> import torch
    >>> from hopfield.functional import SoftmaxN
    >>> from hopfield.memory import retrieve
    >>> memories = torch.randn(100, 64, dtype=torch.float64)
    >>> noisy = memories[:5] + 0.3 * torch.randn(5, 64, dtype=torch.float64)
    >>> result = retrieve(noisy, memories, SoftmaxN(1), beta=1.0, steps=10, tol=1e-8,
    ...                   track_energy=True)
    >>> result.patterns.shape, result.energy.shape[1:]
    (torch.Size([5, 64]), torch.Size([5]))
    >>> bool((result.energy[1:] <= result.energy[:-1] + 1e-9).all())
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from hopfield.functional.associate import associate
from hopfield.functional.energy import Energy, energy_for
from hopfield.functional.separation import Separation, Softmax
from hopfield.functional.structures import Dense, Structure

__all__ = ["Retrieval", "retrieve"]


@dataclass
class Retrieval:
    """The result of :func:`retrieve`.

    Attributes:
        patterns: the retrieved patterns, the shape of the query ``(..., L, d)`` (or ``(d,)``).
        steps: updates applied to each query ``(..., L)`` (int64), at most ``steps``.
        converged: ``(..., L)`` bool, whether the last update moved the query by ``<= tol``.
        residuals: ``(T, ..., L)``, ``‖x_{t+1} - x_t‖`` of every step ``t`` run (0 once stopped).
        energy: ``(T + 1, ..., L)``, the energy before the first and after every step, or
            ``None`` when it was not tracked (the default) or the model has no energy.
    """

    patterns: Tensor
    steps: Tensor
    converged: Tensor
    residuals: Tensor
    energy: Tensor | None

    @property
    def steps_used(self) -> int:
        """The largest number of updates any query needed."""
        return int(self.steps.max()) if self.steps.numel() else 0


def _as_batched(query: Tensor, memories: Tensor) -> tuple[Tensor, Tensor, tuple[int, ...]]:
    """``(B, 1, L, d)`` queries and ``(B, 1, M, d)`` memories, and the shape to restore."""
    for name, t in (("query", query), ("memories", memories)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {t.dtype}")
    if query.dtype != memories.dtype:
        raise TypeError(
            f"query and memories must share a dtype, got {query.dtype}, {memories.dtype}"
        )
    if query.dim() not in (1, 2, 3):
        raise ValueError(f"query must be (d,), (L, d) or (B, L, d), got {tuple(query.shape)}")
    if memories.dim() not in (2, 3):
        raise ValueError(f"memories must be (M, d) or (B, M, d), got {tuple(memories.shape)}")
    if query.shape[-1] != memories.shape[-1]:
        raise ValueError(
            f"query and memories must share the pattern size d, got {query.shape[-1]} and "
            f"{memories.shape[-1]}"
        )
    if memories.shape[-2] == 0:
        raise ValueError("memories must hold at least one pattern")
    shape = tuple(query.shape)
    q = query.reshape(1, 1, 1, -1) if query.dim() == 1 else query
    q = q.unsqueeze(0) if q.dim() == 2 else q
    m = memories.unsqueeze(0) if memories.dim() == 2 else memories
    if q.dim() == 3:
        q = q.unsqueeze(1)
    batch = max(q.shape[0], m.shape[0])
    if q.shape[0] not in (1, batch) or m.shape[0] not in (1, batch):
        raise ValueError(
            f"query batch {q.shape[0]} and memories batch {m.shape[0]} do not broadcast"
        )
    q = q.expand(batch, *q.shape[1:])
    m = m.unsqueeze(1).expand(batch, 1, *m.shape[1:])
    if len(shape) < 3 and batch > 1:
        shape = (batch, *shape)
    return q, m, shape


def _traced_energy(
    separation: Separation, dense: bool, energy: Energy | None, track_energy: bool | None
) -> Energy | None:
    """The energy :func:`retrieve` traces, or ``None``; see its ``track_energy``."""
    if energy is not None and not isinstance(energy, Energy):
        raise TypeError(f"energy must be an Energy or None, got {type(energy).__name__}")
    if track_energy is not None and not isinstance(track_energy, bool):
        raise TypeError(f"track_energy must be a bool or None, got {type(track_energy).__name__}")
    if track_energy is False:
        if energy is not None:
            raise ValueError(f"energy={energy!r} was given with track_energy=False; drop one")
        return None
    if energy is not None or not track_energy or not dense:
        return energy
    return energy_for(separation)


def retrieve(
    query: Tensor,
    memories: Tensor,
    separation: Separation | None = None,
    structure: Structure | None = None,
    beta: float = 1.0,
    steps: int = 1,
    tol: float = 0.0,
    *,
    energy: Energy | None = None,
    track_energy: bool | None = None,
) -> Retrieval:
    """Retrieve stored patterns by iterating ``x ← Ξ sep(β Ξᵀ x)`` from ``query``.

    Args:
        query: initial states ``(d,)``, ``(L, d)`` or ``(B, L, d)``.
        memories: stored patterns as rows, ``(M, d)`` or ``(B, M, d)`` (batches broadcast; a
            batch holds independent memory sets).
        separation: the separation map (default :class:`~hopfield.functional.Softmax`).
        structure: which memories take part (default dense).
        beta: inverse temperature, a positive float.
        steps: the most updates per query (``>= 0``).
        tol: a query stops once an update moves it by at most ``tol`` (Euclidean norm).
        energy: an energy to trace (giving one turns tracking on).
        track_energy: whether to record an energy trace. ``None`` (default): only when
            ``energy`` is given. ``True``: ``energy``, or else the energy of ``separation`` when
            the structure is dense (:func:`~hopfield.functional.energy.energy_for`; no trace for
            other structures or maps without one). ``False``: never (``energy`` must be ``None``).
            A trace costs one extra score product ``β X Ξᵀ`` per step, plus one for the start;
            without it, each step costs only its update.

    Returns:
        A :class:`Retrieval` with the patterns, steps per query, convergence flags, step sizes
        and the energy trace (``None`` unless tracked). The patterns do not depend on whether
        the energy is tracked.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: for bad values or shapes, or an ``energy`` with ``track_energy=False``.
    """
    separation = Softmax() if separation is None else separation
    if not isinstance(separation, Separation):
        raise TypeError(f"separation must be a Separation, got {type(separation).__name__}")
    if structure is not None and not isinstance(structure, Structure):
        raise TypeError(f"structure must be a Structure or None, got {type(structure).__name__}")
    if isinstance(beta, bool) or not isinstance(beta, int | float):
        raise TypeError(f"beta must be a real number, got {type(beta).__name__}")
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta must be a positive finite number, got {beta}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an int >= 0, got {steps!r}")
    if not (isinstance(tol, int | float) and tol >= 0):
        raise ValueError(f"tol must be a number >= 0, got {tol!r}")
    x, keys, shape = _as_batched(query, memories)
    dense = structure is None or isinstance(structure, Dense)
    energy = _traced_energy(separation, dense, energy, track_energy)

    def energy_of(state: Tensor) -> Tensor:
        assert energy is not None
        return energy.energy(state[:, 0], keys[:, 0], float(beta))

    active = torch.ones(x.shape[0], x.shape[2], dtype=torch.bool, device=x.device)
    used = torch.zeros(x.shape[0], x.shape[2], dtype=torch.int64, device=x.device)
    trace = [energy_of(x)] if energy is not None else []
    residuals = []
    for step in range(steps):
        # Every query takes the first step: no check, no selection (a step of few queries
        # costs little more than its update).
        if step > 0 and not bool(active.any()):
            break
        new = associate(
            x, keys, keys, separation=separation, structure=structure, scale=float(beta)
        )
        assert isinstance(new, Tensor)
        moved = (new - x).norm(dim=-1)[:, 0]
        if step == 0:
            x, used = new, used + 1
            residuals.append(moved)
            active = moved > tol
        else:
            x = torch.where(active[:, None, :, None], new, x)
            residuals.append(torch.where(active, moved, torch.zeros_like(moved)))
            used = used + active.long()
            active = active & (moved > tol)
        if energy is not None:
            trace.append(energy_of(x))
    out_shape = shape[:-1]
    empty = x.new_zeros((0, *out_shape))
    return Retrieval(
        patterns=x[:, 0].reshape(shape),
        steps=used.reshape(out_shape),
        converged=(~active).reshape(out_shape),
        residuals=torch.stack(residuals).reshape(-1, *out_shape) if residuals else empty,
        energy=torch.stack(trace).reshape(-1, *out_shape) if energy is not None else None,
    )

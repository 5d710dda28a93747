"""What the ``theory`` checks share: the configuration, the row type of the pass/fail table
and the sampling helpers (float64 points on spheres). The checks of
:mod:`~hopfield.experiments.theory` and its companions (``theory_svr``, ``theory_outliers``,
``theory_generalization``, ``theory_hyperset``) import them from here, so none imports
another."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["COLUMNS", "DTYPE", "Check", "Config", "grid", "separation_radius", "sphere"]

DTYPE = torch.float64


@dataclass
class Config:
    """Grids of the theory checks (every field is a knob; see the module docstring).

    Attributes:
        trials: independent memory sets per grid point.
        dynamics_dims, dynamics_sizes, dynamics_betas, dynamics_radii: grid of the OutEffHop
            energy-descent and convergence checks (pattern size d, number of memories M, β, m).
        max_steps: most updates when iterating to a fixed point.
        lipschitz_pairs: random score pairs for Lemma C.6.
        corollary_trials: random (x, Ξ) draws for Corollary 3.2.1 (per β).
        capacity_dims, capacity_betas, capacity_radii, capacity_ps: Theorem 3.3 grid.
        sparse_dim, sparse_sizes, sparse_betas, sparse_rhos: the nonparametric §12.2 A setting
            (patterns on the sphere of radius √d, queries ``ξ_µ + δ`` with ``‖δ‖ = ρR``).
        top_ks: the K values of Top-K (the memory size M is added: dense).
        mask_fractions: kept fractions of the random masks.
        separation_sizes, separation_betas, separation_angle_deg: Lemma 4.1 (well-separated
            memories: orthonormal patterns plus one close pair at this angle, radius 1).
        boundary_points: points sampled on the boundary of ``S_µ`` per memory.
        prop_dims, prop_ks: the Proposition 4.1 grid (m=1, R=0.1, β=50, p=0.01 as the spec).
        convergence_betas, convergence_ks: Corollary 4.1.3 (iterate from ``x_0 ∈ S_µ``).
        svr_dim, svr_sizes, svr_betas, svr_trials: the SVR rows (nonparametric §3,
            :mod:`~hopfield.experiments.theory_svr`): pattern size, memory sizes M, β and memory
            sets per grid point.
        svr_rho: contamination and query distance ``‖δξ_µ‖ = ‖δ‖ = ρR``.
        svr_retrieval: the retrieval error ``ϵ = svr_retrieval · R`` of Definition 3.2.
        generalization_sizes, generalization_trials, generalization_steps: OutEffHop Theorem
            3.4 (:mod:`~hopfield.experiments.theory_generalization`): training-set sizes N,
            teachers per N and full-batch training steps.
        int8_sizes, int8_outliers: OutEffHop §4.1 (:mod:`~hopfield.experiments.theory_outliers`):
            entries of the Gaussian tensors quantized per tensor, and the outlier magnitudes in
            units of the tensor's largest ``|x|`` (``trials`` tensors per pair).
        hyperset_tokens, hyperset_trials: the Hyper-SET rows
            (:mod:`~hopfield.experiments.theory_hyperset`): token counts N (from
            ``FUSED_MIN_TOKENS`` on, the bi-softmax takes its fused path) and draws per N.
        figure: draw the Top-K and capacity figure.
        threads: torch CPU threads during the run (1 avoids thread-pool overhead on these
            many small products; restored afterwards).
    """

    trials: int = 16
    dynamics_dims: tuple[int, ...] = (8, 16, 64)
    dynamics_sizes: tuple[int, ...] = (4, 50, 1000)
    dynamics_betas: tuple[float, ...] = (0.1, 1.0, 8.0)
    dynamics_radii: tuple[float, ...] = (0.5, 1.0, 3.0)
    max_steps: int = 2000
    lipschitz_pairs: int = 10_000
    corollary_trials: int = 2000
    capacity_dims: tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    capacity_betas: tuple[float, ...] = (0.1, 1.0, 10.0)
    capacity_radii: tuple[float, ...] = (0.5, 1.0, 2.0)
    capacity_ps: tuple[float, ...] = (0.01, 0.05, 0.1)
    sparse_dim: int = 64
    sparse_sizes: tuple[int, ...] = (50, 100, 200)
    sparse_betas: tuple[float, ...] = (0.05, 0.1, 0.2)
    sparse_rhos: tuple[float, ...] = (0.25, 0.5, 0.9)
    top_ks: tuple[int, ...] = (1, 2, 5, 10, 20, 50)
    mask_fractions: tuple[float, ...] = (0.2, 0.5, 0.8)
    separation_sizes: tuple[int, ...] = (10, 20)
    separation_betas: tuple[float, ...] = (6.5, 8.0, 20.0)
    separation_angle_deg: float = 20.0
    boundary_points: int = 20
    prop_dims: tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    prop_ks: tuple[int, ...] = (2, 5, 10, 20, 50, 100)
    convergence_betas: tuple[float, ...] = (0.1, 0.2)
    convergence_ks: tuple[int, ...] = (2, 10, 20)
    svr_dim: int = 64
    svr_sizes: tuple[int, ...] = (20, 50, 100)
    svr_betas: tuple[float, ...] = (0.05, 0.1, 0.2)
    svr_trials: int = 4
    svr_rho: float = 0.5
    svr_retrieval: float = 0.25
    generalization_sizes: tuple[int, ...] = (32, 128, 512)
    generalization_trials: int = 3
    generalization_steps: int = 300
    int8_sizes: tuple[int, ...] = (256, 4096)
    int8_outliers: tuple[float, ...] = (2.0, 10.0, 100.0)
    hyperset_tokens: tuple[int, ...] = (8, 64, 520)
    hyperset_trials: int = 4
    figure: bool = True
    threads: int = 1
    seed: int = 0


COLUMNS = ["paper", "statement", "kind", "check", "trials", "violations", "worst margin", "status"]


@dataclass
class Check:
    """One row of the pass/fail table."""

    paper: str
    statement: str
    kind: str
    check: str
    trials: int
    violations: int
    margin: float

    @property
    def status(self) -> str:
        if self.kind == "info":
            return "info"
        return "pass" if self.violations == 0 and self.trials > 0 else "fail"

    def row(self) -> list[Any]:
        return [
            self.paper,
            self.statement,
            self.kind,
            self.check,
            self.trials,
            self.violations,
            self.margin,
            self.status,
        ]


def sphere(generator: torch.Generator, *shape: int, radius: float = 1.0) -> Tensor:
    """Points uniform on the sphere of ``radius`` in ``R^d``: shape ``(*batch, d)``."""
    g = torch.randn(*shape, generator=generator, dtype=DTYPE)
    return radius * g / g.norm(dim=-1, keepdim=True)


def separation_radius(memories: Tensor) -> Tensor:
    """``R = ½ min_{µ≠ν} ‖ξ_µ - ξ_ν‖`` per memory set: ``(..., M, d) -> (...)``."""
    distances = torch.cdist(memories, memories)
    eye = torch.eye(memories.shape[-2], dtype=torch.bool)
    return 0.5 * distances.masked_fill(eye, math.inf).amin(dim=(-1, -2))


def grid(*axes: Sequence[Any]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [()]
    for axis in axes:
        out = [(*prefix, value) for prefix in out for value in axis]
    return out

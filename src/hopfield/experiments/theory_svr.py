"""The ``theory`` rows of the nonparametric paper's SVR framework (§3, App. D.1-D.3).

Every fit is :func:`hopfield.functional.svr.fit_svr` in float64 on memories uniform on the
sphere of radius ``√d`` (the §12.2 A setting), contaminated as ``ξ_µ + δξ_µ`` with
``‖δξ_µ‖ = ρR`` (``R`` half the smallest pairwise distance):

* Theorem 3.1: on explicit feature maps (linear; the exponential map truncated at degree 3), the
  dual map (3.3) equals ``W*Φ(x)`` with ``W* = Σ_µ (α_µ - α̃_µ)Φ(ξ_µ + δξ_µ)``, and ``W*``
  minimises the primal (3.2): the primal and dual objectives agree (zero duality gap);
* Lemma 3.1: the normalised exponential kernel with the proof's coefficients is the dense update
  ``Ξ Softmax(βΞ_δᵀx)`` (exact), and a *fitted* SVR on that kernel approaches it as β grows (the
  proof's identification ``(α_µ - α̃_µ)/h(ξ_µ + δξ_µ) = ξ_µ`` is not what the regression gives:
  it gives ``P⁻¹Ξ`` with ``P`` the keys' softmax matrix);
* Theorem 3.2: with a support 𝓜 (Top-K, target-forced random masks) the construction is
  :func:`~hopfield.functional.associate` with that structure (exact);
* Definition 3.2: a fitted SVR with the retrieval error ϵ retrieves every stored pair within ϵ;
  from fresh queries ``ξ_µ + δ`` in ``S_µ`` (which the construction does not cover) its success
  rate is reported beside dense retrieval's, per memory size M (the SVR memory capacity table).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from hopfield.experiments.results import Table
from hopfield.experiments.theory_common import Check, Config, grid, separation_radius, sphere
from hopfield.functional import associate
from hopfield.functional.efficient import TopK
from hopfield.functional.svr import (
    ExponentialKernel,
    NormalizedKernel,
    SVRMemory,
    exponential_features,
    fit_svr,
    linear_kernel,
    nonparametric_dense,
    primal_objective,
)

EXACT = 1e-8  # Theorem 3.1: map deviation and duality gap (relative)
IDENTITY = 1e-12  # Lemma 3.1 / Theorem 3.2: the construction against the softmax formula
SVR_SEED = 18  # offset of the SVR checks' generator (the other rows keep their draws)
FREE_C = 1e30  # "C = ∞": the penalty never binds, relative to the coefficient scale


def svr_checks(config: Config) -> tuple[list[Check], Table]:
    """Every SVR row and the retrieval-versus-M table (own generator: other rows unchanged)."""
    generator = torch.Generator().manual_seed(config.seed + SVR_SEED)
    checks = [check_theorem_31(config, generator)]
    checks += check_lemma_31(config, generator)
    checks.append(check_theorem_32(config, generator))
    retrieval, table = check_retrieval(config, generator)
    return checks + retrieval, table


def contaminated(
    generator: torch.Generator, size: int, d: int, rho: float
) -> tuple[Tensor, Tensor, float]:
    """``(keys, values, R)``: ``ξ_µ + δξ_µ`` and ``ξ_µ`` (radius √d), ``‖δξ_µ‖ = ρR``."""
    values = sphere(generator, size, d, radius=math.sqrt(d))
    radius = float(separation_radius(values))
    keys = values + rho * radius * sphere(generator, size, d)
    return keys, values, radius


# ------------------------------------------------------------------------------------------------
# Theorem 3.1
# ------------------------------------------------------------------------------------------------


def theorem_31_cases(beta: float = 0.3, degree: int = 3) -> list[tuple[str, Callable, bool]]:
    """``(name, explicit feature map, whether the retrieval bound binds)`` of the check."""

    def truncated(x: Tensor) -> Tensor:
        return exponential_features(x, beta, degree)

    def identity(x: Tensor) -> Tensor:
        return x

    return [("linear", identity, False), ("exp", truncated, False), ("exp", truncated, True)]


def certify(
    memory: SVRMemory, features: Callable[[Tensor], Tensor], queries: Tensor
) -> tuple[float, float]:
    """``(map deviation, duality gap)`` of a fit, both relative: ``|T - W*Φ|`` on ``queries``
    and ``(primal(W*) - dual(α - α̃)) / (1 + |primal|)`` (``inf`` if W* leaves the tube)."""
    weights = memory.weights(features)
    primal_map = features(queries) @ weights.transpose(0, 1)
    deviation = float((memory(queries) - primal_map).abs().max()) / (
        1 + float(primal_map.abs().max())
    )
    primal = primal_objective(
        weights,
        features(memory.keys),
        memory.targets,
        epsilon=memory.epsilon,
        C=memory.C,
        retrieval_error=memory.retrieval_error,
    )
    return deviation, abs(primal - memory.dual_objective()) / (1 + abs(primal))


def check_theorem_31(config: Config, generator: torch.Generator) -> Check:
    """Theorem 3.1 on explicit feature maps (d=6, M=20, ε=0.05, C=0.05, 20 queries per fit)."""
    d, size, epsilon, C = 6, 20, 0.05, 0.05
    worst, trials = 0.0, 0
    for _ in range(config.svr_trials):
        keys, values, _ = contaminated(generator, size, d, config.svr_rho)
        queries = sphere(generator, 20, d, radius=math.sqrt(d))
        for name, features, bound in theorem_31_cases():
            kernel = linear_kernel if name == "linear" else feature_kernel(features)
            memory = fit_svr(keys, values, kernel, epsilon=epsilon, C=C)
            if bound:
                # Bound the slacks below the free fit's worst component error: it binds.
                tube = max(epsilon, 0.7 * float((memory(keys) - values).abs().max()))
                memory = fit_svr(
                    keys, values, kernel, epsilon=epsilon, C=C, retrieval_error=tube * math.sqrt(d)
                )
            deviation, gap = certify(memory, features, queries)
            worst = max(worst, deviation, gap)
            trials += 1
    return Check(
        "Nonparametric Thm 3.1",
        "the SVR dual map Σ_µ(α_µ-α̃_µ)K(ξ_µ+δξ_µ, x) is the primal minimiser's map W*Φ(x)",
        "theorem",
        f"|T_SVR - W*Φ| and primal - dual objective <= {EXACT:g} (relative; explicit linear and "
        "degree-3 exponential features, with and without a binding ϵ bound)",
        trials,
        int(worst > EXACT),
        EXACT - worst,
    )


def feature_kernel(features: Callable[[Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    """The kernel ``K(a, b) = Φ(a) Φ(b)ᵀ`` of an explicit feature map: ``(N, d), (P, d) -> (N, P)``."""

    def kernel(a: Tensor, b: Tensor) -> Tensor:
        return features(a) @ features(b).transpose(0, 1)

    return kernel


# ------------------------------------------------------------------------------------------------
# Lemma 3.1 and Theorem 3.2
# ------------------------------------------------------------------------------------------------


def relative(a: Tensor, b: Tensor) -> float:
    """``max_rows ‖a - b‖ / ‖b‖``."""
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-300)).max())


def check_lemma_31(config: Config, generator: torch.Generator) -> list[Check]:
    """The construction is the dense update; fitted coefficients approach it as β grows."""
    d = config.svr_dim
    worst, trials = 0.0, 0
    deviation: dict[tuple[int, float], list[float]] = {}
    for size, beta in grid(config.svr_sizes, config.svr_betas):
        for _ in range(config.svr_trials):
            keys, values, radius = contaminated(generator, size, d, config.svr_rho)
            x = values + config.svr_rho * radius * sphere(generator, size, d)
            dense = torch.softmax(beta * x @ keys.T, dim=-1) @ values
            worst = max(worst, relative(nonparametric_dense(keys, values, beta)(x), dense))
            trials += size
            kernel = NormalizedKernel(ExponentialKernel(beta), keys)
            scale = float((kernel.h(keys)[:, None] * values).abs().max())
            fitted = fit_svr(keys, values, kernel, epsilon=0.0, C=FREE_C * scale)
            identified = fitted.coef / kernel.h(keys)[:, None]
            error = float((identified - values).norm() / values.norm())
            deviation.setdefault((size, beta), []).append(error)
    means = {key: sum(v) / len(v) for key, v in deviation.items()}
    ratios = [
        means[(size, low)] / means[(size, high)]
        for size in config.svr_sizes
        for low, high in zip(config.svr_betas, config.svr_betas[1:], strict=False)
    ]
    spread = ", ".join(
        f"β={b:g}: {means[(max(config.svr_sizes), b)]:.2g}" for b in config.svr_betas
    )
    return [
        Check(
            "Nonparametric Lemma 3.1",
            "the normalised exp-kernel SVR map with the proof's coefficients is Ξ Softmax(βΞ_δᵀx)",
            "theorem",
            f"max ‖T_SVR(x) - Ξ Softmax(βΞ_δᵀx)‖ / ‖·‖ <= {IDENTITY:g}",
            trials,
            int(worst > IDENTITY),
            IDENTITY - worst,
        ),
        Check(
            "Nonparametric Lemma 3.1",
            "a fitted normalised exp-kernel SVR approaches Ξ Softmax(βΞ_δᵀx) as β grows",
            "empirical",
            "mean ‖(α-α̃)/h(ξ+δξ) - ξ‖/‖Ξ‖ falls with β at every M (the proof sets it to 0; "
            f"M={max(config.svr_sizes)}: {spread})",
            len(ratios),
            sum(r <= 1 for r in ratios),
            min(ratios) - 1,
        ),
    ]


def check_theorem_32(config: Config, generator: torch.Generator) -> Check:
    """Theorem 3.2: the masked construction is Top-K / masked softmax retrieval (``associate``)."""
    d = config.svr_dim
    worst, trials = 0.0, 0
    for size, beta in grid(config.svr_sizes, config.svr_betas):
        keys, values, radius = contaminated(generator, size, d, config.svr_rho)
        x = values + config.svr_rho * radius * sphere(generator, size, d)
        for k in [k for k in config.top_ks if k < size]:
            expected = _associate(x, keys, values, beta, structure=TopK(k))
            support = torch.zeros(size, size, dtype=torch.bool)
            support.scatter_(1, (x @ keys.T).topk(k, dim=-1).indices, True)
            worst = max(worst, _masked_deviation(keys, values, beta, x, support, expected))
            trials += size
        for fraction in config.mask_fractions:
            support = torch.rand(size, size, generator=generator) < fraction
            support.fill_diagonal_(True)  # the target is kept (µ ∈ 𝓜)
            expected = _associate(x, keys, values, beta, mask=support)
            worst = max(worst, _masked_deviation(keys, values, beta, x, support, expected))
            trials += size
    return Check(
        "Nonparametric Thm 3.2",
        "the masked SVR construction (3.6) is Ξ_𝓜 Softmax(βΞ_δ,𝓜ᵀx) (Top-K, random masks)",
        "theorem",
        f"max relative deviation from associate(TopK / mask) <= {IDENTITY:g}",
        trials,
        int(worst > IDENTITY),
        IDENTITY - worst,
    )


def _associate(x: Tensor, keys: Tensor, values: Tensor, beta: float, **options: Any) -> Tensor:
    """:func:`associate` of queries ``(L, d)`` on one memory set: ``(L, d_out)``."""
    out = associate(x[None, None], keys[None, None], values[None, None], scale=beta, **options)
    assert isinstance(out, Tensor)
    return out[0, 0]


def _masked_deviation(
    keys: Tensor, values: Tensor, beta: float, x: Tensor, support: Tensor, expected: Tensor
) -> float:
    """Worst relative deviation of each query's construction (support row) from ``expected``."""
    out = torch.stack(
        [nonparametric_dense(keys, values, beta, support[i])(x[i]) for i in range(x.shape[0])]
    )
    return relative(out, expected)


# ------------------------------------------------------------------------------------------------
# Definition 3.2 and retrieval versus memory size
# ------------------------------------------------------------------------------------------------


def check_retrieval(config: Config, generator: torch.Generator) -> tuple[list[Check], Table]:
    """Definition 3.2 on the stored pairs (theorem) and from fresh queries in ``S_µ`` (info).

    ϵ = ``svr_retrieval · R``, ε = ϵ/(2√d), and two penalties: ``C = 0.1 ×`` the coefficient
    scale ``max |h(ξ_µ+δξ_µ) ξ_µ|`` (the ϵ bound binds) and ``C = ∞`` (it never binds).
    """
    d = config.svr_dim
    stored = stored_bad = fresh = fresh_bad = 0
    margin = math.inf
    rows = []
    for size, beta in grid(config.svr_sizes, config.svr_betas):
        per_c: dict[str, list[list[float]]] = {"0.1": [], "∞": []}
        for _ in range(config.svr_trials):
            keys, values, radius = contaminated(generator, size, d, config.svr_rho)
            x = values + config.svr_rho * radius * sphere(generator, size, d)
            error = config.svr_retrieval * radius
            kernel = NormalizedKernel(ExponentialKernel(beta), keys)
            scale = float((kernel.h(keys)[:, None] * values).abs().max())
            dense = (torch.softmax(beta * x @ keys.T, dim=-1) @ values - values).norm(dim=-1)
            for label, c in (("0.1", 0.1 * scale), ("∞", FREE_C * scale)):
                memory = fit_svr(
                    keys,
                    values,
                    kernel,
                    epsilon=error / (2 * math.sqrt(d)),
                    C=c,
                    retrieval_error=error,
                )
                train = (memory(keys) - values).norm(dim=-1) / error
                query = (memory(x) - values).norm(dim=-1) <= error
                stored += size
                stored_bad += int((train > 1 + 1e-9).sum())
                margin = min(margin, 1 - float(train.max()))
                fresh += size
                fresh_bad += int((~query).sum())
                per_c[label].append(
                    [
                        float(train.max()),
                        float(query.double().mean()),
                        float((dense <= error).double().mean()),
                    ]
                )
        for label, values_c in per_c.items():
            columns = list(zip(*values_c, strict=True))
            rows.append([size, beta, label, max(columns[0]), _mean(columns[1]), _mean(columns[2])])
    checks = [
        Check(
            "Nonparametric Def. 3.2",
            "a fitted SVR memory ϵ-retrieves every stored memory from its query ξ_µ+δξ_µ",
            "theorem",
            "‖T_SVR(ξ_µ+δξ_µ) - ξ_µ‖ <= ϵ (ϵ = "
            f"{config.svr_retrieval:g}R, normalised exp kernel, C = 0.1·scale and ∞)",
            stored,
            stored_bad,
            margin,
        ),
        Check(
            "Nonparametric Def. 3.2",
            "fresh queries x ∈ S_µ (not fitted) are ϵ-retrieved by the SVR memory",
            "info",
            f"queries ξ_µ + δ, ‖δ‖ = {config.svr_rho:g}R, missing ϵ (violations column; the "
            "construction covers only the fitted pairs)",
            fresh,
            fresh_bad,
            1 - fresh_bad / max(fresh, 1),
        ),
    ]
    table = Table(
        "SVR memory: ϵ-retrieval versus memory size",
        ["M", "β", "C / scale", "stored max error / ϵ", "query success SVR", "query success dense"],
        rows,
        caption=f"Nonparametric §3 (Def. 3.2): d={d}, memories on the sphere of radius √d, keys "
        f"ξ_µ + δξ_µ and queries ξ_µ + δ with ‖δ‖ = {config.svr_rho:g}R, ϵ = "
        f"{config.svr_retrieval:g}R; success = ‖T(x) - ξ_µ‖ <= ϵ; mean over "
        f"{config.svr_trials} memory sets. 'scale' = max|h(ξ_µ+δξ_µ)ξ_µ|, the coefficient size "
        "of Lemma 3.1's construction.",
    )
    return checks, table


def _mean(values: tuple[float, ...]) -> float:
    return sum(values) / len(values)


__all__ = [
    "check_lemma_31",
    "check_retrieval",
    "check_theorem_31",
    "check_theorem_32",
    "svr_checks",
]

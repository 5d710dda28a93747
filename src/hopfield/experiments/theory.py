"""``theory``: numeric checks of the statements of OutEffHop, the nonparametric Hopfield paper and
Hyper-SET.

Every check runs in float64 on synthetic memories (uniform on a sphere of radius ``m``) and gives
one row of a pass/fail table: how many trials it covered, how many violated the statement, and the
worst margin (how close the worst trial came to violating it; positive = holds). Rows have a
*kind*:

* ``theorem``: a mathematical statement (or an exact identity); must hold in every trial;
* ``heuristic``: a statement whose printed proof is not rigorous (nonparametric Cor. 4.1.1) or
  that a paper states without proof; reported as "pass" or "fail" all the same;
* ``empirical``: a trend the papers report (Top-K error grows with K, random masks fail);
  checked on averages over trials;
* ``printed``: a statement exactly as a paper prints it where we found it can fail (OutEffHop's
  Theorem 3.2 bound, which omits the ``(1 - γ)‖ξ‖`` term, and Corollary 3.2.1's condition
  ``(γ + 1)/2 >= cos α``); reported as "pass" or "fail", the failing trials and a
  counterexample kept, and beside it a row of kind ``theorem`` with our corrected form;
* ``info``: a quantity reported for reference, never a claim (the claims ledger refuses it).

OutEffHop (Hu et al., ICML 2024): Lemma 2.1 (energy descent), Theorem 3.1 (convergence to
stationary points), ``T_OutEff = γ·T_dense``, Lemma C.6 (Softmax_1 is 2-Lipschitz ℓ∞→ℓ1) and its
Jacobian norm, Corollary 3.2.1, Theorem 3.2's bound and Theorem 3.3 / Lemma C.1 (capacity-bound
ordering via Lambert W). Nonparametric Hopfield (Hu et al., ICML 2025): Theorem 4.1 (retrieval
error bound ``m(M+k-2)exp(-βΔ̃)`` for Top-K and target-forced random masks), Corollary 4.1.1
(sparse ≤ dense), Corollary 4.1.2 (one-step error ``<= 2m(M-1)exp(-β(Δ_µ - 2m‖x - ξ_µ‖))``, on
the random memories and on well-separated ones), Top-K error grows with K, Lemma 4.1
(well-separation: ``T(S_µ) ⊆ S_µ``), Proposition 4.1 (capacity lower bound grows with d, falls with k), Corollary 4.1.3 (fixed-point
convergence) and random masks that may drop the target failing. The SVR framework of the
nonparametric paper (Thm 3.1, Lemma 3.1, Thm 3.2, Def. 3.2) is checked in
:mod:`~hopfield.experiments.theory_svr`, OutEffHop's Theorem 3.4 (generalization bound) in
:mod:`~hopfield.experiments.theory_generalization`, OutEffHop's App. B.1 example and §4.1 INT8
premise in :mod:`~hopfield.experiments.theory_outliers`, and Hyper-SET's gradient identities
(Eqs. 7, 10, Tables 18-19), spheres (§3) and identity at initialisation (§3.3) in
:mod:`~hopfield.experiments.theory_hyperset`; each draws from its own generator.

Top-K and random masks are :class:`hopfield.functional.efficient.TopK` and
:class:`~hopfield.functional.efficient.RandomMask` (with ``force`` = the target, to condition on
``µ ∈ 𝓜``), run through :func:`hopfield.memory.retrieve`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from hopfield.experiments.registry import Experiment, register
from hopfield.experiments.results import Results, RunContext, Table, with_threads
from hopfield.experiments.theory_common import (
    COLUMNS,
    DTYPE,
    Check,
    Config,
    grid,
    separation_radius,
    sphere,
)
from hopfield.functional import Separation, Softmax, SoftmaxN
from hopfield.functional.efficient import RandomMask, TopK
from hopfield.functional.energy import DenseEnergy, OutEffEnergy
from hopfield.functional.structures import Structure
from hopfield.memory import retrieve

PRESETS = {
    "tiny": Config(
        trials=6,
        dynamics_dims=(8, 16),
        dynamics_sizes=(4, 50),
        max_steps=1000,
        lipschitz_pairs=2000,
        corollary_trials=500,
        capacity_dims=(8, 32, 128),
        sparse_sizes=(50, 100),
        top_ks=(1, 2, 5, 10, 20),
        separation_sizes=(10,),
        boundary_points=8,
        prop_dims=(16, 64, 256),
        prop_ks=(2, 10, 100),
        svr_sizes=(20, 50),
        svr_trials=2,
        generalization_sizes=(32, 128),
        generalization_trials=2,
        generalization_steps=150,
        int8_sizes=(256,),
        hyperset_tokens=(8,),
        hyperset_trials=2,
        figure=False,
    ),
    "small": Config(),
    "paper": Config(
        trials=50,
        lipschitz_pairs=100_000,
        corollary_trials=10_000,
        boundary_points=50,
        svr_sizes=(20, 50, 100, 200),
        svr_trials=10,
        generalization_sizes=(32, 128, 512, 2048),
        generalization_trials=5,
        int8_sizes=(256, 4096, 65536),
        hyperset_tokens=(8, 64, 520, 1024),
        hyperset_trials=16,
    ),
}

# The spec's numpy pre-check (nonparametric spec §7.9 / §12.2 A.2): d=64, M=100, β=0.1, ρ=0.5.
SPEC_TOPK_ERRORS = {1: 0.0, 2: 0.13, 5: 0.27, 10: 0.44, 20: 0.68, 50: 1.09, 100: 1.38}
# The spec's Proposition 4.1 values (§7.7): m=1, R=0.1, β=50, p=0.01; (d, k) -> (C, bound).
SPEC_CAPACITY = {
    (16, 2): (1.791, 0.8895),
    (16, 10): (1.449, 0.4018),
    (16, 100): (1.1757, 0.1835),
    (64, 2): (1.309, 6.95),
    (64, 10): (1.1976, 1.711),
    (64, 100): (1.0864, 0.369),
    (256, 2): (1.0942, 31.14),
    (256, 10): (1.063, 4.922),
    (256, 100): (1.029, 0.6171),
}

# ------------------------------------------------------------------------------------------------
# Sampling helpers
# ------------------------------------------------------------------------------------------------


def memory_separation(memories: Tensor) -> Tensor:
    """Definition 4.1, ``Δ_µ = min_{ν≠µ} [⟨ξ_µ, ξ_µ⟩ - ⟨ξ_µ, ξ_ν⟩]`` of every memory:
    ``(..., M, d) -> (..., M)``."""
    gram = memories @ memories.transpose(-1, -2)
    eye = torch.eye(memories.shape[-2], dtype=torch.bool)
    return (gram.diagonal(dim1=-2, dim2=-1)[..., None] - gram).masked_fill(eye, math.inf).amin(-1)


def one_step(
    x: Tensor, memories: Tensor, beta: float, separation: Separation, structure: Structure | None
) -> Tensor:
    """One update of every query ``x (B, L, d)`` against ``memories (B, M, d)``."""
    return retrieve(
        x, memories, separation, structure, beta=beta, steps=1, track_energy=False
    ).patterns


# ------------------------------------------------------------------------------------------------
# OutEffHop
# ------------------------------------------------------------------------------------------------


def check_dynamics(config: Config, generator: torch.Generator) -> list[Check]:
    """Lemma 2.1 / Theorem 3.1 for Softmax_1 (and the dense baseline): descent and stationarity."""
    checks = []
    for name, separation, energy in (
        ("OutEffHop", SoftmaxN(1.0), OutEffEnergy(1.0)),
        ("dense", Softmax(), DenseEnergy()),
    ):
        descents, worst_rise, stationary, worst_gradient = 0, -math.inf, 0, 0.0
        rise_violations = stationary_violations = moving = 0
        slowest = 0.0
        # One batch per (d, M, β): the memory sets of every radius m run together.
        for d, size, beta in grid(
            config.dynamics_dims, config.dynamics_sizes, config.dynamics_betas
        ):
            memories = torch.cat(
                [sphere(generator, config.trials, size, d, radius=m) for m in config.dynamics_radii]
            )
            x = torch.cat(
                [sphere(generator, config.trials, 1, d, radius=m) for m in config.dynamics_radii]
            )
            result = retrieve(
                x,
                memories,
                separation,
                beta=beta,
                steps=config.max_steps,
                tol=1e-12,
                track_energy=True,
            )
            assert result.energy is not None
            trace = result.energy
            scale = 1 + trace.abs().amax(dim=0)
            rise = (
                ((trace[1:] - trace[:-1]).amax(dim=0) / scale) if trace.shape[0] > 1 else 0 * scale
            )
            descents += rise.numel()
            rise_violations += int((rise > 1e-10).sum())
            worst_rise = max(worst_rise, float(rise.max()))
            # Runs still moving after max_steps are no counterexample (the theorem is about
            # limits); they are counted apart with their last step size.
            gradient = energy.gradient(result.patterns, memories, beta).norm(dim=-1)
            done = result.converged
            moving += int((~done).sum())
            if bool((~done).any()):
                slowest = max(slowest, float(result.residuals[-1][~done].max()))
            stationary += int(done.sum())
            stationary_violations += int(((gradient > 1e-8) & done).sum())
            if bool(done.any()):
                worst_gradient = max(worst_gradient, float(gradient[done].max()))
        paper = "OutEffHop Lemma 2.1" if name == "OutEffHop" else "Ramsauer et al. Thm 1"
        checks.append(
            Check(
                paper,
                f"{name} energy never increases along its update",
                "theorem",
                "max relative rise H(x_t+1) - H(x_t) <= 1e-10",
                descents,
                rise_violations,
                1e-10 - worst_rise,
            )
        )
        paper = "OutEffHop Thm 3.1" if name == "OutEffHop" else "Ramsauer et al. Thm 2"
        checks.append(
            Check(
                paper,
                f"{name} iterates converge to stationary points of H",
                "theorem",
                f"‖∇H(x*)‖ <= 1e-8 once ‖x_t+1 - x_t‖ <= 1e-12 ({moving} runs still moving "
                f"after {config.max_steps} steps, last step <= {slowest:.1e})",
                stationary,
                stationary_violations,
                1e-8 - worst_gradient,
            )
        )
    return checks


def check_gamma_identity(config: Config, generator: torch.Generator) -> Check:
    """``T_OutEff(x) = γ(x) · T_dense(x)`` with ``γ = S / (1 + S)`` (OutEffHop §1.6, spec A6)."""
    worst, trials = 0.0, 0
    for d, size, beta in grid(config.dynamics_dims, config.dynamics_sizes, config.dynamics_betas):
        memories = torch.cat(
            [sphere(generator, config.trials, size, d, radius=m) for m in config.dynamics_radii]
        )
        x = torch.cat(
            [sphere(generator, config.trials, 1, d, radius=m) for m in config.dynamics_radii]
        )
        dense = one_step(x, memories, beta, Softmax(), None)
        outeff = one_step(x, memories, beta, SoftmaxN(1.0), None)
        s = torch.exp(beta * x @ memories.transpose(-1, -2)).sum(-1, keepdim=True)
        expected = s / (1 + s) * dense
        error = (outeff - expected).norm(dim=-1) / expected.norm(dim=-1).clamp_min(1e-300)
        worst = max(worst, float(error.max()))
        trials += error.numel()
    violations = 0 if worst <= 1e-12 else 1
    return Check(
        "OutEffHop §2.3",
        "one Softmax_1 step is γ(x) times one softmax step",
        "theorem",
        "relative deviation <= 1e-12",
        trials,
        violations,
        1e-12 - worst,
    )


def check_lipschitz(config: Config, generator: torch.Generator) -> list[Check]:
    """Lemma C.6: ``‖Softmax_1(z1) - Softmax_1(z2)‖_1 <= 2‖z1 - z2‖_∞``; ``‖J‖_{1,1} <= 2``."""
    n = config.lipschitz_pairs
    size = int(torch.randint(2, 64, (1,), generator=generator))
    scale = torch.exp(torch.empty(n, 1, dtype=DTYPE).uniform_(-3, 3, generator=generator))
    z1 = scale * torch.randn(n, size, generator=generator, dtype=DTYPE)
    near = torch.exp(torch.empty(n, 1, dtype=DTYPE).uniform_(-6, 1, generator=generator))
    step = torch.randn(n, size, generator=generator, dtype=DTYPE)
    # Half the pairs differ along a vertex of the ℓ∞ ball (±1 entries), the worst directions.
    step[: n // 2] = step[: n // 2].sign()
    z2 = z1 + near * step
    sep = SoftmaxN(1.0)
    ratio = (sep(z1) - sep(z2)).abs().sum(-1) / (z1 - z2).abs().amax(-1)
    lipschitz = Check(
        "OutEffHop Lemma C.6",
        "Softmax_1 is 2-Lipschitz from ℓ∞ to ℓ1",
        "theorem",
        "max ‖Δs‖_1 / ‖Δz‖_∞ <= 2",
        n,
        int((ratio > 2).sum()),
        2 - float(ratio.max()),
    )
    count = min(n, 2000)
    z = z1[:count].clone().requires_grad_(True)
    s = sep(z)
    # Row i of every Jacobian from one batched backward pass: J[:, i, :] = ∂s_i / ∂z.
    jac = torch.stack(
        [torch.autograd.grad(s[:, i].sum(), z, retain_graph=True)[0] for i in range(size)], dim=1
    )
    s = s.detach()
    gamma = s.sum(-1)
    identity = gamma + gamma**2 - 2 * (s**2).sum(-1)
    norm = jac.abs().sum(dim=(-1, -2))
    worst_identity = float((norm - identity).abs().max())
    worst_norm = float(norm.max())
    jacobian = Check(
        "OutEffHop Lemma C.6",
        "‖J‖_{1,1} = γ + γ² - 2Σs² <= 2 (autograd Jacobian)",
        "theorem",
        "identity to 1e-12 and norm <= 2",
        count,
        int(worst_identity > 1e-12) + int(worst_norm > 2),
        2 - worst_norm,
    )
    return [lipschitz, jacobian]


def check_corollary_321(config: Config, generator: torch.Generator) -> list[Check]:
    """Corollary 3.2.1 as printed: with ``x`` and the memories normalised, OutEffHop is at least as
    close to ξ_µ as dense retrieval *when* ``(γ + 1)/2 >= cos α`` (α: the angle between
    ``T_dense(x)`` and ξ_µ); a violation is a trial where the condition holds and OutEffHop is
    farther. Beside it our exact form: closer *iff* ``(γ + 1)‖v1‖² >= 2 v1·ξ`` (``v1 =
    T_dense(x)``; the printed condition takes ``‖v1‖ = 1``, but a blend of memories is shorter)."""
    exact_violations = printed_violations = total = 0
    exact_margin = printed_margin = math.inf
    for beta, size in grid((0.1, 1.0, 4.0, 16.0), (5, 50, 500)):
        count = max(1, config.corollary_trials // 4)
        d = 16
        memories = sphere(generator, count, size, d)
        target = torch.randint(0, size, (count,), generator=generator)
        w = memories[torch.arange(count), target]
        x = sphere(generator, count, 1, d)
        v1 = one_step(x, memories, beta, Softmax(), None)[:, 0]
        v2 = one_step(x, memories, beta, SoftmaxN(1.0), None)[:, 0]
        s = torch.exp(beta * (memories @ x.transpose(-1, -2))[..., 0]).sum(-1)
        gamma = s / (1 + s)
        closer = (v2 - w).norm(dim=-1) - (v1 - w).norm(dim=-1)
        condition = (gamma + 1) * (v1 * v1).sum(-1) - 2 * (v1 * w).sum(-1)
        decided = closer.abs() > 1e-12
        exact_violations += int(((closer <= 0) != (condition >= 0))[decided].sum())
        cos = (v1 * w).sum(-1) / (v1.norm(dim=-1) * w.norm(dim=-1))
        printed = ((gamma + 1) / 2 >= cos) & decided
        printed_violations += int((printed & (closer > 0)).sum())
        if printed.any():
            printed_margin = min(printed_margin, float((-closer[printed]).min()))
        total += int(decided.sum())
        exact_margin = min(exact_margin, float(condition.abs().min()))
    return [
        Check(
            "OutEffHop Cor. 3.2.1",
            "‖T_OutEff - ξ‖ <= ‖T_dense - ξ‖ when (γ+1)/2 >= cos α (as printed; x, ξ normalised)",
            "printed",
            "trials where the condition holds and OutEffHop is farther (margin: closer by)",
            total,
            printed_violations,
            printed_margin,
        ),
        Check(
            "OutEffHop Cor. 3.2.1",
            "ours, exact form: ‖T_OutEff - ξ‖ <= ‖T_dense - ξ‖ iff (γ+1)‖v1‖² >= 2 v1·ξ",
            "theorem",
            "the condition decides which retrieval is closer",
            total,
            exact_violations,
            exact_margin,
        ),
    ]


#: The counterexample to Theorem 3.2's printed bound: two memories ``(1, 0)`` and ``(-1, 0)``,
#: β = 5, the query at the first memory (error 6.8e-3 against the bound 9.0e-5).
THEOREM_32_COUNTEREXAMPLE_MEMORIES = ((1.0, 0.0), (-1.0, 0.0))
THEOREM_32_COUNTEREXAMPLE_BETA = 5.0

#: Offset of the seed of Theorem 3.2's tight grid, drawn apart from the shared generator so the
#: rows after it keep their numbers.
_THEOREM_32_TIGHT_SEED = 32


#: Float64 rounding allowance of a bound check where the bound can be tight to the last bit.
_ROUNDING = 1e-12


def theorem_32_terms(memories: Tensor, x: Tensor, beta: float) -> dict[str, Tensor]:
    """Theorem 3.2's quantities for queries ``x (B, 1, d)`` retrieving the first of ``memories
    (B, M, d)`` in one Softmax_1 step: ``error`` ``‖T_OutEff(x) − ξ_1‖``, the ``printed`` bound
    ``γ·2m(M−1)exp(−βΔ̃)`` and our ``corrected`` bound, the printed one plus ``(1 − γ)‖ξ_1‖``
    (``T_OutEff = γ T_dense``); ``Δ̃ = ⟨ξ_1, x⟩ − max_{ν≠1} ⟨ξ_ν, x⟩`` (at ``x = ξ_1`` the paper's
    ``⟨ξ_1, x⟩ − max_ν ⟨ξ_1, ξ_ν⟩``) and ``m = max_ν ‖ξ_ν‖``. Each has shape ``(B,)``."""
    size = memories.shape[-2]
    out = one_step(x, memories, beta, SoftmaxN(1.0), None)[:, 0]
    scores = (memories @ x.transpose(-1, -2))[..., 0]
    gap = scores[:, 0] - scores[:, 1:].amax(-1)
    s = torch.exp(beta * scores).sum(-1)
    gamma = s / (1 + s)
    m = memories.norm(dim=-1).amax(-1)
    printed = gamma * 2 * m * (size - 1) * torch.exp(-beta * gap)
    corrected = printed + (1 - gamma) * memories[:, 0].norm(dim=-1)
    return {
        "error": (out - memories[:, 0]).norm(dim=-1),
        "printed": printed,
        "corrected": corrected,
    }


def _theorem_32_trials(config: Config, generator: torch.Generator) -> list[dict[str, Tensor]]:
    """Theorem 3.2's terms on three sets of trials: the random queries near a memory (20
    memories, from the shared ``generator``), a tight grid (2 to 5 memories, β up to 32, the
    query at a memory or near it; its own generator) and :func:`theorem_32_counterexample`."""
    trials = []
    for beta, radius in grid((0.5, 2.0, 8.0), (0.5, 1.0, 2.0)):
        memories = sphere(generator, config.trials * 4, 20, 16, radius=radius)
        r = separation_radius(memories)
        x = memories[:, :1] + (0.5 * r)[:, None, None] * sphere(generator, config.trials * 4, 1, 16)
        trials.append(theorem_32_terms(memories, x, beta))
    tight = torch.Generator().manual_seed(config.seed + _THEOREM_32_TIGHT_SEED)
    for beta, size, offset in grid((2.0, 8.0, 32.0), (2, 3, 5), (0.0, 0.1)):
        memories = sphere(tight, config.trials, size, 4)
        x = memories[:, :1] + offset * sphere(tight, config.trials, 1, 4)
        trials.append(theorem_32_terms(memories, x, beta))
    trials.append(theorem_32_counterexample())
    return trials


def theorem_32_counterexample() -> dict[str, Tensor]:
    """:func:`theorem_32_terms` of the counterexample (shape ``(1,)`` each): the memories
    :data:`THEOREM_32_COUNTEREXAMPLE_MEMORIES`, the query at the first."""
    example = torch.tensor([THEOREM_32_COUNTEREXAMPLE_MEMORIES], dtype=DTYPE)
    return theorem_32_terms(example, example[:, :1], THEOREM_32_COUNTEREXAMPLE_BETA)


def check_theorem_32(config: Config, generator: torch.Generator) -> list[Check]:
    """Theorem 3.2's bound as printed, ``‖T_OutEff(x) − ξ_µ‖ <= γ·2m(M−1)exp(−βΔ̃_µ)``, and our
    corrected bound with the ``(1 − γ)‖ξ_µ‖`` term it omits (spec §1.9), on the trials of
    :func:`_theorem_32_trials` (margin: bound − error, positive = holds)."""
    trials = _theorem_32_trials(config, generator)
    error = torch.cat([t["error"] for t in trials])
    rows = []
    for key, statement, kind in (
        ("printed", "‖T_OutEff - ξ_µ‖ <= γ·2m(M-1)exp(-βΔ̃) (as printed)", "printed"),
        ("corrected", "ours: ‖T_OutEff - ξ_µ‖ <= γ·2m(M-1)exp(-βΔ̃) + (1-γ)‖ξ_µ‖", "theorem"),
    ):
        bound = torch.cat([t[key] for t in trials])
        rows.append(
            Check(
                "OutEffHop Thm 3.2",
                statement,
                kind,
                "trials where the bound fails (x at or near ξ_µ, M = 2-20, β up to 32)",
                error.numel(),
                int((error > bound + _ROUNDING * (1 + bound)).sum()),
                float((bound - error).min()),
            )
        )
    return rows


def theorem_32_counterexample_table() -> Table:
    """The record of :func:`theorem_32_counterexample`: the error against both bounds."""
    terms = theorem_32_counterexample()
    return Table(
        "OutEffHop Thm 3.2: counterexample to the printed bound",
        ["memories", "β", "query", "error ‖T_OutEff(x) − ξ_1‖", "printed bound", "corrected bound"],
        [
            [
                "(1, 0), (-1, 0)",
                THEOREM_32_COUNTEREXAMPLE_BETA,
                "x = ξ_1",
                float(terms["error"][0]),
                float(terms["printed"][0]),
                float(terms["corrected"][0]),
            ]
        ],
        caption="Two memories, the query at the first: the error exceeds the printed bound "
        "γ·2m(M−1)exp(−βΔ̃) by a factor of about 75; the bound omits (1−γ)‖ξ_1‖, which our "
        "corrected bound adds.",
    )


def log_capacity(a: float, b: float) -> float:
    """``ln C`` with ``C = b / W_0(exp(a + ln b))`` (Lemma C.3), overflow-free via Wright ω.

    ``W_0(e^y)`` is the Wright omega function ``ω(y)``; where it underflows, ``ω(y) ≈ e^y``.
    """
    from scipy.special import wrightomega

    y = a + math.log(b)
    omega = float(np.real(wrightomega(y)))
    return math.log(b) - (math.log(omega) if omega > 0 else y)


def check_theorem_33(config: Config) -> list[Check]:
    """Lemma C.1: ``C(a, b) > C̃(ã, b)`` whenever ``δ > 0`` (ordering only; uses ``|√p - 1|``)."""
    violations = trials = ties = 0
    margin = math.inf
    shrink_violations = shrink_trials = 0
    for d, beta, m, p in grid(
        config.capacity_dims, config.capacity_betas, config.capacity_radii, config.capacity_ps
    ):
        r = 0.1 * m
        # δ = β⁻¹ ln(1 + 1/S) at x = ξ_µ with S >= exp(βm²): its largest value.
        delta = math.log1p(math.exp(-beta * m * m)) / beta
        base = math.log(2 * m * m * abs(math.sqrt(p) - 1) / r) + 1
        a_original = 4 / (d - 1) * base
        a_outeff = 4 / (d - 1) * (base - delta / (2 * beta * m * r))
        b = 4 * m * m * beta / (5 * (d - 1))
        gain = log_capacity(a_outeff, b) - log_capacity(a_original, b)
        trials += 1
        ties += int(gain == 0)
        violations += int(gain < 0)
        margin = min(margin, gain)
    for beta, m in grid(config.capacity_betas, config.capacity_radii):
        deltas = [math.log1p(math.exp(-beta * s * s)) / beta for s in (m, 2 * m, 4 * m)]
        shrink_trials += 1
        shrink_violations += int(not (deltas[0] > deltas[1] > deltas[2] >= 0))
    return [
        Check(
            "OutEffHop Thm 3.3 / Lemma C.1",
            "capacity bound M >= M_original: C(a,b) > C̃(ã,b) when δ > 0",
            "theorem",
            f"ln C - ln C̃ >= 0 on a d×β×m×p grid, |√p-1|, R=0.1m ({ties} ties: δ below "
            "float64 resolution)",
            trials,
            violations,
            margin,
        ),
        Check(
            "OutEffHop Thm 3.3",
            "the gain δ = β⁻¹ln(1+1/S) shrinks to 0 as βm² grows",
            "theorem",
            "δ(m) > δ(2m) > δ(4m) at x = ξ_µ",
            shrink_trials,
            shrink_violations,
            0.0,
        ),
    ]


# ------------------------------------------------------------------------------------------------
# Nonparametric (sparse-structured) Hopfield models
# ------------------------------------------------------------------------------------------------


@dataclass
class SparseTrials:
    """One-step retrievals of the §12.2 A setting at one (M, β, ρ)."""

    size: int
    beta: float
    rho: float
    radius: float
    errors: dict[str, Tensor]  # model -> (T,) one-step error ‖T(x) - ξ_µ‖
    in_support: dict[str, Tensor]  # model -> (T,) bool: µ ∈ 𝓜
    kept: dict[str, int]  # model -> k (support size)
    gap: Tensor  # (T,) Δ̃_µ = ⟨x, ξ_µ⟩ - max_{ν≠µ} ⟨x, ξ_ν⟩
    separation: Tensor  # (T,) R = ½ min_{µ≠ν} ‖ξ_µ - ξ_ν‖
    delta: Tensor  # (T,) Δ_µ = ⟨ξ_µ, ξ_µ⟩ - max_{ν≠µ} ⟨ξ_µ, ξ_ν⟩ (Definition 4.1)


def sparse_trials(config: Config, generator: torch.Generator) -> list[SparseTrials]:
    """All one-step retrievals of the nonparametric checks (Top-K, random masks, dense)."""
    d = config.sparse_dim
    m = math.sqrt(d)
    out = []
    for size, beta, rho in grid(config.sparse_sizes, config.sparse_betas, config.sparse_rhos):
        t = config.trials * 8
        memories = sphere(generator, t, size, d, radius=m)
        r = separation_radius(memories)
        x = memories[:, :1] + (rho * r)[:, None, None] * sphere(generator, t, 1, d)
        scores = (memories @ x.transpose(-1, -2))[..., 0]  # (T, M)
        rank = (scores > scores[:, :1]).sum(-1)  # 0 = the target has the top score
        gap = scores[:, 0] - scores[:, 1:].amax(-1)
        errors, support, kept = {}, {}, {}
        for k in sorted({*(k for k in config.top_ks if k < size), size}):
            structure: Structure | None = None if k == size else TopK(k)
            name = "dense" if k == size else f"top-{k}"
            out_x = one_step(x, memories, beta, Softmax(), structure)[:, 0]
            errors[name] = (out_x - memories[:, 0]).norm(dim=-1)
            support[name] = rank < k
            kept[name] = k
        force = torch.zeros(t, 1, 1, dtype=torch.int64)
        for fraction in config.mask_fractions:
            k = max(1, int(fraction * size))
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
            forced = RandomMask(fraction=fraction, seed=seed, force=force)
            free = RandomMask(fraction=fraction, seed=seed + 1)
            for name, structure, inside in (
                (f"random {fraction:g} forced", forced, torch.ones(t, dtype=torch.bool)),
                (f"random {fraction:g}", free, None),
            ):
                out_x = one_step(x, memories, beta, Softmax(), structure)[:, 0]
                errors[name] = (out_x - memories[:, 0]).norm(dim=-1)
                support[name] = inside if inside is not None else torch.zeros(t, dtype=torch.bool)
                kept[name] = k
        delta = memory_separation(memories)[:, 0]
        out.append(SparseTrials(size, beta, rho, m, errors, support, kept, gap, r, delta))
    return out


@dataclass
class BoundTally:
    """Trials of a bound ``error <= bound`` on memories of norm at most ``m``: how many, how many
    violate it (beyond rounding), how many bounds are non-vacuous (``< 2m``, the largest possible
    error) and the worst slack ``(bound - error) / 2m``."""

    count: int = 0
    violations: int = 0
    nonvacuous: int = 0
    margin: float = math.inf

    def add(self, error: Tensor, bound: Tensor, m: float) -> None:
        """One batch of trials: ``error`` and ``bound`` ``(T,)``."""
        if error.numel() == 0:
            return
        self.count += int(error.numel())
        self.violations += int((error > bound * (1 + 1e-12) + 1e-12).sum())
        self.nonvacuous += int((bound < 2 * m).sum())
        self.margin = min(self.margin, float(((bound - error) / (2 * m)).min()))


def target_kept(trials: list[SparseTrials]) -> Iterator[tuple[SparseTrials, str, Tensor]]:
    """``(group, model, µ ∈ 𝓜 (T,))`` for the models whose support may hold the target: Top-K,
    target-forced random masks and dense (masks free to drop it are left out)."""
    for group in trials:
        for name in group.errors:
            if not (name.startswith("random") and not name.endswith("forced")):
                yield group, name, group.in_support[name]


def check_theorem_41(trials: list[SparseTrials]) -> list[Check]:
    """Theorem 4.1: ``‖T(x) - ξ_µ‖ <= m(M+k-2)exp(-βΔ̃_µ)`` whenever ``µ ∈ 𝓜`` (Top-K, forced masks)."""
    tally = BoundTally()
    for group, name, inside in target_kept(trials):
        k = group.kept[name]
        bound = group.radius * (group.size + k - 2) * torch.exp(-group.beta * group.gap)
        tally.add(group.errors[name][inside], bound[inside], group.radius)
    return [
        Check(
            "Nonparametric Thm 4.1",
            "‖T_sparse(x) - ξ_µ‖ <= m(M+k-2)exp(-βΔ̃_µ) for µ ∈ 𝓜 (Top-K, forced masks, dense)",
            "theorem",
            f"every trial with µ ∈ 𝓜; bound non-vacuous (< 2m) in {tally.nonvacuous} of them",
            tally.count,
            tally.violations,
            tally.margin,
        )
    ]


def one_step_bound(size: int, m: float, delta: Tensor, distance: Tensor, beta: float) -> Tensor:
    """Corollary 4.1.2's bound ``2m(M-1)exp(-β(Δ_µ - 2m‖x - ξ_µ‖))``, shape of ``delta``.

    The corollary takes Ramsauer et al.'s Theorem 4 through Corollary 4.1.1; the paper writes
    ``max_{x∈S_µ}‖x - ξ_µ‖`` (= R), Ramsauer ``max{‖x - ξ_µ‖, ‖x*_µ - ξ_µ‖}``, where this
    takes the query's own ``‖x - ξ_µ‖`` (``distance``): the smallest of the three, so a trial
    that meets this form meets the printed ones. It holds for sparse retrieval without the
    heuristic Corollary 4.1.1: ``‖T(x) - ξ_µ‖ <= 2m(1 - p_µ) <= 2m(k-1)exp(-βΔ̃_µ)`` and
    ``Δ̃_µ >= Δ_µ - 2m‖x - ξ_µ‖`` (Cauchy-Schwarz).
    """
    return 2 * m * (size - 1) * torch.exp(-beta * (delta - 2 * m * distance))


ONE_STEP_SEED = 85  # offset of Cor. 4.1.2's well-separated draws (the other rows keep theirs)


def _one_step_well_separated(config: Config, tally: BoundTally) -> None:
    """Cor. 4.1.2 on well-separated memories (:func:`well_separated`, norm 1), where its bound is
    far from vacuous: ``boundary_points`` queries ``ξ_µ + rδ`` per memory (``r`` uniform in
    ``[0, R]``, ``δ`` a unit direction), one Top-K step (K ∈ {1, 2, 5}) and one dense step."""
    generator = torch.Generator().manual_seed(config.seed + ONE_STEP_SEED)
    d = max(config.sparse_dim, max(config.separation_sizes) + 2)
    angle = math.radians(config.separation_angle_deg)
    for size, beta in grid(config.separation_sizes, config.separation_betas):
        target = torch.arange(size).repeat_interleave(config.boundary_points)
        for _ in range(config.trials):
            memories = well_separated(generator, size, d, angle)
            m = float(memories.norm(dim=-1).max())
            distance = float(separation_radius(memories)) * torch.rand(
                target.numel(), generator=generator, dtype=DTYPE
            )
            x = memories[target] + distance[:, None] * sphere(generator, target.numel(), d)
            scores = x @ memories.T
            rank = (scores > scores.gather(1, target[:, None])).sum(-1)
            bound = one_step_bound(size, m, memory_separation(memories)[target], distance, beta)
            for k in sorted({1, 2, 5, size} & set(range(1, size + 1))):
                structure = None if k == size else TopK(k)
                out = one_step(x[None], memories[None], beta, Softmax(), structure)[0]
                inside = rank < k
                error = (out - memories[target]).norm(dim=-1)
                tally.add(error[inside], bound[inside], m)


def check_corollary_412(config: Config, trials: list[SparseTrials]) -> Check:
    """Corollary 4.1.2: one sparse step's error is exponentially suppressed by ``Δ_µ``
    (:func:`one_step_bound`), on the §12.2 A trials (random memories on a sphere, where the
    bound is mostly vacuous) and on well-separated memories (where it is not)."""
    tally = BoundTally()
    for group, name, inside in target_kept(trials):
        bound = one_step_bound(
            group.size, group.radius, group.delta, group.rho * group.separation, group.beta
        )
        tally.add(group.errors[name][inside], bound[inside], group.radius)
    _one_step_well_separated(config, tally)
    return Check(
        "Nonparametric Cor. 4.1.2",
        "‖T_sparse(x) - ξ_µ‖ <= 2m(M-1)exp(-β(Δ_µ - 2m‖x - ξ_µ‖)) for x ∈ S_µ, µ ∈ 𝓜 (one step)",
        "theorem",
        "every trial with µ ∈ 𝓜 (Top-K, forced masks, dense; random and well-separated "
        f"memories); bound non-vacuous (< 2m) in {tally.nonvacuous} of them",
        tally.count,
        tally.violations,
        tally.margin,
    )


def check_sparse_trends(trials: list[SparseTrials]) -> list[Check]:
    """Cor. 4.1.1 (per trial), Top-K error grows with K and random masks failing (averages)."""
    cor_count = cor_violations = 0
    cor_margin = math.inf
    mono_count = mono_violations = 0
    mono_margin = math.inf
    random_count = random_violations = skipped = 0
    random_margin = math.inf
    for group in trials:
        dense = group.errors["dense"]
        topk = sorted((v for n, v in group.kept.items() if n.startswith("top-")))
        for k in topk:
            error = group.errors[f"top-{k}"]
            inside = group.in_support[f"top-{k}"]
            cor_count += int(inside.sum())
            cor_violations += int(((error > dense + 1e-12) & inside).sum())
            if bool(inside.any()):
                cor_margin = min(cor_margin, float((dense - error)[inside].min()))
        means = [float(group.errors[f"top-{k}"].mean()) for k in topk] + [float(dense.mean())]
        for low, high in itertools.pairwise(means):
            mono_count += 1
            mono_violations += int(high < low - 1e-9)
            mono_margin = min(mono_margin, high - low)
        # Random masks that may drop the target: worse than dense, worse the more is masked,
        # wherever dense retrieval works (mean dense error below R/2).
        if float(dense.mean()) >= 0.5 * float(group.separation.mean()):
            skipped += 1
            continue
        fractions = sorted(
            float(n.split()[1])
            for n in group.errors
            if n.startswith("random") and "forced" not in n
        )
        free = [float(group.errors[f"random {f:g}"].mean()) for f in fractions]
        if free:
            random_count += len(free) + len(free) - 1
            random_violations += sum(int(e <= float(dense.mean())) for e in free)
            random_violations += sum(int(a < b) for a, b in itertools.pairwise(free))
            random_margin = min(random_margin, min(free) - float(dense.mean()))
    return [
        Check(
            "Nonparametric Cor. 4.1.1",
            "‖T_TopK(x) - ξ_µ‖ <= ‖T_dense(x) - ξ_µ‖ for µ ∈ 𝓜 (proof heuristic)",
            "heuristic",
            "every trial with µ ∈ 𝓜",
            cor_count,
            cor_violations,
            cor_margin,
        ),
        Check(
            "Nonparametric Thm 4.1 / Fig. 2",
            "Top-K retrieval error grows with K (dense = K=M)",
            "empirical",
            "mean error non-decreasing along K at every (M, β, ρ)",
            mono_count,
            mono_violations,
            mono_margin,
        ),
        Check(
            "Nonparametric App. B / Fig. 2",
            "random masks that can drop the target fail: error > dense, growing with the masked share",
            "empirical",
            f"mean errors where dense retrieves (error < R/2; {skipped} (M, β, ρ) points where "
            "dense fails skipped)",
            random_count,
            random_violations,
            random_margin,
        ),
    ]


def well_separated(generator: torch.Generator, size: int, d: int, angle: float) -> Tensor:
    """``size - 2`` orthonormal patterns and one pair at ``angle`` (radians) in their complement."""
    basis, _ = torch.linalg.qr(torch.randn(d, size, generator=generator, dtype=DTYPE))
    u, v = basis[:, size - 2], basis[:, size - 1]
    return torch.cat([basis.T[: size - 1], (math.cos(angle) * u + math.sin(angle) * v)[None]])


def separation_threshold(beta: float, size: int, k: int, m: float, r: float) -> float:
    """Lemma 4.1: the separation ``Δ_µ`` must be at least ``β⁻¹ ln((M+k-2)m/R) + 2mR``."""
    return math.log((size + k - 2) * m / r) / beta + 2 * m * r


def check_well_separated(config: Config, generator: torch.Generator) -> list[Check]:
    """Lemma 4.1 and Corollary 4.1.3 on memories that meet the well-separation condition.

    Lemma 4.1: with ``Δ_µ`` above the threshold, one Top-K step maps points on the boundary of
    ``S_µ`` into ``S_µ``. Corollary 4.1.3: iterating from inside ``S_µ`` converges to a fixed
    point in ``S_µ``.
    """
    d = max(config.sparse_dim, max(config.separation_sizes) + 2)
    angle = math.radians(config.separation_angle_deg)
    count = violations = covered = 0
    margin = math.inf
    order_count = order_violations = 0
    fixed_count = fixed_violations = 0
    fixed_margin = math.inf
    for size, beta in grid(config.separation_sizes, config.separation_betas):
        ks = sorted({1, 2, 5, size} & set(range(1, size + 1)))
        thresholds = []
        for _ in range(config.trials):
            memories = well_separated(generator, size, d, angle)
            r = float(separation_radius(memories))
            delta = memory_separation(memories)
            for k in ks:
                threshold = separation_threshold(beta, size, k, 1.0, r)
                thresholds.append((k, threshold))
                good = (delta >= threshold).nonzero().flatten()
                if good.numel() == 0:
                    continue
                covered += int(good.numel())
                targets = memories[good][:, None]
                structure = None if k == size else TopK(k)
                batch = memories.expand(int(good.numel()), size, d)
                directions = sphere(generator, int(good.numel()), config.boundary_points, d)
                out = one_step(targets + r * directions, batch, beta, Softmax(), structure)
                distance = (out - targets).norm(dim=-1)
                count += distance.numel()
                violations += int((distance > r * (1 + 1e-12)).sum())
                margin = min(margin, float(((r - distance) / r).min()))
                inside = torch.rand(*directions.shape[:2], 1, generator=generator, dtype=DTYPE)
                result = retrieve(
                    targets + 0.999 * r * inside * directions,
                    batch,
                    Softmax(),
                    structure,
                    beta=beta,
                    steps=200,
                    tol=1e-12,
                    track_energy=False,
                )
                final = (result.patterns - targets).norm(dim=-1)
                fixed_count += final.numel()
                fixed_violations += int((~(result.converged & (final < r))).sum())
                fixed_margin = min(fixed_margin, float(((r - final) / r).min()))
        for k_small, k_large in itertools.pairwise(ks):
            small = [t for k, t in thresholds if k == k_small]
            large = [t for k, t in thresholds if k == k_large]
            order_count += len(small)
            order_violations += sum(int(not s < t) for s, t in zip(small, large, strict=True))
    return [
        Check(
            "Nonparametric Lemma 4.1",
            "Δ_µ >= β⁻¹ln((M+k-2)m/R) + 2mR ⇒ T_TopK maps S_µ into S_µ",
            "theorem",
            f"points on the boundary of S_µ ({covered} memories meet the condition)",
            count,
            violations,
            margin,
        ),
        Check(
            "Nonparametric Lemma 4.1",
            "the separation threshold decreases as k decreases",
            "theorem",
            "threshold(k) < threshold(k') for k < k'",
            order_count,
            order_violations,
            0.0,
        ),
        Check(
            "Nonparametric Cor. 4.1.3",
            "iterating T_TopK from x_0 ∈ S_µ converges to a fixed point in S_µ",
            "theorem",
            "well-separated memories; ‖x_t+1 - x_t‖ <= 1e-12 within 200 steps, ‖x* - ξ_µ‖ < R",
            fixed_count,
            fixed_violations,
            fixed_margin,
        ),
    ]


def capacity_bound(
    d: int, k: int, m: float, r: float, beta: float, p: float
) -> tuple[float, float]:
    """Proposition 4.1: ``(C, √p C^{(d-1)/4})`` with ``a = 4/(d-1)(ln[m(√p+k-1)/R] + 1)``."""
    a = 4 / (d - 1) * (math.log(m * (math.sqrt(p) + k - 1) / r) + 1)
    b = 4 * m * m * beta / (5 * (d - 1))
    log_c = log_capacity(a, b)
    return math.exp(log_c), math.exp(0.5 * math.log(p) + (d - 1) / 4 * log_c)


def check_proposition_41(config: Config) -> tuple[list[Check], Table]:
    """Proposition 4.1 (m=1, R=0.1, β=50, p=0.01): the bound grows with d, falls with k."""
    m, r, beta, p = 1.0, 0.1, 50.0, 0.01
    values = {
        (d, k): capacity_bound(d, k, m, r, beta, p)
        for d in config.prop_dims
        for k in config.prop_ks
    }
    d_count = d_violations = k_count = k_violations = c_count = c_violations = 0
    d_margin = k_margin = math.inf
    for k in config.prop_ks:
        for d0, d1 in zip(config.prop_dims[:-1], config.prop_dims[1:], strict=True):
            d_count += 1
            ratio = values[(d1, k)][1] / values[(d0, k)][1]
            d_violations += int(not ratio > 1)
            d_margin = min(d_margin, ratio - 1)
    for d in config.prop_dims:
        for k0, k1 in zip(config.prop_ks[:-1], config.prop_ks[1:], strict=True):
            k_count += 1
            ratio = values[(d, k0)][1] / values[(d, k1)][1]
            k_violations += int(not ratio > 1)
            k_margin = min(k_margin, ratio - 1)
    for (d, k), (c, _) in values.items():
        a = 4 / (d - 1) * (math.log(m * (math.sqrt(p) + k - 1) / r) + 1)
        b = 4 * m * m * beta / (5 * (d - 1))
        c_count += 1
        c_violations += int((c > 1) != (b > a))
    rows = []
    for (d, k), (c, bound) in sorted(values.items()):
        spec = SPEC_CAPACITY.get((d, k))
        rows.append([d, k, c, bound, spec[0] if spec else None, spec[1] if spec else None])
    table = Table(
        "Proposition 4.1 capacity lower bound (m=1, R=0.1, β=50, p=0.01)",
        ["d", "k", "C", "√p·C^((d-1)/4)", "C (spec)", "bound (spec)"],
        rows,
        caption="C = b / W0(exp(a + ln b)); the spec's values were computed by its author with "
        "scipy (the paper prints no numbers).",
    )
    checks = [
        Check(
            "Nonparametric Prop. 4.1",
            "the capacity lower bound grows with d",
            "theorem",
            "bound(d') / bound(d) > 1 for d < d', every k",
            d_count,
            d_violations,
            d_margin,
        ),
        Check(
            "Nonparametric Prop. 4.1",
            "the capacity lower bound falls with k",
            "theorem",
            "bound(k) / bound(k') > 1 for k < k', every d",
            k_count,
            k_violations,
            k_margin,
        ),
        Check(
            "Nonparametric Prop. 4.1",
            "C > 1 (exponential capacity) iff b > a",
            "theorem",
            "every grid point",
            c_count,
            c_violations,
            min(abs(c - 1) for c, _ in values.values()),
        ),
    ]
    return checks, table


def check_convergence_random(config: Config, generator: torch.Generator) -> list[Check]:
    """Spec §12.2 A.7 on random sphere memories (d=64, m=8, M=100, x_0 = ξ_µ + δ, ‖δ‖ = R/2).

    Without the well-separation condition the corollary does not apply; how often Top-K and dense
    iterates still end inside ``S_µ``, and whether Top-K needs fewer steps, is reported.
    """
    d, size, rho, tol = config.sparse_dim, 100, 0.5, 1e-6
    m = math.sqrt(d)
    count = outside = faster = compared = 0
    margin = math.inf
    for beta in config.convergence_betas:
        memories = sphere(generator, config.trials * 4, size, d, radius=m)
        r = separation_radius(memories)
        x = memories[:, :1] + (rho * r)[:, None, None] * sphere(generator, config.trials * 4, 1, d)
        steps = {}
        for k in (*config.convergence_ks, size):
            structure = None if k == size else TopK(k)
            result = retrieve(
                x, memories, Softmax(), structure, beta=beta, steps=200, tol=tol, track_energy=False
            )
            distance = (result.patterns[:, 0] - memories[:, 0]).norm(dim=-1)
            ok = result.converged[:, 0] & (distance < r)
            count += int(ok.numel())
            outside += int((~ok).sum())
            margin = min(margin, float(((r - distance) / r).min()))
            steps[k] = result.steps[:, 0]
        for k in config.convergence_ks:
            compared += int(steps[k].numel())
            faster += int((steps[k] <= steps[size]).sum())
    betas = ", ".join(f"{b:g}" for b in config.convergence_betas)
    return [
        Check(
            "Nonparametric §12.2 A.7",
            f"random memories (β ∈ {{{betas}}}): Top-K and dense iterates end inside S_µ",
            "info",
            f"runs not converged (tol {tol:g}, 200 steps) or ending outside S_µ (violations)",
            count,
            outside,
            1 - outside / max(count, 1),
        ),
        Check(
            "Nonparametric Cor. 4.1.1 (computational reading)",
            "Top-K needs no more iterations than dense to reach the tolerance",
            "info",
            "runs where Top-K needs more steps (violations column)",
            compared,
            compared - faster,
            faster / max(compared, 1),
        ),
    ]


def topk_table(trials: list[SparseTrials]) -> Table:
    """Mean one-step error per model at every (M, β, ρ), with the spec's pre-check beside."""
    rows = []
    for group in trials:
        for name, error in group.errors.items():
            k = int(name.split("-")[1]) if name.startswith("top-") else None
            spec = None
            if group.size == 100 and group.beta == 0.1 and group.rho == 0.5:
                if name == "dense":
                    spec = SPEC_TOPK_ERRORS[100]
                elif k is not None:
                    spec = SPEC_TOPK_ERRORS.get(k)
            rows.append(
                [
                    group.size,
                    group.beta,
                    group.rho,
                    name,
                    float(error.mean()),
                    float(error.std()),
                    float(group.in_support[name].float().mean()),
                    spec,
                ]
            )
    return Table(
        "One-step retrieval error ‖T(x) - ξ_µ‖ (d=64, m=8, x = ξ_µ + δ, ‖δ‖ = ρR)",
        ["M", "β", "ρ", "model", "mean error", "std", "P(µ ∈ 𝓜)", "spec pre-check"],
        rows,
        caption="Nonparametric §12.2 A: Top-K keeps the K largest scores; 'random f' keeps a "
        "random fraction f ('forced': the target is always kept). The last column is the spec "
        "author's numpy pre-check (mean error at M=100, β=0.1, ρ=0.5).",
    )


def draw_figure(path: str, trials: list[SparseTrials], table: Table) -> None:
    """Top-K error versus K (one line per β, ρ = middle value) and the capacity bound vs d."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    rhos = sorted({g.rho for g in trials})
    rho = rhos[len(rhos) // 2]
    size = max(g.size for g in trials)
    for group in trials:
        if group.rho != rho or group.size != size:
            continue
        ks = sorted(v for n, v in group.kept.items() if n.startswith("top-") or n == "dense")
        names = [f"top-{k}" if k != group.size else "dense" for k in ks]
        means = [float(group.errors[n].mean()) for n in names]
        left.plot(ks, means, marker="o", label=f"β={group.beta:g}")
    left.set_xscale("log")
    left.set_xlabel("K (memories kept; K=M is dense)")
    left.set_ylabel("mean ‖T(x) - ξ_µ‖")
    left.set_title(f"Top-K one-step error, M={size}, ρ={rho:g}")
    left.legend()
    by_k: dict[int, list[tuple[int, float]]] = {}
    for d, k, _, bound, _, _ in table.rows:
        by_k.setdefault(k, []).append((d, bound))
    for k, points in sorted(by_k.items()):
        points.sort()
        right.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"k={k}")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("d")
    right.set_ylabel("√p C^((d-1)/4)")
    right.set_title("Prop. 4.1 capacity lower bound")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run(config: Config, ctx: RunContext) -> Results:
    """Run every check and return the pass/fail table, the Top-K and capacity tables."""
    return with_threads(config.threads, lambda: _run(config, ctx))


def _run(config: Config, ctx: RunContext) -> Results:
    generator = torch.Generator().manual_seed(config.seed)
    stages: list[tuple[str, Callable[[], list[Check]]]] = [
        ("OutEffHop dynamics", lambda: check_dynamics(config, generator)),
        ("γ identity", lambda: [check_gamma_identity(config, generator)]),
        ("Lipschitz", lambda: check_lipschitz(config, generator)),
        ("Cor. 3.2.1", lambda: check_corollary_321(config, generator)),
        ("Thm 3.2", lambda: check_theorem_32(config, generator)),
        ("Thm 3.3", lambda: check_theorem_33(config)),
    ]
    checks: list[Check] = []
    for _, stage in ctx.track(stages, total=len(stages), desc="theory (OutEffHop)"):
        checks.extend(stage())
    trials = sparse_trials(config, generator)
    checks.extend(check_theorem_41(trials))
    checks.append(check_corollary_412(config, trials))
    checks.extend(check_sparse_trends(trials))
    checks.extend(check_well_separated(config, generator))
    prop_checks, capacity_table = check_proposition_41(config)
    checks.extend(prop_checks)
    checks.extend(check_convergence_random(config, generator))
    # Nonparametric §3 (SVR), OutEffHop Thm 3.4, App. B.1 and §4.1, Hyper-SET: own generators,
    # the rows above keep theirs.
    from hopfield.experiments.theory_generalization import generalization_checks
    from hopfield.experiments.theory_hyperset import hyperset_checks
    from hopfield.experiments.theory_outliers import outlier_checks
    from hopfield.experiments.theory_svr import svr_checks

    svr, svr_table = svr_checks(config)
    generalization, generalization_table = generalization_checks(config)
    checks += svr + generalization + outlier_checks(config) + hyperset_checks(config)
    table = Table(
        "Theory checks",
        COLUMNS,
        [c.row() for c in checks],
        caption="float64; 'worst margin' is the slack of the worst trial (positive = holds; for "
        "'info' rows it is the share that agrees). Kinds: theorem (must hold), printed (a "
        "paper's statement as printed that we found can fail, beside our corrected theorem), "
        "heuristic (the paper's proof is not rigorous), empirical (a trend on averages), info "
        "(reported).",
    )
    failed = [c for c in checks if c.status == "fail"]
    metrics: dict[str, float] = {
        "checks": float(len(checks)),
        "failed": float(len(failed)),
        "failed_theorems": float(sum(c.kind == "theorem" for c in failed)),
        "failed_printed": float(sum(c.kind == "printed" for c in failed)),
    }
    for c in checks:
        key = f"{c.paper}: {c.statement}"
        metrics[f"violations/{key}"] = float(c.violations)
    figures = []
    topk = topk_table(trials)
    if config.figure and ctx.is_main_process:
        draw_figure(str(ctx.path("theory_topk_capacity.png")), trials, capacity_table)
        figures.append("theory_topk_capacity.png")
    notes = [
        "Lemma C.1 as printed takes ln of 2m²(√p-1)/R < 0; we use |√p-1| (only the ordering "
        "C > C̃ is meaningful).",
        "Theorem 4.1 uses the proof's exponent Δ̃_µ = ⟨x,ξ_µ⟩ - max_ν⟨x,ξ_ν⟩ (the main text prints "
        "⟨ξ_µ,ξ_ν⟩).",
        "Theorem 3.2's bound as printed omits the (1-γ)‖ξ_µ‖ that T_OutEff = γ·T_dense leaves "
        "and fails where it is tight (the counterexample table); our corrected bound adds it.",
        "Corollary 3.2.1's printed condition (γ+1)/2 >= cos α takes ‖T_dense(x)‖ = 1; with a "
        "blend of memories it is shorter and the condition can hold while OutEffHop is farther; "
        "our exact form (γ+1)‖v1‖² >= 2 v1·ξ decides every trial.",
    ]
    notes += [f"FAILED: {c.paper}: {c.statement} ({c.violations}/{c.trials})" for c in failed]
    return Results(
        tables=[
            table,
            topk,
            capacity_table,
            svr_table,
            generalization_table,
            theorem_32_counterexample_table(),
        ],
        metrics=metrics,
        figures=figures,
        notes=notes,
    )


register(
    Experiment(
        name="theory",
        summary="numeric checks of the OutEffHop, nonparametric Hopfield and Hyper-SET theorems "
        "(pass/fail)",
        presets=PRESETS,
        run=run,
        paper="OutEffHop Lemma 2.1, Thms 3.1-3.4, Cor. 3.2.1, Lemma C.6, App. B.1, §4.1; "
        "Nonparametric Thms 3.1, 3.2, 4.1, Lemma 3.1, Def. 3.2, Cor. 4.1.1-4.1.3, Lemma 4.1, "
        "Prop. 4.1; Hyper-SET Eqs. 7, 10, Tables 18-19, §3, §3.3",
        single_process=True,
    )
)

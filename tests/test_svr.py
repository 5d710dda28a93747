"""The SVR view of modern Hopfield memories (nonparametric §3, App. D.1-D.3), in float64.

References: the primal objective (3.2) evaluated on explicit feature maps, the plain softmax
formula ``Ξ Softmax(β Ξ_δᵀ x)`` and :func:`hopfield.functional.associate` with Top-K / masks.
"""

from __future__ import annotations

import math

import pytest
import torch

from hopfield.functional import TopK, associate
from hopfield.functional.svr import (
    ExponentialKernel,
    NormalizedKernel,
    exponential_features,
    fit_svr,
    linear_kernel,
    nonparametric_dense,
    primal_objective,
)

DTYPE = torch.float64


def memories(seed: int, size: int, d: int, noise: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keys, values)``: ``ξ_µ + δξ_µ`` and ``ξ_µ`` on the sphere of radius √d, ``(M, d)``."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(size, d, generator=g, dtype=DTYPE)
    values = math.sqrt(d) * values / values.norm(dim=-1, keepdim=True)
    keys = values + noise * torch.randn(size, d, generator=g, dtype=DTYPE)
    return keys, values


def truncated_exp(beta: float, degree: int):
    """The explicit truncated exponential feature map and its kernel (a user callable)."""

    def features(x: torch.Tensor) -> torch.Tensor:
        return exponential_features(x, beta, degree)

    def kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return features(a) @ features(b).T

    return features, kernel


def test_exponential_features_span_the_taylor_kernel() -> None:
    # Lemmas D.2/D.3: ⟨Φ(x), Φ(y)⟩ = Σ_{n<=N} (β⟨x,y⟩)^n / n!, C(d+N, N) features.
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(6, 4, generator=g, dtype=DTYPE), torch.randn(5, 4, generator=g, dtype=DTYPE)
    beta = 0.7
    for degree in (0, 1, 3, 5):
        features = exponential_features(a, beta, degree)
        assert features.shape == (6, math.comb(4 + degree, degree))
        expected = sum((beta * a @ b.T) ** n / math.factorial(n) for n in range(degree + 1))
        got = features @ exponential_features(b, beta, degree).T
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    # Enough terms give the exponential kernel itself.
    got = exponential_features(a, 0.1, 14) @ exponential_features(b, 0.1, 14).T
    torch.testing.assert_close(got, ExponentialKernel(0.1)(a, b), rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", ["linear", "truncated-exp"])
@pytest.mark.parametrize("tube", [False, True])
def test_theorem_31_dual_map_is_the_primal_minimiser(name: str, tube: bool) -> None:
    keys, values = memories(0, 12, 4, noise=0.3)
    targets = values[:, :3]
    if name == "linear":
        features, kernel = (lambda x: x), linear_kernel
    else:
        features, kernel = truncated_exp(0.4, 3)
    # A retrieval error ϵ small enough that the bound ε + η <= ϵ/√d binds for some memories.
    retrieval_error = {"linear": 1.0, "truncated-exp": 0.5}[name] if tube else None
    epsilon, C = 0.05, 0.5
    memory = fit_svr(keys, targets, kernel, epsilon=epsilon, C=C, retrieval_error=retrieval_error)
    assert memory.kkt_violation <= 1e-10
    weights = memory.weights(features)  # w*_i = Σ_µ (α_µ[i] - α̃_µ[i]) Φ(ξ_µ + δξ_µ)
    queries = torch.randn(20, 4, generator=torch.Generator().manual_seed(5), dtype=DTYPE)
    # (3.3): the dual expression equals the primal map ⟨w*_i, Φ(x)⟩.
    torch.testing.assert_close(memory(queries), features(queries) @ weights.T, rtol=0, atol=1e-8)
    # W* minimises the primal (3.2): zero duality gap, and no perturbation lowers the objective.
    phi = features(keys)
    objective = lambda w: primal_objective(  # noqa: E731
        w, phi, targets, epsilon=epsilon, C=C, retrieval_error=retrieval_error
    )
    best = objective(weights)
    assert math.isfinite(best)
    assert best - memory.dual_objective() == pytest.approx(0.0, abs=1e-8 * (1 + abs(best)))
    g = torch.Generator().manual_seed(7)
    for scale in (1e-1, 1e-3):
        for _ in range(20):
            step = scale * torch.randn(weights.shape, generator=g, dtype=DTYPE)
            assert objective(weights + step) >= best - 1e-10
    # Every segment of the dual occurs at this C: zero, inside (0, C) and at ±C.
    magnitude = memory.coef.abs()
    assert bool((magnitude == 0).any()) and bool(((magnitude > 0) & (magnitude < C)).any())
    assert bool((magnitude >= C).any())
    # With the bound, some coefficients pass C (the slack is capped) and no residual leaves it.
    assert bool((magnitude > C).any()) == tube
    if retrieval_error is not None:
        residual = (targets - memory(keys)).abs().max()
        assert float(residual) <= retrieval_error / math.sqrt(3) * (1 + 1e-9)


def test_a_wrong_coefficient_breaks_the_certificate() -> None:
    # The duality gap and KKT check can fail: perturb one coefficient of an exact fit.
    keys, values = memories(2, 10, 4, noise=0.3)
    features, kernel = truncated_exp(0.4, 2)
    memory = fit_svr(keys, values, kernel, epsilon=0.05, C=0.5)
    memory.coef[3, 1] += 1e-3 if memory.coef[3, 1] < 0.5 else -1e-3
    gap = primal_objective(memory.weights(features), features(keys), values, epsilon=0.05, C=0.5)
    assert gap - memory.dual_objective() > 1e-8


def test_lemma_31_construction_is_the_dense_update() -> None:
    keys, values = memories(3, 40, 16)
    x = keys[:8] + 0.5 * torch.randn(8, 16, generator=torch.Generator().manual_seed(4), dtype=DTYPE)
    for beta in (0.05, 0.2, 1.0):
        memory = nonparametric_dense(keys, values, beta)
        expected = torch.softmax(beta * x @ keys.T, dim=-1) @ values  # Ξ Softmax(β Ξ_δᵀ x)
        torch.testing.assert_close(memory(x), expected, rtol=1e-12, atol=1e-12)
    # Without noise (Remark 3.5): the auto-associative update of retrieve().
    from hopfield.memory import retrieve

    memory = nonparametric_dense(values, values, 0.2)
    torch.testing.assert_close(
        memory(x), retrieve(x, values, beta=0.2, steps=1).patterns, rtol=1e-12, atol=1e-12
    )


def test_a_query_far_from_every_memory_gives_no_nan() -> None:
    # β⟨x, ξ⟩ << -745 for every key: exp underflows, h(x) = 0; the log-space kernel stays finite.
    keys, values = memories(9, 10, 4)
    x = -1e3 * keys[:1]
    memory = nonparametric_dense(keys, values, 1.0)
    expected = torch.softmax(x @ keys.T, dim=-1) @ values
    torch.testing.assert_close(memory(x), expected, rtol=1e-12, atol=1e-12)
    assert bool(memory(x).isfinite().all())


def test_a_fitted_normalised_exp_svr_approaches_the_dense_model_as_beta_grows() -> None:
    # The proof identifies (α_µ − α̃_µ)/h(ξ_µ + δξ_µ) with ξ_µ; a real fit gives P⁻¹Ξ (P the
    # softmax matrix of the keys), which tends to Ξ only as the keys separate (β‖ξ‖² large).
    keys, values = memories(4, 30, 16)
    deviations = []
    for beta in (0.1, 0.3, 3.0):
        kernel = NormalizedKernel(ExponentialKernel(beta), keys)
        memory = fit_svr(keys, values, kernel, epsilon=0.0, C=1e30)  # C never binds
        assert memory.kkt_violation <= 1e-10
        identified = memory.coef / kernel.h(keys)[:, None]
        softmax = torch.softmax(beta * keys @ keys.T, dim=-1)
        torch.testing.assert_close(softmax @ identified, values, rtol=0, atol=1e-8)
        deviations.append(float((identified - values).norm() / values.norm()))
    assert deviations[0] > deviations[1] > deviations[2]
    assert deviations[2] < 1e-4 and deviations[0] > 0.05, deviations


@pytest.mark.parametrize("kernel_name", ["linear", "exp", "callable"])
def test_definition_32_every_memory_is_retrieved_within_the_tube(kernel_name: str) -> None:
    keys, values = memories(5, 16, 8, noise=0.2)
    kernel = {
        "linear": linear_kernel,
        "exp": ExponentialKernel(0.1),
        "callable": truncated_exp(0.1, 3)[1],
    }[kernel_name]
    size = 8 if kernel_name == "linear" else 16  # the linear Gram matrix has rank d
    retrieval_error = 0.5
    memory = fit_svr(
        keys[:size], values[:size], kernel, epsilon=0.02, C=0.01, retrieval_error=retrieval_error
    )
    assert memory.kkt_violation <= 1e-10
    errors = (memory(keys[:size]) - values[:size]).norm(dim=-1)
    assert float(errors.max()) <= retrieval_error * (1 + 1e-9)
    # The tube binds: a small C alone (no retrieval error) retrieves far worse.
    loose = fit_svr(keys[:size], values[:size], kernel, epsilon=0.02, C=0.01)
    assert float((loose(keys[:size]) - values[:size]).norm(dim=-1).max()) > retrieval_error
    # ε-insensitivity: memories retrieved strictly inside the ε tube carry no coefficient.
    sparse = fit_svr(keys[:size], values[:size], kernel, epsilon=0.5, C=10.0)
    inside = ((sparse(keys[:size]) - values[:size]).abs() < 0.5 - 1e-9) & (sparse.coef != 0)
    assert not bool(inside.any())


def test_definition_33_masked_svr_is_the_sparse_structured_model() -> None:
    keys, values = memories(6, 30, 16)
    beta, k = 0.2, 5
    g = torch.Generator().manual_seed(8)
    x = keys[:6] + 0.4 * torch.randn(6, 16, generator=g, dtype=DTYPE)
    top = TopK(k)
    expected = associate(
        x[None, None], keys[None, None], values[None, None], structure=top, scale=beta
    )
    random_mask = torch.rand(6, 30, generator=g) < 0.5
    random_mask[:, 0] = True
    masked = associate(
        x[None, None], keys[None, None], values[None, None], mask=random_mask, scale=beta
    )
    for i in range(6):
        support = torch.zeros(30, dtype=torch.bool)
        support[(x[i] @ keys.T).topk(k).indices] = True
        memory = nonparametric_dense(keys, values, beta, support)
        assert set(memory.support_vectors.tolist()) == set(
            torch.nonzero(support).flatten().tolist()
        )
        torch.testing.assert_close(memory(x[i]), expected[0, 0, i], rtol=1e-12, atol=1e-12)
        memory = nonparametric_dense(keys, values, beta, random_mask[i])
        torch.testing.assert_close(memory(x[i]), masked[0, 0, i], rtol=1e-12, atol=1e-12)
    # A fitted masked SVR (3.6) only uses the support: zero coefficients outside it.
    support = torch.zeros(30, dtype=torch.bool)
    support[::3] = True
    kernel = NormalizedKernel(ExponentialKernel(1.0), keys, support)
    memory = fit_svr(keys, values, kernel, epsilon=0.01, C=1e30, mask=support)
    assert bool((memory.coef[~support] == 0).all())
    assert float((memory(keys[support]) - values[support]).abs().max()) <= 0.01 + 1e-9


def test_bad_input_is_refused_with_the_argument_named() -> None:
    keys, values = memories(7, 6, 3)
    cases = [
        (dict(epsilon=-0.1), ValueError, "epsilon"),
        (dict(C=0.0), ValueError, "C"),
        (dict(C=math.inf), ValueError, "C"),
        (dict(retrieval_error=0.0), ValueError, "retrieval_error"),
        (dict(epsilon=1.0, retrieval_error=0.5), ValueError, "epsilon"),
        (dict(mask=torch.ones(5, dtype=torch.bool)), ValueError, "mask"),
        (dict(mask=torch.zeros(6, dtype=torch.bool)), ValueError, "mask"),
        (dict(mask=torch.ones(6)), TypeError, "mask"),
        (dict(max_sweeps=0), ValueError, "max_sweeps"),
        (dict(polish="yes"), TypeError, "polish"),
    ]
    for kwargs, error, name in cases:
        with pytest.raises(error, match=name):
            fit_svr(keys, values, linear_kernel, **kwargs)
    with pytest.raises(ValueError, match="targets"):
        fit_svr(keys, values[:5], linear_kernel)
    with pytest.raises(ValueError, match="keys"):
        fit_svr(keys[0], values, linear_kernel)
    with pytest.raises(TypeError, match="keys"):
        fit_svr(keys.long(), values, linear_kernel)
    with pytest.raises(TypeError, match="kernel"):
        fit_svr(keys, values, "rbf")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kernel"):
        fit_svr(keys, values, lambda a, b: (a @ b.T)[:, :2])
    with pytest.raises(ValueError, match="beta"):
        ExponentialKernel(0.0)
    with pytest.raises(ValueError, match="degree"):
        exponential_features(keys, 1.0, -1)
    with pytest.raises(ValueError, match="values"):
        nonparametric_dense(keys, values[:4], 1.0)
    memory = nonparametric_dense(keys, values, 1.0)
    with pytest.raises(ValueError, match="x"):
        memory(torch.zeros(2, 4, dtype=DTYPE))


def test_non_finite_memories_or_gram_are_refused() -> None:
    """NaN keys used to give all-zero coefficients after one sweep (``kkt_violation=nan``)."""
    keys, values = memories(7, 6, 3)
    nan_keys = keys.clone()
    nan_keys[2, 1] = math.nan
    with pytest.raises(ValueError, match="keys must be finite, got NaN or inf in row 2"):
        fit_svr(nan_keys, values, linear_kernel)
    inf_values = values.clone()
    inf_values[4, 0] = math.inf
    with pytest.raises(ValueError, match=r"targets must be finite.*row 4"):
        fit_svr(keys, inf_values, linear_kernel)
    with pytest.raises(ValueError, match="kernel: the Gram matrix"):
        fit_svr(keys, values, ExponentialKernel(1e4))

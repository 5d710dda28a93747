"""Energies of modern Hopfield models: values, CCCP updates, monotone descent, fixed points."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from hopfield.functional.energy import (
    DenseEnergy,
    Energy,
    OutEffEnergy,
    PolynomialEnergy,
    TsallisEnergy,
    energy_for,
    scores_of,
)
from hopfield.functional.separation import (
    ClippedSoftmax,
    Entmax,
    Polynomial,
    Softmax,
    SoftmaxN,
    Sparsemax,
)

DTYPE = torch.float64
ENERGIES = [
    DenseEnergy(),
    OutEffEnergy(1.0),
    OutEffEnergy(5.0),
    TsallisEnergy(2.0),
    TsallisEnergy(1.5),
    PolynomialEnergy(10),
    PolynomialEnergy(3),
]


def sphere(generator: torch.Generator, count: int, dim: int, radius: float) -> torch.Tensor:
    """``count`` points uniform on the sphere of ``radius`` in ``R^dim`` (float64)."""
    g = torch.randn(count, dim, generator=generator, dtype=DTYPE)
    return radius * g / g.norm(dim=-1, keepdim=True)


def sparsemax_np(z: np.ndarray) -> np.ndarray:
    """Independent float64 sparsemax (Martins & Astudillo, 2016) of a vector."""
    s = np.sort(z)[::-1]
    k = np.arange(1, len(z) + 1)
    cs = np.cumsum(s)
    support = k[1 + k * s > cs].max()
    tau = (cs[support - 1] - 1) / support
    return np.maximum(z - tau, 0)


def test_potentials_match_float64_formulas() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        z = rng.normal(scale=3.0, size=17)
        zt = torch.tensor(z)
        lse = math.log(np.exp(z).sum())
        assert DenseEnergy().potential(zt).item() == pytest.approx(lse, rel=1e-12)
        assert OutEffEnergy(1).potential(zt).item() == pytest.approx(
            math.log(1 + np.exp(z).sum()), rel=1e-12
        )
        p = sparsemax_np(z)
        gini = 0.5 * (z @ z) - 0.5 * ((z - p) @ (z - p)) + 0.5
        assert TsallisEnergy(2).potential(zt).item() == pytest.approx(gini, rel=1e-10)
        r = np.maximum(z, 0)
        assert PolynomialEnergy(10).potential(zt).item() == pytest.approx(
            (r**11).sum() ** (1 / 11), rel=1e-12
        )


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0])
def test_tsallis_potential_is_the_convex_conjugate(alpha: float) -> None:
    # Φ(z) = max_{p in simplex} <p, z> - Ψ(p): entmax attains it, any other p gives less.
    energy = TsallisEnergy(alpha)
    g = torch.Generator().manual_seed(1)
    z = 2 * torch.randn(50, 12, generator=g, dtype=DTYPE)
    value = energy.potential(z)
    for _ in range(20):
        q = torch.distributions.Dirichlet(torch.full((12,), 0.3, dtype=DTYPE)).sample((50,))
        assert bool(((q * z).sum(-1) - energy.negative_entropy(q) <= value + 1e-9).all())
    p = energy.weights(z)
    torch.testing.assert_close(p.sum(-1), torch.ones(50, dtype=DTYPE), rtol=0, atol=1e-9)


def test_weights_are_the_gradient_of_the_potential() -> None:
    g = torch.Generator().manual_seed(2)
    for energy in ENERGIES:
        z = (3 * torch.randn(8, 9, generator=g, dtype=DTYPE)).requires_grad_()
        (grad,) = torch.autograd.grad(energy.potential(z).sum(), z)
        torch.testing.assert_close(grad, energy.weights(z).detach(), rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("energy", ENERGIES, ids=repr)
def test_update_is_the_cccp_step_of_the_energy(energy: Energy) -> None:
    # CCCP with H = ½‖x‖² - β⁻¹Φ(βΞᵀx): x_new = ∇_x β⁻¹Φ(βΞᵀx) = x - ∇H(x) (autograd oracle).
    g = torch.Generator().manual_seed(3)
    for beta, radius in itertools.product([0.1, 1.0, 4.0], [0.5, 1.0, 3.0]):
        memories = sphere(g, 20, 8, radius)
        x = (radius * torch.randn(6, 8, generator=g, dtype=DTYPE)).requires_grad_()
        (grad,) = torch.autograd.grad(energy.energy(x, memories, beta).sum(), x)
        torch.testing.assert_close(
            energy.update(x.detach(), memories, beta), x.detach() - grad, rtol=1e-7, atol=1e-9
        )


def test_updates_equal_retrieval_with_the_separation_maps() -> None:
    g = torch.Generator().manual_seed(4)
    memories = torch.rand(30, 16, generator=g, dtype=DTYPE)
    x = torch.rand(5, 16, generator=g, dtype=DTYPE)
    for energy in [
        DenseEnergy(),
        OutEffEnergy(1),
        OutEffEnergy(2.5),
        TsallisEnergy(2),
        TsallisEnergy(1.5),
    ]:
        expected = energy.separation()(0.7 * x @ memories.T) @ memories
        torch.testing.assert_close(energy.update(x, memories, 0.7), expected, rtol=1e-9, atol=1e-12)


def test_outeff_update_is_gamma_times_dense_update() -> None:
    g = torch.Generator().manual_seed(5)
    memories = sphere(g, 40, 10, 1.0)
    x = sphere(g, 7, 10, 1.0)
    for beta in [0.1, 1.0, 8.0]:
        s = torch.exp(scores_of(x, memories, beta)).sum(-1, keepdim=True)
        dense = DenseEnergy().update(x, memories, beta)
        outeff = OutEffEnergy(1).update(x, memories, beta)
        torch.testing.assert_close(outeff, s / (1 + s) * dense, rtol=1e-12, atol=0)
        no_op = OutEffEnergy(1).no_op_mass(x, memories, beta)
        torch.testing.assert_close(no_op, (1 / (1 + s)).squeeze(-1), rtol=1e-9, atol=1e-15)


def test_polynomial_cccp_and_sum_normalised_weights_share_direction() -> None:
    g = torch.Generator().manual_seed(6)
    z = torch.randn(20, 15, generator=g, dtype=DTYPE)
    w = PolynomialEnergy(10).weights(z)
    p = Polynomial(10)(z)
    r = z.clamp_min(0)
    c = (r**11).sum(-1, keepdim=True) ** (10 / 11) / (r**10).sum(-1, keepdim=True)
    torch.testing.assert_close(p, c * w, rtol=1e-10, atol=1e-14)
    assert bool(((c > 0) & (c <= 1 + 1e-12)).all())
    # β cancels in the polynomial energy.
    memories, x = (
        torch.rand(9, 4, generator=g, dtype=DTYPE),
        torch.rand(3, 4, generator=g, dtype=DTYPE),
    )
    e = PolynomialEnergy(10)
    torch.testing.assert_close(e.energy(x, memories, 0.1), e.energy(x, memories, 5.0))


@pytest.mark.parametrize("energy", ENERGIES, ids=repr)
def test_energy_never_increases_along_the_updates(energy: Energy) -> None:
    # Lemma 2.1 (OutEffHop), Ramsauer et al. Thm 1, Hu et al. 2023 Lemma 2.1: many seeds, β, norms.
    for seed, beta, radius in itertools.product(range(6), [0.1, 1.0, 8.0], [0.5, 1.0, 2.8]):
        g = torch.Generator().manual_seed(seed)
        d, m = [(8, 4), (16, 50), (64, 300)][seed % 3]
        memories = sphere(g, m, d, radius)
        x = radius * torch.randn(4, d, generator=g, dtype=DTYPE) / math.sqrt(d)
        values = [energy.energy(x, memories, beta)]
        for _ in range(15):
            x = energy.update(x, memories, beta)
            values.append(energy.energy(x, memories, beta))
        trace = torch.stack(values)
        increase = (trace[1:] - trace[:-1]).max().item()
        assert increase <= 1e-10 * (1 + trace.abs().max().item()), (seed, beta, radius, increase)


@pytest.mark.parametrize("energy", ENERGIES, ids=repr)
def test_iterates_converge_to_stationary_points(energy: Energy) -> None:
    # Theorem 3.1 (OutEffHop): limit points of the iteration are stationary points of H.
    for seed, beta in itertools.product(range(3), [0.5, 2.0, 8.0]):
        g = torch.Generator().manual_seed(10 + seed)
        memories = sphere(g, 25, 12, 1.0)
        x = memories[:3] + 0.1 * torch.randn(3, 12, generator=g, dtype=DTYPE)
        for _ in range(3000):
            new = energy.update(x, memories, beta)
            done = (new - x).norm(dim=-1).max().item() < 1e-12
            x = new
            if done:
                break
        assert energy.gradient(x, memories, beta).norm(dim=-1).max().item() < 1e-8


def test_single_state_and_batched_shapes() -> None:
    g = torch.Generator().manual_seed(7)
    memories = torch.randn(2, 11, 5, generator=g, dtype=DTYPE)
    x = torch.randn(2, 3, 5, generator=g, dtype=DTYPE)
    for energy in ENERGIES:
        assert energy.energy(x, memories).shape == (2, 3)
        assert energy.update(x, memories).shape == (2, 3, 5)
        single = energy.energy(x[0, 1], memories[0])
        assert single.shape == ()
        torch.testing.assert_close(single, energy.energy(x, memories)[0, 1])
        torch.testing.assert_close(
            energy.update(x[0, 1], memories[0]), energy.update(x, memories)[0, 1]
        )


def test_energy_for_maps_separations_to_their_energies() -> None:
    assert isinstance(energy_for(Softmax()), DenseEnergy)
    outeff = energy_for(SoftmaxN(1))
    assert isinstance(outeff, OutEffEnergy) and outeff.n == 1
    sparse = energy_for(Sparsemax())
    assert isinstance(sparse, TsallisEnergy) and sparse.alpha == 2
    ent = energy_for(Entmax(1.5))
    assert isinstance(ent, TsallisEnergy) and ent.alpha == 1.5
    assert energy_for(Polynomial(10)) is None
    assert energy_for(ClippedSoftmax(-0.1, 1.0)) is None
    assert energy_for(Entmax(1.5, learnable=True)) is None
    with pytest.raises(TypeError, match="separation"):
        energy_for("softmax")  # type: ignore[arg-type]


def test_bad_arguments_raise() -> None:
    memories, x = torch.randn(4, 3), torch.randn(2, 3)
    with pytest.raises(ValueError, match="beta"):
        DenseEnergy().energy(x, memories, beta=0.0)
    with pytest.raises(TypeError, match="beta"):
        DenseEnergy().energy(x, memories, beta="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pattern size"):
        DenseEnergy().update(torch.randn(2, 4), memories)
    with pytest.raises(ValueError, match="memories"):
        DenseEnergy().update(x, torch.randn(3))
    with pytest.raises(TypeError, match="memories"):
        DenseEnergy().update(x, [[1.0, 2.0, 3.0]])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="floating"):
        DenseEnergy().update(x, torch.ones(4, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="n must"):
        OutEffEnergy(-1.0)
    with pytest.raises(ValueError, match="alpha"):
        TsallisEnergy(1.0)
    with pytest.raises(TypeError, match="alpha"):
        TsallisEnergy("2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="degree"):
        PolynomialEnergy(0)

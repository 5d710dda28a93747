"""Separation maps against float64 reference formulas, gradients, masks and extreme inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck

from hopfield.functional import (
    ClippedSoftmax,
    Entmax,
    Polynomial,
    Separation,
    Softmax,
    SoftmaxN,
    Sparsemax,
    entmax,
)
from oracles import ref_entmax, ref_softmax_n, ref_sparsemax

INF = math.inf


ALL_MAPS: list[tuple[str, Separation]] = [
    ("softmax", Softmax()),
    ("softmax1", SoftmaxN(1.0)),
    ("softmax2.5", SoftmaxN(2.5)),
    ("sparsemax", Sparsemax()),
    ("entmax15", Entmax(1.5)),
    ("entmax13", Entmax(1.3)),
    ("clipped", ClippedSoftmax(gamma=-0.1, zeta=1.1)),
    ("clipped1", ClippedSoftmax(gamma=-0.05, zeta=1.0, base=SoftmaxN(1))),
    ("poly", Polynomial(3)),
]
SPARSE_MAPS = [m for m in ALL_MAPS if m[0] in {"sparsemax", "entmax15", "entmax13", "clipped"}]


def test_softmax1_reference_values_of_the_paper() -> None:
    s1 = SoftmaxN(1.0)
    z = torch.tensor([-10.0, -10.0, -10.0], dtype=torch.float64)
    assert torch.allclose(s1(z), torch.full((3,), 4.53937e-5, dtype=torch.float64), rtol=1e-5)
    big = Softmax()(torch.tensor([100.0, -10.0, -10.0], dtype=torch.float64))
    assert big[0] == pytest.approx(1.0) and big[1] == pytest.approx(1.68891e-48, rel=1e-5)
    assert torch.allclose(
        s1(torch.zeros(3, dtype=torch.float64)), torch.full((3,), 0.25, dtype=torch.float64)
    )
    assert torch.equal(s1(torch.tensor([1000.0, 0.0])), torch.tensor([1.0, 0.0]))
    assert torch.equal(s1(torch.tensor([-1000.0, -1000.0])), torch.tensor([0.0, 0.0]))


@pytest.mark.parametrize("n", [0.0, 0.5, 1.0, 3.0])
def test_softmax_n_matches_formula(n: float) -> None:
    z = torch.randn(4, 6, 9, dtype=torch.float64) * 3
    expected = ref_softmax_n(z.numpy(), n)
    assert np.allclose(SoftmaxN(n)(z).numpy(), expected, rtol=1e-12, atol=1e-15)


def test_softmax_n_zero_is_softmax_and_softmax1_is_appended_zero_logit() -> None:
    z = torch.randn(5, 7, dtype=torch.float64)
    assert torch.allclose(SoftmaxN(0)(z), torch.softmax(z, -1), atol=1e-15)
    padded = torch.softmax(torch.cat([z, torch.zeros(5, 1, dtype=z.dtype)], -1), -1)[:, :-1]
    assert torch.allclose(SoftmaxN(1)(z), padded, atol=1e-15)
    gamma = SoftmaxN(1)(z).sum(-1, keepdim=True)
    assert torch.allclose(SoftmaxN(1)(z), gamma * torch.softmax(z, -1), atol=1e-15)


def test_sparsemax_and_entmax_match_references() -> None:
    z = torch.randn(3, 5, 11, dtype=torch.float64) * 2
    assert np.allclose(Sparsemax()(z).numpy(), ref_sparsemax(z.numpy()), atol=1e-12)
    for alpha in (1.5, 1.3, 1.8):
        assert np.allclose(Entmax(alpha)(z).numpy(), ref_entmax(z.numpy(), alpha), atol=1e-9)
    assert torch.allclose(entmax(z, 2.0), Sparsemax()(z))


def test_entmax_bisection_agrees_with_exact_thresholds() -> None:
    z = torch.randn(4, 13, dtype=torch.float64)
    assert torch.allclose(
        entmax(z, torch.tensor(1.5 + 1e-12, dtype=z.dtype)), entmax(z, 1.5), atol=1e-9
    )
    assert torch.allclose(
        entmax(z, torch.tensor(2.0 - 1e-12, dtype=z.dtype)), entmax(z, 2.0), atol=1e-9
    )


def test_clipped_softmax_formula_exact_zeros_and_ones() -> None:
    z = torch.randn(6, 8, dtype=torch.float64)
    sep = ClippedSoftmax(gamma=-0.2, zeta=1.5)
    expected = np.clip(1.7 * ref_softmax_n(z.numpy(), 0) - 0.2, 0, 1)
    assert np.allclose(sep(z).numpy(), expected, atol=1e-15)
    peaked = torch.tensor([[50.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    out = sep(peaked)
    assert out[0, 0] == 1.0 and bool((out[0, 1:] == 0).all())
    alpha = ClippedSoftmax.from_alpha(12, 512)
    assert alpha.gamma == -12 / 512 and alpha.zeta == 1.0


def test_polynomial_weights() -> None:
    z = torch.tensor([[2.0, 1.0, -1.0, 0.0]], dtype=torch.float64)
    out = Polynomial(3)(z)
    assert torch.allclose(out, torch.tensor([[8 / 9, 1 / 9, 0.0, 0.0]], dtype=torch.float64))
    assert torch.allclose(Polynomial(3)(z * 10), out)
    assert torch.equal(Polynomial(2)(-torch.ones(1, 3)), torch.zeros(1, 3))


@pytest.mark.parametrize(("name", "sep"), SPARSE_MAPS)
def test_sparse_maps_give_exact_zeros(name: str, sep: Separation) -> None:
    z = torch.tensor([[3.0, 2.9, -4.0, -5.0, -6.0]], dtype=torch.float64)
    out = sep(z)
    assert bool((out[0, 2:] == 0).all()), name
    assert bool((out[0, :2] > 0).all()), name


@pytest.mark.parametrize(("name", "sep"), ALL_MAPS)
def test_masked_entries_are_zero_and_fully_masked_rows_give_zeros_with_finite_grads(
    name: str, sep: Separation
) -> None:
    z = torch.randn(3, 6, dtype=torch.float64)
    z[0, 2:4] = -INF
    z[1] = -INF
    z.requires_grad_(True)
    out = sep(z)
    assert bool((out[0, 2:4] == 0).all()), name
    assert bool((out[1] == 0).all()), name
    (out * torch.arange(6.0, dtype=z.dtype)).sum().backward()
    assert z.grad is not None and bool(torch.isfinite(z.grad).all()), name


@pytest.mark.parametrize(("name", "sep"), ALL_MAPS)
def test_gradcheck(name: str, sep: Separation) -> None:
    z = (torch.randn(2, 3, 7, dtype=torch.float64) * 1.5).requires_grad_(True)
    assert gradcheck(sep, (z,)), name


@pytest.mark.parametrize(("name", "sep"), ALL_MAPS)
def test_gradcheck_with_mask(name: str, sep: Separation) -> None:
    z = torch.randn(2, 3, 7, dtype=torch.float64)
    keep = torch.rand(2, 3, 7) > 0.3
    keep[..., 0] = True

    def masked(x: torch.Tensor) -> torch.Tensor:
        return sep(x.masked_fill(~keep, -INF))

    assert gradcheck(masked, (z.requires_grad_(True),)), name


def test_gradcheck_learnable_alpha_per_head() -> None:
    z = torch.randn(2, 3, 4, 6, dtype=torch.float64, requires_grad=True)
    logits = torch.randn(3, 1, 1, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda x, a: entmax(x, 1 + torch.sigmoid(a)), (z, logits))


def test_learnable_entmax_parameters() -> None:
    sep = Entmax(alpha=1.5, learnable=True, num_heads=4)
    assert sep.alpha_logit is not None and sep.alpha_logit.shape == (4, 1, 1)
    assert torch.allclose(torch.as_tensor(sep.alpha), torch.full((4, 1, 1), 1.5))
    out = sep(torch.randn(2, 4, 3, 5))
    out.pow(2).sum().backward()
    assert sep.alpha_logit.grad is not None and bool((sep.alpha_logit.grad != 0).any())
    with pytest.raises(ValueError, match="H=4"):
        sep(torch.randn(2, 3, 3, 5))


@pytest.mark.parametrize("num_heads", [None, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_a_learned_alpha_driven_to_the_softmax_limit_stays_an_entmax(
    num_heads: int | None, dtype: torch.dtype
) -> None:
    """A learnable alpha's logit far below 0 (about -16 in float32) rounded ``1 + sigmoid`` to
    exactly 1, which entmax refuses: the training step raised. Alpha now stays at ``1 + eps`` of
    the logit's dtype, the softmax limit, and the map gives the softmax to rounding."""
    sep = Entmax(alpha=1.5, learnable=True, num_heads=num_heads, dtype=dtype)
    assert sep.alpha_logit is not None
    with torch.no_grad():
        sep.alpha_logit.fill_(-40.0)
    scores = torch.randn(2, 3, 4, 6, dtype=dtype)
    weights = sep(scores)
    assert bool((torch.as_tensor(sep.alpha) > 1).all())
    tolerance = 1e-5 if dtype != torch.bfloat16 else 5e-2
    torch.testing.assert_close(weights, torch.softmax(scores, -1), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(("name", "sep"), ALL_MAPS)
@pytest.mark.parametrize("magnitude", [1e4, -1e4])
def test_extreme_logits_stay_finite(name: str, sep: Separation, magnitude: float) -> None:
    z = torch.randn(4, 8) * magnitude
    assert bool(torch.isfinite(sep(z)).all()), name
    assert bool(torch.isfinite(sep(torch.full((2, 5), magnitude))).all()), name


@pytest.mark.parametrize(("name", "sep"), ALL_MAPS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32(
    name: str, sep: Separation, dtype: torch.dtype
) -> None:
    z = torch.randn(4, 16) * 4
    z[0, :3] = -INF
    out = sep(z.to(dtype))
    assert out.dtype == dtype
    assert bool(torch.isfinite(out).all()), name
    assert torch.allclose(out.float(), sep(z.to(dtype).float()), atol=1e-2), name


def test_bad_parameters_raise_value_errors_naming_the_argument() -> None:
    with pytest.raises(ValueError, match="n must be >= 0"):
        SoftmaxN(-1)
    with pytest.raises(ValueError, match="gamma must be <= 0"):
        ClippedSoftmax(gamma=0.1)
    with pytest.raises(ValueError, match="zeta must be >= 1"):
        ClippedSoftmax(zeta=0.9)
    with pytest.raises(TypeError, match="base"):
        ClippedSoftmax(base=Sparsemax())
    with pytest.raises(ValueError, match="alpha"):
        Entmax(alpha=2.5)
    with pytest.raises(ValueError, match="alpha"):
        entmax(torch.randn(3), 1.0)
    with pytest.raises(ValueError, match="degree"):
        Polynomial(0)
    with pytest.raises(TypeError, match="n must be a real number"):
        SoftmaxN("1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="floating point"):
        Softmax()(torch.ones(3, dtype=torch.long))


@pytest.mark.parametrize("zeta", [1.0, 1.1])
def test_clipped_softmax_zeroes_uniform_weights_below_minus_zeta_over_t_minus_one(
    zeta: float,
) -> None:
    """The docstring's rule: uniform weights over T keys are all clipped to 0 (no gradient)
    once gamma <= -zeta / (T - 1), as for BERT's gamma = -0.025 at T = 128; above it they live."""
    length = 128
    threshold = -zeta / (length - 1)
    for gamma, alive in ((-0.025, False), (1.01 * threshold, False), (0.99 * threshold, True)):
        gen = torch.Generator().manual_seed(0)  # logits within ±0.4 % of each other
        noise = torch.randn(2, length, generator=gen, dtype=torch.float64).clamp(-4, 4)
        scores = (0.001 * noise).requires_grad_()
        weights = ClippedSoftmax(gamma=gamma, zeta=zeta)(scores)
        (grad,) = torch.autograd.grad((weights * torch.randn_like(weights)).sum(), scores)
        assert bool((weights > 0).any()) is alive, gamma
        assert bool((grad != 0).any()) is alive, gamma

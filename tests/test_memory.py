"""Iterated associative-memory retrieval: updates, stopping, energy traces, Softmax_1 identity."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import torch

from hopfield.functional import Entmax, Polynomial, Softmax, SoftmaxN, Sparsemax
from hopfield.functional.energy import DenseEnergy, Energy, PolynomialEnergy, energy_for
from hopfield.memory import retrieve

DTYPE = torch.float64
SEPARATIONS = [Softmax(), SoftmaxN(1), Sparsemax(), Entmax(1.5), Polynomial(10)]


def sphere(generator: torch.Generator, count: int, dim: int, radius: float) -> torch.Tensor:
    g = torch.randn(count, dim, generator=generator, dtype=DTYPE)
    return radius * g / g.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("separation", SEPARATIONS, ids=repr)
def test_steps_are_the_explicit_update(separation: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(0)
    memories = torch.rand(40, 16, generator=g, dtype=DTYPE)
    x = torch.rand(6, 16, generator=g, dtype=DTYPE)
    result = retrieve(x, memories, separation, beta=0.8, steps=4)
    expected = x
    for _ in range(4):
        expected = separation(0.8 * expected @ memories.T) @ memories
    torch.testing.assert_close(result.patterns, expected, rtol=1e-10, atol=1e-12)
    assert result.steps.tolist() == [4] * 6
    assert result.residuals.shape == (4, 6)


def test_softmax1_retrieval_is_gamma_times_softmax_retrieval() -> None:
    # OutEffHop §1.6: T_OutEff(x) = γ(x)·T_original(x), γ = S/(1+S), S = Σ exp(βξᵀx).
    g = torch.Generator().manual_seed(1)
    for beta, radius in itertools.product([0.1, 1.0, 4.0], [0.5, 1.0, 3.0]):
        memories = sphere(g, 50, 12, radius)
        x = sphere(g, 8, 12, radius)
        dense = retrieve(x, memories, Softmax(), beta=beta).patterns
        outeff = retrieve(x, memories, SoftmaxN(1), beta=beta).patterns
        s = torch.exp(beta * x @ memories.T).sum(-1, keepdim=True)
        torch.testing.assert_close(outeff, s / (1 + s) * dense, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("separation", SEPARATIONS[:4], ids=repr)
def test_energy_trace_is_non_increasing_and_matches_the_energy(separation: torch.nn.Module) -> None:
    energy = energy_for(separation)
    assert energy is not None
    for seed, beta, radius in itertools.product(range(4), [0.1, 1.0, 8.0], [0.5, 1.0, 2.8]):
        g = torch.Generator().manual_seed(seed)
        memories = sphere(g, 30 + 20 * seed, 16, radius)
        x = memories[:5] + 0.5 * radius * torch.randn(5, 16, generator=g, dtype=DTYPE) / 4
        result = retrieve(x, memories, separation, beta=beta, steps=12, track_energy=True)
        assert result.energy is not None
        assert result.energy.shape == (result.steps_used + 1, 5) and result.steps_used <= 12
        trace = result.energy
        assert (trace[1:] - trace[:-1]).max().item() <= 1e-10 * (1 + trace.abs().max().item())
        torch.testing.assert_close(trace[-1], energy.energy(result.patterns, memories, beta))


def test_queries_stop_on_their_own_at_tol() -> None:
    g = torch.Generator().manual_seed(2)
    memories = sphere(g, 20, 8, 3.0)
    fixed = retrieve(memories[:2], memories, beta=4.0, steps=500, tol=1e-14).patterns
    start = torch.cat([fixed, memories[2:4] + 0.5 * torch.randn(2, 8, generator=g, dtype=DTYPE)])
    result = retrieve(start, memories, beta=4.0, steps=200, tol=1e-9)
    assert bool(result.converged.all())
    assert result.steps[:2].tolist() == [1, 1]
    assert bool((result.steps[2:] > 1).all())
    assert result.steps_used == int(result.steps.max()) == result.residuals.shape[0]
    # A stopped query no longer moves and its residuals stay 0.
    torch.testing.assert_close(result.patterns[:2], fixed, rtol=0, atol=1e-9)
    assert bool((result.residuals[1:, :2] == 0).all())
    gradient = DenseEnergy().gradient(result.patterns, memories, 4.0)
    assert gradient.norm(dim=-1).max().item() < 1e-8


def test_zero_steps_and_single_query() -> None:
    g = torch.Generator().manual_seed(3)
    memories = torch.randn(10, 4, generator=g, dtype=DTYPE)
    q = torch.randn(4, generator=g, dtype=DTYPE)
    result = retrieve(q, memories, steps=0, track_energy=True)
    torch.testing.assert_close(result.patterns, q)
    assert result.steps.shape == () and int(result.steps) == 0 and result.steps_used == 0
    assert result.energy is not None and result.energy.shape == (1,)
    assert result.residuals.shape == (0,)
    one = retrieve(q, memories, steps=1)
    assert one.patterns.shape == (4,)
    torch.testing.assert_close(one.patterns, torch.softmax(memories @ q, -1) @ memories)


def test_batched_memory_sets_equal_separate_calls() -> None:
    g = torch.Generator().manual_seed(4)
    memories = torch.randn(3, 25, 6, generator=g, dtype=DTYPE)
    queries = torch.randn(3, 4, 6, generator=g, dtype=DTYPE)
    both = retrieve(queries, memories, SoftmaxN(1), beta=2.0, steps=5, tol=1e-6, track_energy=True)
    shared = retrieve(queries[0], memories, SoftmaxN(1), beta=2.0, steps=5, tol=1e-6)
    assert shared.patterns.shape == (3, 4, 6)
    for b in range(3):
        alone = retrieve(
            queries[b], memories[b], SoftmaxN(1), beta=2.0, steps=5, tol=1e-6, track_energy=True
        )
        torch.testing.assert_close(both.patterns[b], alone.patterns)
        assert both.steps[b].tolist() == alone.steps.tolist()
        assert both.energy is not None and alone.energy is not None
        torch.testing.assert_close(both.energy[:, b], alone.energy)
        one = retrieve(queries[0], memories[b], SoftmaxN(1), beta=2.0, steps=5, tol=1e-6)
        torch.testing.assert_close(shared.patterns[b], one.patterns)


def test_polynomial_has_no_default_energy_but_accepts_one() -> None:
    g = torch.Generator().manual_seed(5)
    memories = torch.rand(30, 10, generator=g, dtype=DTYPE)
    x = torch.rand(4, 10, generator=g, dtype=DTYPE)
    assert retrieve(x, memories, Polynomial(10), steps=3, track_energy=True).energy is None
    traced = retrieve(x, memories, Polynomial(10), steps=3, energy=PolynomialEnergy(10))
    assert traced.energy is not None and traced.energy.shape == (4, 4)
    assert retrieve(x, memories, steps=3, track_energy=False).energy is None


def test_energy_is_opt_in_and_does_not_change_the_patterns(monkeypatch) -> None:
    # Issue 16: the default must cost only the updates, never an extra score product per step.
    g = torch.Generator().manual_seed(6)
    memories = torch.rand(30, 10, generator=g, dtype=DTYPE)
    x = torch.rand(4, 10, generator=g, dtype=DTYPE)
    traced = retrieve(x, memories, SoftmaxN(1), steps=3, track_energy=True)
    assert traced.energy is not None and traced.energy.shape == (4, 4)

    def no_energy(*args: object, **kwargs: object) -> None:
        raise AssertionError("the default retrieval computed an energy")

    monkeypatch.setattr(Energy, "energy", no_energy)
    plain = retrieve(x, memories, SoftmaxN(1), steps=3)
    assert plain.energy is None
    assert torch.equal(plain.patterns, traced.patterns)
    assert torch.equal(plain.residuals, traced.residuals)
    with pytest.raises(ValueError, match="track_energy=False"):
        retrieve(x, memories, Polynomial(10), energy=PolynomialEnergy(10), track_energy=False)
    with pytest.raises(TypeError, match="track_energy"):
        retrieve(x, memories, track_energy="yes")  # type: ignore[arg-type]


def test_float32_queries() -> None:
    memories = torch.rand(50, 20)
    result = retrieve(
        memories[:3] * 0.9, memories, SoftmaxN(1), beta=1.0, steps=3, track_energy=True
    )
    assert result.patterns.dtype == torch.float32 and result.energy is not None


def test_bad_arguments_raise() -> None:
    m, q = torch.randn(5, 3), torch.randn(2, 3)
    with pytest.raises(ValueError, match="beta"):
        retrieve(q, m, beta=-1.0)
    with pytest.raises(TypeError, match="beta"):
        retrieve(q, m, beta=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps"):
        retrieve(q, m, steps=-1)
    with pytest.raises(ValueError, match="tol"):
        retrieve(q, m, tol=-1e-3)
    with pytest.raises(TypeError, match="separation"):
        retrieve(q, m, "softmax")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="structure"):
        retrieve(q, m, structure="dense")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="energy"):
        retrieve(q, m, energy="dense")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pattern size"):
        retrieve(torch.randn(2, 4), m)
    with pytest.raises(ValueError, match="memories"):
        retrieve(q, torch.randn(3))
    with pytest.raises(ValueError, match="at least one"):
        retrieve(q, torch.randn(0, 3))
    with pytest.raises(ValueError, match="query"):
        retrieve(torch.randn(1, 1, 2, 3), m)
    with pytest.raises(TypeError, match="dtype"):
        retrieve(q.double(), m)
    with pytest.raises(TypeError, match="floating"):
        retrieve(q.long(), m.long())
    with pytest.raises(ValueError, match="broadcast"):
        retrieve(torch.randn(2, 4, 3), torch.randn(3, 5, 3))


def test_the_examples_in_the_documentation_run() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "memory.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, "docs/memory.md", "exec"), {})


@pytest.mark.parametrize("tol", [0.0, 0.5])
def test_first_step_without_selection_matches_the_formula(tol: float) -> None:
    """The first step takes every query without selecting (issue 31, item 6): patterns,
    residuals, steps and convergence are those of one explicit update."""
    gen = torch.Generator().manual_seed(4)
    memories = torch.randn(30, 6, dtype=torch.float64, generator=gen)
    query = torch.randn(5, 6, dtype=torch.float64, generator=gen)
    query[0] = memories[3] * 8  # converges within tol at once
    expected = torch.softmax(0.5 * query @ memories.T, -1) @ memories
    moved = (expected - query).norm(dim=-1)
    for steps in (1, 2):
        result = retrieve(query, memories, beta=0.5, steps=steps, tol=tol)
        torch.testing.assert_close(result.residuals[0], moved, rtol=1e-12, atol=1e-12)
        if steps == 1:
            torch.testing.assert_close(result.patterns, expected, rtol=1e-12, atol=1e-12)
            assert torch.equal(result.steps, torch.ones(5, dtype=torch.int64))
            assert torch.equal(result.converged, moved <= tol)
        else:  # queries that converged in the first step stay where it left them
            stopped = moved <= tol
            torch.testing.assert_close(result.patterns[stopped], expected[stopped])
            assert torch.equal(result.steps, torch.where(stopped, 1, 2))

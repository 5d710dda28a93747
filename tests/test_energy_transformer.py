"""Energy Transformer baseline: closed-form update vs autograd, energy descent, parameter counts."""

from __future__ import annotations

import pytest
import torch

from hopfield.models.energy_transformer import (
    EnergyLayerNorm,
    EnergyTransformerEncoder,
    EnergyTransformerLayer,
    energy_image_classifier,
    energy_sudoku_model,
)
from hopfield.models.hyperset import SudokuModel
from hopfield.nn.hyperset import count_parameters


def _layer(**options: float) -> EnergyTransformerLayer:
    torch.manual_seed(0)
    layer = EnergyTransformerLayer(12, 3, 2.0, dtype=torch.float64, **options)
    with torch.no_grad():  # weights large enough that every term of the energy matters
        layer.query.normal_(std=0.5)
        layer.key.normal_(std=0.5)
        layer.memory.weight.normal_(std=0.5)
        layer.norm.gain.fill_(1.3)
        layer.norm.bias.normal_(std=0.2)
    return layer


def test_update_is_minus_the_energy_gradient_float64() -> None:
    layer = _layer(step_size=0.7)
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    g = layer.norm(x).detach().requires_grad_(True)
    (autograd,) = torch.autograd.grad(layer.energy(g).sum(), g)
    torch.testing.assert_close(layer.energy_gradient(g.detach()), autograd, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(layer(x), x - 0.7 * autograd, rtol=1e-10, atol=1e-12)
    assert autograd.abs().max() > 1e-2  # a gradient of the size of the tokens, not ~0


def test_energy_of_each_term_against_explicit_sums() -> None:
    """Attention energy −(1/β)Σ_h Σ_i log Σ_j exp(β q_i·k_j) and Hopfield −½ Σ ReLU(ξ·g)² by loops."""
    layer = _layer()
    g = torch.randn(1, 5, 12, dtype=torch.float64)
    expected = torch.zeros((), dtype=torch.float64)
    for h in range(3):
        q, k = g[0] @ layer.query[h].T, g[0] @ layer.key[h].T
        for i in range(5):
            expected -= torch.log(sum(torch.exp(layer.beta * q[i] @ k[j]) for j in range(5)))
    expected = expected / layer.beta
    expected -= 0.5 * torch.relu(g[0] @ layer.memory.weight.T).pow(2).sum()
    torch.testing.assert_close(layer.energy(g), expected.reshape(1))
    assert layer.beta == pytest.approx(0.5)  # 1/√p with p = 12/3


def test_small_steps_descend_the_energy() -> None:
    """The update is −∇_g E while the state moves in x; with a scalar LayerNorm gain the Jacobian
    ∂g/∂x is symmetric positive semi-definite, so small steps lower E(g(x))."""
    layer = _layer(step_size=1e-3)
    x = torch.randn(3, 6, 12, dtype=torch.float64)
    energies = [layer.state_energy(x)]
    for _ in range(20):
        x = layer(x)
        energies.append(layer.state_energy(x))
    steps = torch.stack(energies).diff(dim=0)
    assert (steps < 0).all()


def test_energy_layer_norm() -> None:
    norm = EnergyLayerNorm(8, dtype=torch.float64)
    x = torch.randn(4, 8, dtype=torch.float64) * 3 + 1
    g = norm(x)
    torch.testing.assert_close(g.mean(-1), torch.zeros(4, dtype=torch.float64))
    torch.testing.assert_close(
        g.pow(2).mean(-1), torch.ones(4, dtype=torch.float64), atol=1e-5, rtol=0
    )
    assert count_parameters(norm) == 9  # scalar gain + (d,) bias


def test_small_cifar10_parameter_count() -> None:
    """Spec §4.5: Energy Transformer Small CIFAR-10 (d 384, 6 heads, 4d memories) = 908,939."""
    with torch.device("meta"):
        model = energy_image_classifier()
        wide10 = energy_image_classifier(d_model=1152, num_heads=12)
        wide100 = energy_image_classifier(d_model=1152, num_heads=12, num_classes=100)
    assert count_parameters(model) == 908_939
    # Table 20 rows: 8.0 M / 8.1 M at d 1152
    assert round(count_parameters(wide10) / 1e5) == 80
    assert round(count_parameters(wide100) / 1e5) == 81


def test_encoder_runs_images_and_sudoku() -> None:
    torch.manual_seed(0)
    model = energy_image_classifier(image_size=8, in_channels=1, grid=4, d_model=8, num_heads=2,
                                    iterations=3)  # fmt: skip
    logits, states = model(torch.randn(2, 1, 8, 8), return_states=True)
    assert logits.shape == (2, 10) and len(states) == 3 and torch.isfinite(logits).all()
    logits.sum().backward()
    assert model.encoder.layers[0].query.grad is not None
    sudoku = energy_sudoku_model(d_model=8, num_heads=2, iterations=2)
    assert isinstance(sudoku, SudokuModel)
    assert sudoku(torch.zeros(3, 81, dtype=torch.long), 4).shape == (3, 81, 9)


def test_initialisation() -> None:
    torch.manual_seed(0)
    encoder = EnergyTransformerEncoder(64, 4, iterations=2, init_std=0.02)
    layer = encoder.energy_layers()[0]
    assert layer.query.std().item() == pytest.approx(0.002, rel=0.1)
    assert layer.memory.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert layer.norm.gain.item() == 1.0 and not layer.norm.bias.any()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_heads": 5}, ValueError, "num_heads=5 must divide d_model=12"),
        ({"num_heads": 2.0}, TypeError, "num_heads"),
        ({"memory_ratio": 0.0}, ValueError, "memory_ratio"),
        ({"step_size": -1.0}, ValueError, "step_size"),
    ],
)
def test_bad_arguments(kwargs: dict, error: type, match: str) -> None:
    options = {"d_model": 12, "num_heads": 3, **kwargs}
    with pytest.raises(error, match=match):
        EnergyTransformerLayer(**options)


def test_bad_input_and_iterations() -> None:
    layer = EnergyTransformerLayer(12, 3)
    with pytest.raises(ValueError, match="x must have shape"):
        layer(torch.zeros(2, 5, 10))
    with pytest.raises(ValueError, match="num_layers=2 must divide iterations=3"):
        EnergyTransformerEncoder(12, 3, iterations=3, num_layers=2)

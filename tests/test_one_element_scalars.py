"""Learnable scalars are one-element vectors (FSDP2 refuses 0-d parameters), read as scalars, and
state dicts that hold them 0-d (written before 29 Nov 2026) still load."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from hopfield.functional import Entmax, Sink
from hopfield.models.energy_transformer import EnergyLayerNorm, energy_sudoku_model
from hopfield.models.stanhop import ASSOCIATION_KINDS, Association, STanHopNet
from hopfield.nn import Hopfield

F64 = torch.float64
WIDTH, HEADS = 8, 2


def _entmax_layer() -> nn.Module:
    return Hopfield(WIDTH, HEADS, separation=Entmax(1.3, learnable=True), dtype=F64)


def _sink_layer() -> nn.Module:
    return Hopfield(WIDTH, HEADS, separation=Sink(0.4, learnable=True, value=4), dtype=F64)


def _energy_norm() -> nn.Module:
    return EnergyLayerNorm(WIDTH, dtype=F64)


SCALARS: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "entmax": (_entmax_layer, "separation.alpha_logit"),
    "sink": (_sink_layer, "separation.logit"),
    "energy-norm": (_energy_norm, "gain"),
}


def _changed(make: Callable[[], nn.Module], name: str) -> nn.Module:
    """A module whose scalar is not its initial value (so that loading it is seen)."""
    torch.manual_seed(0)
    module = make()
    with torch.no_grad():
        module.get_parameter(name).add_(0.7)
    return module


@pytest.mark.parametrize("kind", list(SCALARS))
def test_a_state_dict_with_the_scalar_zero_dimensional_loads(kind: str) -> None:
    make, name = SCALARS[kind]
    source = _changed(make, name)
    assert source.get_parameter(name).shape == (1,)
    old = {k: v.reshape(()) if k == name else v for k, v in source.state_dict().items()}
    torch.manual_seed(1)
    target = make()
    target.load_state_dict(old)  # strict
    assert target.get_parameter(name).shape == (1,)
    x = torch.randn(2, 5, WIDTH, dtype=F64)
    torch.testing.assert_close(target(x), source(x), rtol=0, atol=0)
    assert not torch.allclose(make()(x), source(x))  # the loaded scalar was used


def test_the_scalars_are_read_as_scalars() -> None:
    entmax = Entmax(1.3, learnable=True)
    alpha = entmax.alpha
    assert isinstance(alpha, torch.Tensor) and alpha.shape == ()
    assert float(alpha.detach()) == pytest.approx(1.3)
    sink = Sink(0.4, learnable=True)
    assert sink.sink_logit(torch.zeros(2, 3, 4, 5)).shape == ()
    assert Sink(torch.tensor(0.4)).sink_logit(torch.zeros(2, 3, 4, 5)).shape == ()


def _models() -> dict[str, nn.Module]:
    found: dict[str, nn.Module] = {
        f"stanhop-{kind}": STanHopNet(
            3, 8, 4, 2, d_model=8, d_ff=8, num_heads=2, e_layers=1, association=Association(kind)
        )
        for kind in ASSOCIATION_KINDS
    }
    found["energy-transformer"] = energy_sudoku_model(d_model=8, num_heads=2, iterations=2)
    found.update({kind: make() for kind, (make, _) in SCALARS.items()})
    return found


def test_no_model_of_the_package_has_a_zero_dimensional_parameter() -> None:
    scalars = [
        f"{model}: {name}"
        for model, module in _models().items()
        for name, parameter in module.named_parameters()
        if parameter.dim() == 0
    ]
    assert not scalars, scalars

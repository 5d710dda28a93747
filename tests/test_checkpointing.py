"""Activation checkpointing (``torch.utils.checkpoint``) recomputes a forward in the backward pass;
the structures that draw at random must give the recomputed call the first call's draws, or
refuse when they cannot."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from hopfield.functional import RandomFeatures, RandomMask, Structure
from hopfield.nn import Hopfield

D = torch.float64

REPLAYED: dict[str, Callable[[], Structure]] = {
    "random-mask-global-generator": lambda: RandomMask(3),
    "random-mask-seeded-eval-fixed": lambda: RandomMask(3, seed=0).eval(),
    "random-features-redrawn-every-call": lambda: RandomFeatures(8, redraw=1, seed=0),
}


def _gradient(layer: Hopfield, x: torch.Tensor, reentrant: bool | None) -> torch.Tensor:
    torch.manual_seed(1)  # the global draws of both runs
    leaf = x.clone().requires_grad_()
    out = layer(leaf) if reentrant is None else checkpoint(layer, leaf, use_reentrant=reentrant)
    out.square().sum().backward()
    assert leaf.grad is not None
    return leaf.grad


def _layer(make: Callable[[], Structure]) -> Hopfield:
    torch.manual_seed(0)
    return Hopfield(8, 2, structure=make(), dtype=D)  # the structure keeps its mode


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("name", list(REPLAYED))
def test_a_recomputed_forward_draws_what_the_first_drew(name: str, reentrant: bool) -> None:
    """Torch's global generator (restored by checkpointing), a generator re-seeded every call
    and a random-feature projection that the recomputation neither redraws nor counts: the
    checkpointed gradients are the plain ones."""
    x = torch.randn(2, 16, 8, dtype=D)
    plain = _gradient(_layer(REPLAYED[name]), x, None)
    checkpointed = _gradient(_layer(REPLAYED[name]), x, reentrant)
    torch.testing.assert_close(checkpointed, plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_seeded_random_mask_refuses_to_be_recomputed(reentrant: bool) -> None:
    """Its own generator would draw other subsets in the recomputation (the gradients of other
    subsets than the output's, silently); the error says what to do instead."""
    layer = _layer(lambda: RandomMask(3, seed=0))
    with pytest.raises(RuntimeError, match="seed=None"):
        _gradient(layer, torch.randn(2, 16, 8, dtype=D), reentrant)

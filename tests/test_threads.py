"""One module called from several threads at once (a model served by a thread pool) gives what
the same calls give one after another: no call draws from another's generator or seed, and a
projection drawn on first use is drawn once."""

from __future__ import annotations

import copy
import pickle
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import Tensor

from hopfield.functional import RandomFeatures, RandomMask, Structure, TopK
from hopfield.nn import Hopfield

THREADS = 8

STRUCTURES: dict[str, Callable[[], Structure]] = {
    "random-mask-eval-fixed": lambda: RandomMask(5, seed=3),
    "random-mask-eval-fixed-with-gradients": lambda: RandomMask(5, seed=3),
    "random-features-seeded": lambda: RandomFeatures(16, seed=3),
    "top-k": lambda: TopK(5),
}


def _concurrently(
    call: Callable[[Tensor], Tensor], inputs: list[Tensor], graded: bool = False
) -> list[Tensor]:
    """``call`` on every input, all threads released together (a barrier) to meet in the call,
    each in inference mode or (``graded``) with gradients: torch's grad modes are per thread."""
    start = threading.Barrier(len(inputs))

    def released(x: Tensor) -> Tensor:
        start.wait()
        with torch.inference_mode(not graded):
            return call(x)

    with ThreadPoolExecutor(len(inputs)) as pool:
        return list(pool.map(released, inputs))


def _layer(name: str) -> Hopfield:
    torch.manual_seed(0)
    return Hopfield(16, 2, structure=STRUCTURES[name](), batch_first=True).eval()


def _inputs() -> list[Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(2, 40 + 7 * i, 16, generator=generator) for i in range(THREADS)]


@pytest.mark.parametrize("name", list(STRUCTURES))
def test_concurrent_calls_give_the_sequential_answers(name: str) -> None:
    layer, inputs = _layer(name), _inputs()
    graded = name.endswith("with-gradients")
    for _ in range(3):  # a few rounds: each meets the others at a different point
        together = _concurrently(layer, inputs, graded)
        with torch.inference_mode(not graded):
            alone = [layer(x) for x in inputs]
            for i, (got, want) in enumerate(zip(together, alone, strict=True)):
                torch.testing.assert_close(got, want, msg=lambda m, i=i: f"input {i}: {m}")


def test_a_projection_drawn_by_concurrent_first_calls_is_the_seeds_first_draw() -> None:
    inputs = _inputs()
    alone = _layer("random-features-seeded")
    with torch.inference_mode():
        want = [alone(x) for x in inputs]
    assert isinstance(alone.structure, RandomFeatures)
    for _ in range(3):
        layer = _layer("random-features-seeded")  # no projection yet: every call draws
        together = _concurrently(layer, inputs)
        structure = layer.structure
        assert isinstance(structure, RandomFeatures) and structure.projection is not None
        assert torch.equal(structure.projection, alone.structure.projection)
        for got, expected in zip(together, want, strict=True):
            torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("clone", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))])
def test_a_random_mask_copies_and_pickles_with_its_per_thread_call_state(
    clone: Callable[[RandomMask], RandomMask],
) -> None:
    mask = RandomMask(5, seed=3).eval()
    q = torch.randn(1, 2, 30, 8, dtype=torch.float64)
    kwargs: dict[str, object] = {
        "separation": Hopfield(8).separation,
        "scale": 0.5,
        "mask": None,
        "causal": False,
        "dropout": 0.0,
        "return_weights": False,
    }
    copied = clone(mask)
    torch.testing.assert_close(copied(q, q, q, **kwargs)[0], mask(q, q, q, **kwargs)[0])

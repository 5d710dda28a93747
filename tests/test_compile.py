"""``torch.compile(fullgraph=True)`` beyond the softmax layers: while a graph is captured the
native kernels (ctypes calls on data pointers) step aside for their PyTorch paths, so Top-K and
the Hyper-SET encoder (native RMS norm) compile in one graph and give eager's values and
gradients (eager runs the native kernels: the two paths agree to rounding)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from hopfield.functional import RandomMask, Structure, TopK, associate
from hopfield.nn.hyperset import HyperSETEncoder


def _compiled(fn, fullgraph: bool = True):  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    return torch.compile(fn, backend="aot_eager", fullgraph=fullgraph)


def _attention(structure: Structure, causal: bool) -> Callable[..., torch.Tensor]:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = associate(q, k, v, structure=structure, causal=causal)
        assert isinstance(out, torch.Tensor)
        return out

    return attend


def _assert_same(
    compiled: torch.Tensor,
    eager: torch.Tensor,
    inputs: Sequence[torch.Tensor],
    loss: Callable[[torch.Tensor], torch.Tensor],
    atol: float,
    unused: bool = False,
) -> None:
    """Equal values (``atol``) and equal gradients of ``loss`` for ``inputs`` (with ``unused``,
    inputs without a gradient are allowed, the same ones on both sides)."""
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=atol)
    got = torch.autograd.grad(loss(compiled), inputs, allow_unused=unused)
    expected = torch.autograd.grad(loss(eager), inputs, allow_unused=unused)
    for a, b in zip(got, expected, strict=True):
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_topk_compiles_in_one_graph(causal: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 24, 8, generator=gen).requires_grad_() for _ in range(3))
    attend = _attention(TopK(5), causal)
    compiled, eager = _compiled(attend)(q, k, v), attend(q, k, v)
    _assert_same(compiled, eager, (q, k, v), lambda out: out.square().sum(), atol=1e-6)


def test_the_hyperset_encoder_compiles_in_one_graph() -> None:
    torch.manual_seed(0)
    encoder = HyperSETEncoder(32, 2, iterations=2)
    x = torch.randn(2, 10, 32)
    compiled, eager = _compiled(encoder)(x), encoder(x)
    params = list(encoder.parameters())
    _assert_same(compiled, eager, params, torch.sum, atol=1e-5, unused=True)


@pytest.mark.parametrize("causal", [False, True])
def test_a_random_mask_on_the_global_generator_compiles(
    causal: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its draws in the graphs are those of its PyTorch path in eager mode (``HOPFIELD_NATIVE=0``:
    the native kernels draw from their own streams) from the same global seed; before, the
    uniform draws failed to compile ("SymIntArrayRef expected to contain only concrete
    integers": ``generator=None`` passed explicitly). Not in one graph: the subset sampler
    branches on drawn values (graph breaks)."""
    monkeypatch.setenv("HOPFIELD_NATIVE", "0")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 8, generator=gen).requires_grad_() for _ in range(3))
    attend = _attention(RandomMask(5), causal)
    compiled_attend = _compiled(attend, fullgraph=False)
    torch.manual_seed(3)
    compiled = compiled_attend(q, k, v)
    torch.manual_seed(3)
    eager = attend(q, k, v)
    _assert_same(compiled, eager, (q, k, v), lambda out: out.square().sum(), atol=1e-6)

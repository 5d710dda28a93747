"""The dense structure under :mod:`torch.func` (``grad``, ``vmap``): the softmax family's
default path (the CPU flash kernel with its sink, ``_FlashSink``) and the sparse separations
(``_Entmax``) give the gradients of ordinary autograd, per sample under ``vmap`` as one by one,
and ensembles of layers under ``vmap`` each member's output."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch.func import functional_call, grad, vmap

from hopfield.functional import (
    Entmax,
    RandomFeatures,
    Separation,
    Sink,
    Softmax,
    SoftmaxN,
    Sparsemax,
    TopK,
    associate,
    entmax,
)
from hopfield.nn import Hopfield

D = torch.float64

SEPARATIONS: dict[str, Callable[[], Separation]] = {
    "softmax": Softmax,
    "softmax_1": lambda: SoftmaxN(1.0),
    "learnable-sink-with-value": lambda: Sink(0.5, learnable=True, heads=2, value=4, dtype=D),
}

#: The sparse separations (one autograd function, ``_Entmax``, written for torch.func).
SPARSE: dict[str, Callable[[], Separation]] = {
    "sparsemax": Sparsemax,
    "entmax-1.5": lambda: Entmax(1.5),
    "entmax-1.3": lambda: Entmax(1.3),
    "learnable-entmax-per-head": lambda: Entmax(1.4, learnable=True, num_heads=2, dtype=D),
}
EVERY = {**SEPARATIONS, **SPARSE}

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")


def _layer(name: str) -> Hopfield:
    torch.manual_seed(0)
    return Hopfield(8, 2, separation=EVERY[name](), dtype=D)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(EVERY))
def test_func_grad_of_a_layer_equals_autograd(name: str, causal: bool) -> None:
    layer = _layer(name)
    x = torch.randn(3, 5, 8, dtype=D)
    params = {n: p.detach() for n, p in layer.named_parameters()}

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        out = functional_call(layer, p, (x,), {"causal": causal})
        return (out * out).sum()

    grads = grad(loss)(params)
    out = layer(x, causal=causal)
    assert isinstance(out, torch.Tensor)
    reference = torch.autograd.grad((out * out).sum(), list(layer.parameters()))
    assert len(reference) == len(params)
    for (n, _), expected in zip(layer.named_parameters(), reference, strict=True):
        torch.testing.assert_close(grads[n], expected, rtol=1e-10, atol=1e-12, msg=n)
    assert any(bool(g.abs().sum() > 0) for g in grads.values())


@pytest.mark.parametrize("name", list(EVERY))
def test_per_sample_gradients_under_vmap_equal_one_by_one(name: str) -> None:
    layer = _layer(name)
    x = torch.randn(4, 5, 8, dtype=D)
    params = {n: p.detach() for n, p in layer.named_parameters()}

    def loss(p: dict[str, torch.Tensor], sample: torch.Tensor) -> torch.Tensor:
        return functional_call(layer, p, (sample.unsqueeze(0),)).square().sum()

    per_sample = vmap(grad(loss), in_dims=(None, 0))(params, x)
    for i in range(x.shape[0]):
        out = layer(x[i : i + 1])
        assert isinstance(out, torch.Tensor)
        one = torch.autograd.grad(out.square().sum(), list(layer.parameters()))
        for (n, _), expected in zip(layer.named_parameters(), one, strict=True):
            torch.testing.assert_close(per_sample[n][i], expected, rtol=1e-10, atol=1e-12)


def test_func_grad_of_associate_with_a_padding_mask() -> None:
    """The flash path with an additive mask and a row that sees no key (Softmax_1: zeros)."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 4, 3, dtype=D, generator=gen) for _ in range(3))
    mask = torch.ones(2, 1, 1, 4, dtype=torch.bool)
    mask[1] = False

    def total(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = associate(q, k, v, separation=SoftmaxN(1.0), mask=mask)
        assert isinstance(out, torch.Tensor)
        return out.square().sum()

    grads = grad(total, argnums=(0, 1, 2))(q, k, v)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = torch.autograd.grad(total(*leaves), leaves)
    for got, expected in zip(grads, reference, strict=True):
        assert bool(torch.isfinite(got).all())
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


class _Attend(torch.nn.Module):
    """``associate`` with a separation whose parameters ``torch.func.functional_call`` can swap."""

    def __init__(self, separation: Separation, mask: torch.Tensor | None, causal: bool) -> None:
        super().__init__()
        self.separation, self.mask, self.causal = separation, mask, causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = associate(q, k, v, separation=self.separation, mask=self.mask, causal=self.causal)
        assert isinstance(out, torch.Tensor)
        return out


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(SEPARATIONS))
def test_the_flash_path_is_twice_differentiable(name: str, causal: bool, masked: bool) -> None:
    """``create_graph=True`` (double backward, gradient penalties, Hessian-vector products):
    the flash kernel's backward has no derivative, so that backward is taken through the
    attention written out; ``gradgradcheck`` in float64 for q, k, v and, with a learnable sink,
    its logit and value, with a padding mask that leaves one row without a key."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 4, 4, dtype=D, generator=gen) for _ in range(3))
    mask = None
    if masked:
        mask = torch.ones(2, 1, 1, 4, dtype=torch.bool)
        mask[0, ..., 1] = False
        mask[1] = False
    module = _Attend(SEPARATIONS[name](), mask, causal)
    names = [n for n, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_() for _, p in module.named_parameters()]

    def attend(*tensors: torch.Tensor) -> torch.Tensor:
        swapped = dict(zip(names, tensors[3:], strict=True))
        out = functional_call(module, swapped, tensors[:3])
        assert isinstance(out, torch.Tensor)
        return out

    inputs = (*(t.requires_grad_() for t in (q, k, v)), *params)
    assert torch.autograd.gradgradcheck(attend, inputs)


@pytest.mark.parametrize("name", list(SEPARATIONS))
def test_keys_that_are_the_values_are_twice_differentiable(name: str) -> None:
    """One tensor as keys and values (``associate(q, k, k)``, the layer's retrieval steps):
    the differentiable backward counts each role once. Before 29 Nov it differentiated the
    recomputed attention with respect to the tensor in each position, so ``create_graph=True``
    (and every ``torch.func.grad``) gave the key position the keys' and the values' gradient
    and the value position both again: off by the whole value gradient."""
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, 2, 4, 4, dtype=D, generator=gen).requires_grad_() for _ in range(2))
    module = _Attend(SEPARATIONS[name](), None, False)

    def attend(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return module(q, k, k)

    cotangent = torch.randn(2, 2, 4, 4, dtype=D, generator=gen)
    first = torch.autograd.grad(attend(q, k), (q, k), cotangent)
    graphed = torch.autograd.grad(attend(q, k), (q, k), cotangent, create_graph=True)
    for once, twice in zip(first, graphed, strict=True):
        torch.testing.assert_close(twice, once, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradgradcheck(attend, (q, k))


def test_func_grad_of_an_iterated_layer_equals_autograd() -> None:
    """A layer with three retrieval steps (its later steps associate the queries with the keys
    as values): ``torch.func.grad`` gives autograd's gradients (before 29 Nov the key
    projection's were off by several times their size)."""
    torch.manual_seed(0)
    layer = Hopfield(8, 2, update_steps=3, dtype=D)
    x = torch.randn(3, 5, 8, dtype=D)
    params = {n: p.detach() for n, p in layer.named_parameters()}
    grads = grad(lambda p: functional_call(layer, p, (x,)).square().sum())(params)
    out = layer(x)
    assert isinstance(out, torch.Tensor)
    reference = torch.autograd.grad(out.square().sum(), list(layer.parameters()))
    for (n, _), expected in zip(layer.named_parameters(), reference, strict=True):
        torch.testing.assert_close(grads[n], expected, rtol=1e-10, atol=1e-12, msg=n)


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("name", list(EVERY))
def test_an_ensemble_under_vmap_equals_each_model(name: str, steps: int) -> None:
    """Model ensembling (``torch.func.stack_module_state`` and ``vmap`` over the stacked
    parameters): each member's output. Before 29 Nov the layer read the data pointers of its
    weights and scale to key its caches, which ``vmap``'s batched tensors do not have."""
    from torch.func import stack_module_state

    torch.manual_seed(0)
    members = [
        Hopfield(8, 2, separation=EVERY[name](), update_steps=steps, dtype=D).eval()
        for _ in range(3)
    ]
    params, buffers = stack_module_state(members)
    base = copy.deepcopy(members[0]).to("meta")
    x = torch.randn(2, 5, 8, dtype=D)

    def member(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> torch.Tensor:
        return functional_call(base, (p, b), (x,))

    with torch.no_grad():
        together = vmap(member)(params, buffers)
        each = torch.stack([m(x) for m in members])
    torch.testing.assert_close(together, each, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("alpha", [2.0, 1.5, 1.3, "learnable"])
def test_entmax_is_twice_differentiable_and_vmaps(alpha: float | str) -> None:
    """The entmax function's backward is differentiable (``gradgradcheck`` over the scores and
    a per-row alpha), and ``vmap`` over scores and alpha equals the rows taken one by one:
    before 29 Nov its autograd function refused every torch.func transform."""
    gen = torch.Generator().manual_seed(4)
    scores = torch.randn(3, 2, 6, dtype=D, generator=gen).requires_grad_()
    if alpha == "learnable":
        a = (1.2 + 0.6 * torch.rand(3, 2, 1, dtype=D, generator=gen)).requires_grad_()
        assert torch.autograd.gradgradcheck(entmax, (scores, a))
        together = vmap(entmax)(scores, a)
        each = torch.stack([entmax(scores[i], a[i]) for i in range(3)])
    else:
        assert torch.autograd.gradgradcheck(lambda z: entmax(z, alpha), (scores,))
        together = vmap(lambda z: entmax(z, alpha))(scores)
        each = torch.stack([entmax(scores[i], alpha) for i in range(3)])
    torch.testing.assert_close(together, each, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "make",
    [lambda: TopK(3), lambda: RandomFeatures(8, seed=0, dtype=D)],
    ids=["top-k", "random-features"],
)
def test_structures_under_vmap_give_ensembles_and_per_sample_gradients(make) -> None:  # type: ignore[no-untyped-def]
    """Top-K (its PyTorch path: no score product into a buffer, ``out=`` has no batching rule)
    and random features (no check that reads the scale's values) under ``vmap``: an ensemble
    equals each member, per-sample gradients the samples one by one."""
    from torch.func import stack_module_state

    torch.manual_seed(0)
    members = [Hopfield(8, 2, structure=make(), dtype=D).eval() for _ in range(3)]
    x = torch.randn(4, 5, 8, dtype=D)
    each = torch.stack([m(x) for m in members])  # draws the random projections
    params, buffers = stack_module_state(members)
    base = copy.deepcopy(members[0]).to("meta")
    with torch.no_grad():
        together = vmap(lambda p, b: functional_call(base, (p, b), (x,)))(params, buffers)
    torch.testing.assert_close(together, each.detach(), rtol=1e-10, atol=1e-12)
    layer = members[0]
    own = {n: p.detach() for n, p in layer.named_parameters()}

    def loss(p: dict[str, torch.Tensor], sample: torch.Tensor) -> torch.Tensor:
        return functional_call(layer, p, (sample.unsqueeze(0),)).square().sum()

    per_sample = vmap(grad(loss), in_dims=(None, 0))(own, x)
    for i in range(x.shape[0]):
        one = torch.autograd.grad(layer(x[i : i + 1]).square().sum(), list(layer.parameters()))
        for (n, _), expected in zip(layer.named_parameters(), one, strict=True):
            torch.testing.assert_close(per_sample[n][i], expected, rtol=1e-10, atol=1e-12)

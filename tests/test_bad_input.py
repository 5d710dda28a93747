"""Bad inputs give a TypeError / ValueError naming the argument; empty inputs work as in torch.

Issue 17, item 1. Every case asserts the exception type and that the message names the argument.
Documented (not errors): NaN in the data propagates as in torch; ``k > S`` keeps every key.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from hopfield.functional import (
    ClippedSoftmax,
    Dense,
    Entmax,
    Linear,
    Polynomial,
    RandomFeatures,
    RandomMask,
    Separation,
    Softmax,
    SoftmaxN,
    Sparsemax,
    TopK,
    Window,
    associate,
    entmax,
)
from hopfield.nn import (
    GatedAttention,
    Hopfield,
    HopfieldLayer,
    HopfieldPooling,
    OutEffHop,
    OutEffHopLayer,
    OutEffHopPooling,
)

D, HEADS, B, N = 8, 2, 2, 5
NAN, INF = math.nan, math.inf


def x32() -> torch.Tensor:
    return torch.randn(B, N, D)


# ---- masks of the layers ---------------------------------------------------------------------

# (layer factory, name of its mask argument); every layer of hopfield.nn that takes a mask.
MASKED_LAYERS: list[tuple[Callable[[], torch.nn.Module], str]] = [
    (lambda: Hopfield(D, HEADS), "key_padding_mask"),
    (lambda: Hopfield(D, HEADS), "attn_mask"),
    (lambda: OutEffHop(D, HEADS), "key_padding_mask"),
    (lambda: OutEffHop(D, HEADS), "attn_mask"),
    (lambda: Hopfield(D, HEADS, gate=GatedAttention(D, HEADS)), "key_padding_mask"),
    (lambda: HopfieldPooling(D, 3, num_heads=HEADS), "key_padding_mask"),
    (lambda: OutEffHopPooling(D, 3, num_heads=HEADS), "key_padding_mask"),
    (lambda: HopfieldLayer(D, N, num_heads=HEADS), "attn_mask"),
    (lambda: OutEffHopLayer(D, N, num_heads=HEADS), "attn_mask"),
]
MASK_IDS = [f"{i}-{name}" for i, (_, name) in enumerate(MASKED_LAYERS)]


def mask_shape(layer: torch.nn.Module, name: str) -> tuple[int, ...]:
    if name == "key_padding_mask":
        return (B, N)
    length = 3 if isinstance(layer, HopfieldPooling) else N
    return (length, N)


BAD_MASKS: dict[str, Callable[[tuple[int, ...]], Any]] = {
    "int64": lambda shape: torch.zeros(shape, dtype=torch.long),
    "int32": lambda shape: torch.ones(shape, dtype=torch.int32),
    "uint8": lambda shape: torch.zeros(shape, dtype=torch.uint8),
    "list": lambda shape: torch.zeros(shape, dtype=torch.bool).tolist(),
    "numpy": lambda shape: torch.zeros(shape, dtype=torch.bool).numpy(),
}


@pytest.mark.parametrize(("make", "name"), MASKED_LAYERS, ids=MASK_IDS)
def test_masks_that_are_not_bool_or_float_tensors_raise_type_errors(
    make: Callable[[], torch.nn.Module], name: str
) -> None:
    layer = make()
    for bad, build in BAD_MASKS.items():
        with pytest.raises(TypeError, match=rf"^{name} must be a") as error:
            layer(x32(), **{name: build(mask_shape(layer, name))})
        assert bad in str(error.value) or bad in ("list", "numpy")


@pytest.mark.parametrize(("make", "name"), MASKED_LAYERS, ids=MASK_IDS)
def test_bool_and_float_masks_are_accepted_as_in_multihead_attention(
    make: Callable[[], torch.nn.Module], name: str
) -> None:
    layer = make()
    shape = mask_shape(layer, name)
    ignore = torch.zeros(shape, dtype=torch.bool)
    ignore[..., 1] = True  # True = ignore (nn.MultiheadAttention convention)
    x = x32()
    by_bool = layer(x, **{name: ignore})
    for dtype in (torch.float32, torch.float64):
        additive = torch.zeros(shape, dtype=dtype).masked_fill(ignore, -INF)
        assert torch.allclose(layer(x, **{name: additive}), by_bool, atol=1e-6)


# ---- input dtypes of the layers --------------------------------------------------------------

INPUT_LAYERS: dict[str, Callable[[], torch.nn.Module]] = {
    "Hopfield": lambda: Hopfield(D, HEADS),
    "OutEffHop": lambda: OutEffHop(D, HEADS),
    "Hopfield-normalized": lambda: Hopfield(D, HEADS, normalize_inputs=True),
    "HopfieldPooling": lambda: HopfieldPooling(D, 2, num_heads=HEADS),
    "OutEffHopPooling": lambda: OutEffHopPooling(D, 2, num_heads=HEADS),
    "HopfieldLayer": lambda: HopfieldLayer(D, 4, num_heads=HEADS),
    "OutEffHopLayer": lambda: OutEffHopLayer(D, 4, num_heads=HEADS),
    "static-gated": lambda: Hopfield(D, HEADS, static=True, gate=GatedAttention(D, HEADS)),
}


@pytest.mark.parametrize("make", INPUT_LAYERS.values(), ids=list(INPUT_LAYERS))
def test_float64_input_into_float32_layer_names_the_input_and_the_layer_dtype(
    make: Callable[[], torch.nn.Module],
) -> None:
    layer = make()
    with pytest.raises(TypeError, match=r"input is torch\.float64 .* torch\.float32"):
        layer(x32().double())
    with pytest.raises(TypeError, match="input must be floating point"):
        layer(torch.ones(B, N, D, dtype=torch.long))
    with pytest.raises(TypeError, match="input must be a Tensor"):
        layer(x32().tolist())
    assert make().to(torch.float64)(x32().double()).dtype == torch.float64


@pytest.mark.parametrize("make", INPUT_LAYERS.values(), ids=list(INPUT_LAYERS))
def test_mixed_dtypes_pass_under_autocast(make: Callable[[], torch.nn.Module]) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = make()(x32().bfloat16())
    assert bool(torch.isfinite(out.float()).all())


def test_each_pattern_of_a_triple_is_named() -> None:
    hop = Hopfield(D, HEADS)
    x = x32()
    with pytest.raises(TypeError, match=r"state patterns is torch\.float64"):
        hop((x, x.double(), x))
    with pytest.raises(TypeError, match=r"projection patterns must be floating point"):
        hop((x, x, x.long()))
    with pytest.raises(TypeError, match=r"input must be a Tensor or a pair"):
        HopfieldPooling(D, 2)((x.tolist(), x))
    with pytest.raises(TypeError, match=r"input must be a Tensor or a pair"):
        HopfieldPooling(D, 2)((x, x, x))


def test_gate_input_dtype_is_named() -> None:
    gate = GatedAttention(D, HEADS)
    with pytest.raises(TypeError, match=r"x is torch\.float64 .* torch\.float32"):
        gate(x32().double(), torch.randn(B, HEADS, N, D // HEADS))
    with pytest.raises(TypeError, match="x must be a Tensor"):
        gate.probabilities(x32().tolist())  # type: ignore[arg-type]


# ---- associate arguments ---------------------------------------------------------------------


def qkv(length: int = 3, size: int = 4, dtype: torch.dtype = torch.float64) -> list[torch.Tensor]:
    return [
        torch.randn(B, HEADS, length, 4, dtype=dtype),
        torch.randn(B, HEADS, size, 4, dtype=dtype),
        torch.randn(B, HEADS, size, 3, dtype=dtype),
    ]


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"causal": "yes"}, TypeError, "causal"),
        ({"causal": 1}, TypeError, "causal"),
        ({"causal": None}, TypeError, "causal"),
        ({"causal": torch.tensor(True)}, TypeError, "causal"),
        ({"return_weights": "no"}, TypeError, "return_weights"),
        ({"training": 0}, TypeError, "training"),
        ({"scale": NAN}, ValueError, "scale"),
        ({"scale": INF}, ValueError, "scale"),
        ({"scale": -1.0}, ValueError, "scale"),
        ({"scale": 0}, ValueError, "scale"),
        ({"scale": "2"}, TypeError, "scale"),
        ({"dropout": NAN}, ValueError, "dropout"),
        ({"dropout": "0.1"}, TypeError, "dropout"),
        ({"mask": [[True] * 4] * 3}, TypeError, "mask"),
        ({"mask": torch.ones(3, 4, dtype=torch.long)}, TypeError, "mask"),
    ],
)
def test_associate_arguments(kwargs: dict[str, Any], error: type[Exception], name: str) -> None:
    with pytest.raises(error, match=rf"\b{name} must"):
        associate(*qkv(), **kwargs)


# ---- hyper-parameters ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "name"),
    [
        (lambda: Entmax(1.3, iterations=0), ValueError, "iterations"),
        (lambda: Entmax(1.3, iterations=-3), ValueError, "iterations"),
        (lambda: Entmax(1.3, iterations=2.5), TypeError, "iterations"),
        (lambda: entmax(torch.randn(4), 1.3, iterations=0), ValueError, "iterations"),
        (lambda: entmax(torch.randn(4), NAN), ValueError, "alpha"),
        (lambda: entmax(torch.randn(4), torch.tensor([1.5, NAN])), ValueError, "alpha"),
        (lambda: Entmax(NAN), ValueError, "alpha"),
        (lambda: SoftmaxN(NAN), ValueError, "n"),
        (lambda: SoftmaxN(INF), ValueError, "n"),
        (lambda: ClippedSoftmax(gamma=NAN), ValueError, "gamma"),
        (lambda: ClippedSoftmax(zeta=INF), ValueError, "zeta"),
        (lambda: Hopfield(D, update_eps=NAN), ValueError, "update_eps"),
        (lambda: Hopfield(D, update_eps=INF), ValueError, "update_eps"),
        (lambda: Hopfield(D, update_eps=-1e-3), ValueError, "update_eps"),
        (lambda: Hopfield(D, update_eps="1e-4"), TypeError, "update_eps"),
        (lambda: Hopfield(D, dropout=NAN), ValueError, "dropout"),
        (lambda: Hopfield(D, dropout="0"), TypeError, "dropout"),
        (lambda: Hopfield(D, scale=NAN), ValueError, "scale"),
        (lambda: Hopfield(D, HEADS, scale=[1.0, INF]), ValueError, "scale"),
        (lambda: Hopfield(D, scale="big"), TypeError, "scale"),
        (lambda: OutEffHop(D, update_eps=NAN), ValueError, "update_eps"),
        (lambda: HopfieldPooling(D, 2, update_eps=NAN), ValueError, "update_eps"),
        (lambda: HopfieldLayer(D, 2, dropout=NAN), ValueError, "dropout"),
        (lambda: GatedAttention(D, HEADS, pi_init=NAN), ValueError, "pi_init"),
    ],
)
def test_hyper_parameters(make: Callable[[], Any], error: type[Exception], name: str) -> None:
    with pytest.raises(error, match=rf"\b{name} must"):
        make()


# ---- empty inputs work as in torch -----------------------------------------------------------

EMPTY_MAPS: dict[str, Separation] = {
    "softmax": Softmax(),
    "softmax1": SoftmaxN(1.0),
    "softmax2.5": SoftmaxN(2.5),
    "sparsemax": Sparsemax(),
    "entmax15": Entmax(1.5),
    "entmax13": Entmax(1.3),
    "entmax-learnable": Entmax(1.4, learnable=True),
    "clipped": ClippedSoftmax(-0.1, 1.1),
    "clipped1": ClippedSoftmax(-0.05, base=SoftmaxN(1)),
    "polynomial": Polynomial(3),
}


@pytest.mark.parametrize("sep", EMPTY_MAPS.values(), ids=list(EMPTY_MAPS))
def test_maps_on_empty_rows_match_torch_softmax(sep: Separation) -> None:
    for shape in [(0,), (3, 0), (2, 3, 0), (0, 4)]:
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            z = torch.zeros(shape, dtype=dtype, requires_grad=True)
            out = sep(z)
            expected = torch.softmax(z, dim=-1)
            assert out.shape == expected.shape and out.dtype == expected.dtype
            (out * 2).sum().backward()
            assert z.grad is not None and z.grad.shape == z.shape
            assert bool(torch.isfinite(z.grad).all())
    for parameter in sep.parameters():  # zero gradients, as nn.Linear on an empty batch
        assert parameter.grad is not None and bool((parameter.grad == 0).all())


def test_per_head_entmax_and_functional_entmax_on_empty_rows() -> None:
    sep = Entmax(1.5, learnable=True, num_heads=HEADS)
    assert sep(torch.zeros(B, HEADS, 3, 0)).shape == (B, HEADS, 3, 0)
    assert entmax(torch.zeros(3, 0), 1.3).shape == (3, 0)


STRUCTURES: dict[str, Callable[[], Any]] = {
    "dense": Dense,
    "dense-blockwise": lambda: Dense(blockwise_from=0),
    "topk": lambda: TopK(2),
    "topk-fraction": lambda: TopK(fraction=0.5),
    "random": lambda: RandomMask(2, seed=0),
    "linear": Linear,
    "random-features": lambda: RandomFeatures(8, seed=0),
}


@pytest.mark.parametrize("make", STRUCTURES.values(), ids=list(STRUCTURES))
def test_associate_without_memories_gives_zeros_and_finite_gradients(
    make: Callable[[], Any],
) -> None:
    kernel = isinstance(make(), Linear | RandomFeatures)  # they stand in for Softmax only
    for sep in [Softmax()] if kernel else [Softmax(), SoftmaxN(1), Sparsemax(), Entmax(1.3)]:
        for return_weights in (False, True):
            q, k, v = (t.requires_grad_(True) for t in qkv(size=0))
            result = associate(
                q,
                k,
                v,
                separation=sep,
                structure=make(),
                causal=True,
                return_weights=return_weights,
            )
            out = result[0] if isinstance(result, tuple) else result
            assert out.shape == (B, HEADS, 3, 3) and bool((out == 0).all())
            if isinstance(result, tuple):
                assert result[1] is not None and result[1].shape == (B, HEADS, 3, 0)
            out.sum().backward()
            for t in (q, k, v):
                assert t.grad is not None and t.grad.shape == t.shape
                assert bool(torch.isfinite(t.grad).all())


@pytest.mark.parametrize(
    "make", [*STRUCTURES.values(), lambda: Window(2)], ids=[*STRUCTURES, "window"]
)
def test_associate_without_queries_gives_an_empty_output(make: Callable[[], Any]) -> None:
    size = 0 if make().__class__ is Window else 4
    q, k, v = qkv(length=0, size=size)
    out = associate(q, k, v, structure=make(), mask=torch.ones(0, size, dtype=torch.bool))
    assert isinstance(out, torch.Tensor) and out.shape == (B, HEADS, 0, 3)


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("shape", [(B, 0, D), (0, N, D)])
def test_layers_on_empty_sequences_and_batches(shape: tuple[int, ...], steps: int) -> None:
    x = torch.randn(shape, requires_grad=True)
    for layer in (Hopfield(D, HEADS, update_steps=steps), HopfieldLayer(D, 4, num_heads=HEADS)):
        out = layer(x)
        assert isinstance(out, torch.Tensor) and out.shape == shape
        out.sum().backward()
        assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    pooled = HopfieldPooling(D, 2, num_heads=HEADS)(x)
    assert isinstance(pooled, torch.Tensor) and pooled.shape == (shape[0], 2, D)


# ---- documented, not errors ------------------------------------------------------------------


@pytest.mark.parametrize("sep", EMPTY_MAPS.values(), ids=list(EMPTY_MAPS))
def test_nan_and_inf_in_the_scores_propagate_as_in_torch(sep: Separation) -> None:
    z = torch.tensor([[NAN, 1.0, 0.0], [INF, 1.0, 0.0], [-INF, NAN, 0.0], [0.5, 1.0, -INF]])
    out = sep(z)
    expected = torch.softmax(z, dim=-1)  # rows with NaN or +inf are NaN; -inf masks
    assert torch.equal(torch.isnan(out), torch.isnan(expected))
    assert bool(torch.isfinite(out[3]).all()) and out[3, 2] == 0


@pytest.mark.parametrize("make", [lambda k: TopK(k), lambda k: RandomMask(k, seed=0)])
def test_k_above_the_number_of_keys_keeps_every_key(make: Callable[[int], Any]) -> None:
    q, k, v = qkv(size=4)
    keep = torch.tensor([True, False, True, True])
    for extra in (1, 5):
        dense = associate(q, k, v, mask=keep)
        assert torch.allclose(associate(q, k, v, structure=make(4 + extra), mask=keep), dense)
        assert torch.allclose(associate(q, k, v, structure=make(3 + extra)), associate(q, k, v))

"""Blockwise sparsemax / entmax attention and recomputed Top-K against the explicit reference paths."""

from __future__ import annotations

import math

import pytest
import torch

from hopfield.functional import Dense, Entmax, Softmax, Sparsemax, TopK, associate
from hopfield.functional import structures as structures_module
from hopfield.functional.blockwise import blockwise_entmax_attention

# Every test runs on the native CPU kernels and on the PyTorch path (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("kernel_path")

D = torch.float64
EXPLICIT = Dense(blockwise_from=None)


def blockwise(key_block: int, tile: int = 1 << 21) -> Dense:
    return Dense(blockwise_from=0, key_block=key_block, max_tile_elements=tile)


def patterns(b=2, h=2, length=9, size=23, e=4, ev=3, seed=1, spread=2.0):
    gen = torch.Generator().manual_seed(seed)
    q = (spread * torch.randn(b, h, length, e, dtype=D, generator=gen)).requires_grad_()
    k = torch.randn(b, h, size, e, dtype=D, generator=gen, requires_grad=True)
    v = torch.randn(b, h, size, ev, dtype=D, generator=gen, requires_grad=True)
    return q, k, v


def grads(out, inputs, probe):
    return torch.autograd.grad((out * probe).sum(), inputs, retain_graph=True, allow_unused=True)


def assert_same_values_and_grads(out, ref, inputs) -> None:
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    probe = torch.randn_like(out)
    for a, b in zip(grads(out, inputs, probe), grads(ref, inputs, probe), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def make_mask(kind: str, b: int, length: int, size: int):
    gen = torch.Generator().manual_seed(7)
    if kind == "none":
        return None
    if kind == "padding":  # (B, 1, 1, S) key padding, item 1 fully padded
        mask = torch.rand(b, 1, 1, size, generator=gen) > 0.3
        mask[-1] = False
        return mask
    if kind == "additive":  # per-query additive bias with -inf entries and one blocked row
        bias = torch.randn(1, 1, length, size, dtype=D, generator=gen)
        bias = bias.masked_fill(torch.rand(1, 1, length, size, generator=gen) < 0.3, -math.inf)
        bias[..., 2, :] = -math.inf
        return bias
    raise AssertionError(kind)


SEPARATIONS = [Sparsemax(), Entmax(1.5), Entmax(1.25)]


@pytest.mark.parametrize("separation", SEPARATIONS, ids=["sparsemax", "entmax15", "entmax125"])
@pytest.mark.parametrize("key_block,tile", [(5, 40), (7, 1 << 21), (64, 1 << 21)])
@pytest.mark.parametrize("mask_kind", ["none", "padding", "additive"])
@pytest.mark.parametrize("causal", [False, True])
def test_blockwise_equals_explicit(separation, key_block, tile, mask_kind, causal) -> None:
    """Values and gradients (q, k, v and a per-head scale) in float64; 23 keys never divide."""
    q, k, v = patterns()
    scale = torch.tensor([0.7, 1.3], dtype=D, requires_grad=True)
    mask = make_mask(mask_kind, 2, 9, 23)
    kw = {"separation": separation, "scale": scale, "mask": mask, "causal": causal}
    out = associate(q, k, v, structure=blockwise(key_block, tile), **kw)
    ref = associate(q, k, v, structure=EXPLICIT, **kw)
    assert_same_values_and_grads(out, ref, (q, k, v, scale))


@pytest.mark.parametrize("length,size", [(12, 5), (4, 17)])
@pytest.mark.parametrize("separation", SEPARATIONS[:2], ids=["sparsemax", "entmax15"])
def test_blockwise_causal_with_more_or_fewer_queries(length, size, separation) -> None:
    """Causal offset ``S - L`` both ways; with L > S the first queries see no key: zeros."""
    q, k, v = patterns(length=length, size=size)
    kw = {"separation": separation, "causal": True}
    out = associate(q, k, v, structure=blockwise(3), **kw)
    ref = associate(q, k, v, structure=EXPLICIT, **kw)
    assert_same_values_and_grads(out, ref, (q, k, v))
    if length > size:
        assert (out[:, :, : length - size] == 0).all()


@pytest.mark.parametrize("separation", SEPARATIONS, ids=["sparsemax", "entmax15", "entmax125"])
def test_blockwise_exact_zeros_where_sparse(separation) -> None:
    """With one-hot values the output is the weight matrix: zero exactly where the reference is."""
    size = 19
    q, k, _ = patterns(length=8, size=size, spread=4.0)
    eye = torch.eye(size, dtype=D).expand(2, 2, size, size)
    out = associate(q, k, eye, separation=separation, structure=blockwise(4))
    ref = associate(q, k, eye, separation=separation, structure=EXPLICIT)
    assert ((ref == 0).sum() > 0) and ((ref > 0).sum() > 0)
    assert torch.equal(out == 0, ref == 0)
    torch.testing.assert_close(out.sum(-1), torch.ones_like(out[..., 0]))


@pytest.mark.parametrize("alpha", [2.0, 1.5, 1.3])
def test_blockwise_gradcheck(alpha: float) -> None:
    q, k, v = patterns(b=1, h=2, length=4, size=6, e=3, ev=2)
    mask = torch.tensor([True, True, False, True, True, True]).view(1, 1, 1, 6)
    bias = torch.zeros(1, 1, 1, 6, dtype=D).masked_fill(~mask, -math.inf)
    scale = torch.tensor(0.9, dtype=D, requires_grad=True)

    def f(q, k, v, scale):
        return blockwise_entmax_attention(
            q, k, v, alpha=alpha, scale=scale, bias=bias, causal=True, key_block=4
        )

    assert torch.autograd.gradcheck(f, (q, k, v, scale))


def test_blockwise_fully_masked_rows_give_zero_and_finite_gradients() -> None:
    q, k, v = patterns(length=6, size=10)
    mask = torch.ones(2, 1, 6, 10, dtype=torch.bool)
    mask[0, :, 3] = False  # one query of item 0 sees nothing
    mask[1] = False  # item 1 sees nothing
    out = associate(q, k, v, separation=Sparsemax(), mask=mask, structure=blockwise(4))
    assert (out[0, :, 3] == 0).all() and (out[1] == 0).all()
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad).all()
    assert q.grad is not None and (q.grad[0, :, 3] == 0).all() and (q.grad[1] == 0).all()


def test_blockwise_sparsemax_with_many_ties_and_large_support() -> None:
    """Equal scores (duplicated keys) and near-flat rows: Michelot still ends at the exact τ."""
    q, k, v = patterns(length=5, size=40, spread=0.05)
    k = k.detach().clone()
    k[:, :, 20:] = k[:, :, :20]
    k.requires_grad_()
    out = associate(q, k, v, separation=Sparsemax(), structure=blockwise(6))
    ref = associate(q, k, v, separation=Sparsemax(), structure=EXPLICIT)
    assert_same_values_and_grads(out, ref, (q, k, v))


def test_blockwise_half_precision_and_float32() -> None:
    q, k, v = (t.detach() for t in patterns(length=7, size=30))
    ref = associate(q, k, v, separation=Sparsemax(), structure=EXPLICIT)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 5e-2)):
        out = associate(
            q.to(dtype), k.to(dtype), v.to(dtype), separation=Sparsemax(), structure=blockwise(8)
        )
        assert out.dtype == dtype
        torch.testing.assert_close(out.to(D), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("alpha", [1.0001, 1.001, 1.01, 1.1, 1.5, 2.0])
def test_blockwise_near_alpha_one_matches_float64(alpha: float) -> None:
    """Newton stopped at ``h - 1 <= tol``, but ``h - 1 = (α - 1) log G0``: near α = 1 it
    stopped with ``G0`` still far from 1, and ``gap^r`` lost ``r`` ulps (errors ~1e-4 in float32
    at α = 1.0001). Float32 values and gradients must be within 1e-4 of float64."""
    results = []
    for spread in (1e-3, 1.0, 30.0):
        q, k, v = patterns(b=1, length=6, size=40, e=8, spread=spread)
        probe = torch.randn(1, 2, 6, 3, dtype=D, generator=torch.Generator().manual_seed(3))
        for dtype in (torch.float32, D):
            inputs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
            out = associate(*inputs, separation=Entmax(alpha), structure=blockwise(16))
            results.append([out, *grads(out, inputs, probe.to(dtype))])
    for low, high in zip(results[::2], results[1::2], strict=True):
        for a, b in zip(low, high, strict=True):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a.to(D), b, rtol=0, atol=1e-4)
    q, k, v = patterns(b=1, h=1, length=3, size=7, e=3, ev=2)

    def f(q, k, v):
        return blockwise_entmax_attention(q, k, v, alpha=alpha, scale=2.0, key_block=3)

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_dense_dispatch(monkeypatch) -> None:
    """Dense takes the blockwise path above ``blockwise_from``; weights, dropout, learnable α,
    other separations and masks with gradients take the explicit path."""
    calls = []
    original = structures_module.blockwise_entmax_attention

    def spy(*args, **kwargs):
        calls.append(kwargs["alpha"])
        return original(*args, **kwargs)

    monkeypatch.setattr(structures_module, "blockwise_entmax_attention", spy)
    q, k, v = patterns(b=1, h=1, length=4, size=8)
    small = Dense(blockwise_from=33)  # B·H·L·S = 32
    associate(q, k, v, separation=Sparsemax(), structure=small)
    assert calls == []
    large = Dense(blockwise_from=32)
    associate(q, k, v, separation=Sparsemax(), structure=large)
    associate(q, k, v, separation=Entmax(1.5), structure=large)
    assert calls == [2.0, 1.5]
    _, weights = associate(q, k, v, separation=Sparsemax(), structure=large, return_weights=True)
    associate(q, k, v, separation=Sparsemax(), structure=large, dropout=0.1)
    associate(q, k, v, separation=Entmax(1.5, learnable=True), structure=large)
    associate(q, k, v, separation=Softmax(), structure=large)
    bias = torch.zeros(1, 1, 1, 8, dtype=D, requires_grad=True)
    associate(q, k, v, separation=Sparsemax(), structure=large, mask=bias)
    assert calls == [2.0, 1.5]
    assert weights is not None
    assert Dense().blockwise_from == 1 << 18
    with pytest.raises(ValueError):
        Dense(blockwise_from=-1)


# ------------------------------------------------------------------------------------------------
# Top-K: the recomputing path (gradients, no weights) against TopK's explicit path (weights)
# ------------------------------------------------------------------------------------------------


def topk_both(structure, q, k, v, **kw):
    out = associate(q, k, v, structure=structure, **kw)
    ref, _ = associate(q, k, v, structure=structure, return_weights=True, **kw)
    return out, ref


@pytest.mark.parametrize("separation", [Softmax(), Sparsemax(), Entmax(1.5)])
@pytest.mark.parametrize(
    "structure",
    [TopK(3, chunk_size=4, max_block_elements=50), TopK(6), TopK(fraction=0.4, chunk_size=5)],
    ids=["k3-chunks", "k6", "fraction"],
)
@pytest.mark.parametrize("mask_kind", ["none", "padding", "additive"])
@pytest.mark.parametrize("causal", [False, True])
def test_topk_recomputed_equals_explicit(separation, structure, mask_kind, causal) -> None:
    q, k, v = patterns(length=9, size=23)
    scale = torch.full((2, 1, 9, 1), 0.8, dtype=D, requires_grad=True)  # per-query scale
    mask = make_mask(mask_kind, 2, 9, 23)
    kw = {"separation": separation, "scale": scale, "mask": mask, "causal": causal}
    out, ref = topk_both(structure, q, k, v, **kw)
    assert_same_values_and_grads(out, ref, (q, k, v, scale))


def test_topk_recomputed_ties_match_topk(monkeypatch) -> None:
    """Duplicated keys tie at the K-th score: both paths keep the same K keys (the recomputed
    path: the fused kernels compute their scores with their own BLAS product, whose rounding
    may tell duplicated keys apart by an ulp; their ties are tested on exact scores in
    tests/test_native.py)."""
    monkeypatch.setattr(TopK, "_attends_fused", lambda *args: False)
    q, k, v = patterns(length=6, size=16)
    k = k.detach().clone()
    k[:, :, 8:] = k[:, :, :8]
    k.requires_grad_()
    structure = TopK(3, chunk_size=5)
    out, ref = topk_both(structure, q, k, v, separation=Softmax())
    assert_same_values_and_grads(out, ref, (q, k, v))
    # One-hot values: exactly K nonzero weights per row.
    eye = torch.eye(16, dtype=D).expand(2, 2, 16, 16).clone().requires_grad_()
    weights = associate(q, k, eye, structure=structure, separation=Softmax())
    assert ((weights > 0).sum(-1) == 3).all()


def test_topk_recomputed_gradcheck_and_fully_masked_rows() -> None:
    q, k, v = patterns(b=1, h=2, length=6, size=4, e=3, ev=2)

    def f(q, k, v):
        return associate(
            q, k, v, separation=Sparsemax(), structure=TopK(2, chunk_size=3), causal=True
        )

    assert torch.autograd.gradcheck(f, (q, k, v))
    out = f(q, k, v)  # L > S: the first two queries see no key
    assert (out[:, :, :2] == 0).all()
    out.sum().backward()
    assert q.grad is not None and (q.grad[:, :, :2] == 0).all()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (k, v))

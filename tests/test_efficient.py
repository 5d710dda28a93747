"""TopK, RandomMask and Window against dense association under the equivalent explicit -inf mask."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from hopfield.functional import Entmax, Softmax, SoftmaxN, Sparsemax, associate
from hopfield.functional.efficient import RandomMask, TopK, Window, floyd_sample
from hopfield.nn import Hopfield

# Every test runs on the native CPU kernels and on the PyTorch path (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("kernel_path", "dispatch")


@pytest.fixture(params=["default", "gathered"])
def dispatch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test with the default size dispatch (small problems with gradients take the dense
    masked path, :func:`~hopfield.functional.efficient.dense_with_support`; Softmax_n without
    gradients the fused kernels) and with the gathered path at every size."""
    if request.param == "gathered":
        from hopfield.functional.efficient import _GatheredStructure

        monkeypatch.setattr(_GatheredStructure, "_dense_fits", lambda *args: False)
        monkeypatch.setattr(TopK, "_selects_densely", lambda *args: False)
        monkeypatch.setattr(RandomMask, "_samples_densely", lambda *args: False)
        monkeypatch.setattr(TopK, "_attends_fused", lambda *args: False)
        monkeypatch.setattr(RandomMask, "_attends_fused", lambda *args: False)
    return str(request.param)


D = torch.float64
NO = {"causal": False, "dropout": 0.0, "return_weights": False}


def patterns(b: int = 2, h: int = 3, length: int = 11, size: int = 11, e: int = 4, ev: int = 5):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(b, h, length, e, dtype=D, generator=gen, requires_grad=True)
    k = torch.randn(b, h, size, e, dtype=D, generator=gen, requires_grad=True)
    v = torch.randn(b, h, size, ev, dtype=D, generator=gen, requires_grad=True)
    return q, k, v


def reference(q, k, v, separation, scale, allowed: Tensor, bias: Tensor | None = None):
    """Dense association with an explicit boolean support (``False`` -> -inf)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    weights = separation(scores.masked_fill(~allowed, -math.inf))
    return torch.matmul(weights, v), weights


def causal_allowed(length: int, size: int) -> Tensor:
    return torch.arange(size)[None, :] <= torch.arange(length)[:, None] + size - length


def assert_same(out, ref, inputs) -> None:
    """Values and gradients (of a random linear functional) agree in float64."""
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    probe = torch.randn_like(out)
    g1 = torch.autograd.grad((out * probe).sum(), inputs, retain_graph=True)
    g2 = torch.autograd.grad((ref * probe).sum(), inputs, retain_graph=True)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def topk_support(q, k, scale, count: Tensor | int, allowed: Tensor | None = None) -> Tensor:
    """Independent oracle: a key is kept iff its score is >= the K-th largest allowed score."""
    scores = (torch.matmul(q, k.transpose(-1, -2)) * scale).detach()
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    ordered = scores.sort(dim=-1, descending=True).values
    count = torch.as_tensor(count).expand(scores.shape[:-1])
    threshold = ordered.gather(-1, (count - 1).unsqueeze(-1))
    return (scores >= threshold) & torch.isfinite(scores)


# ------------------------------------------------------------------------------------------------
# TopK
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("separation", [Softmax(), Sparsemax(), Entmax(1.5)])
@pytest.mark.parametrize("chunk_size,block", [(1024, 1 << 23), (3, 40)])
@pytest.mark.parametrize("count", [2, 5])  # scores from gathered keys / from the block product
def test_topk_equals_dense_with_explicit_mask(separation, chunk_size, block, count) -> None:
    q, k, v = patterns(length=9, size=23)
    structure = TopK(count, chunk_size=chunk_size, max_block_elements=block)
    out, _ = structure(q, k, v, separation=separation, scale=0.7, mask=None, **NO)
    allowed = topk_support(q, k, 0.7, count)
    assert int(allowed.sum(-1).min()) == count == int(allowed.sum(-1).max())
    ref, _ = reference(q, k, v, separation, 0.7, allowed)
    assert_same(out, ref, (q, k, v))


def test_topk_fraction_counts_valid_keys_per_row_and_padding() -> None:
    q, k, v = patterns(b=3, length=6, size=17)
    valid = torch.tensor([17, 10, 3])
    padding = (torch.arange(17)[None, :] < valid[:, None]).view(3, 1, 1, 17)
    scale = torch.tensor([0.5, 1.0, 2.0], dtype=D).view(3, 1, 1)  # per head
    structure = TopK(fraction=0.3, chunk_size=4)
    out, weights = structure(
        q,
        k,
        v,
        separation=Softmax(),
        scale=scale,
        mask=padding,
        causal=False,
        dropout=0.0,
        return_weights=True,
    )
    counts = torch.clamp((valid.double() * 0.3).floor().long(), min=1)  # 5, 3, 1
    allowed = topk_support(q, k, scale, counts.view(3, 1, 1), padding)
    assert weights is not None
    assert torch.equal((weights > 0), allowed)
    assert torch.equal((weights > 0).sum(-1)[:, 0, 0], counts)
    ref, ref_w = reference(q, k, v, Softmax(), scale, allowed)
    torch.testing.assert_close(weights, ref_w)
    assert_same(out, ref, (q, k, v))


def test_topk_zeros_outside_support_and_additive_mask() -> None:
    q, k, v = patterns(length=5, size=12)
    bias = torch.randn(1, 1, 5, 12, dtype=D).masked_fill(torch.rand(1, 1, 5, 12) < 0.3, -math.inf)
    out, weights = TopK(4)(
        q,
        k,
        v,
        separation=Softmax(),
        scale=1.0,
        mask=bias,
        causal=False,
        dropout=0.0,
        return_weights=True,
    )
    assert weights is not None
    scores = torch.matmul(q, k.transpose(-1, -2)).detach() + bias
    kth = scores.sort(-1, descending=True).values[..., 3:4]
    outside = scores < kth
    assert (weights[outside] == 0).all()  # exactly zero, not merely small
    ref, _ = reference(q, k, v, Softmax(), 1.0, ~outside & torch.isfinite(scores), bias)
    assert_same(out, ref, (q, k, v))


@pytest.mark.parametrize("structure", [TopK(30), TopK(fraction=1.0)])
def test_topk_with_k_at_least_keys_equals_dense(structure) -> None:
    q, k, v = patterns(length=7, size=12)
    out = associate(q, k, v, structure=structure)
    dense = associate(q, k, v)
    assert_same(out, dense, (q, k, v))


def test_topk_causal_fully_masked_rows_and_gradcheck() -> None:
    q, k, v = patterns(b=1, h=2, length=8, size=5, e=3, ev=2)
    out, weights = TopK(2, chunk_size=2)(
        q,
        k,
        v,
        separation=Softmax(),
        scale=1.0,
        mask=None,
        causal=True,
        dropout=0.0,
        return_weights=True,
    )
    # L > S: the first three queries see no key at all.
    assert torch.isfinite(out).all()
    assert (out[:, :, :3] == 0).all()
    allowed = topk_support(q, k, 1.0, 2, causal_allowed(8, 5))
    assert weights is not None
    assert torch.equal(weights > 0, allowed)
    ref, _ = reference(q, k, v, Softmax(), 1.0, allowed)
    assert_same(out, ref, (q, k, v))
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))

    def f(q, k, v):
        return TopK(2, chunk_size=2)(q, k, v, separation=Softmax(), scale=0.8, mask=None, **NO)[0]

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_topk_argument_errors() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        TopK()
    with pytest.raises(ValueError, match="exactly one"):
        TopK(3, fraction=0.5)
    with pytest.raises(ValueError, match="k must"):
        TopK(0)
    with pytest.raises(ValueError, match="fraction"):
        TopK(fraction=1.5)
    with pytest.raises(TypeError, match="fraction"):
        TopK(fraction="half")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chunk_size"):
        TopK(3, chunk_size=0)


# ------------------------------------------------------------------------------------------------
# RandomMask
# ------------------------------------------------------------------------------------------------


def support_of(structure, q, k, v, **kw) -> Tensor:
    _, weights = structure(
        q,
        k,
        v,
        separation=Softmax(),
        scale=1.0,
        return_weights=True,
        dropout=0.0,
        **{"mask": None, "causal": False, **kw},
    )
    return weights > 0


@pytest.mark.parametrize("separation", [Softmax(), Sparsemax()])
@pytest.mark.parametrize("k_count", [3, 10])  # Floyd sampler (k² <= 4S) and priority sampler
def test_random_mask_equals_dense_with_its_mask(separation, k_count) -> None:
    q, k, v = patterns(length=7, size=23 if k_count > 5 else 64)
    structure = RandomMask(k_count, seed=3).eval()  # "fixed": the same subset at every call
    allowed = support_of(structure, q, k, v)
    assert (allowed.sum(-1) == k_count).all()
    out, _ = structure(q, k, v, separation=separation, scale=0.9, mask=None, **NO)
    ref, _ = reference(q, k, v, separation, 0.9, allowed)
    assert_same(out, ref, (q, k, v))


@pytest.mark.parametrize("fraction", [0.5, 0.8])  # keep the largest / drop the smallest priorities
def test_random_mask_priority_sampler_with_padding_and_causal(fraction: float) -> None:
    q, k, v = patterns(b=2, length=10, size=10)
    padding = torch.ones(2, 1, 1, 10, dtype=torch.bool)
    padding[1, ..., 6:] = False
    structure = RandomMask(fraction=fraction, seed=0).eval()
    allowed = support_of(structure, q, k, v, mask=padding, causal=True)
    visible = padding & causal_allowed(10, 10)
    assert not (allowed & ~visible).any()
    expected = torch.minimum(
        torch.clamp((visible.sum(-1).double() * fraction).floor().long(), min=1), visible.sum(-1)
    )
    assert torch.equal(allowed.sum(-1), expected.expand_as(allowed.sum(-1)))
    out, _ = structure(
        q,
        k,
        v,
        separation=Softmax(),
        scale=1.0,
        mask=padding,
        causal=True,
        dropout=0.0,
        return_weights=False,
    )
    ref, _ = reference(q, k, v, Softmax(), 1.0, allowed)
    assert_same(out, ref, (q, k, v))


def test_random_mask_determinism_and_modes() -> None:
    q, k, v = patterns(length=6, size=40)
    train = RandomMask(4, seed=7)
    first, second = support_of(train, q, k, v), support_of(train, q, k, v)
    assert not torch.equal(first, second)  # training resamples every call
    assert torch.equal(first, support_of(RandomMask(4, seed=7), q, k, v))  # same seed, same draws
    gen_a, gen_b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(
        support_of(RandomMask(4, generator=gen_a), q, k, v),
        support_of(RandomMask(4, generator=gen_b), q, k, v),
    )
    fixed = RandomMask(4, seed=7).eval()
    assert torch.equal(support_of(fixed, q, k, v), support_of(fixed, q, k, v))
    assert not torch.equal(
        support_of(fixed, q, k, v), support_of(RandomMask(4, seed=8).eval(), q, k, v)
    )
    resample = RandomMask(4, seed=7, eval_sampling="resample").eval()
    assert not torch.equal(support_of(resample, q, k, v), support_of(resample, q, k, v))
    dense = RandomMask(4, eval_sampling="dense").eval()
    torch.testing.assert_close(associate(q, k, v, structure=dense), associate(q, k, v))
    with pytest.raises(ValueError, match="eval_sampling"):
        RandomMask(4, eval_sampling="sometimes")  # type: ignore[arg-type]


@pytest.mark.parametrize("mask", [None, torch.ones(1, 1, 1, 30, dtype=torch.bool)])
def test_random_mask_force_keeps_the_target(mask) -> None:
    q, k, v = patterns(b=2, h=1, length=30, size=30)
    target = torch.randperm(30).view(1, 30)
    allowed = support_of(RandomMask(3, seed=1, force=target), q, k, v, mask=mask)
    assert (allowed.sum(-1) == 3).all()
    assert allowed.gather(-1, target.view(1, 1, 30, 1).expand(2, 1, 30, 1)).all()
    with pytest.raises(ValueError, match="force"):
        support_of(RandomMask(3, force=torch.full((30,), 30)), q, k, v)


def test_random_mask_force_of_a_wrong_shape_is_named() -> None:
    """A 4-D force crashed in ``expand``; a shape not broadcastable to (B, H, L) did too."""
    q, k, v = patterns(b=2, h=1, length=30, size=30)
    with pytest.raises(
        ValueError, match=r"force must be broadcastable .* got shape \(1, 1, 1, 30\)"
    ):
        RandomMask(3, force=torch.zeros(1, 1, 1, 30, dtype=torch.long))
    with pytest.raises(ValueError, match=r"= \(2, 1, 30\), got shape \(3, 30\)"):
        support_of(RandomMask(3, force=torch.zeros(3, 30, dtype=torch.long)), q, k, v)
    with pytest.raises(TypeError, match="force must be an integer Tensor"):
        RandomMask(3, force=torch.ones(30, dtype=torch.bool))


@pytest.mark.parametrize("n,count", [(12, 3), (12, 11), (5, 5)])
def test_floyd_sample_is_exact_and_uniform(n: int, count: int) -> None:
    rows = 20000
    gen = torch.Generator().manual_seed(0)
    chosen = floyd_sample(
        torch.full((rows,), count),
        torch.full((rows,), n),
        count,
        torch.rand(rows, count, generator=gen),
    )
    assert ((chosen >= 0) & (chosen < n)).all()
    assert (chosen.sort(-1).values.diff(dim=-1) > 0).all()  # distinct
    freq = torch.bincount(chosen.flatten(), minlength=n).double() / rows
    # Each key is included with probability count / n (binomial std <= 0.0036 here).
    torch.testing.assert_close(freq, torch.full((n,), count / n, dtype=D), atol=0.02, rtol=0)
    if count == 3:  # all 220 subsets are about equally frequent
        codes = (1 << chosen).sum(-1)
        _, hist = codes.unique(return_counts=True)
        assert hist.numel() == math.comb(n, count)
        assert hist.max() / hist.min() < 2.5


def test_random_mask_inclusion_is_uniform_in_both_samplers() -> None:
    q = torch.zeros(1, 1, 4000, 2)
    k = torch.zeros(1, 1, 16, 2)
    v = torch.zeros(1, 1, 16, 1)
    for structure, mask in (
        (RandomMask(2, seed=0), None),
        (RandomMask(6, seed=0), None),
        (RandomMask(2, seed=0), torch.ones(1, 1, 1, 16, dtype=torch.bool)),
        (RandomMask(12, seed=0), torch.ones(1, 1, 1, 16, dtype=torch.bool)),  # drops 4
    ):
        allowed = support_of(structure, q, k, v, mask=mask)
        freq = allowed.double().mean(dim=(0, 1, 2))
        expected = structure.k / 16
        torch.testing.assert_close(freq, torch.full((16,), expected, dtype=D), atol=0.03, rtol=0)


def test_random_mask_gradcheck() -> None:
    q, k, v = patterns(b=1, h=2, length=5, size=6, e=3, ev=2)

    def f(q, k, v):
        structure = RandomMask(3, seed=0).eval()
        return structure(q, k, v, separation=Softmax(), scale=0.8, mask=None, **NO)[0]

    assert torch.autograd.gradcheck(f, (q, k, v))


# ------------------------------------------------------------------------------------------------
# Window
# ------------------------------------------------------------------------------------------------


def band(length: int, w: int, causal: bool = False) -> Tensor:
    rel = torch.arange(length)[None, :] - torch.arange(length)[:, None]
    return (rel >= -w) & (rel <= (0 if causal else w))


@pytest.mark.parametrize(
    "length,w,block",
    [(1, 2, None), (7, 1, None), (13, 3, 4), (37, 5, None), (29, 4, 7), (11, 0, 3)],
)
@pytest.mark.parametrize("separation", [Softmax(), Sparsemax()])
def test_window_equals_dense_with_band_mask(length, w, block, separation) -> None:
    q, k, v = patterns(length=length, size=length)
    out, weights = Window(w, block=block)(
        q,
        k,
        v,
        separation=separation,
        scale=0.6,
        mask=None,
        causal=False,
        dropout=0.0,
        return_weights=True,
    )
    ref, ref_w = reference(q, k, v, separation, 0.6, band(length, w))
    assert weights is not None
    torch.testing.assert_close(weights, ref_w)
    assert (weights[..., ~band(length, w)] == 0).all()
    assert_same(out, ref, (q, k, v))


@pytest.mark.parametrize("kind", ["padding", "bool", "additive"])
def test_window_respects_masks_and_per_query_scale(kind: str) -> None:
    q, k, v = patterns(b=2, length=19, size=19)
    if kind == "padding":
        mask = torch.ones(2, 1, 1, 19, dtype=torch.bool)
        mask[1, ..., 12:] = False
        allowed, bias = band(19, 3) & mask, None
    elif kind == "bool":
        mask = torch.rand(2, 3, 19, 19) < 0.7
        allowed, bias = band(19, 3) & mask, None
    else:
        mask = torch.randn(2, 1, 19, 19, dtype=D).masked_fill(
            torch.rand(2, 1, 19, 19) < 0.2, -math.inf
        )
        allowed, bias = band(19, 3).expand(2, 1, 19, 19), mask
    scale = torch.rand(1, 3, 19, 1, dtype=D) + 0.5
    out, _ = Window(3, block=5)(q, k, v, separation=Softmax(), scale=scale, mask=mask, **NO)
    ref, _ = reference(q, k, v, Softmax(), scale, allowed, bias)
    assert_same(out, ref, (q, k, v))


@pytest.mark.parametrize("w", [7, 8, 50])  # w >= L - 1: every pair is in the window
def test_window_at_least_length_equals_dense(w: int) -> None:
    q, k, v = patterns(length=8, size=8)
    assert_same(associate(q, k, v, structure=Window(w)), associate(q, k, v), (q, k, v))


def test_window_causal_and_fully_masked_rows() -> None:
    q, k, v = patterns(length=10, size=10)
    mask = torch.ones(1, 1, 10, 10, dtype=torch.bool)
    mask[..., 4, :] = False  # query 4 sees nothing
    out, _ = Window(2, block=3)(
        q,
        k,
        v,
        separation=Softmax(),
        scale=1.0,
        mask=mask,
        causal=True,
        dropout=0.0,
        return_weights=False,
    )
    assert torch.isfinite(out).all() and (out[:, :, 4] == 0).all()
    ref, _ = reference(q, k, v, Softmax(), 1.0, band(10, 2, causal=True) & mask)
    assert_same(out, ref, (q, k, v))
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_window_gradcheck_and_errors() -> None:
    q, k, v = patterns(b=1, h=1, length=7, size=7, e=3, ev=2)

    def f(q, k, v):
        return Window(2, block=3)(q, k, v, separation=Softmax(), scale=0.7, mask=None, **NO)[0]

    assert torch.autograd.gradcheck(f, (q, k, v))
    q2, k2, v2 = patterns(length=5, size=7)
    with pytest.raises(ValueError, match="self-association"):
        Window(2)(q2, k2, v2, separation=Softmax(), scale=1.0, mask=None, **NO)
    with pytest.raises(ValueError, match="size"):
        Window(-1)
    with pytest.raises(ValueError, match="block"):
        Window(2, block=0)


@pytest.mark.parametrize("structure", [Window(2), TopK(3), RandomMask(3, seed=0).eval()])
def test_dropout_is_unbiased_and_stays_on_the_support(structure) -> None:
    q, k, _ = patterns(b=1, h=1, length=6, size=6)
    q, k = q.detach(), k.detach()
    v = torch.eye(6, dtype=D).view(1, 1, 6, 6)  # the output rows are the (dropped) weights
    kw = {"separation": Softmax(), "scale": 1.0, "mask": None, "causal": False}
    clean, weights = structure(q, k, v, dropout=0.0, return_weights=True, **kw)
    torch.testing.assert_close(clean, weights)
    draws = torch.stack(
        [structure(q, k, v, dropout=0.5, return_weights=False, **kw)[0] for _ in range(600)]
    )
    # Every draw keeps each weight of the support doubled or drops it; nothing leaves the support.
    doubled = (draws - 2 * weights).abs() < 1e-12
    assert ((draws == 0) | doubled).all()
    assert (draws[:, weights == 0] == 0).all()
    assert doubled.any() and (draws == 0).any()
    torch.testing.assert_close(draws.mean(0), weights, atol=0.08, rtol=0)


# ------------------------------------------------------------------------------------------------
# Through associate() and the layers
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("structure", [TopK(3), RandomMask(3, seed=0), Window(2)])
def test_structures_in_hopfield_layer_with_padding(structure) -> None:
    torch.manual_seed(0)
    layer = Hopfield(8, num_heads=2, structure=structure).double().eval()
    x = torch.randn(2, 9, 8, dtype=D)
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, 6:] = True
    result = layer(x, key_padding_mask=padding, return_weights=True)
    out, weights = result.output, result.weights
    assert out.shape == (2, 9, 8) and torch.isfinite(out).all()
    assert weights is not None and (weights[1, ..., 6:] == 0).all()
    out.sum().backward()


def test_topk_fraction_with_causal_rule_counts_visible_keys() -> None:
    q, k, v = patterns(b=1, h=2, length=9, size=9)
    out, weights = TopK(fraction=0.5)(
        q,
        k,
        v,
        separation=Softmax(),
        scale=1.0,
        mask=None,
        causal=True,
        dropout=0.0,
        return_weights=True,
    )
    counts = torch.clamp(torch.arange(1, 10) // 2, min=1)  # int(0.5 · (i + 1)) per query
    allowed = topk_support(q, k, 1.0, counts, causal_allowed(9, 9))
    assert weights is not None and torch.equal(weights > 0, allowed)
    ref, _ = reference(q, k, v, Softmax(), 1.0, allowed)
    assert_same(out, ref, (q, k, v))
    with torch.no_grad():  # the inference path reuses the selected scores
        torch.testing.assert_close(
            TopK(fraction=0.5)(
                q,
                k,
                v,
                separation=Softmax(),
                scale=1.0,
                mask=None,
                causal=True,
                dropout=0.0,
                return_weights=False,
            )[0],
            ref,
        )


# ------------------------------------------------------------------------------------------------
# Fast paths (issue 16): the redrawing sampler, the group-threshold top-K, pieces, recomputation
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,count", [(12, 3), (12, 6), (2048, 64)])
def test_rejection_sample_is_exact_and_uniform(n: int, count: int) -> None:
    from hopfield.functional.efficient import rejection_sample

    rows = 20000
    gen = torch.Generator().manual_seed(0)
    chosen = rejection_sample(
        torch.full((rows,), count),
        torch.full((rows,), n),
        count,
        lambda shape: torch.rand(shape, generator=gen),
    )
    assert ((chosen >= 0) & (chosen < n)).all()
    assert (chosen.sort(-1).values.diff(dim=-1) > 0).all()  # distinct
    freq = torch.bincount(chosen.flatten(), minlength=n).double() / rows
    torch.testing.assert_close(freq, torch.full((n,), count / n, dtype=D), atol=0.02, rtol=0)
    if count == 3:  # every one of the 220 subsets about equally often: chi-square, 219 d.o.f.
        _, hist = (1 << chosen).sum(-1).unique(return_counts=True)
        assert hist.numel() == math.comb(n, count)
        expected = rows / hist.numel()
        chi2 = float(((hist - expected) ** 2 / expected).sum())
        assert chi2 < 219 + 5 * math.sqrt(2 * 219)


def test_sample_subsets_mixed_rows_and_causal_random_mask() -> None:
    from hopfield.functional.efficient import sample_subsets

    gen = torch.Generator().manual_seed(1)
    n = torch.tensor([0, 1, 5, 8, 40, 100, 3])
    count = torch.minimum(torch.full_like(n, 4), n)
    chosen = sample_subsets(count, n, 4, lambda shape: torch.rand(shape, generator=gen))
    for row in range(n.numel()):
        c = int(count[row])
        picked = chosen[row, :c]
        assert picked.unique().numel() == c and bool((picked < n[row]).all())
        assert (chosen[row, c:] == 0).all()
    # Causal RandomMask through the index sampler: only visible keys, exactly min(k, visible).
    q, k, v = patterns(b=2, h=2, length=40, size=40)
    allowed = support_of(RandomMask(4, seed=2), q, k, v, causal=True)
    visible = causal_allowed(40, 40)
    assert not (allowed & ~visible).any()
    assert torch.equal(allowed.sum(-1)[0, 0], torch.clamp(visible.sum(-1), max=4))


def test_top_scores_matches_topk_with_ties_masks_and_pieces() -> None:
    from hopfield.functional.efficient import top_scores

    gen = torch.Generator().manual_seed(0)
    for width, count in [(1024, 8), (300, 4), (5000, 64), (40, 5)]:
        x = torch.randn(2, 3, 9, width, dtype=D, generator=gen)
        x[0, 0, 0] = -math.inf
        x[0, 0, 0, 5] = 1.0  # a single finite score
        x[0, 0, 1] = 0.5  # all tied
        x[1, 2, 3, width // 3 :] = -math.inf  # padding
        x[1, 1, 1, :: width // count] = 7.0  # ties at the top
        values, idx = top_scores(x, count)
        expected = x.topk(count, dim=-1).values
        assert torch.equal(values.sort(-1).values, expected.sort(-1).values)
        assert torch.equal(x.gather(-1, idx), values)
        assert (idx.sort(-1).values.diff(dim=-1) > 0).all()  # distinct keys


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "padding"])
def test_topk_wide_rows_and_pieces_equal_dense_with_explicit_mask(monkeypatch, causal, mask_kind):
    import hopfield.functional.efficient as efficient

    monkeypatch.setattr(efficient, "_SCORE_PIECE", 600)  # several pieces of queries
    q, k, v = patterns(b=2, h=2, length=50, size=200, e=4, ev=3)
    mask = None
    allowed = causal_allowed(50, 200) if causal else torch.ones(50, 200, dtype=torch.bool)
    if mask_kind == "padding":
        mask = torch.ones(2, 1, 1, 200, dtype=torch.bool)
        mask[1, ..., 150:] = False
        allowed = allowed & mask
    structure = TopK(4, chunk_size=128)  # rows of >= 16 K keys: the group threshold
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            out, weights = structure(
                q,
                k,
                v,
                separation=Softmax(),
                scale=0.7,
                mask=mask,
                causal=causal,
                dropout=0.0,
                return_weights=not grad,
            )
        kept = topk_support(q, k, 0.7, 4, allowed)
        if weights is not None:
            assert torch.equal(weights > 0, kept)
            assert (weights[~kept] == 0).all()
        ref, _ = reference(q, k, v, Softmax(), 0.7, kept)
        if grad:
            assert_same(out, ref, (q, k, v))
        else:
            torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("separation", [Softmax(), Sparsemax()])
@pytest.mark.parametrize("causal", [False, True])
def test_random_mask_recomputed_gradients_equal_explicit(separation, causal) -> None:
    q, k, v = patterns(b=2, h=2, length=30, size=30)
    structure = RandomMask(4, seed=3).eval()  # the same subsets at every call
    allowed = support_of(structure, q, k, v, causal=causal)
    out = associate(q, k, v, separation=separation, structure=structure, causal=causal)
    ref, _ = reference(q, k, v, separation, 1 / math.sqrt(4), allowed)
    assert_same(out, ref, (q, k, v))

    def f(q, k, v):
        return associate(q, k, v, structure=RandomMask(3, seed=0).eval(), causal=causal)

    small = patterns(b=1, h=1, length=8, size=8, e=3, ev=2)
    assert torch.autograd.gradcheck(f, small)


def _random_mask_both_paths(monkeypatch, separation, mask, causal, grad_probe=True):
    """The masked-kernel path and the gathered path of one ``RandomMask`` call (single query block,
    so both draw the same subsets), in float64: outputs and gradients of a random probe."""
    import hopfield.functional.efficient as efficient

    q, k, v = patterns(b=2, h=2, length=9, size=12, e=4, ev=4)
    results = []
    for elements in (efficient._MASKED_KERNEL_ELEMENTS, 0):
        monkeypatch.setattr(efficient, "_MASKED_KERNEL_ELEMENTS", elements)
        structure = RandomMask(4, seed=2, dense_until=None).eval()
        out, _ = structure(
            q, k, v, separation=separation, scale=0.7, mask=mask, causal=causal, dropout=0.0,
            return_weights=False,
        )  # fmt: skip
        probe = torch.linspace(-1, 1, out.numel(), dtype=D).view_as(out)
        grads = torch.autograd.grad((out * probe).sum(), (q, k, v))
        results.append((out, grads))
    return results


@pytest.mark.parametrize("separation", [Softmax(), SoftmaxN(1.0)])
@pytest.mark.parametrize("mask_kind", ["none", "padding", "additive"])
@pytest.mark.parametrize("causal", [False, True])
def test_random_mask_masked_kernel_equals_gathered_path(monkeypatch, separation, mask_kind, causal):
    mask = None
    if mask_kind == "padding":  # batch item 1 sees no key at all: zero rows, finite gradients
        mask = torch.ones(2, 1, 1, 12, dtype=torch.bool)
        mask[1] = False
    elif mask_kind == "additive":
        mask = torch.linspace(-1.5, 0.5, 12, dtype=D).view(1, 1, 1, 12)
    (fast, fast_grads), (gathered, gathered_grads) = _random_mask_both_paths(
        monkeypatch, separation, mask, causal
    )
    torch.testing.assert_close(fast, gathered, rtol=1e-10, atol=1e-12)
    for a, b in zip(fast_grads, gathered_grads, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    if mask_kind == "padding":
        assert (fast[1] == 0).all()


def test_random_mask_masked_kernel_applies_by_size_and_separation(kernel_path) -> None:
    from hopfield.functional.efficient import _masked_kernel_applies

    def applies(size: int, separation=None, grad: bool = False, **kw) -> bool:
        q = torch.zeros(1, 2, 8, 4, requires_grad=grad)
        k = torch.zeros(1, 2, size, 4)
        return _masked_kernel_applies(
            q, k, k, separation or Softmax(), 1.0, kw.get("mask"), kw.get("dropout", 0.0),
            kw.get("return_weights", False), min(64, size),
        )  # fmt: skip

    if kernel_path == "native":  # the gathered kernels beat the masked dense kernel at any size
        assert not applies(2048, grad=True) and not applies(512, grad=True)
        return
    assert applies(2048, grad=True) and not applies(4096, grad=True)  # S <= 32 k
    assert not applies(512)  # without gradients the gathered path serves
    assert not applies(512, Sparsemax(), grad=True)  # only the fused kernels' Softmax_n family
    assert not applies(512, grad=True, dropout=0.1)
    assert not applies(512, grad=True, return_weights=True)
    assert not applies(512, grad=True, mask=torch.zeros(1, 1, 1, 512, requires_grad=True))


def test_random_mask_masked_kernel_samples_by_query_block(monkeypatch, kernel_path) -> None:
    """With a small block budget the masked kernel draws its subsets block by block: every query
    still keeps exactly k allowed keys, and the output is the explicit association on them."""
    if kernel_path == "native":
        pytest.skip("the masked kernel serves only the PyTorch path")
    from hopfield.functional import structures

    captured: list[Tensor] = []
    original = structures.Dense.forward

    def spy(self, q, k, v, **kw):
        captured.append(kw["mask"])
        return original(self, q, k, v, **kw)

    monkeypatch.setattr(structures.Dense, "forward", spy)
    q, k, v = patterns(b=2, h=2, length=13, size=12, e=4, ev=4)
    padding = torch.ones(2, 1, 1, 12, dtype=torch.bool)
    padding[0, ..., 9:] = False
    structure = RandomMask(3, seed=5, max_block_elements=2 * 2 * 12 * 4).eval()  # 4 rows a block
    out, _ = structure(
        q, k, v, separation=Softmax(), scale=0.7, mask=padding, causal=True, dropout=0.0,
        return_weights=False,
    )  # fmt: skip
    (kernel_mask,) = captured
    kept = torch.isfinite(kernel_mask)
    visible = (padding & causal_allowed(13, 12)).expand_as(kept)
    assert not (kept & ~visible).any()
    assert torch.equal(kept.sum(-1), visible.sum(-1).clamp(max=3))
    ref, _ = reference(q, k, v, Softmax(), 0.7, kept)
    assert_same(out, ref, (q, k, v))


def test_product_into_writes_the_workspace_or_falls_back_to_a_fresh_tensor() -> None:
    from hopfield.functional.efficient import _product_into

    q, k = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 6, 5)
    expected = q @ k.transpose(-1, -2)
    workspace = torch.empty(2 * 3 * 4 * 6 + 7)
    out = _product_into(workspace, q, k)
    torch.testing.assert_close(out, expected)
    assert out.data_ptr() == workspace.data_ptr()
    small = torch.empty(10)
    assert _product_into(small, q, k).data_ptr() != small.data_ptr()
    promoted = _product_into(workspace, q.double(), k.double())  # a float32 workspace
    assert promoted.dtype == torch.float64 and promoted.data_ptr() != workspace.data_ptr()
    torch.testing.assert_close(promoted, q.double() @ k.double().transpose(-1, -2))


# ------------------------------------------------------------------------------------------------
# Size dispatch: the dense masked path of Top-K and random masks (issue 31, item 2)
# ------------------------------------------------------------------------------------------------

DISPATCH_STRUCTURES = {
    "topk": lambda until: TopK(3, dense_until=until),
    "topk-fraction": lambda until: TopK(fraction=0.4, dense_until=until),
    "random": lambda until: RandomMask(3, seed=1, dense_until=until).eval(),
    "random-fraction": lambda until: RandomMask(fraction=0.5, seed=1, dense_until=until).eval(),
}


def _dispatch_mask(kind: str) -> Tensor | None:
    """None, a boolean mask with a fully masked row, or an additive mask with -inf entries."""
    gen = torch.Generator().manual_seed(3)
    allowed = torch.rand(2, 1, 9, 12, generator=gen) > 0.3
    allowed[0, :, 4] = False  # a query that sees no key
    if kind == "none":
        return None
    if kind == "bool":
        return allowed
    values = torch.randn(2, 1, 9, 12, dtype=D, generator=gen)
    return values.masked_fill(~allowed, -math.inf)


@pytest.mark.parametrize("separation", [Softmax(), SoftmaxN(1.0), Sparsemax(), Entmax(1.5)])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(DISPATCH_STRUCTURES))
def test_dense_dispatch_equals_gathered_path(dispatch, separation, mask_kind, causal, name):
    """Both sides of the crossover (``dense_until`` above and below S) give the same values and
    gradients in float64, with masks, causal rows and rows that see no key (zeros)."""
    if dispatch == "gathered":
        pytest.skip("the test picks its paths itself")
    q, k, v = patterns(b=2, h=2, length=9, size=12, e=4, ev=4)
    scale = torch.full((2, 1, 1), 0.7, dtype=D, requires_grad=True)
    mask = _dispatch_mask(mask_kind)
    results = []
    for until in (None, 12):
        out = associate(
            q, k, v, separation=separation, structure=DISPATCH_STRUCTURES[name](until),
            scale=scale, mask=mask, causal=causal,
        )  # fmt: skip
        probe = torch.linspace(-1, 1, out.numel(), dtype=D).view_as(out)
        results.append((out, *torch.autograd.grad((out * probe).sum(), (q, k, v, scale))))
    for gathered, dense in zip(*results, strict=True):
        assert torch.isfinite(dense).all()
        torch.testing.assert_close(dense, gathered, rtol=1e-9, atol=1e-11)
    if mask_kind != "none":
        assert (results[1][0][0, :, 4] == 0).all()


@pytest.mark.parametrize("separation", [Softmax(), Sparsemax()])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_topk_path_equals_the_float64_reference(dispatch, separation, causal) -> None:
    """The dense Top-K path against the explicit reference on the oracle's support; weights
    outside the support are exactly 0."""
    q, k, v = patterns(b=2, h=2, length=9, size=12, e=4, ev=4)
    allowed = causal_allowed(9, 12) if causal else None
    support = topk_support(q, k, 0.5, 3, allowed)
    out, weights = associate(
        q, k, v, separation=separation, structure=TopK(3, dense_until=64), scale=0.5,
        causal=causal, return_weights=True,
    )  # fmt: skip
    ref, ref_weights = reference(q, k, v, separation, 0.5, support)
    assert_same(out, ref, (q, k, v))
    assert weights is not None
    assert (weights[~support.expand_as(weights)] == 0).all()
    torch.testing.assert_close(weights, ref_weights, rtol=1e-10, atol=1e-12)


def test_dense_dispatch_applies_with_gradients_below_the_crossover(
    monkeypatch, dispatch, kernel_path
) -> None:
    if dispatch == "gathered":
        pytest.skip("the test picks its paths itself")
    import hopfield.functional.efficient as efficient

    calls: list[int] = []
    original = efficient.dense_with_support
    selected = efficient._SelectedSoftmax.apply

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    def spy_selected(*args):
        calls.append(1)
        return selected(*args)

    # the dense paths: the fused kernel with a support mask, or Softmax_n on the kernels' weights
    # (as for a separation or mask the fused native kernels do not take)
    monkeypatch.setattr(TopK, "_attends_fused", lambda *args: False)
    monkeypatch.setattr(RandomMask, "_attends_fused", lambda *args: False)
    monkeypatch.setattr(efficient, "dense_with_support", spy)
    monkeypatch.setattr(efficient._SelectedSoftmax, "apply", spy_selected)
    q, k, v = patterns(b=1, h=2, length=9, size=12, e=4, ev=4)
    for structure in (TopK(3, dense_until=12), RandomMask(3, seed=0, dense_until=12)):
        associate(q, k, v, structure=structure)  # gradients, S <= dense_until: dense
        assert len(calls) == 1
        with torch.no_grad():  # no gradients: the gathered path or Top-K's dense selection
            associate(q, k, v, structure=structure)
        structure.dense_until = 11  # above the crossover: the gathered path
        if isinstance(structure, TopK) or kernel_path == "native":
            # (without the native kernels random masks with gradients take the masked kernel)
            associate(q, k, v, structure=structure)
        assert len(calls) == 1
        calls.clear()
    small_budget = TopK(3, dense_until=12, max_block_elements=2 * 9 * 12 - 1)
    associate(q, k, v, structure=small_budget)  # the L x S mask exceeds the budget
    assert not calls


@pytest.mark.parametrize("bad", [-1, 2.5, True, "128"])
def test_dense_until_must_be_a_non_negative_int(bad) -> None:
    for make in (lambda: TopK(3, dense_until=bad), lambda: RandomMask(3, dense_until=bad)):
        with pytest.raises(ValueError, match="dense_until"):
            make()


def test_topk_with_one_key_chunk_ranks_it_once(monkeypatch, kernel_path) -> None:
    """Keys that fit one chunk are ranked by one top-K, without a running selection (whose
    per-row state made Top-K at N <= 2048 several times slower)."""
    from hopfield.functional import native

    def refuse(*args, **kwargs):
        raise AssertionError("a running selection for a single chunk")

    monkeypatch.setattr(native, "RunningTopK", refuse)
    q, k, v = patterns(b=1, h=2, length=9, size=40, e=4, ev=4)
    with torch.no_grad():
        out = associate(q, k, v, structure=TopK(3, dense_until=None), scale=0.5)
    ref, _ = reference(q, k, v, Softmax(), 0.5, topk_support(q, k, 0.5, 3))
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("separation", [Softmax(), SoftmaxN(1.0), Sparsemax(), Entmax(1.5)])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("count", [{"k": 3}, {"k": 20}, {"fraction": 0.4}])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_topk_dense_selection_equals_gathered_path_without_gradients(
    monkeypatch, dispatch, kernel_path, separation, mask_kind, causal, count, dtype
) -> None:
    """Without gradients, small problems select on the full score matrix
    (:func:`native.topk_keep`, Softmax_n weighed in the kernel); it keeps the gathered path's keys
    and gives its values, with masks, causal rows, rows that see no key (zeros), a per-query
    scale, ``k`` above the key count and ``fraction``."""
    if dispatch == "gathered" or kernel_path != "native":
        pytest.skip("needs the native kernels; the test picks its paths itself")
    import hopfield.functional.efficient as efficient
    from hopfield.functional import native

    calls: list[int] = []
    original = native.topk_keep

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(efficient.native, "topk_keep", spy)
    q, k, v = (t.to(dtype) for t in patterns(b=2, h=2, length=9, size=12, e=4, ev=4))
    scale = torch.full((2, 1, 1), 0.7, dtype=dtype)
    mask = _dispatch_mask(mask_kind)
    mask = mask.to(dtype) if mask is not None and mask.is_floating_point() else mask
    structure = TopK(**count)
    kwargs = {"separation": separation, "scale": scale, "mask": mask, "causal": causal}
    with torch.no_grad():
        selected = associate(q, k, v, structure=structure, **kwargs)
        assert calls == [1]
        monkeypatch.setattr(TopK, "_selects_densely", lambda *args: False)
        gathered = associate(q, k, v, structure=structure, **kwargs)
    assert calls == [1]
    tolerance = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {}
    torch.testing.assert_close(selected, gathered, **tolerance)
    if mask_kind != "none":
        assert (selected[0, :, 4] == 0).all()


def test_topk_dense_selection_applies_by_size_gradients_and_budget(dispatch, kernel_path) -> None:
    """The dense selections take no-gradient calls up to TOPK_SELECT_UNTIL (random masks:
    RANDOM_MASK_SELECT_UNTIL, without a mask or forced keys) keys whose score matrix fits the
    block budget, without dropout or weights, on the native kernels."""
    if dispatch == "gathered":
        pytest.skip("the test picks its paths itself")
    from hopfield.functional.efficient import RANDOM_MASK_SELECT_UNTIL, TOPK_SELECT_UNTIL

    assert RANDOM_MASK_SELECT_UNTIL == TOPK_SELECT_UNTIL  # the sizes below serve both

    q = torch.randn(1, 2, 6, 8)
    small = torch.randn(1, 2, TOPK_SELECT_UNTIL, 8)
    large = torch.randn(1, 2, TOPK_SELECT_UNTIL + 1, 8)
    structure = TopK(4)
    native_path = kernel_path == "native"
    with torch.no_grad():
        assert structure._selects_densely(q, small, small, 1.0, 0.0, False) == native_path
        assert not structure._selects_densely(q, large, large, 1.0, 0.0, False)
        assert not structure._selects_densely(q, small, small, 1.0, 0.1, False)
        assert not structure._selects_densely(q, small, small, 1.0, 0.0, True)
        tight = TopK(4, max_block_elements=2 * 6 * TOPK_SELECT_UNTIL - 1)
        assert not tight._selects_densely(q, small, small, 1.0, 0.0, False)
    needs_grad = small.clone().requires_grad_()
    assert not structure._selects_densely(q, needs_grad, small, 1.0, 0.0, False)
    sampled = RandomMask(4, seed=0)
    with torch.no_grad():
        assert sampled._samples_densely(q, small, small, 1.0, None, 0.0, False) == native_path
        assert not sampled._samples_densely(q, large, large, 1.0, None, 0.0, False)
        assert not sampled._samples_densely(
            q, small, small, 1.0, torch.ones(6, 1).bool(), 0.0, False
        )
        forced = RandomMask(4, force=torch.tensor(0))
        assert not forced._samples_densely(q, small, small, 1.0, None, 0.0, False)


def _selection_blocks(monkeypatch, blocks: str) -> None:
    """``"one"``: the score matrix in one block; ``"rows"``: two query rows a block."""
    import hopfield.functional.efficient as efficient

    if blocks == "rows":
        monkeypatch.setattr(efficient, "_SELECT_BLOCK", 2 * 2 * 2 * 12)


_FUSED_STRUCTURES = {
    "topk": lambda: TopK(3),
    "topk-fraction": lambda: TopK(fraction=0.5),
    "topk-chunks": lambda: TopK(3, chunk_size=4),
    "topk-above-S": lambda: TopK(40, chunk_size=4),
    "random": lambda: RandomMask(3, seed=5).eval(),
    "random-fraction": lambda: RandomMask(fraction=0.8, seed=5).eval(),
}


def _fused_mask(kind: str, length: int, size: int, dtype: torch.dtype) -> Tensor | None:
    """None; a boolean mask per key ``(2, 1, 1, S)`` (padding: the second sequence keeps its
    first third, the first loses key 1); the same as an additive mask with finite values, whose
    second sequence has no key at all; or a mask per query (not the fused kernels')."""
    gen = torch.Generator().manual_seed(7)
    allowed = torch.ones(2, 1, 1, size, dtype=torch.bool)
    allowed[1, ..., size // 3 :] = False
    allowed[0, ..., 1] = False
    if kind == "none":
        return None
    if kind == "padding":
        return allowed
    if kind == "additive":
        allowed[1] = False
        values = torch.randn(2, 1, 1, size, dtype=dtype, generator=gen)
        return values.masked_fill(~allowed, -math.inf)
    return torch.rand(2, 1, length, size, generator=gen) > 0.3


@pytest.mark.parametrize("name", list(_FUSED_STRUCTURES))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(9, 12), (12, 9), (1, 30)])
@pytest.mark.parametrize("separation", [Softmax(), SoftmaxN(1.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("grads", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "padding", "additive", "per-query"])
def test_fused_kernels_equal_the_gathered_path(
    monkeypatch, dispatch, kernel_path, name, causal, shape, separation, dtype, grads, mask_kind
) -> None:
    """Softmax_n Top-K and random masks run in one fused kernel (:func:`native.topk_attend`,
    :func:`native.sample_attend`; with gradients :class:`_FusedSoftmax`, whose backward is
    :func:`native.attend_backward`) and give the gathered path's association and gradients:
    fixed ``k`` and ``fraction``, several key chunks, ``k > S``, causal rows (with ``L > S``
    some see no key), one query, masks per key (padding, additive, a sequence without keys:
    random masks draw the same subsets on every path). A mask per query takes the other
    paths."""
    if dispatch == "gathered" or kernel_path != "native":
        pytest.skip("needs the native kernels; the test picks its paths itself")
    import hopfield.functional.efficient as efficient

    length, size = shape
    q, k, v = (
        t.detach().to(dtype).requires_grad_(grads)
        for t in patterns(b=2, h=2, length=length, size=size)
    )
    kernel = "topk_attend" if name.startswith("topk") else "sample_attend"
    calls: list[int] = []
    original = getattr(efficient.native, kernel)
    monkeypatch.setattr(
        efficient.native, kernel, lambda *a, **kw: calls.append(1) or original(*a, **kw)
    )
    monkeypatch.setattr(TopK, "_selects_densely", lambda *args: False)
    monkeypatch.setattr(RandomMask, "_samples_densely", lambda *args: False)
    mask = _fused_mask(mask_kind, length, size, dtype)
    kwargs = {"separation": separation, "scale": 0.7, "causal": causal, "mask": mask}
    structure = _FUSED_STRUCTURES[name]()

    def run() -> list[Tensor]:
        with torch.set_grad_enabled(grads):
            out = associate(q, k, v, structure=structure, **kwargs)
        if not grads:
            return [out]
        probe = torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)
        return [out, *torch.autograd.grad((out * probe).sum(), (q, k, v))]

    fused = run()
    if kernel == "topk_attend" and not efficient.native.attention_available(q):
        pytest.skip("no BLAS product found")
    per_query = mask_kind == "per-query" and length > 1  # one query: a mask per key
    assert calls == ([] if per_query else [1])
    for cls in (TopK, RandomMask):  # the gathered path (with gradients: the recomputed one)
        monkeypatch.setattr(cls, "_attends_fused", lambda *args: False)
        monkeypatch.setattr(cls, "_dense_fits", lambda *args: False)
    # float32: two summation orders over up to 64 keys of values ~1 whose weighted sum may be
    # ~0.05 (an ASan build of the kernels, other vector code, differed by 1.8e-6 in one entry)
    tolerance = (1e-5, 1e-5) if dtype == torch.float32 else (1e-10, 1e-12)
    for ours, gathered in zip(fused, run(), strict=True):
        torch.testing.assert_close(ours, gathered, rtol=tolerance[0], atol=tolerance[1])


@pytest.mark.parametrize("name", ["topk", "topk-chunks", "random"])
def test_fused_backward_passes_gradcheck(dispatch, kernel_path, name) -> None:
    """The fused kernels' hand backward (:func:`native.attend_backward`) matches finite
    differences in float64 (distinct scores: the support does not move)."""
    if dispatch == "gathered" or kernel_path != "native":
        pytest.skip("needs the native kernels")
    q, k, v = (t[:1, :2, :6].detach().clone().requires_grad_() for t in patterns(size=7))
    structure = _FUSED_STRUCTURES[name]()

    def fn(*inputs: Tensor) -> Tensor:
        return associate(*inputs, separation=SoftmaxN(1.0), structure=structure, scale=0.7)

    assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.parametrize("blocks", ["one", "rows"])
@pytest.mark.parametrize("mask_kind", ["none", "additive"])
def test_topk_dense_selection_in_query_blocks_equals_gathered_path(
    monkeypatch, dispatch, kernel_path, blocks, mask_kind
) -> None:
    if dispatch == "gathered" or kernel_path != "native":
        pytest.skip("needs the native kernels; the test picks its paths itself")
    _selection_blocks(monkeypatch, blocks)
    q, k, v = patterns(b=2, h=2, length=9, size=12, e=4, ev=4)
    scale = torch.linspace(0.5, 1.5, 9, dtype=D).view(1, 1, 9, 1)  # one scale per query
    kwargs = {"scale": scale, "mask": _dispatch_mask(mask_kind), "causal": True}
    with torch.no_grad():
        selected = associate(q, k, v, structure=TopK(fraction=0.5), **kwargs)
        monkeypatch.setattr(TopK, "_selects_densely", lambda *args: False)
        gathered = associate(q, k, v, structure=TopK(fraction=0.5), **kwargs)
    torch.testing.assert_close(selected, gathered, rtol=1e-10, atol=1e-12)


def _sampled_weights(structure, q, k, separation, causal, dtype=D) -> Tensor:
    """The weights of a no-gradient random-mask association, read off with ``v = I``."""
    size = k.shape[-2]
    eye = torch.eye(size, dtype=dtype).expand(*k.shape[:-2], size, size)
    with torch.no_grad():
        return associate(q, k, eye, separation=separation, structure=structure, causal=causal)


def _random_mask_path(monkeypatch, path: str) -> list[int]:
    """Route no-gradient random masks through the dense sampling kernel
    (:func:`native.sample_keep`, ``"dense"``) or the fused one (:func:`native.sample_attend`,
    ``"fused"``); returns the list that records the chosen kernel's calls."""
    import hopfield.functional.efficient as efficient

    if path == "dense":
        monkeypatch.setattr(RandomMask, "_attends_fused", lambda *args: False)
    name = "sample_keep" if path == "dense" else "sample_attend"
    calls: list[int] = []
    original = getattr(efficient.native, name)
    monkeypatch.setattr(
        efficient.native, name, lambda *a, **kw: calls.append(1) or original(*a, **kw)
    )
    return calls


@pytest.mark.parametrize("separation", [Softmax(), SoftmaxN(1.0), Sparsemax()])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("blocks", ["one", "rows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("path", ["dense", "fused"])
def test_random_mask_dense_sampling_keeps_k_allowed_keys_and_weighs_them(
    monkeypatch, dispatch, kernel_path, separation, causal, blocks, dtype, path
) -> None:
    """Without gradients, random masks draw each query's subset in a kernel (on the full
    scores, :func:`native.sample_keep`, or fused, :func:`native.sample_attend`, for Softmax_n):
    exactly ``min(k, visible)`` keys among those the causal rule lets it see, weighed by the
    separation over their scores (float64 reference)."""
    if dispatch == "gathered" or kernel_path != "native":
        pytest.skip("needs the native kernels; the test picks its paths itself")
    if path == "fused" and (isinstance(separation, Sparsemax) or blocks == "rows"):
        pytest.skip("the fused kernel is Softmax_n's and has no query blocks")
    _selection_blocks(monkeypatch, blocks)
    calls = _random_mask_path(monkeypatch, path)
    q, k, _ = (t.to(dtype) for t in patterns(b=2, h=2, length=9, size=12, e=4, ev=4))
    weights = _sampled_weights(RandomMask(5, seed=0), q, k, separation, causal, dtype).double()
    assert calls
    support = weights != 0
    visible = causal_allowed(9, 12) if causal else torch.ones(9, 12, dtype=torch.bool)
    assert not (support & ~visible).any()
    if not isinstance(separation, Sparsemax):  # sparsemax may zero a kept key
        expected = visible.sum(-1).clamp(max=5)
        assert torch.equal(support.sum(-1), expected.expand_as(support[..., 0]))
        # the weights are the separation's over the kept scores
        scores = (q.double() @ k.double().transpose(-1, -2)) * 0.5
        ref = separation(scores.masked_fill(~support, -math.inf))
        torch.testing.assert_close(weights, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("path", ["dense", "fused"])
def test_random_mask_dense_sampling_is_uniform_seeded_and_thread_independent(
    monkeypatch, dispatch, kernel_path, path
) -> None:
    """Every visible key is kept with probability k / visible (a 6-sigma band over 2,000 calls'
    worth of rows); a seeded structure repeats its subsets after re-seeding, whatever the
    threads; evaluation ("fixed") repeats them call after call; training draws fresh ones (the
    dense and the fused sampling kernels)."""
    if dispatch == "gathered" or kernel_path != "native":
        pytest.skip("needs the native kernels; the test picks its paths itself")
    calls = _random_mask_path(monkeypatch, path)
    q, k, _ = patterns(b=50, h=4, length=9, size=12, e=4, ev=4)
    weights = _sampled_weights(RandomMask(3, seed=1), q, k, Softmax(), True)
    visible = causal_allowed(9, 12).sum(-1).double()  # 4 ... 12 keys
    rate = (weights != 0).double().mean(dim=(0, 1))  # (9, 12): 200 rows per entry
    expected = (3 / visible).clamp(max=1).unsqueeze(-1).expand(9, 12)
    band = 6 * (expected * (1 - expected) / 200).sqrt() + 1e-12
    allowed = causal_allowed(9, 12)
    assert ((rate - expected).abs()[allowed] <= band[allowed]).all()
    assert (rate[~allowed] == 0).all()
    first = _sampled_weights(RandomMask(3, seed=7), q, k, Softmax(), False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if threads > 1 else 2)
    try:
        again = _sampled_weights(RandomMask(3, seed=7), q, k, Softmax(), False)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(first, again)
    training = RandomMask(3, seed=7)
    assert not torch.equal(
        _sampled_weights(training, q, k, Softmax(), False),
        _sampled_weights(training, q, k, Softmax(), False),
    )
    fixed = RandomMask(3, seed=7).eval()
    assert torch.equal(
        _sampled_weights(fixed, q, k, Softmax(), False),
        _sampled_weights(fixed, q, k, Softmax(), False),
    )
    assert calls


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("count", [{"k": 3}, {"fraction": 0.8}])
@pytest.mark.parametrize("mask_kind", ["none", "padding"])
def test_random_mask_paths_and_query_blocks_draw_the_same_subsets(
    monkeypatch, dispatch, kernel_path, causal, count, mask_kind
) -> None:
    """On the native kernels a call's subsets come from its streams: the fused kernel, the
    dense sampling, the gathered path in one block and in blocks of two queries give the same
    association, also under a padding mask (the draws among each sequence's allowed keys)."""
    if dispatch == "gathered" or kernel_path != "native":
        pytest.skip("needs the native kernels; the test picks its paths itself")
    q, k, v = patterns(b=2, h=2, length=9, size=12, e=4, ev=4)
    outs = []
    with torch.no_grad():
        for path in ("fused", "dense", "gathered", "blocks"):
            if path != "fused":
                monkeypatch.setattr(RandomMask, "_attends_fused", lambda *args: False)
            if path not in ("fused", "dense"):
                monkeypatch.setattr(RandomMask, "_samples_densely", lambda *args: False)
            budget = 2 * 2 * 2 * 12 if path == "blocks" else 1 << 23
            structure = RandomMask(**count, seed=4, max_block_elements=budget)
            mask = _fused_mask(mask_kind, 9, 12, D)
            outs.append(associate(q, k, v, structure=structure, causal=causal, mask=mask))
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("separation", [Softmax(), Sparsemax()])
def test_random_mask_under_a_mask_broadcast_over_keys(dispatch, kernel_path, separation) -> None:
    """A mask ``(B, 1, 1, 1)`` (one flag a sequence, broadcast over the keys): the masked
    sequence gives zeros, and the allowed one the subsets of the unmasked call (on the native
    kernels the draws among all keys are the unmasked draws), on the fused and gathered paths."""
    q, k, v = patterns(b=2, h=2, length=9, size=12, e=4, ev=4)
    mask = torch.tensor([True, False]).view(2, 1, 1, 1)
    with torch.no_grad():
        masked = associate(
            q, k, v, separation=separation, structure=RandomMask(3, seed=6), mask=mask
        )
        plain = associate(q, k, v, separation=separation, structure=RandomMask(3, seed=6))
    assert not masked[1].any()
    if kernel_path == "native":
        torch.testing.assert_close(masked[0], plain[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("make", [lambda: TopK(3), lambda: RandomMask(3, seed=2).eval()])
def test_dense_selections_under_cpu_autocast_compute_in_float32(dispatch, kernel_path, make):
    """Inside ``torch.autocast("cpu", bfloat16)`` (the bf16 training presets) the selections on
    the full score matrix keep their products in float32 and give the float32 result."""
    q, k, v = (t.float().detach() for t in patterns(b=2, h=2, length=9, size=12, e=4, ev=4))
    structure = make()
    with torch.no_grad():
        plain = associate(q, k, v, structure=structure)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = associate(q, k, v, structure=structure)
    torch.testing.assert_close(mixed.float(), plain, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("separation", [Softmax(), SoftmaxN(1.0)])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(DISPATCH_STRUCTURES))
def test_selected_softmax_with_gradients_equals_gathered_path(
    monkeypatch, dispatch, kernel_path, separation, mask_kind, causal, name
):
    """With gradients, a number β and Softmax_n, the dense paths weigh the kernels' support and
    differentiate by hand (``_SelectedSoftmax``): values and gradients of q, k, v equal the
    gathered path's in float64 (rows that see no key: zeros), and its backward passes
    gradcheck."""
    if dispatch == "gathered" or kernel_path != "native":
        pytest.skip("needs the native kernels; the test picks its paths itself")
    import hopfield.functional.efficient as efficient

    calls: list[int] = []
    selected = efficient._SelectedSoftmax.apply
    monkeypatch.setattr(
        efficient._SelectedSoftmax, "apply", lambda *a: calls.append(1) or selected(*a)
    )
    # without a mask the fused kernels would take these (see the fused tests)
    monkeypatch.setattr(TopK, "_attends_fused", lambda *args: False)
    monkeypatch.setattr(RandomMask, "_attends_fused", lambda *args: False)
    q, k, v = patterns(b=2, h=2, length=9, size=12, e=4, ev=4)
    mask = _dispatch_mask(mask_kind)
    results = []
    for until in (None, 12):
        out = associate(
            q, k, v, separation=separation, structure=DISPATCH_STRUCTURES[name](until),
            scale=0.7, mask=mask, causal=causal,
        )  # fmt: skip
        probe = torch.linspace(-1, 1, out.numel(), dtype=D).view_as(out)
        results.append((out, *torch.autograd.grad((out * probe).sum(), (q, k, v))))
    random_with_mask = name.startswith("random") and mask is not None  # the masked kernel
    assert calls == ([] if random_with_mask else [1])
    for gathered, dense in zip(*results, strict=True):
        assert torch.isfinite(dense).all()
        torch.testing.assert_close(dense, gathered, rtol=1e-9, atol=1e-11)
    if random_with_mask or mask_kind == "additive" or causal:
        return
    small = tuple(t[:1, :1, :5].detach().clone().requires_grad_() for t in (q, k, v))
    structure = DISPATCH_STRUCTURES[name](12)

    def fn(*inputs: Tensor) -> Tensor:
        return associate(*inputs, separation=separation, structure=structure, scale=0.7)

    assert torch.autograd.gradcheck(fn, small)


def test_fused_kernels_step_aside_for_dispatch_modes(monkeypatch, dispatch, kernel_path) -> None:
    """Inside a dispatch mode (a FLOP counter, the plan's measurement) the association runs
    PyTorch operations that the mode sees (the fused kernels' products would go uncounted), and
    gives the same result."""
    from torch.utils.flop_counter import FlopCounterMode

    import hopfield.functional.efficient as efficient

    calls: list[str] = []
    for name in ("topk_attend", "sample_attend"):
        original = getattr(efficient.native, name)
        monkeypatch.setattr(
            efficient.native,
            name,
            lambda *a, _f=original, _n=name, **kw: calls.append(_n) or _f(*a, **kw),
        )
    q, k, v = (t.detach() for t in patterns(b=1, h=2, length=9, size=12, e=4, ev=4))
    outside = []
    for structure in (TopK(3), RandomMask(3, seed=0).eval()):
        with FlopCounterMode(display=False) as counter:
            counted = associate(q, k, v, structure=structure)
        assert not calls
        assert counter.get_total_flops() > 0
        torch.testing.assert_close(counted, associate(q, k, v, structure=structure))
        outside += calls
        calls.clear()
    if kernel_path == "native" and dispatch == "default":
        assert outside == ["topk_attend", "sample_attend"]  # outside the mode: the kernels

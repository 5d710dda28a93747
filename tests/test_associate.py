"""associate(): the fused path against the explicit reference path, masks, scale, validation."""

from __future__ import annotations

import math
from types import ModuleType

import pytest
import torch
from torch.autograd import gradcheck

from hopfield.functional import (
    ClippedSoftmax,
    Entmax,
    RandomFeatures,
    RandomMask,
    Separation,
    Sink,
    Softmax,
    SoftmaxN,
    Sparsemax,
    TopK,
    associate,
    causal_mask,
    efficient,
    structures,
)
from hopfield.functional.associate import normalize_mask
from hopfield.functional.structures import Dense

B, H, L, S, E, EV = 2, 3, 5, 7, 4, 6


def patterns(
    length: int = L, size: int = S, dtype: torch.dtype = torch.float64, value_size: int = EV
) -> tuple[torch.Tensor, ...]:
    return (
        torch.randn(B, H, length, E, dtype=dtype),
        torch.randn(B, H, size, E, dtype=dtype),
        torch.randn(B, H, size, value_size, dtype=dtype),
    )


def reference(q, k, v, sep: Separation, scale, allowed: torch.Tensor | None):  # type: ignore[no-untyped-def]
    """Written out by hand: scores, -inf outside the allowed set, separation, weighted sum."""
    scores = scale * torch.einsum("bhle,bhse->bhls", q, k)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    return torch.einsum("bhls,bhsv->bhlv", sep(scores), v)


def mask_kinds() -> dict[str, tuple[torch.Tensor | None, torch.Tensor | None, bool]]:
    """name -> (mask passed to associate, equivalent boolean 'allowed' mask, causal)."""
    padding = torch.ones(B, 1, 1, S, dtype=torch.bool)
    padding[0, ..., 4:] = False
    random = torch.rand(B, H, L, S) > 0.3
    full_row = random.clone()
    full_row[1, 2, 3] = False
    additive = torch.zeros(L, S, dtype=torch.float64).masked_fill(~random[0, 0], -math.inf)
    causal = causal_mask(L, S)
    return {
        "none": (None, None, False),
        "key_padding": (padding, padding, False),
        "bool_2d": (random[0, 0], random[0, 0], False),
        "bool_4d": (random, random, False),
        "fully_masked_row": (full_row, full_row, False),
        "additive": (additive, random[0, 0], False),
        "causal": (None, causal, True),
        "causal_and_padding": (padding, padding & causal, True),
    }


SEPARATIONS = [
    Softmax(),
    SoftmaxN(1),
    SoftmaxN(2),
    SoftmaxN(0.5),
    Sparsemax(),
    ClippedSoftmax(-0.1, 1.1),
]


@pytest.mark.parametrize("value_size", [E, EV], ids=["flash-lse", "sdpa-or-explicit"])
@pytest.mark.parametrize("sep", SEPARATIONS, ids=lambda s: repr(s))
@pytest.mark.parametrize("kind", list(mask_kinds()))
def test_fast_path_equals_reference_values_and_gradients(
    sep: Separation, kind: str, value_size: int
) -> None:
    mask, allowed, causal = mask_kinds()[kind]
    q, k, v = (t.requires_grad_(True) for t in patterns(value_size=value_size))
    out = associate(q, k, v, separation=sep, mask=mask, causal=causal)
    expected = reference(q, k, v, sep, 1 / math.sqrt(E), allowed)
    assert isinstance(out, torch.Tensor)
    assert not torch.isnan(out).any()
    assert torch.allclose(out, expected, atol=1e-12)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
    grads_ref = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    for g, r in zip(grads, grads_ref, strict=True):
        assert torch.allclose(g, r, atol=1e-10)


@pytest.mark.parametrize("on_device", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("n", [0, 1, 2])
@pytest.mark.parametrize("kind", list(mask_kinds()))
def test_zero_key_sdpa_fallback_equals_reference(
    n: int, kind: str, on_device: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path used off the CPU or with dropout: n zero keys appended to fused SDPA (on a
    device, where reading the mask would synchronise, a masked softmax always gets the zero key
    that only fully masked rows see)."""
    monkeypatch.setattr(structures, "reading_waits", lambda tensor: on_device)
    mask, allowed, causal = mask_kinds()[kind]
    q, k, v = (t.requires_grad_(True) for t in patterns(value_size=E))
    normalized = normalize_mask(mask, q, k)
    out = Dense._fused(q, k, v, n, 1 / math.sqrt(E), normalized, causal, 0.0)
    expected = reference(q, k, v, SoftmaxN(n), 1 / math.sqrt(E), allowed)
    assert torch.allclose(out, expected, atol=1e-12)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    for g, r in zip(grads, torch.autograd.grad(expected.sum(), (q, k, v)), strict=True):
        assert torch.allclose(g, r, atol=1e-10)


@pytest.mark.parametrize("n", [0.0, 1.0, 0.3])
def test_gradcheck_flash_softmax_n(n: float) -> None:
    q, k, v = (t[:1, :2, :4].clone().requires_grad_(True) for t in patterns(value_size=E))
    keep = torch.rand(1, 1, 4, 4) > 0.3
    assert gradcheck(
        lambda a, b, c: associate(a, b, c, separation=SoftmaxN(n), mask=keep, causal=True),
        (q, k, v),
    )


def test_fully_masked_rows_give_zero_output_and_finite_gradients() -> None:
    blocked = torch.zeros(B, 1, L, S, dtype=torch.bool)
    for sep, value_size in ((Softmax(), E), (SoftmaxN(1), E), (Softmax(), EV), (Sparsemax(), EV)):
        q, k, v = (t.requires_grad_(True) for t in patterns(value_size=value_size))
        out = associate(q, k, v, separation=sep, mask=blocked)
        assert isinstance(out, torch.Tensor)
        assert torch.equal(out, torch.zeros_like(out))
        out.sum().backward()
        assert q.grad is not None and bool(torch.isfinite(q.grad).all())


def test_return_weights_rows_sum_as_the_map_says() -> None:
    q, k, v = patterns()
    _, w = associate(q, k, v, return_weights=True)
    assert w is not None and w.shape == (B, H, L, S)
    assert torch.allclose(w.sum(-1), torch.ones(B, H, L, dtype=w.dtype))
    _, w1 = associate(q, k, v, separation=SoftmaxN(1), return_weights=True)
    assert w1 is not None and bool((w1.sum(-1) < 1).all())


def test_per_head_and_learnable_scale() -> None:
    q, k, v = patterns()
    scale = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    for sep in (Softmax(), SoftmaxN(1), Sparsemax()):
        out = associate(q, k, v, separation=sep, scale=scale)
        assert isinstance(out, torch.Tensor)
        for h in range(H):
            expected = reference(
                q[:, h : h + 1],
                k[:, h : h + 1],
                v[:, h : h + 1],
                sep,
                float(scale[h].detach()),
                None,
            )
            assert torch.allclose(out[:, h : h + 1], expected, atol=1e-12)
        out.sum().backward()
        assert scale.grad is not None and bool((scale.grad != 0).all())
        scale.grad = None


def test_gradcheck_through_fused_and_explicit_paths() -> None:
    q, k, v = (t[:1, :2, :3].clone().requires_grad_(True) for t in patterns())
    keep = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    keep[..., 0, 1:] = False
    for sep in (Softmax(), SoftmaxN(1), Sparsemax(), Entmax(1.5)):
        assert gradcheck(
            lambda a, b, c, sep=sep: associate(a, b, c, separation=sep, mask=keep), (q, k, v)
        )


def test_dropout_only_in_training() -> None:
    q, k, v = patterns()
    clean = associate(q, k, v)
    assert torch.equal(associate(q, k, v, dropout=0.5, training=False), clean)  # type: ignore[arg-type]
    assert not torch.allclose(associate(q, k, v, dropout=0.5), clean)  # type: ignore[arg-type]


def test_half_precision_and_extreme_scores_stay_finite() -> None:
    q, k, v = patterns(dtype=torch.float32)
    for sep in (Softmax(), SoftmaxN(1), Sparsemax()):
        out = associate(q * 1e3, k * 1e3, v, separation=sep)
        assert isinstance(out, torch.Tensor) and bool(torch.isfinite(out).all())
        half = associate(q.bfloat16(), k.bfloat16(), v.bfloat16(), separation=sep)
        assert isinstance(half, torch.Tensor) and half.dtype == torch.bfloat16
        assert bool(torch.isfinite(half).all())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"q": torch.randn(2, 3, 4)}, ValueError, "q must be 4-D"),
        ({"k": torch.randn(B, H, S, E + 1)}, ValueError, "pattern size E"),
        ({"v": torch.randn(B, H, S + 1, EV)}, ValueError, "same number of memories"),
        ({"v": torch.randn(B, H + 1, S, EV)}, ValueError, "share \\(B, H\\)"),
        ({"mask": torch.ones(3, 3, dtype=torch.bool)}, ValueError, "mask of shape"),
        ({"mask": torch.ones(L, S, dtype=torch.long)}, TypeError, "mask must be boolean"),
        ({"scale": torch.ones(H + 1)}, ValueError, "scale must be"),
        ({"separation": "softmax"}, TypeError, "separation must be a Separation"),
        ({"structure": Softmax()}, TypeError, "structure must be a Structure"),
        ({"dropout": 1.5}, ValueError, "dropout must lie"),
        ({"q": torch.randn(B, H, L, E, dtype=torch.float64)}, TypeError, "share a dtype"),
    ],
)
def test_bad_input_raises_clear_errors(kwargs: dict, error: type, match: str) -> None:
    q, k, v = patterns(dtype=torch.float32)
    args = {"q": q, "k": k, "v": v, **kwargs}
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(error, match=match):
        associate(q, k, v, **args)


@pytest.fixture
def split_keys(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Small key parts and four threads, so that small problems take the split-key flash path."""
    monkeypatch.setattr(structures, "KEYS_PER_PART", 4)
    threads = torch.get_num_threads()
    torch.set_num_threads(4)
    yield structures
    torch.set_num_threads(threads)


def _assert_flash_path_is_the_reference(
    structures: ModuleType,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sep: Separation,
    scale: float,
) -> None:
    """``associate``'s values and gradients, and ``flash_attention``'s lse, equal the float64
    reference for these patterns (whichever flash path they take)."""
    out = associate(q, k, v, separation=sep)
    expected = reference(q, k, v, sep, scale, None)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
    grads_ref = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    for g, r in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, r, atol=1e-10, rtol=1e-10)
    _, lse = structures.flash_attention(q, k, v, None, False, scale)
    scores = torch.einsum("bhle,bhse->bhls", q, k) * scale
    torch.testing.assert_close(lse, scores.logsumexp(-1), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize(
    "shape", [(1, 1, 5, 37), (1, 2, 3, 40), (2, 1, 4, 33)], ids=["one-head", "two-heads", "batch"]
)
@pytest.mark.parametrize("sep", [Softmax(), SoftmaxN(1), SoftmaxN(0.5)], ids=repr)
def test_split_key_flash_equals_reference_values_and_gradients(
    split_keys, shape: tuple[int, int, int, int], sep: Separation
) -> None:
    """Fewer batch-heads than threads: the keys run as parts (with a remainder part where they
    do not divide) merged by their log-sum-exps; values, lse and gradients are the reference's."""
    batch, heads, length, size = shape
    q, k, v = (
        torch.randn(batch, heads, n, E, dtype=torch.float64).requires_grad_(True)
        for n in (length, size, size)
    )
    parts = split_keys._key_parts(q, k, None, False)
    assert parts >= 2
    _assert_flash_path_is_the_reference(split_keys, q, k, v, sep, 1 / math.sqrt(E))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_split_key_flash_in_low_precision_matches_the_whole_call(split_keys, dtype) -> None:  # type: ignore[no-untyped-def]
    q, k, v = (torch.randn(1, 1, n, E, dtype=dtype) for n in (6, 50, 50))
    split = associate(q, k, v)
    split_keys.KEYS_PER_PART = 10**9  # one part: the kernel's own call
    whole = associate(q, k, v)
    assert isinstance(split, torch.Tensor) and isinstance(whole, torch.Tensor)
    assert split.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(split.float(), whole.float(), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("sep", [Softmax(), SoftmaxN(1)], ids=repr)
def test_many_wide_queries_take_whole_products_with_reference_values_and_gradients(
    sep: Separation,
) -> None:
    """Between 96 and 767 queries no wider than their patterns, the scores are computed whole;
    values, lse and the kernel backward's gradients from them are the reference's."""
    from hopfield.functional import structures

    length, size, width = 100, 300, 128
    q, k, v = (
        torch.randn(1, 2, n, width, dtype=torch.float64).requires_grad_(True)
        for n in (length, size, size)
    )
    assert structures._by_products(q, k, None, False)
    _assert_flash_path_is_the_reference(structures, q, k, v, sep, 1 / math.sqrt(width))


def test_whole_products_in_float32_match_the_kernels_own_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hopfield.functional import structures

    q, k, v = (torch.randn(2, 1, n, 100) for n in (100, 500, 500))
    assert structures._by_products(q, k, None, False)
    whole, whole_lse = structures.flash_attention(q, k, v, None, False, 0.1)
    monkeypatch.setattr(structures, "PRODUCT_QUERIES", range(0))
    kernel, kernel_lse = structures.flash_attention(q, k, v, None, False, 0.1)
    torch.testing.assert_close(whole, kernel, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(whole_lse, kernel_lse, atol=1e-5, rtol=1e-5)


def test_scores_are_computed_whole_only_where_they_are_no_larger_than_the_keys() -> None:
    """Not below 96 or from 768 queries, not for queries wider than their patterns, with a
    mask, causal, in half precision or without keys."""
    from hopfield.functional import structures

    def whole(
        length: int,
        width: int = 800,
        size: int = 50,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> bool:
        q = torch.randn(1, 1, length, width, dtype=dtype)
        k = torch.randn(1, 1, size, width, dtype=dtype)
        return structures._by_products(q, k, mask, causal)

    assert whole(96) and whole(767) and whole(100, width=100)
    assert not whole(95) and not whole(768) and not whole(100, width=99)
    assert not whole(100, mask=torch.zeros(1, 1, 1, 50))
    assert not whole(100, causal=True)
    assert not whole(100, dtype=torch.bfloat16)
    assert not whole(100, size=0)
    shared = torch.randn(1, 1, 50, 800).expand(16, 1, 50, 800)  # one memory for 16 batches
    assert structures._by_products(torch.randn(8, 1, 100, 800), shared[:8], None, False)
    assert not structures._by_products(torch.randn(16, 1, 100, 800), shared, None, False)


def test_keys_are_split_only_where_it_balances_the_threads(split_keys) -> None:  # type: ignore[no-untyped-def]
    """No split with a mask, causal association, as many batch-heads as threads, too few keys,
    or several heads whose keys do not divide into views."""
    q, k = torch.randn(1, 1, 3, E), torch.randn(1, 1, 40, E)
    assert split_keys._key_parts(q, k, None, False) == 4
    assert split_keys._key_parts(q, k, torch.ones(1, 1, 3, 40, dtype=torch.bool), False) == 1
    assert split_keys._key_parts(q, k, None, True) == 1
    assert split_keys._key_parts(torch.randn(4, 1, 3, E), k, None, False) == 1
    assert split_keys._key_parts(q, torch.randn(1, 1, 7, E), None, False) == 1
    assert split_keys._key_parts(q[:0], k[:0], None, False) == 1  # an empty batch
    assert split_keys._key_parts(torch.randn(1, 2, 3, E), torch.randn(1, 2, 7, E), None, False) == 1
    two = torch.randn(1, 2, 3, E)
    assert split_keys._key_parts(two, torch.randn(1, 2, 40, E), None, False) == 2
    assert split_keys._key_parts(two, torch.randn(1, 2, 41, E), None, False) == 1


_KEPT_STRUCTURES = {
    "topk": lambda: TopK(2),
    "random": lambda: RandomMask(2, seed=0).eval(),  # one mask for every call
    "random-features": lambda: RandomFeatures(8, seed=0),
}


@pytest.mark.parametrize("scale", [None, 1.0])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(_KEPT_STRUCTURES))
def test_a_structure_first_called_under_inference_mode_gives_gradients_later(
    name: str, causal: bool, scale: float | None
) -> None:
    """What a structure keeps from one call to the next (Top-K's and random masks' per-query
    counts, the random-feature projection drawn on first use) is an ordinary tensor even when
    the first call ran under ``torch.inference_mode``: a later call with gradients can save it
    for the backward, and gives the values and gradients of a structure never run that way."""
    efficient._query_counts.cache_clear()  # a count kept by another test would hide the case
    q, k, v = patterns(length=13, size=11, dtype=torch.float32)  # the projection's dtype
    results = []
    for first_in_inference in (True, False):
        structure = _KEPT_STRUCTURES[name]()
        if first_in_inference:
            with torch.inference_mode():
                associate(q, k, v, structure=structure, causal=causal, scale=scale)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = associate(*leaves, structure=structure, causal=causal, scale=scale)
        assert isinstance(out, torch.Tensor)
        results.append((out.detach(), *torch.autograd.grad(out.sum(), leaves)))
    for kept, fresh in zip(*results, strict=True):
        torch.testing.assert_close(kept, fresh, rtol=0, atol=0)


def _feature_major(x: torch.Tensor, layout: str) -> torch.Tensor:
    """``x (..., N, E)`` stored another way, with the same values: ``"transposed"`` as an
    ``(..., E, N)`` tensor transposed (feature-major: the last dimension has stride ``N``),
    ``"strided"`` every other column of one twice as wide (stride 2)."""
    if layout == "transposed":
        return x.transpose(-2, -1).contiguous().transpose(-2, -1)
    wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
    wide[..., ::2] = x
    return wide[..., ::2]


@pytest.mark.parametrize("layout", ["transposed", "strided"])
@pytest.mark.parametrize("role", ["q", "k", "v"])
@pytest.mark.parametrize("kind", ["none", "key_padding", "causal"])
@pytest.mark.parametrize(
    "make",
    [Softmax, lambda: SoftmaxN(1), lambda: Sink(0.5, learnable=True, heads=H, value=E)],
    ids=["softmax", "softmax1", "learnable-sink"],
)
@pytest.mark.parametrize("split", [False, True], ids=["whole", "split-keys"])
def test_inputs_stored_feature_major_give_the_answers_of_contiguous_ones(
    request: pytest.FixtureRequest,
    make,
    split: bool,
    kind: str,
    role: str,
    layout: str,  # type: ignore[no-untyped-def]
) -> None:
    """q, k or v whose last dimension is not stored with stride 1 (keys kept feature-major, a
    slice of every other column) give the values and gradients of the same inputs stored
    contiguously; the CPU flash kernels, called directly, read such rows wrongly (before 29
    Nov: outputs off by 1.6 and wrong gradients, silently)."""
    if split:
        request.getfixturevalue("split_keys")
    mask, _, causal = mask_kinds()[kind]
    torch.manual_seed(0)
    separation = make()
    contiguous = [t.requires_grad_(True) for t in patterns(value_size=E)]
    stored = {"q": 0, "k": 1, "v": 2}[role]
    inputs = list(contiguous)
    inputs[stored] = _feature_major(contiguous[stored].detach(), layout).requires_grad_(True)
    assert inputs[stored].stride(-1) != 1
    outs = [
        associate(*args, separation=separation, mask=mask, causal=causal)
        for args in (inputs, contiguous)
    ]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-12)
    cotangent = torch.randn_like(outs[0])
    got = torch.autograd.grad(outs[0], inputs, cotangent)
    want = torch.autograd.grad(outs[1], contiguous, cotangent)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)

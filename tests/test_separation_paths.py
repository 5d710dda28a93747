"""The fast threshold paths of sparsemax / entmax: partial sort (torch.topk) with retries, full
sort and Newton, against each other, the float64 oracles and gradcheck, on rows long enough that
the partial sort is taken (the first k is 16 for sparsemax, 64 for 1.5-entmax)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from torch import Tensor
from torch.autograd import gradcheck

from hopfield.functional import Entmax, Sparsemax, entmax
from hopfield.functional import separation as sep_module
from hopfield.plan import measure_step
from oracles import ref_entmax, ref_masked, ref_sparsemax

INF = math.inf


def mixed_rows(rows: int, keys: int, dtype: torch.dtype, seed: int = 0) -> Tensor:
    """Rows with small and large supports (scales 0.01 to 10), masked entries, a fully masked
    row, ties and a row with a single key."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-2, 1, rows, dtype=dtype)[:, None]
    z = torch.randn(rows, keys, generator=gen, dtype=dtype) * scale
    z[1, ::3] = -INF
    z[2] = -INF
    z[3, 1:] = -INF
    z[4] = 0.5  # all tied: support = the whole row
    z[5, :40] = 2.0  # a tied block at the top
    return z


def forward_backward(
    fn: Callable[[Tensor, Tensor | float], Tensor], z: Tensor, alpha: Tensor | float
) -> tuple[Tensor, ...]:
    z = z.clone().requires_grad_(True)
    a = alpha.clone().requires_grad_(True) if isinstance(alpha, Tensor) else alpha
    out = fn(z, a)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=z.dtype)
    out.backward(upstream)
    assert z.grad is not None
    grads = (z.grad,) if not isinstance(a, Tensor) else (z.grad, a.grad)
    return (out.detach(), *(g for g in grads if g is not None))


@pytest.fixture
def whole_rows(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """Make every threshold use the whole row (full sort, or Newton on the unsorted row)."""

    def use() -> None:
        monkeypatch.setattr(sep_module, "_first_k", lambda k, size: size)

    yield use


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", [2.0, 1.5])
@pytest.mark.parametrize("first_k", [None, 1, 3])
def test_partial_sort_equals_full_sort(
    whole_rows: Callable[[], None],
    monkeypatch: pytest.MonkeyPatch,
    dtype: torch.dtype,
    alpha: float,
    first_k: int | None,
) -> None:
    """Exactly where the partial sorts complete (the same prefix sums of the same sorted
    values); to rounding where a row's support looks too large for the next partial sort and
    Newton's method takes the whole row (:func:`separation._flat`)."""
    # first_k 1 or 3: almost every row is retried (k -> 8k -> 64k -> the whole row)
    z = mixed_rows(64, 700, dtype)
    if first_k is not None:
        monkeypatch.setattr(sep_module, "_FIRST_K_SPARSEMAX", first_k)
        monkeypatch.setattr(sep_module, "_FIRST_K_ENTMAX15", first_k)
    fast = forward_backward(entmax, z, alpha)
    with monkeypatch.context() as sorts_only:
        never = lambda x, alpha, grown: torch.zeros_like(x[:, :1], dtype=torch.bool)  # noqa: E731
        sorts_only.setattr(sep_module, "_flat", never)
        sorted_path = forward_backward(entmax, z, alpha)
    whole_rows()
    full = forward_backward(entmax, z, alpha)
    tolerance = 1e-12 if dtype == torch.float64 else 2e-6
    for got, exact, want in zip(fast, sorted_path, full, strict=True):
        assert torch.equal(exact, want)
        torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
        assert torch.equal(got == 0, want == 0)  # the same exact zeros
    support = (fast[0] > 0).sum(-1)
    assert int(support.max()) > 64 and int(support.min()) == 0  # retries and a masked row


def test_first_k_halves_for_short_rows() -> None:
    """Rows shorter than twice the preferred k take a halved partial sort, not the whole sort,
    down to the smallest first k; 0 and rows too short for it take the whole row."""
    assert sep_module._first_k(64, 1024) == 64
    assert sep_module._first_k(64, 128) == 32
    assert sep_module._first_k(64, 64) == 16
    assert sep_module._first_k(64, 40) == 16
    assert sep_module._first_k(16, 32) == 32
    assert sep_module._first_k(0, 700) == 700
    assert sep_module._first_k(1, 700) == 1


@pytest.mark.parametrize("keys", [48, 64, 128])
@pytest.mark.parametrize("alpha", [2.0, 1.5])
def test_short_rows_partial_sort_equals_the_whole_row(
    whole_rows: Callable[[], None], monkeypatch: pytest.MonkeyPatch, keys: int, alpha: float
) -> None:
    """Rows of 48 to 128 keys: the (for 1.5-entmax halved) first partial sort (with its retries: rows of scale 10
    have larger supports) gives the whole-row weights, exact zeros and gradients."""
    z = mixed_rows(64, keys, torch.float64)
    taken: list[int] = []
    topk = torch.Tensor.topk
    monkeypatch.setattr(
        torch.Tensor, "topk", lambda self, k, **kw: taken.append(k) or topk(self, k, **kw)
    )
    fast = forward_backward(entmax, z, alpha)
    assert taken and max(taken) < keys  # a partial sort was taken
    whole_rows()
    full = forward_backward(entmax, z, alpha)
    for got, want in zip(fast, full, strict=True):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)
    assert torch.equal(fast[0] == 0, full[0] == 0)


def test_sparsemax_and_entmax15_long_rows_match_the_float64_oracles() -> None:
    z = mixed_rows(48, 300, torch.float64)
    expected = ref_masked(ref_sparsemax, z.numpy())
    assert np.allclose(Sparsemax()(z).numpy(), expected, atol=1e-12)
    expected = ref_masked(lambda r: ref_entmax(r, 1.5), z.numpy())
    assert np.allclose(Entmax(1.5)(z).numpy(), expected, atol=1e-12)


@pytest.mark.parametrize("alpha", [1.05, 1.3, 1.45, 1.8, 1.95])
def test_newton_threshold_matches_the_float64_oracle(alpha: float) -> None:
    z = mixed_rows(48, 300, torch.float64)
    expected = ref_masked(lambda r: ref_entmax(r, alpha), z.numpy())
    out = Entmax(alpha)(z)
    assert np.allclose(out.numpy(), expected, atol=1e-12)
    learnable = entmax(z, torch.tensor(alpha, dtype=z.dtype))
    assert np.allclose(learnable.numpy(), expected, atol=1e-12)
    assert torch.allclose(out.sum(-1)[torch.arange(48) != 2], torch.ones(47, dtype=z.dtype))


@pytest.mark.parametrize("alpha", [1.05, 1.3, 1.8])
def test_newton_partial_sort_agrees_with_the_whole_row(
    whole_rows: Callable[[], None], alpha: float
) -> None:
    z = mixed_rows(64, 700, torch.float64)
    a = torch.tensor(alpha, dtype=z.dtype)
    fast = forward_backward(entmax, z, a)
    whole_rows()
    full = forward_backward(entmax, z, a)
    for got, want in zip(fast, full, strict=True):
        assert torch.allclose(got, want, atol=1e-12, rtol=1e-10)
        assert bool(torch.isfinite(got).all())
    assert torch.equal(fast[0] > 0, full[0] > 0)


def test_newton_per_head_alpha_matches_the_oracle() -> None:
    z = torch.randn(2, 3, 5, 200, dtype=torch.float64) * 3
    alpha = torch.tensor([1.2, 1.6, 2.0], dtype=z.dtype).view(3, 1, 1)
    out = entmax(z, alpha)
    for h, a in enumerate((1.2, 1.6, 2.0)):
        ref = ref_sparsemax if a == 2.0 else (lambda r, a=a: ref_entmax(r, a))
        assert np.allclose(out[:, h].numpy(), ref(z[:, h].numpy()), atol=1e-12)


@pytest.mark.parametrize("alpha", [2.0, 1.5, 1.3])
def test_gradcheck_on_the_partial_sort_path(alpha: float) -> None:
    z = mixed_rows(6, 40, torch.float64)[[0, 1, 2, 3, 5]]  # no exact ties (not differentiable)
    z = z.masked_fill(torch.isinf(z), -INF).requires_grad_(True)
    assert gradcheck(lambda x: entmax(x, alpha), (z,))


def test_gradcheck_learnable_alpha_on_the_partial_sort_path() -> None:
    z = (torch.randn(2, 3, 40, dtype=torch.float64) * 2).requires_grad_(True)
    logit = torch.tensor([0.3, -0.2], dtype=torch.float64).view(2, 1, 1).requires_grad_(True)
    assert gradcheck(lambda x, a: entmax(x, 1 + torch.sigmoid(a)), (z, logit))


@pytest.mark.parametrize("alpha", [2.0, 1.5, 1.3])
def test_masked_rows_have_exact_zeros_and_finite_gradients(alpha: float) -> None:
    z = mixed_rows(32, 200, torch.float32).requires_grad_(True)
    a = torch.tensor(alpha, requires_grad=alpha != 2.0)
    out = entmax(z, a)
    assert bool(torch.isfinite(out).all())
    assert bool((out[1, ::3] == 0).all()) and bool((out[2] == 0).all())
    assert out[3, 0] == 1 and bool((out[3, 1:] == 0).all())
    (out * torch.randn_like(out)).sum().backward()
    assert z.grad is not None and bool(torch.isfinite(z.grad).all())
    assert bool((z.grad[2] == 0).all())
    if a.grad is not None:
        assert bool(torch.isfinite(a.grad).all())


def test_plan_measures_entmax_on_the_meta_device() -> None:
    meta = torch.device("meta")
    for sep in (Sparsemax(), Entmax(1.5), Entmax(1.3), Entmax(1.5, learnable=True)):
        sep = sep.to(meta)
        z = torch.randn(2, 4, 300, device=meta, requires_grad=True)
        measured = measure_step(sep, z, lambda model, x: model(x).pow(2).sum())
        assert measured.activation_bytes > 0


@pytest.mark.parametrize("alpha", [2.0, 1.5, 1.3])
def test_no_rows_give_an_empty_result_and_gradient(alpha: float) -> None:
    z = torch.randn(0, 3, 50, requires_grad=True)
    a = torch.tensor(alpha, requires_grad=alpha != 2.0)
    out = entmax(z, a)
    assert out.shape == z.shape
    out.sum().backward()
    assert z.grad is not None and z.grad.shape == z.shape


NEAR_ONE = [1.0001, 1.001, 1.01, 1.02, 1.05, 1.1, 1.25, 1.5, 1.75, 2.0]


def scaled_rows(dtype: torch.dtype, keys: int = 50) -> Tensor:
    """One row per scale 1e-3, 1e-2, ..., 1e4 of ``randn`` scores (issue 26, item 4)."""
    gen = torch.Generator().manual_seed(4)
    scale = torch.logspace(-3, 4, 8, dtype=torch.float64)[:, None]
    return (torch.randn(8, keys, generator=gen, dtype=torch.float64) * scale).to(dtype)


@pytest.mark.parametrize("alpha", NEAR_ONE)
def test_entmax_near_alpha_one_is_finite_and_matches_float64(alpha: float) -> None:
    """Newton's weights ``[(z - tau/coef)]^r`` overflowed to inf / inf = NaN near alpha = 1 (in
    float32 from 1.02 down, in float64 from 1.001 down); float32 must be within 1e-4 of float64."""
    z64 = scaled_rows(torch.float64)
    reference = Entmax(alpha)(z64)
    assert np.allclose(reference.numpy(), ref_entmax(z64.numpy(), alpha), atol=1e-9)
    for weights in (Entmax(alpha)(z64.float()), entmax(z64.float(), torch.tensor(alpha))):
        assert bool(torch.isfinite(weights).all())
        assert torch.allclose(weights.double(), reference, atol=1e-4, rtol=0)
        assert bool((weights[reference == 0] == 0).all())  # exact zeros kept
    for dtype in (torch.float16, torch.bfloat16):
        rounded = z64.to(dtype)
        half = Entmax(alpha)(rounded)
        assert half.dtype == dtype and bool(torch.isfinite(half).all())
        assert torch.allclose(half.double(), Entmax(alpha)(rounded.double()), atol=1e-2, rtol=0)


@pytest.mark.parametrize("alpha", [1.0001, 1.01, 1.1, 1.5, 1.75])
def test_entmax_gradients_near_alpha_one_match_float64(alpha: float) -> None:
    """The alpha gradient ``(-p log p + s (z - tau')) / (alpha - 1)`` cancelled ``|z| / coef``
    ulps (a wrong sign in float32 at alpha = 1.0001 for scores of scale 100)."""
    grads = []
    for dtype in (torch.float32, torch.float64):
        z = scaled_rows(dtype).requires_grad_(True)
        a = torch.tensor(alpha, dtype=dtype, requires_grad=True)
        upstream = torch.randn(z.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
        (entmax(z, a) * upstream).sum().backward()
        assert z.grad is not None and a.grad is not None
        assert bool(torch.isfinite(z.grad).all()) and bool(torch.isfinite(a.grad).all())
        grads.append((z.grad.double(), a.grad.double()))
    (z32, a32), (z64, a64) = grads
    assert torch.allclose(z32, z64, atol=1e-4, rtol=0)
    assert torch.allclose(a32, a64, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("alpha", [1.001, 1.01, 1.02])
def test_gradcheck_near_alpha_one(alpha: float) -> None:
    z = torch.randn(3, 12, generator=torch.Generator().manual_seed(6), dtype=torch.float64) * 3
    a = torch.tensor(alpha, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda x, b: entmax(x, b), (z.requires_grad_(True), a), atol=1e-5)


@pytest.mark.parametrize("alpha", [2.0, 1.5])
def test_flat_rows_take_newton_on_the_whole_row_and_match_the_oracle(
    monkeypatch: pytest.MonkeyPatch, alpha: float
) -> None:
    """Rows of nearly equal scores keep most keys: after the first partial sort the threshold
    comes from Newton's method on the unsorted rows (no second partial sort, no full sort),
    equal to the float64 oracle to rounding, with the same exact zeros."""
    calls: list[int] = []
    newton = sep_module._newton_threshold

    def spy(d: Tensor, *args: object) -> tuple[Tensor, Tensor]:
        calls.append(d.shape[-1])
        return newton(d, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(sep_module, "_newton_threshold", spy)
    gen = torch.Generator().manual_seed(3)
    z = 1e-3 * torch.randn(32, 1024, generator=gen, dtype=torch.float64)
    z[0, :500] = -math.inf  # a masked half: outside the support, exactly 0
    p = entmax(z, alpha)
    assert calls == [1024]  # one Newton solve, on the whole rows
    oracle = ref_sparsemax if alpha == 2.0 else (lambda r: ref_entmax(r, 1.5))
    expected = torch.from_numpy(ref_masked(oracle, z.numpy()))
    torch.testing.assert_close(p, expected, atol=1e-12, rtol=1e-12)
    assert bool((p[0, :500] == 0).all())  # masked keys: exact zeros
    assert int((p[1:] > 0).sum(-1).min()) > 512  # supports no partial sort of 8 x 64 holds


def test_alpha_gradient_is_finite_where_a_weight_rounds_to_the_support_edge() -> None:
    """A weight so small that ``p^(alpha-1)`` rounds to 0 in float32 (a key at the edge of the
    support) gave a NaN alpha gradient (``0 · inf``) and stopped a STanHop-Net training run."""
    alpha = 1.2
    edge = torch.tensor(-1.0 / (alpha - 1))
    second = edge + torch.arange(-400, 400) * 1.2e-7  # the second key's score, in ulps around it
    scores = torch.stack([torch.zeros_like(second), second], -1)
    grads = []
    for dtype in (torch.float32, torch.float64):
        a = torch.tensor(alpha, dtype=dtype, requires_grad=True)
        weights = entmax(scores.to(dtype), a.expand(len(second), 1))
        assert ((weights[:, 1] > 0) & (weights[:, 1] < 1e-30)).any()  # the case is present
        weights[:, 1].sum().backward()
        assert a.grad is not None
        grads.append(a.grad)
    assert torch.isfinite(grads[0])
    torch.testing.assert_close(grads[0].double(), grads[1], rtol=1e-3, atol=1e-6)

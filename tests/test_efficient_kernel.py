"""Linear and random-feature association against their naive quadratic formulas."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from hopfield.functional import Softmax, SoftmaxN, Sparsemax, associate
from hopfield.functional.efficient_kernel import (
    Linear,
    RandomFeatures,
    kernel_association,
    orthogonal_gaussian,
)
from hopfield.nn import Hopfield, HopfieldPooling

D = torch.float64
NO = {"causal": False, "dropout": 0.0, "return_weights": False}


def patterns(b: int = 2, h: int = 3, length: int = 11, size: int = 11, e: int = 4, ev: int = 5):
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(b, h, length, e, dtype=D, generator=gen, requires_grad=True)
    k = torch.randn(b, h, size, e, dtype=D, generator=gen, requires_grad=True)
    v = torch.randn(b, h, size, ev, dtype=D, generator=gen, requires_grad=True)
    return q, k, v


def naive(kernel: Tensor, v: Tensor, eps: float, allowed: Tensor | None = None) -> Tensor:
    """``Σ_j K_ij v_j / (Σ_j K_ij + eps)`` with an explicit (L, S) double loop-free sum."""
    if allowed is not None:
        kernel = kernel * allowed
    return (kernel.unsqueeze(-1) * v.unsqueeze(-3)).sum(-2) / (kernel.sum(-1, keepdim=True) + eps)


def causal_allowed(length: int, size: int) -> Tensor:
    return torch.arange(size)[None, :] <= torch.arange(length)[:, None] + size - length


def assert_same(out, ref, inputs) -> None:
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-11)
    probe = torch.randn_like(out)
    g1 = torch.autograd.grad((out * probe).sum(), inputs, retain_graph=True)
    g2 = torch.autograd.grad((ref * probe).sum(), inputs, retain_graph=True)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def elu1(x: Tensor) -> Tensor:
    return torch.where(x > 0, x + 1, torch.exp(x))


# ------------------------------------------------------------------------------------------------
# Linear
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "length,size,causal,chunk",
    [
        (11, 11, False, 128),
        (11, 11, True, 4),
        (7, 12, True, 3),
        (12, 7, True, 5),
        (9, 9, True, 128),
    ],
)
def test_linear_equals_naive_formula(length, size, causal, chunk) -> None:
    q, k, v = patterns(length=length, size=size)
    structure = Linear(chunk_size=chunk)
    out, weights = structure(
        q,
        k,
        v,
        separation=Softmax(),
        scale=0.3,
        mask=None,
        causal=causal,
        dropout=0.0,
        return_weights=True,
    )
    kernel = torch.matmul(elu1(q), elu1(k).transpose(-1, -2))
    allowed = causal_allowed(length, size) if causal else None
    ref = naive(kernel, v, 1e-6, allowed)
    assert_same(out, ref, (q, k, v))
    assert weights is not None
    torch.testing.assert_close(torch.matmul(weights, v), out)
    if causal:
        assert (weights[..., ~causal_allowed(length, size)] == 0).all()
        if length > size:  # the first queries see no key: zeros, no NaN
            assert (out[:, :, : length - size] == 0).all()


def test_linear_key_masks_zero_the_padded_keys() -> None:
    q, k, v = patterns(b=2, length=6, size=9)
    padding = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    padding[1, ..., 5:] = False
    padding[0, ..., :] = False  # batch 0 fully masked: zeros, finite gradients
    out, _ = Linear()(q, k, v, separation=Softmax(), scale=1.0, mask=padding, **NO)
    kernel = torch.matmul(elu1(q), elu1(k).transpose(-1, -2))
    ref = naive(kernel, v, 1e-6, padding)
    assert_same(out, ref, (q, k, v))
    assert (out[0] == 0).all()
    # An additive key mask m_j multiplies key j's kernel by exp(m_j), as it does for the softmax.
    bias = torch.randn(2, 1, 1, 9, dtype=D)
    out, _ = Linear()(q, k, v, separation=Softmax(), scale=1.0, mask=bias, **NO)
    assert_same(out, naive(kernel * bias.exp(), v, 1e-6), (q, k, v))


def test_kernel_structures_reject_what_they_cannot_do() -> None:
    q, k, v = patterns(length=5, size=5)
    for structure in (Linear(), RandomFeatures(seed=0)):
        for separation in (Sparsemax(), SoftmaxN(1.0)):
            with pytest.raises(ValueError, match="separation"):
                structure(q, k, v, separation=separation, scale=1.0, mask=None, **NO)
        with pytest.raises(ValueError, match="mask"):
            structure(
                q,
                k,
                v,
                separation=Softmax(),
                scale=1.0,
                mask=torch.ones(1, 1, 5, 5, dtype=torch.bool),
                **NO,
            )
        with pytest.raises(ValueError, match="dropout"):
            structure(
                q,
                k,
                v,
                separation=Softmax(),
                scale=1.0,
                mask=None,
                causal=False,
                dropout=0.1,
                return_weights=False,
            )
    with pytest.raises(ValueError, match="feature_map"):
        Linear("relu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eps"):
        Linear(eps=-1.0)
    with pytest.raises(ValueError, match="scale"):
        RandomFeatures(seed=0)(q, k, v, separation=Softmax(), scale=-1.0, mask=None, **NO)
    with pytest.raises(ValueError, match="scale"):
        RandomFeatures(seed=0)(
            q, k, v, separation=Softmax(), scale=torch.ones(1, 1, 5, 1, dtype=D), mask=None, **NO
        )
    with pytest.raises(ValueError, match="kernel"):
        RandomFeatures(kernel="cos")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_features"):
        RandomFeatures(0)


# ------------------------------------------------------------------------------------------------
# Random features
# ------------------------------------------------------------------------------------------------


def test_orthogonal_projection_rows_are_orthogonal_in_blocks() -> None:
    w = orthogonal_gaussian(10, 4, generator=torch.Generator().manual_seed(0))
    assert w.shape == (10, 4)
    for block in (w[:4], w[4:8]):
        gram = block @ block.T
        off = gram - torch.diag(torch.diagonal(gram))
        assert off.abs().max() < 1e-10


@pytest.mark.parametrize("orthogonal", [False, True])
def test_prf_kernel_estimate_converges_like_one_over_sqrt_m(orthogonal: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 16, 8, dtype=D, generator=gen) * 0.35
    k = torch.randn(1, 1, 16, 8, dtype=D, generator=gen) * 0.35
    beta = 0.5
    exact = torch.exp(beta * q @ k.transpose(-1, -2))
    errors = []
    sizes = [16, 64, 256, 1024]
    for m in sizes:
        trials = []
        for seed in range(20):
            rf = RandomFeatures(m, orthogonal=orthogonal, seed=seed, dtype=D)
            estimate = rf.kernel(q, k, beta)
            trials.append(((estimate - exact) / exact).pow(2).mean().sqrt())
        errors.append(float(torch.stack(trials).mean()))
    assert all(a > b for a, b in itertools.pairwise(errors))
    slope = math.log(errors[-1] / errors[0]) / math.log(sizes[-1] / sizes[0])
    assert -0.7 < slope < -0.35, (errors, slope)  # relative error ~ 1/sqrt(m)
    assert errors[-1] < 0.1


@pytest.mark.parametrize("count", [32, 130])  # 130: padded with zero features to 144
@pytest.mark.parametrize("kernel", ["softmax", "relu"])
@pytest.mark.parametrize("causal,length,size", [(False, 9, 13), (True, 10, 10), (True, 6, 9)])
def test_random_features_equal_naive_formula(kernel, causal, length, size, count) -> None:
    q, k, v = patterns(length=length, size=size, e=6)
    rf = RandomFeatures(count, kernel=kernel, seed=0, chunk_size=4, dtype=D)
    scale = torch.tensor([0.3, 0.5, 0.8], dtype=D).view(3, 1, 1)
    padding = torch.ones(2, 1, 1, size, dtype=torch.bool)
    padding[1, ..., size - 3 :] = False
    out, weights = rf(
        q,
        k,
        v,
        separation=Softmax(),
        scale=scale,
        mask=padding,
        causal=causal,
        dropout=0.0,
        return_weights=True,
    )
    allowed = padding & causal_allowed(length, size) if causal else padding
    kernel_matrix = rf.kernel(q, k, scale)  # unstabilised features: the stabilisers cancel
    ref = naive(kernel_matrix, v, 0.0, allowed)
    assert_same(out, ref, (q, k, v))
    assert weights is not None
    torch.testing.assert_close(torch.matmul(weights, v), out)
    if kernel == "relu":
        w = rf.projection
        assert w is not None and w.shape == (count, 6)
        phi_q = F.relu((q * scale.sqrt()) @ w.T) + 1e-3
        phi_k = F.relu((k * scale.sqrt()) @ w.T) + 1e-3
        torch.testing.assert_close(kernel_matrix, phi_q @ phi_k.transpose(-1, -2))


def test_random_features_approach_softmax_and_are_stable() -> None:
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 20, 8, dtype=D, generator=gen) * 0.6
    k = torch.randn(1, 2, 50, 8, dtype=D, generator=gen) * 0.6
    v = torch.randn(1, 2, 50, 3, dtype=D, generator=gen)
    exact = associate(q, k, v, scale=0.3)
    approx = associate(q, k, v, scale=0.3, structure=RandomFeatures(4096, seed=0, dtype=D))
    assert (approx - exact).abs().max() < 0.1
    # Large scores overflow exp() without the stabilisers; with them the result stays finite.
    big = associate(q * 30, k * 30, v, scale=1.0, structure=RandomFeatures(64, seed=0))
    assert torch.isfinite(big).all()


def test_random_features_redraw_seed_and_state_dict() -> None:
    q, k, v = patterns(length=5, size=5)
    kw = {"separation": Softmax(), "scale": 0.5, "mask": None, **NO}
    a, b = RandomFeatures(seed=4), RandomFeatures(seed=4)
    torch.testing.assert_close(a(q, k, v, **kw)[0], b(q, k, v, **kw)[0])
    assert a.projection is not None and a.projection.shape == (int(4 * math.log(4)), 4)
    fixed = a.projection.clone()
    a(q, k, v, **kw)
    assert torch.equal(a.projection, fixed)  # redraw=None: never redrawn
    restored = RandomFeatures()
    restored.load_state_dict(a.state_dict())
    torch.testing.assert_close(restored(q, k, v, **kw)[0], a(q, k, v, **kw)[0])
    redrawing = RandomFeatures(seed=1, redraw=2)
    draws = []
    for _ in range(5):
        redrawing(q, k, v, **kw)
        assert redrawing.projection is not None
        draws.append(redrawing.projection.clone())
    same = [torch.equal(x, y) for x, y in itertools.pairwise(draws)]
    assert same == [True, False, True, False]  # a new projection every second call
    redrawing.eval()
    redrawing(q, k, v, **kw)
    assert redrawing.projection is not None and torch.equal(redrawing.projection, draws[-1])
    redrawing.reset_parameters()
    assert not torch.equal(redrawing.projection, draws[-1])
    with pytest.raises(ValueError, match="pattern size"):
        redrawing(*patterns(e=6), **kw)


def test_a_projection_not_drawn_yet_follows_the_module_to_its_device_and_dtype() -> None:
    """A module moved or materialised before its first call (``to_empty`` after a meta build,
    ``.to()``, ``.double()``; on a GPU ``.cuda()``) draws its projection where its buffers now
    live, the seed's projection; before 29 Nov it drew on the device it was built on (a meta
    module's projection stayed on meta: "Tensor on device meta is not on the expected device
    cpu"). A state dict is loaded in the module's dtype, as into any buffer."""
    q, k, v = patterns(length=5, size=5)
    kw = {"separation": Softmax(), "scale": 0.5, "mask": None, **NO}
    reference = RandomFeatures(8, seed=4, dtype=D)
    expected = reference(q, k, v, **kw)[0]
    built_on_meta = RandomFeatures(8, seed=4, device="meta", dtype=D).to_empty(device="cpu")
    widened = RandomFeatures(8, seed=4).double()  # float32 at construction
    for module in (built_on_meta, widened):
        torch.testing.assert_close(module(q, k, v, **kw)[0], expected, rtol=0, atol=0)
        assert module.projection is not None and module.projection.dtype == D
        assert module.projection.device.type == "cpu"
    narrow = RandomFeatures(8)  # float32, no projection yet
    narrow.load_state_dict(reference.state_dict())
    assert narrow.projection is not None and narrow.projection.dtype == torch.float32
    torch.testing.assert_close(narrow.projection, reference.projection.float())


def test_a_layer_draws_its_projection_when_it_is_built() -> None:
    """A layer draws the random-feature projection of its head size when it is built (so that
    a wrapper for several processes finds and broadcasts it), on the layer's device where the
    structure was given none; the seed's projection, as a first call would have drawn it. A
    layer built on meta draws at its first call instead (after ``to_empty``)."""
    layer = Hopfield(12, 3, structure=RandomFeatures(8, seed=4))
    structure = layer.structure
    assert isinstance(structure, RandomFeatures) and structure.projection is not None
    assert structure.projection.shape == (8, 4)  # the head size: 12 / 3
    lazily = RandomFeatures(8, seed=4)
    lazily(*patterns(e=4), separation=Softmax(), scale=0.5, mask=None, **NO)
    assert lazily.projection is not None
    assert torch.equal(structure.projection, lazily.projection)
    on_meta = Hopfield(12, 3, structure=RandomFeatures(8, seed=4), device="meta")
    assert isinstance(on_meta.structure, RandomFeatures) and on_meta.structure.projection is None


@pytest.mark.parametrize("seed", [3, None])
def test_a_state_dict_resumes_the_redraws_where_they_stopped(seed: int | None) -> None:
    """The state dict keeps the first seed and the counts (extra state), so a module loaded
    from one taken mid-run redraws at the same calls and draws the same projections as the
    module that ran on. Before 29 Nov the counts restarted (a resumed run redrew at other calls)
    and a seeded module's generator started over (it redrew the seed's first projections)."""
    q, k, v = patterns(length=5, size=5)
    kw = {"separation": Softmax(), "scale": 0.5, "mask": None, **NO}
    torch.manual_seed(0)
    running = RandomFeatures(8, seed=seed, redraw=2)
    for _ in range(3):
        running(q, k, v, **kw)
    resumed = RandomFeatures(8, seed=None if seed is None else seed + 1, redraw=2)
    resumed.load_state_dict(running.state_dict())
    for _ in range(4):
        torch.testing.assert_close(resumed(q, k, v, **kw)[0], running(q, k, v, **kw)[0])
        assert running.projection is not None and resumed.projection is not None
        assert torch.equal(resumed.projection, running.projection)
    assert running._draws == 4  # one draw, then a new one every second call


def test_state_dicts_without_the_counts_load_and_bad_counts_are_refused() -> None:
    """A state dict saved before the counts existed loads (strictly; the module's counts stand);
    extra state of another form is refused with a ValueError naming what it should be."""
    q, k, v = patterns(length=5, size=5)
    kw = {"separation": Softmax(), "scale": 0.5, "mask": None, **NO}
    saved = RandomFeatures(8, seed=1)
    saved(q, k, v, **kw)
    old = {n: t for n, t in saved.state_dict().items() if not n.endswith("_extra_state")}
    loaded = RandomFeatures(8)
    loaded.load_state_dict(old)
    torch.testing.assert_close(loaded(q, k, v, **kw)[0], saved(q, k, v, **kw)[0])
    for bad in (torch.zeros(3, dtype=torch.int64), torch.zeros(4), torch.tensor([2, 0, 0, 0])):
        with pytest.raises(ValueError, match="extra state"):
            RandomFeatures(8).load_state_dict({**old, "_extra_state": bad})


@pytest.mark.parametrize("structure", [Linear(), RandomFeatures(8, seed=0, dtype=D)])
def test_kernel_gradcheck(structure) -> None:
    q, k, v = patterns(b=1, h=1, length=5, size=6, e=3, ev=2)
    scale = torch.tensor(0.7, dtype=D, requires_grad=True)

    def f(q, k, v, scale):
        return structure(
            q,
            k,
            v,
            separation=Softmax(),
            scale=scale,
            mask=None,
            causal=True,
            dropout=0.0,
            return_weights=False,
        )[0]

    assert torch.autograd.gradcheck(f, (q, k, v, scale))


# ------------------------------------------------------------------------------------------------
# Queries that see no key: zero outputs, finite and exact gradients
# ------------------------------------------------------------------------------------------------


def padded(n: int, dtype: torch.dtype, how: str, *, seed: int = 0, e: int = 8):
    """``q, k, v (2, 2, n, e)`` and a key mask ``(2, 1, 1, n)`` under which some queries see no key.

    ``how="item"``: batch item 0 is fully padded. ``"left"``: the first ``n // 4 + 1`` keys are
    padded (with ``causal=True`` the first queries see only those). ``"left-bias"``: the same keys
    get an additive -30 (weight ~1e-13, so those queries' normaliser is ~eps but not 0).
    """
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(2, 2, n, e, dtype=D, generator=gen).to(dtype).requires_grad_() for _ in range(3)
    )
    first = n // 4 + 1
    if how == "left-bias":
        bias = torch.zeros(2, 1, 1, n, dtype=dtype)
        bias[..., :first] = -30.0
        return q, k, v, bias
    mask = torch.ones(2, 1, 1, n, dtype=torch.bool)
    if how == "item":
        mask[0] = False
    else:
        mask[..., :first] = False
    return q, k, v, mask


def kernel_out(structure, q, k, v, mask, *, causal: bool, return_weights: bool = False):
    return structure(
        q,
        k,
        v,
        separation=Softmax(),
        scale=q.shape[-1] ** -0.5,
        mask=mask,
        causal=causal,
        dropout=0.0,
        return_weights=return_weights,
    )


def test_random_features_fully_padded_item_has_zero_output_and_gradients() -> None:
    for seed in range(10):  # NaN gradients for most seeds before the fix
        q, k, v, mask = padded(64, torch.float32, "item", seed=seed, e=16)
        rf = RandomFeatures(seed=seed)
        out, _ = kernel_out(rf, q, k, v, mask, causal=False)
        assert (out[0] == 0).all() and torch.isfinite(out).all()
        grads = torch.autograd.grad((out * torch.randn_like(out)).sum(), (q, k, v))
        for grad in grads:
            assert torch.isfinite(grad).all(), seed
            assert (grad[0] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_random_features_of_large_patterns_with_padded_keys_are_those_of_the_kept_keys(
    dtype: torch.dtype,
) -> None:
    """The keys' stabiliser is the largest logit of the kept keys; a padded key's logit may lie
    far above it (patterns of norm ~100), and its feature overflowed to inf before its weight 0
    made it NaN, which spread to every output of its batch entry. Padded keys now give exact
    zeros: the result is the one computed from the kept keys alone, with finite gradients."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (30 * torch.randn(2, 2, n, 8, generator=g) for n in (5, 8, 8))
    mask = torch.ones(2, 1, 1, 8, dtype=torch.bool)
    mask[0, ..., 4:] = False
    rf = RandomFeatures(32, seed=0)
    inputs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out, _ = kernel_out(rf, *inputs, mask, causal=False)
    q0, k0, v0 = (t[:1] for t in inputs)
    alone, _ = kernel_out(rf, q0, k0[..., :4, :], v0[..., :4, :], None, causal=False)
    assert torch.isfinite(out).all()
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out[:1], alone, rtol=tolerance, atol=tolerance)
    grads = torch.autograd.grad(out.float().square().sum(), inputs)
    assert all(bool(torch.isfinite(grad).all()) for grad in grads)
    assert bool((grads[1][0, :, 4:] == 0).all())


@pytest.mark.parametrize("n,dtype", [(256, torch.float64), (8, torch.float32)])
def test_random_features_causal_left_padded_keys_give_finite_gradients(n, dtype) -> None:
    q, k, v, mask = padded(n, dtype, "left")
    rf = RandomFeatures(seed=0, dtype=dtype)
    out, weights = kernel_out(rf, q, k, v, mask, causal=True, return_weights=True)
    blind = n // 4 + 1  # queries that see only padded keys
    assert weights is not None and (weights[:, :, :blind] == 0).all()
    assert (out[:, :, :blind] == 0).all() and torch.isfinite(out).all()
    grads = torch.autograd.grad((out * torch.randn_like(out)).sum(), (q, k, v))
    assert all(torch.isfinite(grad).all() for grad in grads)
    assert (grads[0][:, :, :blind] == 0).all()


@pytest.mark.parametrize("how", ["left", "left-bias"])
def test_linear_causal_left_padded_float32_gradients_match_float64(how: str) -> None:
    grads = {}
    for dtype in (torch.float32, torch.float64):
        q, k, v, mask = padded(256, dtype, how, e=16)
        out, _ = kernel_out(Linear(), q, k, v, mask, causal=True)
        probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=D)
        grads[dtype] = torch.autograd.grad((out * probe.to(dtype)).sum(), (q, k, v))
    for low, high in zip(grads[torch.float32], grads[torch.float64], strict=True):
        error = (low.double() - high).abs().max() / high.abs().max()
        assert error < 1e-5  # was 0.1-0.2 (relative to the gradient scale) for k and v


@pytest.mark.parametrize("structure", [Linear(chunk_size=2), RandomFeatures(8, seed=0, dtype=D)])
@pytest.mark.parametrize("how,causal", [("item", False), ("left", True), ("left-bias", True)])
def test_kernel_gradcheck_with_queries_that_see_no_key(structure, how, causal) -> None:
    q, k, v, mask = padded(6, D, how, e=3)

    def f(q, k, v):
        return kernel_out(structure, q, k, v, mask, causal=causal)[0]

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_kernel_association_direct() -> None:
    phi_q = torch.rand(1, 1, 4, 3, dtype=D)
    phi_k = torch.rand(1, 1, 6, 3, dtype=D)
    v = torch.randn(1, 1, 6, 2, dtype=D)
    out, weights = kernel_association(phi_q, phi_k, v, eps=0.5, return_weights=True)
    torch.testing.assert_close(out, naive(phi_q @ phi_k.transpose(-1, -2), v, 0.5))
    assert weights is not None
    torch.testing.assert_close(weights.sum(-1) < 1, torch.ones(1, 1, 4, dtype=torch.bool))


@pytest.mark.parametrize("structure", [Linear(), RandomFeatures(seed=0)])
def test_kernel_structures_in_layers(structure) -> None:
    torch.manual_seed(0)
    layer = Hopfield(8, num_heads=2, structure=structure)
    x = torch.randn(3, 10, 8)
    padding = torch.zeros(3, 10, dtype=torch.bool)
    padding[2, 7:] = True
    out = layer(x, key_padding_mask=padding, causal=True)
    assert out.shape == (3, 10, 8) and torch.isfinite(out).all()
    out.sum().backward()
    pooling = HopfieldPooling(8, quantity=2, num_heads=2, structure=structure)
    pooled = pooling(x, key_padding_mask=padding)
    assert pooled.shape[:2] == (3, 2) and torch.isfinite(pooled).all()


@pytest.mark.parametrize("scale", [1.0, 0.3, "tensor"])
def test_random_features_fast_query_path_is_a_per_row_rescaling(scale) -> None:
    """Stabilised query features leave out -‖x'‖²/2 with the per-query shift: each row is the
    unstabilised row times one positive factor, and keys keep one factor per (batch, head)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 5, dtype=torch.float64, generator=gen)
    beta = (
        torch.tensor([0.2, 0.5, 1.0], dtype=torch.float64).view(3, 1, 1)
        if scale == "tensor"
        else scale
    )
    rf = RandomFeatures(11, seed=0, dtype=torch.float64)
    for is_query, dims in ((True, -1), (False, (-1, -2))):
        fast = rf.features(x, beta, is_query=is_query)
        plain = rf.features(x, beta, is_query=is_query, stabilize=False)
        ratio = fast / plain
        assert bool((ratio > 0).all())
        torch.testing.assert_close(ratio, ratio.mean(dim=dims, keepdim=True).expand_as(ratio))


@pytest.mark.parametrize("kernel", ["softmax", "relu"])
def test_association_pads_the_features_from_many_patterns_with_the_same_result(
    kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From PADDED_FROM_PATTERNS keys or queries on, the association widens 130 features to 144;
    below it, or with the threshold out of reach, it does not; values and gradients agree."""
    from hopfield.functional import efficient_kernel

    q, k, v = patterns(b=1, h=2, length=5, size=efficient_kernel.PADDED_FROM_PATTERNS, e=6)
    rf = RandomFeatures(130, kernel=kernel, seed=0, dtype=D)
    widths: list[int] = []
    scaled_projection = rf._scaled_projection

    def recorded(*args: object) -> tuple[Tensor, object]:
        projected, root = scaled_projection(*args)  # type: ignore[arg-type]
        widths.append(projected.shape[0])
        return projected, root

    monkeypatch.setattr(rf, "_scaled_projection", recorded)
    results = []
    for threshold in (efficient_kernel.PADDED_FROM_PATTERNS, 10**9):
        monkeypatch.setattr(efficient_kernel, "PADDED_FROM_PATTERNS", threshold)
        out = associate(q, k, v, structure=rf)
        assert isinstance(out, Tensor)
        results.append((out, *torch.autograd.grad(out.square().sum(), (q, k, v))))
    assert widths == [144, 130]
    for padded, unpadded in zip(*results, strict=True):
        torch.testing.assert_close(padded, unpadded, rtol=1e-10, atol=1e-12)
    monkeypatch.setattr(efficient_kernel, "PADDED_FROM_PATTERNS", k.shape[-2])
    associate(q, k[..., :7, :], v[..., :7, :], structure=rf)  # few patterns: no padding
    assert widths[-1] == 130


@pytest.mark.parametrize("kernel", ["softmax", "relu"])
def test_random_features_padding_features_are_exact_zeros(kernel: str) -> None:
    """From 128 features on, the association widens the features with zeros to a multiple of 16
    (faster products); fewer features stay as they are:
    the drawn features are those :meth:`features` gives, the padding ones exactly 0, and no
    gradient reaches the patterns through them."""
    q, _, _ = patterns(length=7, size=7, e=5)
    rf = RandomFeatures(130, kernel=kernel, seed=0, dtype=D)
    assert (
        RandomFeatures(11, seed=0).features(q.float(), 0.5, is_query=True, padded=True).shape[-1]
        == 11
    )
    for is_query in (True, False):
        x = q.clone().requires_grad_(True)
        padded = rf.features(x, 0.5, is_query=is_query, padded=True)
        assert padded.shape[-1] == 144
        assert bool((padded[..., 130:] == 0).all())
        torch.testing.assert_close(padded[..., :130], rf.features(x, 0.5, is_query=is_query))
        (grad,) = torch.autograd.grad(padded[..., 130:].sum() + 0 * padded.sum(), x)
        assert torch.equal(grad, torch.zeros_like(grad))

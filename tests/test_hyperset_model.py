"""Hyper-SET: energies vs analytic updates, symmetry, sphere, identity at init, parameter counts."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from hopfield.models.hyperset import (
    image_classifier,
    masked_token_loss,
    masked_token_model,
    patchify,
    sudoku_model,
)
from hopfield.nn import hyperset_energy
from hopfield.nn.hyperset import (
    CRATELayer,
    HyperSETEncoder,
    HyperSETLayer,
    SharedTransformerEncoder,
    StepSizeNetwork,
    count_parameters,
    flops_per_iteration,
)
from hopfield.nn.hyperset_energy import (
    ATTENTION_KINDS,
    FEEDFORWARD_KINDS,
    FUSED_MIN_TOKENS,
    FUSED_MIN_TOKENS_HALF_CPU,
    attention_energy,
    attention_energy_of_projections,
    attention_operator,
    attention_update,
    average_angle,
    bisoftmax_fusable,
    bisoftmax_fused,
    effective_rank,
    feedforward_energy,
    feedforward_update,
    gelu_integral,
    merge_heads,
    sinusoidal_positions,
    sinusoidal_positions_2d,
    split_heads,
    time_embedding,
)

D64 = torch.float64
#: Token counts of the explicit (below FUSED_MIN_TOKENS) and the automatic fused bi-softmax.
TOKENS = (7, FUSED_MIN_TOKENS + 3)


def _random(b: int = 2, n: int = 7, d: int = 12, h: int = 3, m: int = 16):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(b, n, d, generator=g, dtype=D64)
    w = torch.randn(d, d, generator=g, dtype=D64) / math.sqrt(d)
    dm = torch.randn(m, d, generator=g, dtype=D64) / math.sqrt(d)
    return x, w, dm, h


@pytest.mark.parametrize("n", TOKENS)
@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_attention_update_is_energy_gradient(kind: str, n: int) -> None:
    x, w, _, h = _random(n=n)
    x.requires_grad_(True)
    (grad,) = torch.autograd.grad(attention_energy(x, w, h, kind, normalize=False).sum(), x)
    analytic = attention_update(x.detach(), w, h, kind, normalize=False)
    torch.testing.assert_close(analytic, grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", FEEDFORWARD_KINDS)
def test_feedforward_update_is_negative_energy_gradient(kind: str) -> None:
    x, _, dm, _ = _random()
    x.requires_grad_(True)
    (grad,) = torch.autograd.grad(feedforward_energy(x, dm, kind, normalize=False).sum(), x)
    analytic = feedforward_update(x.detach(), dm, kind, normalize=False)
    torch.testing.assert_close(analytic, -grad, rtol=1e-10, atol=1e-10)


def test_gelu_integral_derivative_is_gelu() -> None:
    u = torch.linspace(-5, 5, 41, dtype=D64, requires_grad=True)
    (grad,) = torch.autograd.grad(gelu_integral(u).sum(), u)
    torch.testing.assert_close(grad, F.gelu(u.detach()))
    assert gelu_integral(torch.zeros(1, dtype=D64)).item() == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("n", TOKENS)
@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_normalised_update_is_gradient_on_the_sphere_with_jacobian_dropped(
    kind: str, n: int
) -> None:
    """Eq. (9): the energy gradient w.r.t. the normalised projections, back-projected by W."""
    x, w, _, h = _random(n=n)
    zn = F.rms_norm(split_heads(x @ w.T, h), (w.shape[0] // h,)).requires_grad_(True)
    (gz,) = torch.autograd.grad(attention_energy_of_projections(zn, kind).sum(), zn)
    expected = gz.transpose(1, 2).reshape(x.shape) @ w
    torch.testing.assert_close(attention_update(x, w, h, kind), expected)


def test_layer_steps_match_functional_updates() -> None:
    x, w, dm, h = _random()
    for attention in ATTENTION_KINDS:
        for ff in FEEDFORWARD_KINDS:
            layer = HyperSETLayer(12, h, 16, attention=attention, feedforward=ff, dtype=D64)
            with torch.no_grad():
                layer.qkv.weight.copy_(w)
                layer.mlp.weight.copy_(dm)
            torch.testing.assert_close(
                layer.attention_step(x), attention_update(x, w, h, attention)
            )
            torch.testing.assert_close(layer.feedforward_step(x), feedforward_update(x, dm, ff))
            e_attn, e_ff = layer.energies(x)
            torch.testing.assert_close(e_attn, attention_energy(x, w, h, attention))
            torch.testing.assert_close(e_ff, feedforward_energy(x, dm, ff))
    # one iteration is exactly the two sub-steps with the given step sizes
    alpha, gamma = torch.rand(2, *x.shape, dtype=D64)
    y = layer(x, alpha, gamma)
    mid = x - alpha * layer.attention_step(x)
    torch.testing.assert_close(y, mid + gamma * layer.feedforward_step(mid))


def test_bisoftmax_symmetry_and_single_softmax() -> None:
    x, w, _, h = _random()
    z = F.rms_norm(split_heads(x @ w.T, h), (4,))
    scores = z @ z.transpose(-1, -2) / 2.0
    torch.testing.assert_close(scores, scores.transpose(-1, -2))
    torch.testing.assert_close(
        torch.softmax(scores, dim=-2), torch.softmax(scores, dim=-1).transpose(-1, -2)
    )
    fast = attention_operator(z, z, z, symmetric=True)
    slow = attention_operator(z, z, z, symmetric=False)
    torch.testing.assert_close(fast, slow)


def _roles(n: int, p: int = 4, e: int = 4, *, symmetric: bool, shared: bool = False):
    g = torch.Generator().manual_seed(n + p + e)
    zq = F.rms_norm(torch.randn(2, 3, n, p, generator=g, dtype=D64), (p,)).requires_grad_(True)
    if shared:
        return zq, zq, zq
    zk = zq if symmetric else torch.randn(2, 3, n, p, generator=g, dtype=D64).requires_grad_(True)
    return zq, zk, torch.randn(2, 3, n, e, generator=g, dtype=D64).requires_grad_(True)


@pytest.fixture(params=["flash", "padded"])
def fused_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both fused paths: the flash kernel at the head width (CPU, equal widths, float32/64) and
    the padded SDPA calls it falls back to (other devices, other widths and dtypes)."""
    if request.param == "padded":
        monkeypatch.setattr(hyperset_energy, "_flash_applies", lambda *args: False)
    return str(request.param)


@pytest.mark.parametrize("beta", [None, 0.7, -0.4])
@pytest.mark.parametrize(
    ("symmetric", "shared", "e"),
    [(True, True, 4), (True, False, 4), (True, False, 6), (False, False, 4), (False, False, 3)],
)
def test_fused_bisoftmax_matches_explicit(
    symmetric: bool, shared: bool, e: int, beta: float | None, fused_path: str
) -> None:
    """The fused form (two or three kernel calls, no N x N tensor) equals the explicit
    bi-softmax in float64, values and gradients, for Q = K = V, Q = K with separate values, and
    separate roles (the classification code's three norms) with values of another width."""
    zq, zk, zv = _roles(21, e=e, symmetric=symmetric, shared=shared)
    leaves = list({id(t): t for t in (zq, zk, zv)}.values())
    fast = attention_operator(zq, zk, zv, beta=beta, symmetric=symmetric, fused=True)
    slow = attention_operator(zq, zk, zv, beta=beta, symmetric=symmetric, fused=False)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    cotangent = torch.randn_like(fast)
    grads_fast = torch.autograd.grad(fast, leaves, cotangent)
    grads_slow = torch.autograd.grad(slow, leaves, cotangent)
    for a, b in zip(grads_fast, grads_slow, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("e", [3, 4])
def test_fused_bisoftmax_gradcheck(symmetric: bool, e: int, fused_path: str) -> None:
    """Both fused paths have hand-written backward passes: check them numerically (one-hot
    cotangents: most rows get no gradient, so the flash path's lse gradient cannot be folded
    into them and takes its extra call). No second derivative: PyTorch's fused kernels'
    backward passes have none; ``fused=False`` has."""
    zq, zk, zv = _roles(5, p=3, e=e, symmetric=symmetric)
    inputs = (zq, zv) if symmetric else (zq, zk, zv)

    def fn(*args: torch.Tensor) -> torch.Tensor:
        q, k, v = (args[0], args[0], args[1]) if symmetric else args
        return bisoftmax_fused(q, k, v, beta=0.6, symmetric=symmetric)

    assert torch.autograd.gradcheck(fn, inputs)
    (grad,) = torch.autograd.grad(fn(*inputs).sum(), inputs[-1], create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(grad.sum(), inputs[0])


def test_fused_bisoftmax_with_more_keys_than_queries_and_no_tokens(fused_path: str) -> None:
    """Separate roles with 7 queries and 11 keys match the explicit form in values and
    gradients; no tokens at all give empty outputs and gradients on both fused paths."""
    g = torch.Generator().manual_seed(3)
    zq, zk, zv = (
        torch.randn(2, 3, n, 5, generator=g, dtype=D64).requires_grad_(True) for n in (7, 11, 11)
    )
    fast = attention_operator(zq, zk, zv, fused=True)
    slow = attention_operator(zq, zk, zv, fused=False)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    cotangent = torch.randn_like(fast)
    for a, b in zip(
        torch.autograd.grad(fast, (zq, zk, zv), cotangent),
        torch.autograd.grad(slow, (zq, zk, zv), cotangent),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)
    for symmetric in (True, False):
        empty = torch.randn(2, 3, 0, 5, dtype=D64, requires_grad=True)
        out = attention_operator(empty, empty, empty, symmetric=symmetric, fused=True)
        (grad,) = torch.autograd.grad(out.sum(), empty)
        assert out.shape == grad.shape == empty.shape


@pytest.mark.parametrize("symmetric", [True, False])
def test_flash_bisoftmax_gradients_of_partly_zero_cotangents(symmetric: bool) -> None:
    """Rows with zero, subnormal or tiny output gradients (a loss on some tokens only) get the
    column normalisers' gradient through the extra call: the gradients equal the explicit
    ones, and an all-zero cotangent gives zeros, never NaN."""
    zq, zk, zv = _roles(FUSED_MIN_TOKENS + 3, p=8, e=8, symmetric=symmetric, shared=symmetric)
    leaves = list({id(t): t for t in (zq, zk, zv)}.values())
    fast = attention_operator(zq, zk, zv, symmetric=symmetric, fused=True)
    slow = attention_operator(zq, zk, zv, symmetric=symmetric, fused=False)
    cotangent = torch.zeros_like(fast)
    cotangent[:, :, :3] = torch.randn_like(cotangent[:, :, :3])
    cotangent[:, :, 3] = 1e-160  # squares underflow in float64: not foldable
    cotangent[:, :, 4] = 4e-300  # subnormal once scaled
    for grad in (cotangent, torch.zeros_like(fast)):
        grads_fast = torch.autograd.grad(fast, leaves, grad, retain_graph=True)
        grads_slow = torch.autograd.grad(slow, leaves, grad, retain_graph=True)
        for a, b in zip(grads_fast, grads_slow, strict=True):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("shared", [True, False], ids=["v=z", "own-v"])
def test_shared_scores_bisoftmax_matches_explicit_and_gradcheck(shared: bool) -> None:
    """The one-N×N-tensor symmetric bi-softmax equals the explicit form in float64, values and
    gradients (with the values the same tensor as the projections or their own, of another
    width), and passes gradcheck; it has first derivatives only."""
    g = torch.Generator().manual_seed(4)
    z = torch.randn(2, 3, 13, 5, generator=g, dtype=D64, requires_grad=True)
    v = z if shared else torch.randn(2, 3, 13, 7, generator=g, dtype=D64, requires_grad=True)
    leaves = [z] if shared else [z, v]
    lean = hyperset_energy._SharedScoresBisoftmax.apply(z, v, 0.6)
    explicit = attention_operator(z, z, v, beta=0.6, symmetric=True, fused=False)
    torch.testing.assert_close(lean, explicit, rtol=1e-12, atol=1e-12)
    cotangent = torch.randn(lean.shape, generator=g, dtype=D64)
    for a, b in zip(
        torch.autograd.grad(lean, leaves, cotangent),
        torch.autograd.grad(explicit, leaves, cotangent),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)
    small = torch.randn(1, 2, 4, 3, generator=g, dtype=D64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x, w: hyperset_energy._SharedScoresBisoftmax.apply(x, w, 0.6),
        (small, small.detach().clone().requires_grad_(True)),
    )


def test_shared_scores_bisoftmax_is_chosen_for_half_precision_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fused=None below FUSED_MIN_TOKENS_HALF_CPU in bf16 with one tensor as queries and keys
    takes the shared-scores form (close to the float64 explicit result); not in float32, not
    for separate queries and keys, not with fused=False."""
    taken: list[bool] = []
    original = hyperset_energy._SharedScoresBisoftmax.apply

    def spy(*args: object) -> torch.Tensor:
        taken.append(True)
        return original(*args)  # type: ignore[no-any-return]

    monkeypatch.setattr(hyperset_energy._SharedScoresBisoftmax, "apply", spy)
    z = F.rms_norm(torch.randn(2, 2, 64, 16), (16,))
    half = z.bfloat16().requires_grad_(True)
    out = attention_operator(half, half, half, symmetric=True)
    assert taken == [True]
    reference = attention_operator(z.double(), z.double(), z.double(), symmetric=True, fused=False)
    torch.testing.assert_close(out.double(), reference, rtol=3e-2, atol=3e-2)
    (grad,) = torch.autograd.grad(out.float().square().sum(), half)
    exact = z.double().requires_grad_(True)
    expected = attention_operator(exact, exact, exact, symmetric=True, fused=False)
    (grad_expected,) = torch.autograd.grad(expected.square().sum(), exact)
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad.double(), grad_expected, rtol=5e-2, atol=5e-2)
    attention_operator(z, z, z, symmetric=True)
    attention_operator(half, half.detach().clone(), half, symmetric=True)
    attention_operator(half, half, half, symmetric=True, fused=False)
    assert taken == [True]


def test_fused_bisoftmax_is_chosen_when_safe() -> None:
    n = FUSED_MIN_TOKENS
    z = F.rms_norm(torch.randn(1, 2, n, 64), (64,))
    assert bisoftmax_fusable(z, z, beta=1 / 8)  # a = √p = 8: far from float32 underflow
    assert not bisoftmax_fusable(z[..., : n - 1, :], z[..., : n - 1, :], beta=1 / 8)
    assert not bisoftmax_fusable(4.0 * z, 4.0 * z, beta=1 / 8)  # a = 128: e^-a underflows
    assert bisoftmax_fusable(4.0 * z.double(), 4.0 * z.double(), beta=1 / 8)
    assert not bisoftmax_fusable(z, z, beta=0.0)
    # bfloat16 on the CPU: the explicit form is faster below FUSED_MIN_TOKENS_HALF_CPU tokens
    assert not bisoftmax_fusable(z.bfloat16(), z.bfloat16(), beta=1 / 8)
    wide = F.rms_norm(torch.randn(1, 1, FUSED_MIN_TOKENS_HALF_CPU, 8), (8,)).bfloat16()
    assert bisoftmax_fusable(wide, wide, beta=1 / 8)
    meta = torch.empty(1, 2, n, 64, device="meta")
    assert not bisoftmax_fusable(meta, meta, beta=1 / 8)  # the plan counts the explicit form
    # the automatic choice is the fused path: same values as forcing it
    auto = attention_operator(z, z, z, symmetric=True)
    torch.testing.assert_close(auto, attention_operator(z, z, z, symmetric=True, fused=True))
    torch.testing.assert_close(
        auto, attention_operator(z, z, z, symmetric=True, fused=False), rtol=1e-4, atol=1e-5
    )
    # large scores fall back to the explicit form and stay finite
    big = attention_operator(4.0 * z, 4.0 * z, 4.0 * z, symmetric=True)
    assert torch.isfinite(big).all()
    with pytest.raises(ValueError, match="fused=True"):
        attention_operator(z, z, z, "sigmoid", fused=True)


@pytest.mark.parametrize("separate", [False, True])
def test_layer_uses_the_fused_bisoftmax_for_long_sequences(separate: bool) -> None:
    """A layer over N >= FUSED_MIN_TOKENS tokens (fused attention) equals the explicit operator,
    forward and backward, with one shared or three separate Q/K/V norms (learned gains)."""
    torch.manual_seed(0)
    layer = HyperSETLayer(12, 3, 16, separate_qkv_norms=separate, dtype=D64)
    with torch.no_grad():
        for gain in layer.qkv_norms.parameters():
            gain.uniform_(0.5, 1.5)
    x = torch.randn(2, FUSED_MIN_TOKENS + 5, 12, dtype=D64, requires_grad=True)
    fast = layer.attention_step(x)
    zq, zk, zv = layer.projections(x)
    slow = merge_heads(attention_operator(zq, zk, zv, symmetric=not separate, fused=False))
    slow = slow @ layer.qkv.weight
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    params = [x, layer.qkv.weight, *layer.qkv_norms.parameters()]
    for a, b in zip(
        torch.autograd.grad(fast.square().sum(), params),
        torch.autograd.grad(slow.square().sum(), params),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


def test_fused_attention_steps_descend_the_energy_like_the_explicit_ones() -> None:
    """The A.6 dynamics over N >= FUSED_MIN_TOKENS tokens: small fixed attention steps with the
    fused update lower E_ATTN first and follow the explicit trajectory step for step."""
    torch.manual_seed(0)
    n, d, h = FUSED_MIN_TOKENS + 2, 12, 3
    x = torch.randn(1, n, d, dtype=D64)
    q = torch.linalg.qr(torch.randn(d, d, dtype=D64))[0].T.contiguous()
    fast, slow = x, x
    energies = [attention_energy(x, q, h).item()]
    for _ in range(5):
        fast = fast - 0.01 * attention_update(fast, q, h, fused=True)
        slow = slow - 0.01 * attention_update(slow, q, h, fused=False)
        energies.append(attention_energy(fast, q, h).item())
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    assert energies[1] < energies[0]


def test_sphere_radius_of_normalised_projections() -> None:
    layer = HyperSETLayer(16, 4, 24, dtype=D64)
    x = torch.randn(3, 5, 16, dtype=D64) * 7.0
    zq, zk, zv = layer.projections(x)
    assert zq is zk is zv  # one shared norm: Q = K = V
    torch.testing.assert_close(zq.norm(dim=-1), torch.full((3, 4, 5), 2.0, dtype=D64))
    u = layer.ff_norm(layer.mlp(x))
    torch.testing.assert_close(u.norm(dim=-1), torch.full((3, 5), math.sqrt(24), dtype=D64))
    separate = HyperSETLayer(16, 4, separate_qkv_norms=True)
    assert len(separate.qkv_norms) == 3


@pytest.mark.parametrize("style", ["plain", "normed", "direct"])
@pytest.mark.parametrize("condition", ["input", "state"])
def test_zero_initialised_step_sizes_make_the_encoder_the_identity(
    style: str, condition: str
) -> None:
    enc = HyperSETEncoder(
        16,
        2,
        32,
        iterations=4,
        num_layers=2,
        step_style=style,
        condition=condition,
        time_frequency=16,
    )
    x0 = torch.randn(2, 5, 16)
    assert torch.equal(enc(x0), x0)
    assert torch.equal(enc(x0, iterations=10), x0)  # test-time extrapolation too
    states, steps = enc.trajectory(x0)
    assert len(states) == 4 and all(torch.equal(s, x0) for s in states)
    assert all(float(a.abs().max()) == 0.0 and float(g.abs().max()) == 0.0 for a, g in steps)


def test_learned_steps_receive_gradient_and_change_the_state() -> None:
    enc = HyperSETEncoder(8, 2, iterations=3, time_frequency=8)
    x0 = torch.randn(2, 4, 8)
    enc(x0).square().sum().backward()
    step = enc.step_sizes.step  # type: ignore[union-attr]
    assert step.weight.grad is not None and step.weight.grad.abs().sum() > 0
    with torch.no_grad():
        step.bias.fill_(0.1)
    assert not torch.allclose(enc(x0), x0)


def test_fixed_step_and_multi_layer_schedule() -> None:
    enc = HyperSETEncoder(8, 2, iterations=4, num_layers=2, step_size=0.1, dtype=D64)
    assert enc.step_sizes is None
    x0 = torch.randn(1, 3, 8, dtype=D64)
    layers = enc.hyperset_layers()
    x = x0
    for layer in (layers[0], layers[0], layers[1], layers[1]):
        x = layer(x, 0.1, 0.1)
    torch.testing.assert_close(enc(x0), x)
    assert enc.layer_at(1) is layers[0] and enc.layer_at(2) is layers[1]
    with pytest.raises(ValueError, match="num_layers"):
        enc(x0, iterations=5)


def test_time_embedding_matches_code_formula() -> None:
    emb = time_embedding(torch.tensor([1, 3]), 8)
    omega = torch.exp(-torch.arange(4, dtype=D64) * math.log(10000.0) / 3)
    torch.testing.assert_close(emb[1], torch.cat([torch.sin(3 * omega), torch.cos(3 * omega)]))
    pe = sinusoidal_positions(5, 6)
    assert pe[0, 1] == 1.0 and pe[2, 0] == pytest.approx(math.sin(2.0))
    assert sinusoidal_positions_2d(3, 4, 8).shape == (12, 8)


def test_lora_adapters_per_iteration() -> None:
    enc = HyperSETEncoder(8, 2, 8, iterations=3, lora_rank=2, step_size=0.5, dtype=D64)
    assert enc.lora_scale / enc.lora_rank == 4.0
    assert (
        count_parameters(enc)
        - count_parameters(HyperSETEncoder(8, 2, 8, iterations=3, step_size=0.5))
        == 2 * 2 * 8 * 2 * 3
    )
    x0 = torch.randn(1, 3, 8, dtype=D64)
    layer = enc.hyperset_layers()[0]
    x = x0
    for t in range(3):
        dw = 4.0 * enc.lora_attn_b[t] @ enc.lora_attn_a[t]
        dd = 4.0 * enc.lora_ff_b[t] @ enc.lora_ff_a[t]
        x = x - 0.5 * layer.attention_step(x, dw)
        x = x + 0.5 * layer.feedforward_step(x, dd)
    torch.testing.assert_close(enc(x0), x)
    with pytest.raises(ValueError, match="LoRA"):
        enc(x0, iterations=4)


def test_effective_rank_and_angle() -> None:
    eye = torch.eye(4, dtype=D64)
    assert effective_rank(eye).item() == pytest.approx(4.0)
    assert effective_rank(torch.ones(5, 3, dtype=D64)).item() == pytest.approx(1.0)
    assert average_angle(eye).item() == pytest.approx(90.0)
    pair = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]], dtype=D64)
    assert average_angle(pair, "mean_of_arccos").item() == pytest.approx(60.0)
    assert average_angle(pair).item() == pytest.approx(math.degrees(math.acos((2 / 2**0.5) / 3)))


def test_transformer_baseline_shapes_and_sharing() -> None:
    enc = SharedTransformerEncoder(16, 4, iterations=3)
    x0 = torch.randn(2, 5, 16)
    y, states = enc(x0, return_states=True)
    assert y.shape == x0.shape and len(states) == 3
    assert count_parameters(enc) == 2 * 16 + 4 * 16**2 + 2 * 16 * 64
    assert flops_per_iteration("transformer", 5, 16, 64) > flops_per_iteration(
        "hyperset", 5, 16, 16
    )


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="num_heads"):
        HyperSETLayer(10, 3)
    with pytest.raises(ValueError, match="attention"):
        HyperSETLayer(8, 2, attention="cosine")
    with pytest.raises(ValueError, match="frequency"):
        StepSizeNetwork(8, 16, style="direct")
    with pytest.raises(TypeError, match="step_size"):
        HyperSETEncoder(8, 2, step_size="big")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="x must have shape"):
        HyperSETLayer(8, 2).attention_step(torch.randn(2, 3, 9))
    with pytest.raises(ValueError, match="arch"):
        sudoku_model("rnn")


# Spec §4.5: every paper parameter count, reproduced exactly.
PAPER_COUNTS = [
    ("sudoku hyperset", lambda: sudoku_model(), 5_195_584),
    ("sudoku transformer", lambda: sudoku_model("transformer"), 7_156_992),
    ("cifar10 small", lambda: image_classifier(), 962_218),
    ("cifar100 small", lambda: image_classifier(num_classes=100), 996_868),
    ("in100 small", lambda: image_classifier(num_classes=100, image_size=224, grid=16), 1_205_308),
    ("cifar10 scale-up", lambda: image_classifier(d_model=512, num_heads=8), 1_610_538),
    (
        "cifar100 scale-up",
        lambda: image_classifier(d_model=512, num_heads=8, num_classes=100),
        1_656_708,
    ),
    (
        "cifar100 scale-up L2",
        lambda: image_classifier(d_model=512, num_heads=8, num_classes=100, num_layers=2),
        2_181_700,
    ),
    (
        "in100 scale-up",
        lambda: image_classifier(
            d_model=512, num_heads=8, num_classes=100, image_size=224, grid=16
        ),
        1_934_268,
    ),
    *[
        (
            f"in100 scale-up lora{r}",
            (
                lambda r=r: image_classifier(
                    d_model=512,
                    num_heads=8,
                    num_classes=100,
                    image_size=224,
                    grid=16,
                    lora_rank=r,
                )
            ),
            expected,
        )
        for r, expected in [(4, 2_032_572), (8, 2_130_876), (16, 2_327_484), (32, 2_720_700)]
    ],
    (
        "cifar100 base",
        lambda: image_classifier(d_model=768, num_heads=12, num_classes=100),
        3_467_908,
    ),
    ("cifar10 transformer", lambda: image_classifier("transformer"), 1_794_826),
    ("cifar100 transformer", lambda: image_classifier("transformer", num_classes=100), 1_829_476),
    (
        "cifar10 d1536 F=d",
        lambda: image_classifier(d_model=1536, num_heads=12, time_frequency=1536),
        14_268_394,
    ),
    (
        "cifar10 transformer d1152",
        lambda: image_classifier("transformer", d_model=1152, num_heads=12),
        16_001_290,
    ),
    ("cifar10 crate", lambda: image_classifier("crate"), 468_106),
    ("cifar10 crate-t", lambda: image_classifier("crate-t"), 320_266),
    ("mim hyperset", lambda: masked_token_model(), 3_937_856),
    ("mim hyperset 8d", lambda: masked_token_model(ff_ratio=8.0), 8_072_000),
    ("mim transformer", lambda: masked_token_model("transformer"), 8_654_848),
]


@pytest.mark.parametrize(
    ("name", "build", "expected"), PAPER_COUNTS, ids=[c[0] for c in PAPER_COUNTS]
)
def test_paper_parameter_counts(name: str, build, expected: int) -> None:  # type: ignore[no-untyped-def]
    with torch.device("meta"):
        model = build()
    assert count_parameters(model) == expected


def test_task_models_forward() -> None:
    sudoku = sudoku_model(d_model=16, num_heads=2, iterations=2, time_frequency=8)
    puzzles = torch.randint(0, 10, (3, 81))
    assert sudoku(puzzles).shape == (3, 81, 9)
    _, states = sudoku(puzzles, iterations=3, return_states=True)
    assert len(states) == 3
    with pytest.raises(ValueError, match=r"0\.\.9"):
        sudoku(puzzles + 10)
    clf = image_classifier(
        num_classes=4,
        image_size=8,
        in_channels=1,
        grid=4,
        d_model=16,
        num_heads=2,
        iterations=2,
        time_frequency=8,
    )
    assert clf(torch.rand(5, 1, 8, 8)).shape == (5, 4)
    img = torch.arange(16.0).reshape(1, 1, 4, 4)
    assert patchify(img, 2)[0, 1].tolist() == [2.0, 3.0, 6.0, 7.0]
    mim = masked_token_model(codebook_size=6, grid=2, d_model=16, num_heads=2, iterations=2)
    codes = torch.randint(0, 7, (2, 4))
    out = mim(codes)
    assert out.shape == (2, 4, 6)
    masked = codes == 6
    loss = masked_token_loss(out, torch.randint(0, 6, (2, 4)), masked | True)
    assert loss.ndim == 0 and loss > 0


def test_zero_initialised_time_mlp_stays_constant_under_training() -> None:
    """With the official zero initialisation of both time-MLP Linears, their weights get zero
    gradient (GELU(0) = 0 feeds the second, whose zero weight blocks the first): only the last
    bias learns, so the learned step sizes depend on t only through X_t (a documented finding)."""
    enc = HyperSETEncoder(8, 2, iterations=3, time_frequency=8)
    net = enc.step_sizes
    assert net is not None and net.time_in is not None and net.time_out is not None
    optimizer = torch.optim.AdamW(enc.parameters(), lr=0.1)
    x0 = torch.randn(2, 4, 8)
    for _ in range(3):
        optimizer.zero_grad()
        enc(x0).sin().sum().backward()
        optimizer.step()
    assert float(net.time_in.weight.detach().abs().max()) == 0.0
    assert float(net.time_out.weight.detach().abs().max()) == 0.0
    assert float(net.time_out.bias.detach().abs().max()) > 0.0
    c = net.time_condition(torch.arange(1, 4))
    assert torch.equal(c[0], c[2])


def test_untrained_dynamics_with_orthogonal_weights() -> None:
    """Spec §9.3 A.6: fixed FF steps descend E_FF monotonically; fixed attention steps (eq. 9)
    first lower E_ATTN, then the self-interaction shrinks the tokens and E_ATTN climbs toward its
    collapsed maximum ``H·β⁻¹·N(log N + βp)``."""
    torch.manual_seed(0)
    n, d, h = 7, 12, 3
    x = torch.randn(1, n, d, dtype=D64)
    q = torch.linalg.qr(torch.randn(d, d, dtype=D64))[0].T.contiguous()
    for gamma in (0.05, 0.5, 1.0):
        y, energies = x, []
        for _ in range(30):
            y = y + gamma * feedforward_update(y, q)
            energies.append(feedforward_energy(y, q).item())
        assert all(b <= a + 1e-12 for a, b in itertools.pairwise(energies))
    y, energies = x, [attention_energy(x, q, h).item()]
    for _ in range(60):
        y = y - 0.05 * attention_update(y, q, h)
        energies.append(attention_energy(y, q, h).item())
    assert energies[1] < energies[0]
    maximum = h * 2.0 * n * (math.log(n) + 0.5 * 4)  # β = 1/2 for p = 4
    assert energies[-1] > energies[0] and energies[-1] == pytest.approx(maximum, rel=0.01)


def test_crate_layer_ista_and_tied_output() -> None:
    layer = CRATELayer(8, 2, tied_output=True, dtype=D64)
    assert layer.out is None
    x = torch.randn(2, 3, 8, dtype=D64)
    w = split_heads(layer.qkv(layer.norm1(x)), 2)
    y = torch.softmax(w @ w.transpose(-1, -2) / 2.0, dim=-1) @ w
    u = layer.norm2(x + y.transpose(1, 2).reshape(2, 3, 8) @ layer.qkv.weight)
    dic = layer.dictionary
    expected = F.relu(u + 0.1 * (u @ dic - u @ dic @ dic.T) - 0.01)
    torch.testing.assert_close(layer(x), expected)


@pytest.mark.parametrize("shape", [(1,), (6,), (2, 3, 6)])
def test_layer_steps_match_their_formula_with_gradients_for_broadcast_step_sizes(shape) -> None:
    """``X - α ⊙ attention_step + γ ⊙ feedforward_step`` (in turn), with gradients (and second
    derivatives, on the explicit bi-softmax) to X, α and γ of any broadcastable shape."""
    from hopfield.nn.hyperset import _take_step

    torch.manual_seed(0)
    layer = HyperSETLayer(6, 2, 4, dtype=D64)
    x = torch.randn(2, 3, 6, dtype=D64, requires_grad=True)
    alpha = torch.rand(*shape, dtype=D64, requires_grad=True)
    gamma = torch.rand(*shape, dtype=D64, requires_grad=True)
    mid = x - alpha * layer.attention_step(x)
    expected = mid + gamma * layer.feedforward_step(mid)
    torch.testing.assert_close(layer(x, alpha, gamma), expected)
    update = torch.randn(2, 3, 6, dtype=D64, requires_grad=True)
    assert torch.autograd.gradcheck(_take_step, (x, alpha, update))
    assert torch.autograd.gradgradcheck(_take_step, (x, alpha, update))
    torch.testing.assert_close(_take_step(x, 0.5, update), x + 0.5 * update)


@pytest.mark.parametrize("symmetric", [True, False])
def test_flash_bisoftmax_with_split_keys_matches_explicit(monkeypatch, symmetric: bool) -> None:
    """One batch-head on two threads with 2 × 3 keys a part: the flash path's forward calls
    split the keys (structures.flash_attention, split-KV) and still equal the explicit
    bi-softmax in values and gradients."""
    from hopfield.functional import structures

    monkeypatch.setattr(structures, "KEYS_PER_PART", 3)
    parts: list[int] = []

    def spy(q, k, v, mask, is_causal, scale):
        parts.append(structures._key_parts(q, k, mask, is_causal))
        return structures.flash_attention(q, k, v, mask, is_causal, scale)

    monkeypatch.setattr(hyperset_energy, "flash_attention", spy)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(5)
        zq, zk, zv = (torch.randn(1, 1, 7, 4, generator=g, dtype=D64) for _ in range(3))
        zk = zq if symmetric else zk
        leaves = [t.requires_grad_(True) for t in dict.fromkeys((zq, zk, zv))]
        _assert_fused_is_explicit((zq, zk, zv), leaves, symmetric, grad_tolerance=1e-11)
        assert parts and set(parts) == {2}
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("symmetric", [True, False])
def test_flash_bisoftmax_of_projections_stored_feature_major(symmetric: bool) -> None:
    """Projections whose last dimension is not stored with stride 1 (an ``(..., p, N)`` tensor
    transposed) give the explicit bi-softmax's values and gradients on the flash path, whose
    kernels, called directly, read such rows wrongly (before 29 Nov: silently wrong)."""
    zq, zk, zv = _roles(FUSED_MIN_TOKENS + 3, p=8, e=8, symmetric=symmetric)

    def feature_major(x: torch.Tensor) -> torch.Tensor:
        return x.detach().transpose(-2, -1).contiguous().transpose(-2, -1).requires_grad_(True)

    stored = [feature_major(t) for t in ((zq, zv) if symmetric else (zq, zk, zv))]
    roles = (stored[0], stored[0], stored[1]) if symmetric else tuple(stored)
    assert hyperset_energy._flash_applies(*roles) and roles[0].stride(-1) != 1
    _assert_fused_is_explicit(roles, stored, symmetric, grad_tolerance=1e-10)


def _assert_fused_is_explicit(
    roles: tuple[torch.Tensor, ...],
    leaves: list[torch.Tensor],
    symmetric: bool,
    grad_tolerance: float,
) -> None:
    """The fused bi-softmax of ``roles = (zq, zk, zv)`` equals the explicit one in value and in
    the gradients of ``leaves`` for one random cotangent."""
    fast = attention_operator(*roles, symmetric=symmetric, fused=True)
    slow = attention_operator(*roles, symmetric=symmetric, fused=False)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    cotangent = torch.randn_like(fast)
    for a, b in zip(
        torch.autograd.grad(fast, leaves, cotangent),
        torch.autograd.grad(slow, leaves, cotangent),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=grad_tolerance, atol=grad_tolerance)

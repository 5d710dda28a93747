"""The sink family (issue 29): one separation, the same numbers on every path.

Every path (explicit, SDPA with an extra key, the CPU flash kernel's log-sum-exp, FlexAttention)
is checked against a float64 oracle, a softmax over ``[scores, sink logit]`` whose sink weight
retrieves the value sink, in values and in gradients (the sink's own included).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import Tensor

from hopfield.functional import (
    EntmaxSink,
    Sink,
    Softmax,
    SoftmaxN,
    Sparsemax,
    TopK,
    associate,
)
from hopfield.functional.energy import OutEffEnergy, SinkEnergy, energy_for, scores_of
from hopfield.functional.sink import (
    TOLERANCES,
    flex_available,
    flex_lse_is_natural,
    sink_attention,
)
from hopfield.memory import retrieve

B, H, L, S, E = 2, 4, 5, 7, 8
GRAD_PATHS = ("explicit", "sdpa", "lse")


def oracle(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    logit: Tensor,
    value: Tensor | None,
    mask: Tensor | None = None,
    causal: bool = False,
) -> Tensor:
    """Float64 ``softmax([z, s]) @ [v; v_s]``; ``logit`` ``()`` or ``(H,)``, ``value`` ``(H, Ev)``."""
    q, k, v = q.double(), k.double(), v.double()
    z = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    allowed = torch.ones(z.shape[-2:], dtype=torch.bool, device=z.device)
    if causal:
        allowed = allowed.tril(z.shape[-1] - z.shape[-2])
    if mask is not None:
        allowed = allowed & mask
    z = z.masked_fill(~allowed, -math.inf)
    sink = logit.double().reshape(1, -1, 1, 1).expand(*z.shape[:-1], 1)
    p = torch.softmax(torch.cat([z, sink], dim=-1), dim=-1)
    out = p[..., :-1] @ v
    if value is not None:
        out = out + p[..., -1:] * value.double().reshape(1, -1, 1, v.shape[-1])
    return out


def patterns(dtype: torch.dtype = torch.float64, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, E, generator=gen).to(dtype) for n in (L, S, S))  # type: ignore[return-value]


def random_mask() -> Tensor:
    mask = torch.rand(B, 1, L, S, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[0, 0, 1] = False  # a fully masked row
    return mask


def sink_of(kind: str, dtype: torch.dtype = torch.float64) -> Sink:
    """The sinks under test: fixed, per-head learnable, per key/value group, with a value sink."""
    gen = torch.Generator().manual_seed(2)
    if kind == "fixed":
        return Sink(0.7)
    if kind == "head":
        sink = Sink(0.0, learnable=True, heads=H, dtype=dtype)
    elif kind == "group":  # grouped-query attention: 2 key/value groups of 2 query heads
        sink = Sink(0.0, learnable=True, heads=2, value=E, dtype=dtype)
    else:
        sink = Sink(0.0, learnable=True, heads=H, value=E, dtype=dtype)
    with torch.no_grad():
        for parameter in sink.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=gen))
    return sink


def oracle_parameters(sink: Sink) -> tuple[Tensor, Tensor | None]:
    """The sink's logit ``(H,)`` or ``()`` and value ``(H, Ev)`` as the oracle takes them."""
    logit = (
        sink.logit
        if isinstance(sink.logit, Tensor)
        else torch.tensor(sink.logit, dtype=torch.float64)
    )
    value = sink.value
    if logit.dim() == 1:
        logit = logit.repeat_interleave(H // logit.shape[0])
    if value is not None and value.dim() == 2:
        value = value.repeat_interleave(H // value.shape[0], 0)
    return logit, value


@pytest.mark.parametrize("kind", ["fixed", "head", "group", "value"])
@pytest.mark.parametrize("masking", ["none", "mask", "causal"])
def test_paths_match_oracle_values_and_gradients(kind: str, masking: str) -> None:
    sink = sink_of(kind)
    mask = random_mask() if masking == "mask" else None
    causal = masking == "causal"
    upstream = torch.randn(B, H, L, E, dtype=torch.float64)
    results = {}
    for path in (*GRAD_PATHS, "oracle"):
        q, k, v = (t.requires_grad_() for t in patterns())
        sink.zero_grad()
        if path == "oracle":
            out = oracle(q, k, v, *oracle_parameters(sink), mask=mask, causal=causal)
        else:
            out = sink_attention(q, k, v, sink, path=path, mask=mask, causal=causal)  # type: ignore[arg-type]
        (out * upstream).sum().backward()
        grads = [t.grad for t in (q, k, v)] + [p.grad.clone() for p in sink.parameters()]  # type: ignore[union-attr]
        results[path] = (out.detach(), grads)
    expected_out, expected_grads = results.pop("oracle")
    assert len(expected_grads) == 3 + len(list(sink.parameters()))
    for path, (out, grads) in results.items():
        torch.testing.assert_close(out, expected_out, atol=1e-12, rtol=0, msg=path)
        for got, want in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(got, want, atol=1e-12, rtol=0, msg=path)


@pytest.mark.parametrize("value", [None, 4])
def test_lse_path_gradcheck_includes_the_sink(value: int | None) -> None:
    sink = Sink(0.0, learnable=True, heads=2, value=value, dtype=torch.float64)
    with torch.no_grad():
        for parameter in sink.parameters():
            parameter.normal_()
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=gen, dtype=torch.float64) for _ in range(3))

    def run(q: Tensor, k: Tensor, v: Tensor, *params: Tensor) -> Tensor:
        return sink_attention(q, k, v, sink, path="lse", causal=True)

    inputs = (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), *sink.parameters())
    assert torch.autograd.gradcheck(run, inputs)


def test_flex_path_forward_matches_oracle() -> None:
    if not flex_available():
        pytest.skip("FlexAttention is not available in this torch")
    mask = random_mask()
    for kind in ("fixed", "group", "value"):
        sink = sink_of(kind)
        q, k, v = patterns()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager FlexAttention warns that it is not compiled
            out = sink_attention(q, k, v, sink, path="flex", mask=mask)
        expected = oracle(q, k, v, *oracle_parameters(sink), mask=mask)
        torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)


def test_flex_log_sum_exp_is_natural_on_cpu() -> None:
    if not flex_available():
        pytest.skip("FlexAttention is not available in this torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert flex_lse_is_natural("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's backward needs a GPU")
@pytest.mark.parametrize("compiled", [False, True])
def test_flex_path_values_and_gradients_on_the_gpu(compiled: bool) -> None:
    """Where FlexAttention has a backward: values and gradients (the sink's included) against
    the oracle, and the log-sum-exp convention of the eager and the compiled kernels."""
    assert flex_lse_is_natural("cuda", compiled=compiled)
    width = 16  # the compiled kernels want a head size of at least 16
    sink = Sink(0.0, learnable=True, heads=H, value=width, device="cuda")
    with torch.no_grad():
        for parameter in sink.parameters():
            parameter.normal_()
    mask = random_mask().cuda()
    q, k, v = (torch.randn(B, H, n, width, device="cuda").requires_grad_() for n in (L, S, S))
    out = sink_attention(q, k, v, sink, path="flex", mask=mask, compile_flex=compiled)
    upstream = torch.randn(out.shape, device="cuda")
    (out * upstream).sum().backward()
    got = [q.grad, k.grad, v.grad, sink.logit.grad, sink.value.grad]
    exact = [t.detach().double().requires_grad_() for t in (q, k, v, sink.logit, sink.value)]
    expected = oracle(*exact[:3], exact[3], exact[4], mask)
    (expected * upstream.double()).sum().backward()
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=0)
    for tensor, want in zip(got, exact, strict=True):
        assert tensor is not None and want.grad is not None
        torch.testing.assert_close(tensor.double(), want.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("path", GRAD_PATHS)
def test_half_precision_within_documented_tolerance_and_empty_rows_finite(
    dtype: torch.dtype, path: str
) -> None:
    sink = sink_of("value", torch.float32)
    mask = random_mask()
    q, k, v = (t.to(dtype).requires_grad_() for t in patterns())
    out = sink_attention(q, k, v, sink, path=path, mask=mask, causal=True)  # type: ignore[arg-type]
    assert out.dtype == dtype
    expected = oracle(q.detach(), k.detach(), v.detach(), *oracle_parameters(sink), mask, True)
    torch.testing.assert_close(out.double(), expected, atol=TOLERANCES[dtype], rtol=0)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    (out.float() * upstream).sum().backward()
    got = [q.grad, k.grad, v.grad, sink.logit.grad, sink.value.grad]
    exact = [t.detach().double().requires_grad_() for t in (q, k, v, sink.logit, sink.value)]
    (oracle(*exact[:3], exact[3], exact[4], mask, True) * upstream.double()).sum().backward()
    for tensor, want in zip(got, exact, strict=True):
        assert tensor is not None and bool(torch.isfinite(tensor).all())
        assert want.grad is not None
        error = (tensor.double() - want.grad).abs().max() / want.grad.abs().max().clamp_min(1.0)
        assert float(error) <= TOLERANCES[dtype]  # relative to the largest gradient (or 1)
    # The fully masked row abstains entirely: its output is the value sink, exactly as rounded.
    torch.testing.assert_close(out[0, :, 1].float(), sink.value.detach().to(dtype).float())


def test_softmax_n_is_the_sink_with_logit_log_n() -> None:
    for n in (1.0, 3.0, 0.5):
        softmax_n = SoftmaxN(n)
        assert isinstance(softmax_n, Sink) and softmax_n.logit == math.log(n)
        scores = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
        scores_sink = scores.detach().clone().requires_grad_()
        logit = torch.tensor(math.log(n), dtype=torch.float64, requires_grad=True)
        weights, general = softmax_n(scores), Sink(logit)(scores_sink)
        torch.testing.assert_close(weights, general, atol=1e-15, rtol=0)
        upstream = torch.randn(3, 6, dtype=torch.float64)
        (weights * upstream).sum().backward()
        (general * upstream).sum().backward()
        torch.testing.assert_close(scores.grad, scores_sink.grad, atol=1e-15, rtol=0)
    assert Softmax().logit == -math.inf


def test_associate_dispatches_sinks_and_return_weights_agrees() -> None:
    sink = sink_of("value")
    q, k, v = patterns()
    expected = oracle(q, k, v, *oracle_parameters(sink), causal=True)
    fused = associate(q, k, v, separation=sink, causal=True)
    out, weights = associate(q, k, v, separation=sink, causal=True, return_weights=True)
    torch.testing.assert_close(fused, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    assert weights is not None and bool((weights.sum(-1) < 1).all())  # the sink keeps some mass


def test_no_memories_retrieve_the_value_sink() -> None:
    sink = sink_of("value")
    q = torch.randn(B, H, L, E, dtype=torch.float64)
    empty = torch.zeros(B, H, 0, E, dtype=torch.float64)
    out = associate(q, empty, empty, separation=sink)
    torch.testing.assert_close(out, sink.value.detach()[None, :, None].expand(B, H, L, E))


def bisection_entmax(scores: Tensor, alpha: float) -> Tensor:
    """Float64 alpha-entmax by bisection on tau: ``p = [(α-1) z - tau]_+^(1/(α-1))``, Σp = 1."""
    z = scores.double() * (alpha - 1)
    low = z.amax(-1, keepdim=True) - 1.0  # Σp >= 1 here
    high = z.amax(-1, keepdim=True)  # Σp = 0 here
    for _ in range(200):
        tau = (low + high) / 2
        total = (z - tau).clamp_min(0).pow(1 / (alpha - 1)).sum(-1, keepdim=True)
        low, high = torch.where(total >= 1, tau, low), torch.where(total >= 1, high, tau)
    return (z - low).clamp_min(0).pow(1 / (alpha - 1))


@pytest.mark.parametrize("alpha", [1.3, 1.5, 2.0])
def test_entmax_sink_matches_bisection_and_keeps_exact_zeros(alpha: float) -> None:
    separation = EntmaxSink(alpha, logit=0.5)
    scores = torch.randn(4, 9, dtype=torch.float64) * 2
    scores[0] = -5.0  # every score far below the sink: the row abstains
    weights, abstained = separation.split(scores)
    full = bisection_entmax(
        torch.cat([scores, torch.full((4, 1), 0.5, dtype=scores.dtype)], -1), alpha
    )
    torch.testing.assert_close(weights, full[:, :-1], atol=1e-10, rtol=0)
    torch.testing.assert_close(abstained, full[:, -1:], atol=1e-10, rtol=0)
    assert bool((weights[0] == 0).all()) and float(abstained[0]) == pytest.approx(1.0)
    assert bool(((full[:, :-1] == 0) == (weights == 0)).all())  # the same exact zeros


def test_learnable_entmax_sink_gradcheck_alpha_and_sink() -> None:
    separation = EntmaxSink(
        1.4, learnable=True, num_heads=2, logit=0.2, learnable_logit=True, heads=2
    )
    separation.double()
    scores = torch.randn(1, 2, 3, 5, dtype=torch.float64, requires_grad=True)

    def run(scores: Tensor, *params: Tensor) -> Tensor:
        return separation(scores)

    assert torch.autograd.gradcheck(run, (scores, *separation.parameters()))
    assert len(list(separation.parameters())) == 2  # alpha and the sink logit


def test_entmax_sink_value_sink_in_associate() -> None:
    separation = EntmaxSink(1.5, logit=10.0, value=torch.ones(E, dtype=torch.float64))
    q, k, v = patterns()
    out = associate(q, k, v, separation=separation)  # a sink far above every score: abstain
    torch.testing.assert_close(out, torch.ones_like(out))


def test_sink_energy_generalises_outeff_and_retrieval_decreases_it() -> None:
    scores = torch.randn(3, 5, dtype=torch.float64)
    torch.testing.assert_close(
        SinkEnergy(math.log(2.0)).potential(scores), OutEffEnergy(2.0).potential(scores)
    )
    energy = energy_for(Sink(0.3))
    assert isinstance(energy, SinkEnergy) and energy.logit == 0.3
    assert energy_for(Sink(0.0, learnable=True)) is None
    memories = torch.randn(6, 4, dtype=torch.float64)
    x = torch.randn(2, 4, dtype=torch.float64)
    result = retrieve(x, memories, Sink(0.3), beta=2.0, steps=5, track_energy=True)
    assert result.energy is not None
    assert bool((result.energy.diff(dim=0) <= 1e-12).all())
    mass = energy.no_op_mass(x, memories, 2.0)
    lse = torch.logsumexp(scores_of(x, memories, 2.0), -1)
    torch.testing.assert_close(mass, torch.sigmoid(0.3 - lse))


def test_bad_arguments_are_refused_with_their_names() -> None:
    with pytest.raises(ValueError, match="logit"):
        Sink(math.nan)
    with pytest.raises(ValueError, match="learnable"):
        Sink(torch.zeros(H), learnable=True)
    with pytest.raises(ValueError, match="heads"):
        Sink(torch.zeros(3), heads=4)
    with pytest.raises(ValueError, match="value"):
        Sink(0.0, value=0)
    with pytest.raises(ValueError, match="multiple"):
        Sink(0.0, learnable=True, heads=3)(torch.randn(1, 4, 2, 2))
    q, k, v = patterns()
    with pytest.raises(ValueError, match=r"value sink.*Dense.*TopK"):
        associate(q, k, v, separation=Sink(0.0, value=E), structure=TopK(2))
    for path in GRAD_PATHS:
        with pytest.raises(ValueError, match="value sink has size 3"):
            sink_attention(q, k, v, Sink(0.0, value=3), path=path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="path"):
        sink_attention(q, k, v, Sink(), path="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dropout"):
        sink_attention(q, k, v, Sink(), path="lse", dropout=0.1)
    with pytest.raises(TypeError, match="sink"):
        sink_attention(q, k, v, Sparsemax())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no sink"):
        sink_attention(q, k, v, Softmax())


def test_hf_interface_sinks_use_the_sink_paths() -> None:
    """gpt-oss's s_aux through the AttentionInterface function: the fused path and the explicit
    one (output_attentions) agree with the oracle in values and gradients, the sinks' included,
    with grouped-query key/value heads and a padding mask."""
    from torch import nn

    from hopfield.integrations.attention import attention_forward

    module = nn.Module()
    q, k, v = patterns()
    k, v = k[:, :2], v[:, :2]  # 2 key/value heads for H = 4 query heads
    mask = random_mask()
    upstream = torch.randn(B, L, H, E, dtype=torch.float64)
    results = []
    for asked in (False, True, None):
        sinks = torch.linspace(-1.0, 1.0, H, dtype=torch.float64).requires_grad_()
        qq = q.clone().requires_grad_()
        if asked is None:
            full_k, full_v = (t.repeat_interleave(2, 1) for t in (k, v))
            out = oracle(qq, full_k, full_v, sinks, None, mask=mask).transpose(1, 2)
        else:
            out, _ = attention_forward(
                "softmax1", module, qq, k, v, mask, s_aux=sinks, output_attentions=asked
            )
        (out * upstream).sum().backward()
        results.append((out.detach(), qq.grad, sinks.grad))
    for got in results[:2]:
        for a, b in zip(got, results[2], strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_a_learnable_sink_trains_inside_a_hopfield_layer() -> None:
    from hopfield.nn import Hopfield

    layer = Hopfield(16, 4, separation=Sink(0.0, learnable=True, heads=4, value=4))
    assert {"separation.logit", "separation.value"} <= set(layer.state_dict())
    layer(torch.randn(2, 5, 16)).square().sum().backward()
    assert layer.separation.logit.grad is not None and bool(layer.separation.logit.grad.ne(0).all())
    assert layer.separation.value.grad is not None and bool(layer.separation.value.grad.ne(0).any())


def test_the_outlier_benchmarks_sink_logit_attention_is_this_separation() -> None:
    """SinkLM's ``sink_logit`` arm is the learnable per-head Sink: its weights are a softmax over
    ``[b_h, z]`` without the sink's column (how the benchmark's first records computed the arm),
    and the sink logits learn."""
    from hopfield.models.sink_lm import SinkAttention, SinkLMConfig

    torch.manual_seed(0)
    attention = SinkAttention(SinkLMConfig(20, 10, 8, 1, 2, 16, "sink_logit"))
    assert isinstance(attention.separation, Sink) and attention.separation.heads == 2
    with torch.no_grad():
        attention.separation.logit.copy_(torch.tensor([0.5, -1.0]))
    x = torch.randn(3, 6, 8)
    capture: dict[str, Tensor] = {}
    attention(x, capture).square().sum().backward()
    q, k = attention._heads(attention.q_proj(x)), attention._heads(attention.k_proj(x))
    scores = q @ k.transpose(-1, -2) * attention.head_size**-0.5
    masked = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), -math.inf)
    logit = torch.tensor([0.5, -1.0]).view(1, 2, 1, 1).expand(3, 2, 6, 1)
    expected = torch.softmax(torch.cat([logit, masked], dim=-1), dim=-1)[..., 1:]
    torch.testing.assert_close(capture["weights"], expected, atol=1e-6, rtol=0)
    grad = attention.separation.logit.grad
    assert grad is not None and bool(grad.ne(0).all())


def test_a_sink_on_top_k_with_every_key_is_the_dense_sink() -> None:
    sink = sink_of("head")
    q, k, v = patterns()
    dense = associate(q, k, v, separation=sink, causal=True)
    top = associate(q, k, v, separation=sink, structure=TopK(S), causal=True)
    torch.testing.assert_close(top, dense, atol=1e-12, rtol=0)

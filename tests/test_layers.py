"""Hopfield layers against nn.MultiheadAttention and hand-written retrieval; gates; validation."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

from hopfield.functional import Entmax, Sink, Softmax, SoftmaxN, Sparsemax
from hopfield.nn import (
    GatedAttention,
    Hopfield,
    HopfieldLayer,
    HopfieldOutput,
    HopfieldPooling,
    OutEffHop,
    OutEffHopLayer,
    OutEffHopPooling,
)

D, HEADS = 16, 4
F64 = torch.float64


def copy_mha_weights(mha: nn.MultiheadAttention, hop: Hopfield) -> None:
    assert hop.q_proj is not None and hop.k_proj is not None and hop.v_proj is not None
    assert (
        hop.out_proj is not None and mha.in_proj_weight is not None and mha.in_proj_bias is not None
    )
    with torch.no_grad():
        for i, proj in enumerate((hop.q_proj, hop.k_proj, hop.v_proj)):
            proj.weight.copy_(mha.in_proj_weight[i * D : (i + 1) * D])
            assert proj.bias is not None
            proj.bias.copy_(mha.in_proj_bias[i * D : (i + 1) * D])
        hop.out_proj.weight.copy_(mha.out_proj.weight)
        assert hop.out_proj.bias is not None
        hop.out_proj.bias.copy_(mha.out_proj.bias)


def pair(add_zero_attn: bool = False) -> tuple[nn.MultiheadAttention, Hopfield]:
    mha = nn.MultiheadAttention(D, HEADS, batch_first=True, add_zero_attn=add_zero_attn, dtype=F64)
    hop = (OutEffHop if add_zero_attn else Hopfield)(D, HEADS, dtype=F64)
    copy_mha_weights(mha, hop)
    return mha, hop


def masks() -> dict[str, dict[str, torch.Tensor]]:
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[0, 5:] = True
    banned = torch.rand(7, 7) > 0.7
    banned.fill_diagonal_(False)
    additive = torch.zeros(7, 7, dtype=F64).masked_fill(banned, -math.inf)
    return {
        "none": {},
        "key_padding": {"key_padding_mask": padding},
        "attn_bool": {"attn_mask": banned},
        "attn_float": {"attn_mask": additive},
        "both": {"key_padding_mask": padding, "attn_mask": banned},
    }


@pytest.mark.parametrize("add_zero_attn", [False, True], ids=["softmax", "softmax1"])
@pytest.mark.parametrize("kind", list(masks()))
def test_matches_multihead_attention(add_zero_attn: bool, kind: str) -> None:
    mha, hop = pair(add_zero_attn)
    x = torch.randn(3, 7, D, dtype=F64)
    kwargs = masks()[kind]
    expected, expected_w = mha(x, x, x, **kwargs, average_attn_weights=False)
    out = hop(x, **kwargs)
    assert torch.allclose(out, expected, atol=1e-12)
    result = hop(x, **kwargs, return_weights=True)
    assert isinstance(result, HopfieldOutput) and result.weights is not None
    width = result.weights.shape[-1]
    assert torch.allclose(result.weights, expected_w[..., :width], atol=1e-12)


def test_causal_matches_multihead_attention_with_causal_mask() -> None:
    mha, hop = pair()
    x = torch.randn(2, 6, D, dtype=F64)
    banned = ~torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.allclose(hop(x, causal=True), mha(x, x, x, attn_mask=banned)[0], atol=1e-12)


def test_cross_association_and_not_batch_first() -> None:
    mha = nn.MultiheadAttention(D, HEADS, dtype=F64)
    hop = Hopfield(D, HEADS, batch_first=False, dtype=F64)
    copy_mha_weights(mha, hop)
    stored, state = torch.randn(9, 2, D, dtype=F64), torch.randn(4, 2, D, dtype=F64)
    out = hop((stored, state, stored))
    assert torch.allclose(out, mha(state, stored, stored)[0], atol=1e-12)


@pytest.mark.parametrize("sep", [Softmax(), SoftmaxN(1), Sparsemax()], ids=repr)
def test_static_one_step_is_memory_retrieval_by_hand(sep: nn.Module) -> None:
    beta, d, m = 2.0, 8, 12
    memories = torch.randn(1, m, d, dtype=F64)  # rows are xi_mu
    queries = torch.randn(1, 5, d, dtype=F64)
    layer = Hopfield(d, static=True, separation=sep, scale=beta, dtype=F64)  # type: ignore[arg-type]
    out = layer((memories, queries, memories))
    xi = memories[0].T  # (d, M): columns are memories
    for i in range(5):
        x = queries[0, i]
        expected = xi @ sep(beta * xi.T @ x)
        assert torch.allclose(out[0, i], expected, atol=1e-12)
    assert sum(p.numel() for p in layer.parameters()) == 0


def test_iterated_retrieval_reaches_a_fixed_point_and_stops_per_head() -> None:
    d, m = 16, 6
    memories = torch.nn.functional.normalize(torch.randn(1, m, d, dtype=F64), dim=-1) * 4
    noisy = memories[:, :3] + 0.3 * torch.randn(1, 3, d, dtype=F64)
    layer = Hopfield(d, static=True, scale=1.0, update_steps=50, update_eps=1e-10, dtype=F64)
    out = layer((memories, noisy, memories))
    again = Hopfield(d, static=True, scale=1.0, dtype=F64)((memories, out, memories))
    assert torch.allclose(out, again, atol=1e-8)  # a fixed point of T
    assert torch.allclose(out, memories[:, :3], atol=1e-3)  # the stored patterns themselves
    one_step = Hopfield(d, static=True, scale=1.0, dtype=F64)((memories, noisy, memories))
    assert (out - memories[:, :3]).norm() < (one_step - memories[:, :3]).norm()


def test_tied_values_are_a_projection_of_projected_keys() -> None:
    hop = Hopfield(D, HEADS, tie_values_to_keys=True, pattern_size=3, dtype=F64)
    assert hop.v_proj is not None and hop.v_proj.in_features == D
    y, r = torch.randn(2, 5, D, dtype=F64), torch.randn(2, 4, D, dtype=F64)
    out = hop((y, r, torch.zeros_like(y)), return_heads=True)
    assert isinstance(out, HopfieldOutput) and out.heads is not None
    assert out.heads.shape == (2, HEADS, 4, 3)
    assert hop.k_proj is not None
    v = hop.v_proj(hop.k_proj(y)).view(2, 5, HEADS, 3).transpose(1, 2)
    q = hop.q_proj(r).view(2, 4, HEADS, 4).transpose(1, 2)  # type: ignore[misc]
    k = hop.k_proj(y).view(2, 5, HEADS, 4).transpose(1, 2)
    expected = torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1) @ v
    assert torch.allclose(out.heads, expected, atol=1e-12)


def test_separate_sizes_normalisation_and_learnable_scale() -> None:
    hop = Hopfield(
        12,
        3,
        hidden_size=5,
        pattern_size=7,
        output_size=9,
        stored_size=10,
        state_size=12,
        projection_size=8,
        normalize_inputs=True,
        normalize_hopfield_space=True,
        scale=[0.5, 1.0, 2.0],
        scale_learnable=True,
    )
    stored, state, proj = torch.randn(2, 6, 10), torch.randn(2, 4, 12), torch.randn(2, 6, 8)
    out = hop((stored, state, proj))
    assert out.shape == (2, 4, 9)
    out.sum().backward()
    assert isinstance(hop.scale, nn.Parameter) and hop.scale.grad is not None
    assert torch.allclose(hop.scale.detach(), torch.tensor([0.5, 1.0, 2.0]))


def test_pooling_and_lookup_layers() -> None:
    x = torch.randn(3, 8, D)
    pad = torch.zeros(3, 8, dtype=torch.bool)
    pad[1, 4:] = True
    pool = HopfieldPooling(D, quantity=2, num_heads=HEADS)
    out = pool(x, key_padding_mask=pad)
    assert out.shape == (3, 2, D)
    changed = x.clone()
    changed[1, 4:] = 100.0  # padded entries must not matter
    assert torch.allclose(pool(changed, key_padding_mask=pad), out, atol=1e-6)
    direct = pool.hopfield((x, pool.state_patterns.expand(3, -1, -1), x), key_padding_mask=pad)
    assert torch.allclose(out, direct)

    lookup = HopfieldLayer(D, quantity=5, num_heads=HEADS, separate_targets=True)
    res = lookup(x, return_weights=True)
    assert isinstance(res, HopfieldOutput) and res.output.shape == (3, 8, D)
    assert res.weights is not None and res.weights.shape == (3, HEADS, 8, 5)
    assert isinstance(OutEffHopPooling(D).hopfield.separation, SoftmaxN)
    assert isinstance(OutEffHopLayer(D, 3).hopfield.separation, SoftmaxN)


def test_dropout_in_training_only() -> None:
    hop = Hopfield(D, HEADS, dropout=0.5)
    x = torch.randn(2, 10, D)
    hop.eval()
    first = hop(x)
    assert torch.equal(first, hop(x))
    hop.train()
    assert not torch.allclose(first, hop(x))


@pytest.mark.parametrize(
    ("kind", "hidden", "per_head_params"),
    [("conditional_per_token", 16, 1057), ("conditional_per_token", None, 65)],
)
def test_gate_parameter_counts_of_the_paper(
    kind: str, hidden: int | None, per_head_params: int
) -> None:
    gate = GatedAttention(768, 12, kind=kind, hidden=hidden)
    assert sum(p.numel() for p in gate.parameters()) == 12 * per_head_params


def test_gates_start_at_pi_init_and_scale_heads() -> None:
    x = torch.randn(2, 5, D)
    for kind in ("per_head", "conditional_per_head", "conditional_per_token"):
        gate = GatedAttention(D, HEADS, kind=kind, pi_init=0.25)
        if kind != "per_head":
            with torch.no_grad():
                gate.weights[-1].zero_()
        probs = gate.probabilities(x)
        assert torch.allclose(probs, torch.full_like(probs, 0.25))
    gate = GatedAttention(D, HEADS, hidden=4)
    heads = torch.randn(2, HEADS, 5, 3)
    chunk = x.view(2, 5, HEADS, 4)
    h = 1
    w0, b0, w1, b1 = gate.weights[0][h], gate.biases[0][h], gate.weights[1][h], gate.biases[1][h]
    expected = torch.sigmoid(torch.relu(chunk[:, :, h] @ w0 + b0) @ w1 + b1)  # (2, 5, 1)
    assert torch.allclose(gate(x, heads)[:, h], heads[:, h] * expected, atol=1e-6)


def test_gated_hopfield_applies_gate_before_out_projection() -> None:
    gate = GatedAttention(D, HEADS, pi_init=0.5)
    hop = Hopfield(D, HEADS, gate=gate)
    with torch.no_grad():
        gate.weights[0].zero_()
    x = torch.randn(2, 5, D)
    gated = hop(x, return_heads=True)
    assert isinstance(gated, HopfieldOutput) and gated.heads is not None
    hop.gate = None
    plain = hop(x, return_heads=True)
    assert isinstance(plain, HopfieldOutput) and plain.heads is not None
    assert torch.allclose(gated.heads, 0.5 * plain.heads, atol=1e-6)


def test_state_dict_round_trip_and_reset_parameters() -> None:
    hop = OutEffHop(
        D, HEADS, scale_learnable=True, normalize_inputs=True, gate=GatedAttention(D, HEADS)
    )
    clone = OutEffHop(
        D, HEADS, scale_learnable=True, normalize_inputs=True, gate=GatedAttention(D, HEADS)
    )
    clone.load_state_dict(hop.state_dict())
    x = torch.randn(2, 5, D)
    assert torch.equal(hop(x), clone(x))
    before = hop.q_proj.weight.clone()  # type: ignore[union-attr]
    hop.reset_parameters()
    assert not torch.equal(before, hop.q_proj.weight)  # type: ignore[union-attr]


def test_reset_parameters_resets_a_learnable_separation() -> None:
    hop = Hopfield(D, HEADS, separation=Entmax(1.5, learnable=True, num_heads=HEADS))
    sep = hop.separation
    assert isinstance(sep, Entmax) and sep.alpha_logit is not None
    with torch.no_grad():
        sep.alpha_logit.fill_(3.0)
    hop.reset_parameters()
    assert torch.allclose(torch.as_tensor(sep.alpha), torch.full((HEADS, 1, 1), 1.5))


def test_factory_arguments() -> None:
    hop = Hopfield(D, HEADS, dtype=F64, normalize_inputs=True)
    assert all(p.dtype == F64 for p in hop.parameters())
    assert HopfieldPooling(D, 2, dtype=F64).state_patterns.dtype == F64


def test_torch_compile_smoke() -> None:
    hop = OutEffHop(D, HEADS)
    compiled = torch.compile(hop, backend="aot_eager")
    x = torch.randn(2, 5, D)
    assert torch.allclose(compiled(x), hop(x), atol=1e-6)


_COMPILED_LAYERS = {
    "softmax": lambda: Hopfield(D, HEADS),
    "softmax_1": lambda: OutEffHop(D, HEADS),
    "learnable-sink": lambda: Hopfield(
        D, HEADS, separation=Sink(0.5, learnable=True, heads=HEADS, value=D // HEADS)
    ),
}


@pytest.mark.parametrize("gradients", [False, True])
@pytest.mark.parametrize("name", list(_COMPILED_LAYERS))
def test_torch_compile_captures_the_layer_in_one_graph(name: str, gradients: bool) -> None:
    """``fullgraph=True``: while a graph is captured the layer takes no path a graph cannot hold
    (the flash kernel's custom autograd function, the stacked-projection cache keyed by data
    pointers, branches on tensor values) and gives eager's values and gradients."""
    torch.manual_seed(0)
    layer = _COMPILED_LAYERS[name]()
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 5, D)
    with torch.set_grad_enabled(gradients):
        for causal in (False, True):
            out, reference = compiled(x, causal=causal), layer(x, causal=causal)
            torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
            if gradients:
                params = list(layer.parameters())
                got = torch.autograd.grad(out.square().sum(), params)
                expected = torch.autograd.grad(reference.square().sum(), params)
                for a, b in zip(got, expected, strict=True):
                    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: Hopfield(10, 3), ValueError, "divisible by num_heads"),
        (lambda: Hopfield(0), ValueError, "input_size must be an int >= 1"),
        (lambda: Hopfield(8, update_steps=0), ValueError, "update_steps"),
        (lambda: Hopfield(8, dropout=1.0), ValueError, "dropout"),
        (lambda: Hopfield(8, scale=-1.0), ValueError, "scale must be positive"),
        (lambda: Hopfield(8, 2, scale=[1.0]), ValueError, "scale must be a float or 2"),
        (lambda: Hopfield(8, static=True, hidden_size=4), ValueError, "static=True"),
        (lambda: Hopfield(8, separation="softmax"), TypeError, "separation"),  # type: ignore[arg-type]
        (lambda: Hopfield(8, 2, gate=GatedAttention(8, 4)), ValueError, "gate must have"),
        (lambda: GatedAttention(8, 2, kind="x"), ValueError, "kind must be"),
        (lambda: GatedAttention(8, 2, pi_init=1.5), ValueError, "pi_init"),
        (lambda: HopfieldLayer(8, 3, projection_size=4), ValueError, "separate_targets"),
    ],
)
def test_bad_construction_raises(make, error: type, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        make()


def test_bad_forward_input_raises() -> None:
    hop = Hopfield(D, HEADS)
    with pytest.raises(ValueError, match="last dim 16"):
        hop(torch.randn(2, 5, D + 1))
    with pytest.raises(ValueError, match="3-D"):
        hop(torch.randn(2, 3, 5, D))  # (5, D) is unbatched input, see test_migration.py
    with pytest.raises(TypeError, match="tuple"):
        hop([torch.randn(2, 5, D)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key_padding_mask"):
        hop(torch.randn(2, 5, D), key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="attn_mask"):
        hop(torch.randn(2, 5, D), attn_mask=torch.zeros(3, 5, dtype=torch.bool))


def _seeded_layer(batch_first: bool = True) -> Hopfield:
    """A float64 two-head layer of width 8 in eval mode, the same weights on every call."""
    torch.manual_seed(0)
    return Hopfield(8, num_heads=2, batch_first=batch_first, dtype=torch.float64).eval()


def test_inference_caches_follow_weight_and_scale_changes() -> None:
    """Without gradients the layer stacks its projections and reads a shared scale once (issue
    31, item 7); the results equal the training-mode computation, and a changed weight, bias or
    scale (in place or loaded) is used at the next call."""
    layer = _seeded_layer()
    x = torch.randn(2, 5, 8, dtype=torch.float64)

    def both() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            fast = layer(x)
        slow = layer(x)  # gradients: three projections and the scale as a tensor
        assert slow.requires_grad
        return fast, slow.detach()

    fast, slow = both()
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        layer.k_proj.weight.mul_(2.0)
        layer.v_proj.bias.add_(1.0)
        layer.scale.fill_(0.3)
    changed, reference = both()
    assert not torch.allclose(changed, fast)
    torch.testing.assert_close(changed, reference, rtol=1e-12, atol=1e-12)
    state = {key: value.clone() for key, value in layer.state_dict().items()}
    state["scale"] = torch.tensor([0.2, 0.5], dtype=torch.float64)  # per-head scales
    state["q_proj.weight"] = torch.randn(8, 8, dtype=torch.float64)
    layer.load_state_dict(state)
    loaded, reference = both()
    torch.testing.assert_close(loaded, reference, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(loaded, changed)
    layer.v_proj.weight.data = torch.randn(8, 8, dtype=torch.float64)  # new data, version 0
    replaced, reference = both()
    torch.testing.assert_close(replaced, reference, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(replaced, loaded)
    layer.to(torch.float32)  # every weight moves to new storage
    x = x.float()
    converted, reference = both()
    assert converted.dtype == torch.float32
    torch.testing.assert_close(converted, reference)


def test_stacked_projections_follow_a_parametrized_weight() -> None:
    """A parametrized projection (its weight computed from ``original`` on every read) is read
    through its attribute, so a change of ``original`` is used at the next no-grad call."""
    from torch.nn.utils import parametrize

    class Doubled(torch.nn.Module):
        def forward(self, weight: torch.Tensor) -> torch.Tensor:
            return 2.0 * weight

    layer = _seeded_layer()
    parametrize.register_parametrization(layer.k_proj, "weight", Doubled())
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        before = layer(x)
        layer.k_proj.parametrizations.weight.original.mul_(3.0)
        after = layer(x)
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, layer(x).detach(), rtol=1e-12, atol=1e-12)


class _HalvedOutput(nn.Linear):
    """A linear map with a forward of its own (as QAT's fake-quantized ``Linear``)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return 0.5 * super().forward(input)


def _halve_output(
    module: nn.Module, args: tuple[torch.Tensor], output: torch.Tensor
) -> torch.Tensor:
    return 0.5 * output


def _with_own_forward(layer: Hopfield) -> None:
    source = layer.k_proj
    layer.k_proj = _HalvedOutput(8, 8, dtype=torch.float64)
    layer.k_proj.load_state_dict(source.state_dict())


def _with_forward_hook(layer: Hopfield) -> None:
    layer.v_proj.register_forward_hook(_halve_output)


def _with_forward_pre_hook(layer: Hopfield) -> None:
    layer.q_proj.register_forward_pre_hook(lambda module, args: (0.5 * args[0],))


def _pruned(layer: Hopfield) -> None:
    from torch.nn.utils import prune

    prune.l1_unstructured(layer.k_proj, "weight", amount=0.5)


@pytest.mark.parametrize(
    "change", [_with_own_forward, _with_forward_hook, _with_forward_pre_hook, _pruned]
)
def test_projections_with_hooks_or_their_own_forward_are_called(
    change: Callable[[Hopfield], None],
) -> None:
    """The stacked no-grad product stands in for the projections only when calling them would
    compute nothing else: a projection with a forward of its own, a hook or a pruning mask (a
    pre-hook) is called, so the no-grad output equals the training-mode one and differs from the
    unchanged layer's (the stacked product skipped them: a wrong answer, or a ``KeyError`` for a
    pruned weight)."""
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    layer = _seeded_layer()
    with torch.no_grad():
        plain = layer(x)
    change(layer)
    with torch.no_grad():
        fast = layer(x)
    torch.testing.assert_close(fast, layer(x).detach(), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(fast, plain)


def test_hooks_for_every_module_see_the_projections() -> None:
    """A forward hook registered for every module (``register_module_forward_hook``) sees the
    query, key and value projections of a no-grad call too."""
    layer = _seeded_layer()
    seen: list[nn.Module] = []
    handle = nn.modules.module.register_module_forward_hook(
        lambda module, args, output: seen.append(module)
    )
    try:
        with torch.no_grad():
            layer(torch.randn(2, 5, 8, dtype=torch.float64))
    finally:
        handle.remove()
    assert {id(layer.q_proj), id(layer.k_proj), id(layer.v_proj)} <= {id(m) for m in seen}


def test_w8a8_quantizes_the_projections_of_a_self_associating_layer() -> None:
    """``quantize_w8a8`` calibrates (no gradients) the activation quantizers of every linear
    map; those of the query, key and value projections saw no batch, and so stayed off, while
    the stacked product skipped their hooks."""
    from hopfield.outliers import activation_quantizers, quantize_w8a8

    layer = _seeded_layer()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    quantized = quantize_w8a8(layer, [x, x], num_batches=2)
    states = {name: q.state for name, q in activation_quantizers(quantized).items()}
    assert len(states) == 8 and set(states.values()) == {"quantize"}, states


def test_copies_and_pickles_leave_the_per_call_caches_behind() -> None:
    """``copy.deepcopy`` and pickling (``torch.save(module)``) drop the caches keyed by data
    pointers, which name the original's tensors; the copy builds its own and retrieves as the
    original does."""
    import copy
    import io

    layer = _seeded_layer()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        expected = layer(x)
    assert {"_packed_cache", "_scale_cache"} <= set(layer.__dict__)
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for twin in (copy.deepcopy(layer), loaded):
        assert not {"_packed_cache", "_scale_cache"} & set(twin.__dict__)
        with torch.no_grad():
            twin.q_proj.weight.mul_(2.0)  # the copy's own weights, not the original's cache
            torch.testing.assert_close(twin(x), twin(x.clone()), rtol=0, atol=0)
            assert not torch.allclose(twin(x), expected)
    assert "_packed_cache" in layer.__dict__  # the original keeps its own
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)


def test_stacked_projections_built_in_inference_mode_serve_autograd_later() -> None:
    """A frozen layer (no parameter needs a gradient) takes the stacked projections in every
    mode; stacked under ``torch.inference_mode`` they are inference tensors, which autograd cannot
    save, so an input that needs its gradient afterwards gets projections stacked outside it."""
    layer = _seeded_layer().requires_grad_(False)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.inference_mode():
        first = layer(x)
    y = x.clone().requires_grad_()
    out = layer(y)
    out.sum().backward()
    torch.testing.assert_close(out.detach(), first, rtol=1e-12, atol=1e-12)
    assert y.grad is not None and bool(y.grad.abs().sum() > 0)
    with torch.inference_mode():  # and back: the cache follows the mode
        torch.testing.assert_close(layer(x), first, rtol=1e-12, atol=1e-12)


def test_a_layer_made_in_inference_mode_serves_in_it_and_sees_in_place_updates() -> None:
    """A layer built under ``torch.inference_mode`` (a model loaded for serving in one block)
    holds inference tensors, which have no version counter: the layer retrieves as one built
    outside (it failed on reading the counter) and sees its weights and scale changed in place
    (nothing is kept that an unseen update could make stale)."""
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    reference = _seeded_layer()  # ordinary tensors
    with torch.inference_mode():
        layer = _seeded_layer()
        assert layer.q_proj.weight.is_inference() and layer.scale.is_inference()
        torch.testing.assert_close(layer(x), reference(x), rtol=1e-12, atol=1e-12)
        for updated in (layer, reference):
            updated.q_proj.weight.mul_(2.0)
            updated.scale.mul_(3.0)
        torch.testing.assert_close(layer(x), reference(x), rtol=1e-12, atol=1e-12)
        assert not {"_packed_cache", "_scale_cache"} & set(layer.__dict__)


@pytest.mark.parametrize("batch_first", [True, False])
def test_one_input_takes_the_stacked_projections_in_either_layout(batch_first: bool) -> None:
    """One tensor in all three roles is checked and moved once, so the layer sees one input and
    stacks its projections whatever the layout (issue 31, item 7); the result is that of the
    three projections."""
    layer = _seeded_layer(batch_first)
    x = torch.randn(5, 3, 8, dtype=torch.float64)
    with torch.no_grad():
        fast = layer(x)
    assert "_packed_cache" in layer.__dict__
    torch.testing.assert_close(fast, layer(x).detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("pattern_size", [4, 3])
def test_stacked_projections_split_into_heads_as_the_three_projections(pattern_size: int) -> None:
    """The inference path views the one stacked product as the heads (the same head size for
    queries and values) or splits it (value heads of another size); both equal the three
    projections that run with gradients."""
    torch.manual_seed(0)
    layer = Hopfield(
        8,
        num_heads=2,
        hidden_size=4,
        pattern_size=pattern_size,
        batch_first=True,
        dtype=torch.float64,
    ).eval()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        fast = layer(x, return_heads=True)
    slow = layer(x, return_heads=True)
    assert isinstance(fast, HopfieldOutput) and isinstance(slow, HopfieldOutput)
    assert fast.heads is not None and slow.heads is not None and slow.output.requires_grad
    assert fast.heads.shape == (3, 2, 5, pattern_size)
    torch.testing.assert_close(fast.heads, slow.heads.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fast.output, slow.output.detach(), rtol=1e-12, atol=1e-12)

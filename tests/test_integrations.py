"""Outlier-efficient attention variants for transformers BERT / OPT / ViT (hopfield.integrations)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor, nn

pytest.importorskip("transformers")

from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from hopfield.integrations import (
    VARIANTS,
    AttentionProbe,
    add_gates,
    attention_forward,
    attention_modules,
    build_model,
    configure_attention,
    load_model,
    paper_parameter_count,
)

TINY: dict[str, dict[str, Any]] = {
    "bert": dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=97,
        max_position_embeddings=32,
    ),
    "opt": dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_dim=128,
        vocab_size=97,
        word_embed_proj_dim=64,
        max_position_embeddings=32,
    ),
    "vit": dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=32,
        patch_size=8,
        num_labels=10,
    ),
}


def tiny(family: str, variant: str, **kw: Any) -> nn.Module:
    return build_model(family, variant, **{**TINY[family], **kw}).eval()


def inputs(family: str, batch: int = 3, length: int = 10, pad: bool = True) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(1)
    if family == "vit":
        return {"pixel_values": torch.randn(batch, 3, 32, 32, generator=g)}
    mask = torch.ones(batch, length, dtype=torch.long)
    if pad:
        mask[1, 6:] = 0
    return {"input_ids": torch.randint(1, 97, (batch, length), generator=g), "attention_mask": mask}


def logits(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    with torch.no_grad():
        return model(**batch).logits


# --- a float64 reference attention: explicit Softmax_1 exactly as written in the paper -------


def _reference(
    module: nn.Module,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kw: Any,
) -> tuple[Tensor, Tensor]:
    scale = q.shape[-1] ** -0.5 if scaling is None else scaling
    z = (q @ k.transpose(-1, -2)) * scale
    allowed = torch.ones_like(z, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & (mask if mask.dtype == torch.bool else mask > -1e30)
    elif getattr(module, "is_causal", False):
        allowed = allowed & torch.ones(z.shape[-2:], dtype=torch.bool).tril()
    e = torch.where(allowed, torch.exp(z), torch.zeros_like(z))
    p = e / (1.0 + e.sum(-1, keepdim=True))
    return (p @ v).transpose(1, 2).contiguous(), p


AttentionInterface.register("test_reference_softmax1", _reference)
AttentionMaskInterface.register("test_reference_softmax1", sdpa_mask)


# --- parameter counts -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "count", "gated_extra", "paper"),
    [
        ("bert", 108_891_648, 152_208, "108.9"),
        ("opt", 124_059_648, 9_360, "124.06"),
        ("vit", 22_050_664, 4_680, None),
    ],
)
def test_paper_parameter_counts(
    family: str, count: int, gated_extra: int, paper: str | None
) -> None:
    with torch.device("meta"):
        plain = build_model(family, "softmax1")
        gated = build_model(family, "gated_softmax1")
    assert paper_parameter_count(plain) == count
    assert paper_parameter_count(gated) - count == gated_extra
    if paper is not None:
        digits = len(paper.split(".")[1])
        assert f"{count / 1e6:.{digits}f}" == paper
    if family == "bert":  # Table 1: gated BERT "109m", and 12 x 12 x 1,057 gate parameters
        assert round(paper_parameter_count(gated) / 1e6) == 109
        assert gated_extra == 12 * 12 * (64 * 16 + 16 + 16 + 1)
    if family == "opt":  # "124.07m" gated
        assert f"{paper_parameter_count(gated) / 1e6:.2f}" == "124.07"


def test_variants_registered_and_build() -> None:
    for name in VARIANTS:
        assert f"hopfield_{name}" in AttentionInterface._global_mapping
        model = tiny("opt", name)
        assert model.config._attn_implementation == f"hopfield_{name}"
        assert model.config.hopfield_attention["variant"] == name
        assert torch.isfinite(logits(model, inputs("opt"))).all()


def test_an_unknown_variant_lists_ours_and_transformers() -> None:
    """transformers' own error listed only its implementations, none of our variants."""
    with pytest.raises(ValueError, match="variant must be a hopfield variant") as error:
        build_model("bert", "flash", num_hidden_layers=1)
    message = str(error.value)
    assert "softmax1" in message and "sdpa" in message and "eager" in message
    assert message.endswith("got 'flash'")
    assert build_model("bert", "eager", num_hidden_layers=1).config._attn_implementation == "eager"


# --- equivalence with reference / default attention -------------------------------------


@pytest.mark.parametrize("family", ["bert", "opt", "vit"])
def test_softmax1_equals_explicit_reference(family: str) -> None:
    model = tiny(family, "softmax1").double()
    batch = inputs(family)
    fast = logits(model, batch)
    model.set_attn_implementation("test_reference_softmax1")
    reference = logits(model, batch)
    torch.testing.assert_close(fast, reference, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("family", ["bert", "opt", "vit"])
def test_softmax_variant_equals_default_attention(family: str) -> None:
    model = tiny(family, "softmax").double()
    batch = inputs(family)
    ours = logits(model, batch)
    # OPT's eager attention computes its softmax in float32, hence the looser tolerance there
    for implementation, tol in (("sdpa", 1e-10), ("eager", 1e-6)):
        model.set_attn_implementation(implementation)
        torch.testing.assert_close(logits(model, batch), ours, rtol=tol, atol=tol)


@pytest.mark.parametrize("family", ["bert", "opt", "vit"])
def test_output_attentions_gives_the_weights_in_every_family(family: str) -> None:
    """``output_attentions=True`` on the model returns one weight tensor per layer for the
    fused variants too (``softmax``, ``softmax1``, gated): equal to ``eager``'s for ``softmax``
    on the rows of real tokens, below 1 in sum for Softmax_1, and the logits of the call
    without them. OPT's attention module takes ``output_attentions`` by name and does not pass
    it on: before 29 Nov its fused variants returned no weights (an empty tuple), silently."""
    batch = inputs(family)
    rows = batch.get("attention_mask", torch.ones(3, 17)).bool()  # (B, L): real tokens
    with torch.no_grad():
        for variant in ("softmax", "softmax1", "gated_softmax1"):
            model = tiny(family, variant).double()
            out = model(**batch, output_attentions=True)
            assert len(out.attentions) == 2, variant
            torch.testing.assert_close(out.logits, model(**batch).logits, rtol=1e-12, atol=1e-12)
            if variant == "softmax":
                model.set_attn_implementation("eager")
                eager = model(**batch, output_attentions=True).attentions
                for ours, theirs in zip(out.attentions, eager, strict=True):
                    torch.testing.assert_close(
                        ours.transpose(1, 2)[rows], theirs.transpose(1, 2)[rows]
                    )
            else:
                for ours in out.attentions:
                    assert ours.shape[:2] == (3, 4)
                    assert bool((ours.sum(-1).transpose(1, 2)[rows] < 1).all())


def test_padding_is_ignored_like_a_shorter_sequence() -> None:
    for family in ("bert", "opt"):
        model = tiny(family, "clipped_softmax1").double()
        batch = inputs(family, batch=1, length=10, pad=False)
        short = {k: v[:, :6] for k, v in batch.items()}
        padded = {k: v.clone() for k, v in batch.items()}
        padded["attention_mask"][:, 6:] = 0
        padded["input_ids"][:, 6:] = 5  # different content under the padding
        torch.testing.assert_close(
            logits(model, padded)[:, :6], logits(model, short), rtol=1e-9, atol=1e-9
        )


def test_causal_mask_hides_the_future() -> None:
    model = tiny("opt", "gated_softmax1").double()
    batch = inputs("opt", batch=1, pad=False)
    changed = {k: v.clone() for k, v in batch.items()}
    changed["input_ids"][:, 7:] = (changed["input_ids"][:, 7:] + 1) % 97
    a, b = logits(model, batch), logits(model, changed)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=1e-10, atol=1e-10)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_fast_and_explicit_paths_agree() -> None:
    model = tiny("opt", "softmax1").double()
    batch = inputs("opt")
    fast = logits(model, batch)
    from hopfield.outliers import AttentionRecorder

    with AttentionRecorder(model) as recorder:  # probes force the explicit path
        explicit = logits(model, batch)
    torch.testing.assert_close(explicit, fast, rtol=1e-10, atol=1e-10)
    rows = recorder.per_head()
    assert len(rows) == 2 and all(bool((s["row_sum"] < 1).all()) for s in rows.values())


# --- clipping ---------------------------------------------------------------------------


def _module(**settings: Any) -> nn.Module:
    module = nn.Module()
    module.config = SimpleNamespace(hopfield_attention=settings)  # type: ignore[assignment]
    module.is_causal = False  # type: ignore[assignment]
    return module


def test_clipped_gives_exact_zeros_and_ones() -> None:
    for variant, n in (("clipped", 0), ("clipped_softmax1", 1)):
        module = _module(gamma=-0.1, zeta=1.1)
        module.__dict__["_hopfield_probes"] = [AttentionProbe()]  # explicit path, weights back
        q = torch.zeros(1, 1, 2, 4, dtype=torch.float64)
        k = torch.zeros(1, 1, 5, 4, dtype=torch.float64)
        q[0, 0, 0, 0] = 100.0  # row 0: one dominant key -> exactly 1 and exact zeros
        k[0, 0, 2, 0] = 1.0
        v = torch.randn(1, 1, 5, 3, dtype=torch.float64)
        out, weights = attention_forward(variant, module, q, k, v, None, scaling=1.0)
        assert weights is not None
        assert weights[0, 0, 0, 2] == 1.0
        assert (weights[0, 0, 0, [0, 1, 3, 4]] == 0.0).all()
        # row 1: all logits 0: softmax 1/5 (softmax1: 1/6) stretched to (1.2 p - 0.1)
        expected = 1.2 / (5 + n) - 0.1
        torch.testing.assert_close(
            weights[0, 0, 1], torch.full((5,), expected, dtype=torch.float64)
        )
        torch.testing.assert_close(out[0, 0, 0], v[0, 0, 2])


def test_clipped_parameters_from_alpha_and_defaults() -> None:
    model = tiny("opt", "clipped")  # alpha 12 over T = max_position_embeddings
    assert model.config.hopfield_attention["gamma"] == pytest.approx(-12 / 32)
    assert build_model("bert", "clipped_softmax1", **TINY["bert"]).config.hopfield_attention == {
        "variant": "clipped_softmax1",
        "gamma": -0.025,
        "zeta": 1.1,
    }
    cfg = SimpleNamespace()
    configure_attention(cfg, "clipped", alpha=12, length=512)
    assert cfg.hopfield_attention["gamma"] == -0.0234375
    with pytest.raises(ValueError, match="gamma"):
        configure_attention(cfg, "clipped")
    with pytest.raises(ValueError, match="gamma"):
        configure_attention(cfg, "softmax1", gamma=-0.1)
    with pytest.raises(ValueError, match="variant"):
        configure_attention(cfg, "softmax2")
    with pytest.raises(ValueError, match="family"):
        build_model("gpt", "softmax1")


# --- gates ------------------------------------------------------------------------------


def test_gates_at_init_equal_pi_init_and_scale_the_heads() -> None:
    gated = tiny("opt", "gated_softmax1").double()
    plain = tiny("opt", "softmax1").double()
    state = {k: v for k, v in gated.state_dict().items() if ".gate." not in k}
    plain.load_state_dict(state)
    batch = inputs("opt")
    with torch.no_grad():
        for _, module in attention_modules(gated):
            gate = module.gate
            assert gate.pi_init == 0.25 and gate.hidden is None
            assert torch.allclose(
                gate.biases[-1], torch.tensor(math.log(1 / 3), dtype=torch.float64)
            )
            gate.weights[0].zero_()
            x = torch.randn(2, 5, 64, dtype=torch.float64)
            pi = gate.probabilities(x)
            torch.testing.assert_close(
                pi, torch.full_like(pi, 0.25), rtol=0, atol=1e-7
            )  # fp32 bias
        g = float(torch.sigmoid(gate.biases[-1][0, 0]))
        # a constant gate equals scaling the values by it
        for _, module in attention_modules(plain):
            module.v_proj.weight.mul_(g)
            module.v_proj.bias.mul_(g)
    torch.testing.assert_close(logits(gated, batch), logits(plain, batch), rtol=1e-10, atol=1e-10)


def test_gate_is_conditioned_on_the_attention_input() -> None:
    model = tiny("bert", "gated").double()  # BERT: MLP gate d_head -> d_head / 4 -> 1
    module = attention_modules(model)[0][1]
    assert module.gate.hidden == 16 // 4
    seen: dict[str, Tensor] = {}
    module.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0]))
    captured: dict[str, Tensor] = {}
    module.gate.register_forward_hook(lambda m, args, out: captured.__setitem__("x", args[0]))
    logits(model, inputs("bert"))
    assert captured["x"] is seen["x"]
    assert "_hopfield_gate_input" not in module.__dict__  # not kept after the forward pass


def test_gated_model_trains_and_gate_errors() -> None:
    model = tiny("vit", "gated_clipped_softmax1").train()
    out = model(**inputs("vit"), labels=torch.tensor([1, 2, 3]))
    out.loss.backward()
    gate = attention_modules(model)[0][1].gate
    assert gate.weights[0].grad is not None and gate.weights[0].grad.abs().sum() > 0
    with pytest.raises(ValueError, match="already has a gate"):
        add_gates(model)
    bare = build_model("vit", "sdpa", **TINY["vit"])
    bare.set_attn_implementation("hopfield_gated")
    with pytest.raises(RuntimeError, match="gate"):
        bare(**inputs("vit"))


# --- save / load ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "variant"), [("bert", "gated_clipped_softmax1"), ("opt", "softmax1")]
)
def test_save_and_load_keep_the_variant(tmp_path: Any, family: str, variant: str) -> None:
    model = tiny(family, variant)
    if variant.startswith("gated"):
        with torch.no_grad():
            for _, module in attention_modules(model):
                module.gate.biases[-1].add_(0.7)  # a trained-looking gate
    model.save_pretrained(tmp_path)
    loaded = load_model(tmp_path).eval()
    assert loaded.config._attn_implementation == f"hopfield_{variant}"
    assert loaded.config.hopfield_attention == model.config.hopfield_attention
    batch = inputs(family)
    torch.testing.assert_close(logits(loaded, batch), logits(model, batch))

"""Grouped-query attention (Llama/Qwen2/Mistral ``num_key_value_heads < num_attention_heads``),
generic gates and ``output_attentions`` for the registered attention variants."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

pytest.importorskip("transformers")

import transformers
from transformers.integrations.sdpa_attention import repeat_kv

from hopfield.integrations import VARIANTS, add_gates, attention_modules, configure_attention
from hopfield.integrations.attention import _repeat_kv

SIZES: dict[str, Any] = dict(
    vocab_size=61,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    max_position_embeddings=32,
)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4}),
}


def decoder(family: str, variant: str, **extra: Any) -> nn.Module:
    config_name, model_name, defaults = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**SIZES, **defaults, **extra})
    if variant in VARIANTS:
        spec = VARIANTS[variant]
        configure_attention(
            config, variant, **({"gamma": -0.03, "zeta": 1.0} if spec.clipped else {})
        )
    else:
        config._attn_implementation = variant
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config)
    if variant in VARIANTS and VARIANTS[variant].gated:
        add_gates(model, pi_init=0.25)
    return model.eval()


def batch() -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(2)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0  # left padding, as for generation
    return {"input_ids": torch.randint(0, 61, (2, 7), generator=g), "attention_mask": mask}


def test_repeat_kv_is_transformers_repeat_kv() -> None:
    query = torch.randn(2, 6, 5, 4)
    states = torch.randn(2, 3, 7, 4)
    assert torch.equal(_repeat_kv(query, states), repeat_kv(states, 2))
    assert _repeat_kv(query, query) is query
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        _repeat_kv(query, torch.randn(2, 4, 7, 4))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_runs_a_grouped_query_llama(variant: str) -> None:
    model = decoder("llama", variant)
    with torch.no_grad():
        logits = model(**batch()).logits
    assert logits.shape == (2, 7, 61) and torch.isfinite(logits).all()
    if VARIANTS[variant].gated:
        assert len([m for _, m in attention_modules(model) if hasattr(m, "gate")]) == 2


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_softmax_variant_equals_sdpa_and_eager(family: str, padded: bool) -> None:
    inputs = batch() if padded else {"input_ids": batch()["input_ids"]}
    with torch.no_grad():
        ours = decoder(family, "softmax")(**inputs).logits
        for reference in ("sdpa", "eager"):
            theirs = decoder(family, reference)(**inputs).logits
            mask = inputs.get("attention_mask", torch.ones(2, 7)).bool()
            torch.testing.assert_close(ours[mask], theirs[mask], atol=1e-5, rtol=1e-5)


def test_output_attentions_returns_the_weights_the_variant_computes() -> None:
    inputs = batch()
    with torch.no_grad():
        eager = decoder("llama", "eager")(**inputs, output_attentions=True).attentions
        ours = decoder("llama", "softmax")(**inputs, output_attentions=True).attentions
        plain = decoder("llama", "softmax")(**inputs).attentions
        one = decoder("llama", "softmax1")(**inputs, output_attentions=True).attentions
        clipped = decoder("llama", "clipped")(**inputs, output_attentions=True).attentions
    assert len(ours) == 2 and ours[0].shape == (2, 4, 7, 7)
    rows = inputs["attention_mask"].bool()  # padding queries see nothing: eager spreads them
    for a, b in zip(ours, eager, strict=True):
        torch.testing.assert_close(a.transpose(1, 2)[rows], b.transpose(1, 2)[rows])
    assert plain is None  # not asked for: the fused path, no weights
    assert all(w.shape == (2, 4, 7, 7) and (w.sum(-1) < 1).all() for w in one)  # Softmax_1
    assert len(clipped) == 2 and clipped[0].min() == 0  # clipped: exact zeros


def test_gates_find_attention_modules_of_other_models() -> None:
    llama = decoder("llama", "sdpa")
    names = [n for n, _ in attention_modules(llama)]
    assert names == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    bert = transformers.BertModel(
        transformers.BertConfig(
            hidden_size=32, num_attention_heads=4, num_hidden_layers=1, intermediate_size=64
        )
    )
    assert [type(m).__name__ for _, m in attention_modules(bert)] == ["BertSelfAttention"]
    with pytest.raises(ValueError, match="no attention module"):
        add_gates(nn.Sequential(nn.Linear(2, 2)))


# --- namespaced names in transformers' registry --------------------------------------------


def test_variants_are_registered_under_namespaced_names_only() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from hopfield.integrations import attention_name, attention_names, build_model, variant_name

    names = attention_names()
    assert names == tuple(f"hopfield_{v}" for v in VARIANTS)
    assert "hopfield_softmax1" in names and attention_name("softmax1") == "hopfield_softmax1"
    for name in names:
        assert name in AttentionInterface._global_mapping
        assert name in AttentionMaskInterface._global_mapping
    for short in VARIANTS:  # no global registration of the bare names
        assert short not in AttentionInterface._global_mapping
    assert variant_name("hopfield_gated") == variant_name("gated") == "gated"
    assert variant_name("sdpa") is None
    with pytest.raises(ValueError, match="variant must be one of"):
        attention_name("softmax2")
    # our own API takes both forms and stores the short name in the config
    sizes = dict(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32)
    sizes.update(image_size=16, patch_size=8, num_labels=3)
    for given in ("gated_softmax1", "hopfield_gated_softmax1"):
        model = build_model("vit", given, **sizes)
        assert model.config._attn_implementation == "hopfield_gated_softmax1"
        assert model.config.hopfield_attention["variant"] == "gated_softmax1"
    model = decoder("llama", "sdpa")
    model.set_attn_implementation("hopfield_softmax1")
    with torch.no_grad():
        assert torch.isfinite(model(**batch()).logits).all()

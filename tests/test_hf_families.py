"""Every family that uses transformers' attention interface (Llama with grouped-query attention,
Qwen2, Mistral, gpt-oss with its learned sinks) keeps its attention variant, gates and sinks
across ``save_pretrained`` and ``load_model`` / ``AutoModelForCausalLM.from_pretrained``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

pytest.importorskip("transformers")

import transformers
from transformers import AutoModelForCausalLM

from hopfield.integrations import (
    VARIANTS,
    add_gates,
    attention_forward,
    attention_modules,
    configure_attention,
    load_model,
)
from hopfield.integrations.auto import interface_model_class

SIZES: dict[str, Any] = dict(
    vocab_size=61,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,  # grouped-query attention: 4 query heads share one key/value head
    max_position_embeddings=32,
)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4}),
}
if hasattr(transformers, "GptOssConfig"):
    FAMILIES["gpt_oss"] = (
        "GptOssConfig",
        "GptOssForCausalLM",
        {
            "num_key_value_heads": 2,
            "head_dim": 8,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
    )


def decoder(family: str, variant: str | None) -> nn.Module:
    """A tiny stock decoder with ``variant`` (and gates), trained-looking gates and sinks."""
    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**SIZES, **extra})
    if variant is not None:
        clipped = VARIANTS[variant].clipped
        configure_attention(config, variant, **({"gamma": -0.03, "zeta": 1.0} if clipped else {}))
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config)
    if variant is not None and VARIANTS[variant].gated:
        add_gates(model, pi_init=0.25)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, module in attention_modules(model):
            for name, p in module.named_parameters():
                if name.startswith("gate.") or name == "sinks":  # away from their initialisation
                    p.add_(torch.randn(p.shape, generator=g))
    return model.eval()


def batch() -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(2)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    return {"input_ids": torch.randint(0, 61, (2, 9), generator=g), "attention_mask": mask}


def logits(model: nn.Module) -> Tensor:
    with torch.no_grad():
        out: Tensor = model(**batch()).logits
    return out


def sink_variant(family: str, variant: str) -> str:
    """gpt-oss takes the sink form of a variant (its learned sinks need one)."""
    if family == "gpt_oss" and not VARIANTS[variant].n:
        return f"{variant}_softmax1" if variant != "softmax" else "softmax1"
    return variant


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_auto_model_keeps_the_variant(tmp_path: Path, family: str) -> None:
    """The issue's case: a Llama with hopfield_softmax1 came back from AutoModelForCausalLM as
    sdpa (logits off by ~0.1, no warning)."""
    model = decoder(family, "clipped_softmax1")
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["attn_implementation"] == "hopfield_clipped_softmax1"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config._attn_implementation == "hopfield_clipped_softmax1"
    assert loaded.config.hopfield_attention == model.config.hopfield_attention
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=1e-5)
    if family != "gpt_oss":  # the variant matters: the stock attention gives other logits
        stock = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa")
        assert (logits(stock.eval()) - logits(model)).abs().max() > 1e-3


@pytest.mark.parametrize("variant", ["softmax1", "gated_clipped"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_load_model_restores_variant_gates_and_sinks(
    tmp_path: Path, family: str, variant: str
) -> None:
    variant = sink_variant(family, variant)
    model = decoder(family, variant)
    model.save_pretrained(tmp_path / "first")
    loaded = load_model(tmp_path / "first").eval()
    assert isinstance(loaded, type(model))  # the hopfield subclass of the stock class
    assert loaded.config._attn_implementation == f"hopfield_{variant}"
    state, loaded_state = model.state_dict(), loaded.state_dict()
    assert sorted(state) == sorted(loaded_state)
    assert all(torch.equal(state[k], loaded_state[k]) for k in state)  # gates and sinks too
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=1e-5)
    # saved again from the loaded model: still restored, through load_model and AutoModel
    loaded.save_pretrained(tmp_path / "second")
    again = load_model(tmp_path / "second").eval()
    torch.testing.assert_close(logits(again), logits(model), rtol=0, atol=1e-5)
    if not VARIANTS[variant].gated:
        auto = AutoModelForCausalLM.from_pretrained(tmp_path / "second").eval()
        torch.testing.assert_close(logits(auto), logits(model), rtol=0, atol=1e-5)


def test_auto_model_of_a_gated_stock_type_points_to_load_model(tmp_path: Path) -> None:
    decoder("qwen2", "gated_softmax1").save_pretrained(tmp_path)
    auto = AutoModelForCausalLM.from_pretrained(tmp_path)  # builds no gates
    with pytest.raises(RuntimeError, match=r"needs a gate.*load_model"):
        logits(auto)


def test_load_model_refuses_a_bad_hopfield_attention_naming_the_file(tmp_path: Path) -> None:
    decoder("llama", "softmax1").save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved["hopfield_attention"] = {"variant": "clipped"}  # no gamma and zeta
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"config\.json: .*needs gamma and zeta"):
        load_model(tmp_path)


def test_a_stock_checkpoint_loads_as_the_stock_class(tmp_path: Path) -> None:
    model = decoder("llama", None)
    model.save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    assert type(loaded) is transformers.LlamaForCausalLM
    torch.testing.assert_close(logits(loaded.eval()), logits(model), rtol=0, atol=1e-5)


def test_load_model_refuses_a_family_outside_the_attention_interface(tmp_path: Path) -> None:
    config = transformers.BloomConfig(vocab_size=61, hidden_size=32, n_layer=1, n_head=4)
    configure_attention(config, "softmax1")
    transformers.BloomForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"'bloom' model.*attention interface"):
        load_model(tmp_path)
    del config.hopfield_attention, config.attn_implementation  # a stock Bloom: refused too
    transformers.BloomForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"'bloom' model.*attention interface"):
        load_model(tmp_path)
    with pytest.raises(ValueError, match="no transformers model class"):
        interface_model_class("NoSuchModel")


@pytest.mark.skipif("gpt_oss" not in FAMILIES, reason="this transformers has no gpt-oss")
def test_gpt_oss_learned_sinks_are_the_sink_logits() -> None:
    """gpt-oss's sinks map onto the sink variants' sink logit: hopfield_softmax1 on gpt-oss is
    gpt-oss's own (eager) attention; a variant without a sink is refused."""
    model = decoder("gpt_oss", None)
    model.set_attn_implementation("eager")
    reference = logits(model)
    model.set_attn_implementation("hopfield_softmax1")
    torch.testing.assert_close(logits(model), reference, rtol=0, atol=1e-5)
    model.set_attn_implementation("hopfield_clipped")
    model.config.hopfield_attention = {"variant": "clipped", "gamma": -0.03, "zeta": 1.0}
    with pytest.raises(ValueError, match=r"learned attention sinks.*sink variant"):
        logits(model)


def test_learned_sinks_replace_the_fixed_sink_logit() -> None:
    """s_aux = s gives exp(z) / (exp(s_h) + Σ exp z) per head; s = 0 is Softmax_1."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, 4, 8, generator=g) for _ in range(3))
    allowed = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    allowed[1, :, :, :2] = False  # padding
    module = nn.Module()
    sinks = torch.tensor([0.0, 2.0, -1.0], requires_grad=True)
    out, _ = attention_forward("softmax1", module, q, k, v, allowed, s_aux=sinks)
    scores = (q @ k.transpose(-1, -2) / 8**0.5).masked_fill(~allowed, -torch.inf)
    weights = scores.exp() / (scores.exp().sum(-1, keepdim=True) + sinks.view(1, 3, 1, 1).exp())
    torch.testing.assert_close(out, (weights @ v).transpose(1, 2))
    out.sum().backward()
    assert sinks.grad is not None and sinks.grad.abs().min() > 0  # the sinks learn
    at_zero, _ = attention_forward("softmax1", module, q, k, v, allowed, s_aux=torch.zeros(3))
    plain, _ = attention_forward("softmax1", module, q, k, v, allowed)
    torch.testing.assert_close(at_zero, plain)
    with pytest.raises(ValueError, match="one per query head"):
        attention_forward("softmax1", module, q, k, v, allowed, s_aux=torch.zeros(2))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_model_loaded_through_auto_and_saved_again_keeps_the_variant(
    tmp_path: Path, family: str
) -> None:
    """transformers consumes ``attn_implementation`` when it reads config.json; the registered
    attention function writes it back at its first call, so the re-saved checkpoint restores."""
    model = decoder(family, "softmax1")
    model.save_pretrained(tmp_path / "first")
    auto = AutoModelForCausalLM.from_pretrained(tmp_path / "first").eval()
    assert "attn_implementation" not in auto.config.to_dict()  # what transformers leaves
    expected = logits(auto)
    auto.save_pretrained(tmp_path / "second")
    saved = json.loads((tmp_path / "second" / "config.json").read_text())
    assert saved["attn_implementation"] == "hopfield_softmax1"
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "second").eval()
    assert again.config._attn_implementation == "hopfield_softmax1"
    torch.testing.assert_close(logits(again), expected, rtol=0, atol=1e-6)


def test_a_re_saved_checkpoint_without_a_forward_pass_restores_through_the_argument(
    tmp_path: Path,
) -> None:
    """Saved again before any forward pass, the checkpoint lacks the key: the documented argument
    (and load_model) restore the variant."""
    model = decoder("llama", "softmax1")
    model.save_pretrained(tmp_path / "first")
    AutoModelForCausalLM.from_pretrained(tmp_path / "first").save_pretrained(tmp_path / "second")
    assert "attn_implementation" not in json.loads(
        (tmp_path / "second" / "config.json").read_text()
    )
    restored = AutoModelForCausalLM.from_pretrained(
        tmp_path / "second", attn_implementation="hopfield_softmax1"
    ).eval()
    torch.testing.assert_close(logits(restored), logits(model), rtol=0, atol=1e-5)
    torch.testing.assert_close(logits(load_model(tmp_path / "second").eval()), logits(model),
                               rtol=0, atol=1e-5)  # fmt: skip

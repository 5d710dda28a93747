"""Saved hopfield models come back identical through transformers' own Auto classes."""

from __future__ import annotations

import json
import logging
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import Tensor, nn

pytest.importorskip("transformers")

import transformers
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
)

from hopfield.integrations import (
    MODEL_CLASSES,
    VARIANTS,
    HopfieldOPTConfig,
    add_gates,
    attention_modules,
    build_model,
    configure_attention,
    load_model,
)
from hopfield.integrations.auto import AUTO_CLASSES

TINY: dict[str, dict[str, Any]] = {
    "bert": dict(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=97,
        max_position_embeddings=32,
    ),
    "opt": dict(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        ffn_dim=64,
        vocab_size=97,
        word_embed_proj_dim=32,
        max_position_embeddings=32,
    ),
    "vit": dict(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=16,
        patch_size=8,
        num_labels=5,
    ),
}

AUTO = {
    "bert": AutoModelForMaskedLM,
    "opt": AutoModelForCausalLM,
    "vit": AutoModelForImageClassification,
}


def inputs(family: str) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(3)
    if family == "vit":
        return {"pixel_values": torch.randn(2, 3, 16, 16, generator=g)}
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 5:] = 0
    return {"input_ids": torch.randint(3, 97, (2, 9), generator=g), "attention_mask": mask}


def outputs(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    with torch.no_grad():
        out = model(**batch)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def trained_looking(model: nn.Module) -> nn.Module:
    """Move the gates away from their initialisation, so loaded gates must come from the file."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for _, module in attention_modules(model):
            for p in getattr(module, "gate", nn.Module()).parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


@contextmanager
def transformers_messages() -> Iterator[list[str]]:
    """Warnings of transformers' logging and of ``warnings`` raised inside the block."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Collect(level=logging.WARNING)
    root = transformers.logging.get_logger()
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_warning()
    root.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield messages
        messages.extend(str(w.message) for w in caught)
    finally:
        root.removeHandler(handler)
        transformers.logging.set_verbosity(verbosity)


def assert_same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("family", sorted(TINY))
def test_auto_class_restores_variant_clipping_and_gates(
    tmp_path: Any, family: str, variant: str
) -> None:
    spec = VARIANTS[variant]
    options: dict[str, Any] = {}
    if spec.clipped:  # not the family's defaults: they must come from config.json
        options.update(gamma=-0.0625, zeta=1.125)
    if spec.gated:
        options.update(pi_init=0.375)
    model = trained_looking(build_model(family, variant, **TINY[family], **options))
    model.save_pretrained(tmp_path)
    with transformers_messages() as messages:
        loaded, info = AUTO[family].from_pretrained(tmp_path, output_loading_info=True)
    assert messages == []
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    loaded.eval()
    assert type(loaded) is type(model)
    assert loaded.config.model_type == f"hopfield_{family}"
    assert loaded.config._attn_implementation == f"hopfield_{variant}"
    assert loaded.config.hopfield_attention == model.config.hopfield_attention
    if spec.clipped:
        assert loaded.config.hopfield_attention["gamma"] == -0.0625
    if spec.gated:
        gates = [m.gate for _, m in attention_modules(loaded)]
        assert len(gates) == 2 and gates[0].pi_init == 0.375
    assert_same_state(loaded, model)
    batch = inputs(family)
    assert torch.equal(outputs(loaded, batch), outputs(model, batch))


def test_base_model_and_other_heads_keep_the_gates(tmp_path: Any) -> None:
    model = trained_looking(build_model("opt", "gated_clipped_softmax1", **TINY["opt"]))
    model.save_pretrained(tmp_path)
    base = AutoModel.from_pretrained(tmp_path).eval()
    assert type(base).__name__ == "HopfieldOPTModel"
    assert_same_state(base, model.model)
    batch = inputs("opt")
    assert torch.equal(outputs(base, batch), outputs(model.model, batch))

    bert = trained_looking(build_model("bert", "gated_softmax1", **TINY["bert"]))
    bert.save_pretrained(tmp_path / "bert")
    classifier, info = AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "bert", num_labels=3, output_loading_info=True
    )
    assert type(classifier).__name__ == "HopfieldBertForSequenceClassification"
    assert classifier.config._attn_implementation == "hopfield_gated_softmax1"
    # only the new head (and the pooler that the MLM model has not) are missing
    assert {k.rsplit(".", 2)[0] for k in info["missing_keys"]} == {"classifier", "bert.pooler"}
    encoder = {k: v for k, v in bert.state_dict().items() if k.startswith("bert.encoder.")}
    assert all(torch.equal(classifier.state_dict()[k], v) for k, v in encoder.items())
    assert any(".gate." in k for k in encoder)


def test_from_config_builds_the_gates_and_an_explicit_implementation_wins(tmp_path: Any) -> None:
    model = build_model("opt", "gated_softmax1", **TINY["opt"])
    again = AutoModelForCausalLM.from_config(model.config)
    assert type(again) is type(model)
    assert list(again.state_dict()) == list(model.state_dict())
    model.save_pretrained(tmp_path)
    sdpa = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa")
    assert sdpa.config._attn_implementation == "sdpa"
    assert sdpa.config.hopfield_attention["variant"] == "gated_softmax1"


def test_missing_gate_weights_get_the_gate_initialisation(tmp_path: Any) -> None:
    build_model("opt", "sdpa", **TINY["opt"]).save_pretrained(tmp_path)  # a stock checkpoint
    config = HopfieldOPTConfig.from_pretrained(tmp_path)
    configure_attention(config, "gated", pi_init=0.25)
    with transformers_messages() as messages:
        model = MODEL_CLASSES["OPTForCausalLM"].from_pretrained(tmp_path, config=config)
    assert any("MISSING" in m for m in messages)  # the gates are reported missing, as they are
    for _, module in attention_modules(model):
        assert torch.equal(module.gate.biases[-1], torch.full((4, 1), math.log(1 / 3)))
        bound = 1 / math.sqrt(8)  # per-head nn.Linear(d_head = 8, 1) initialisation
        assert 0 < module.gate.weights[0].abs().max() <= bound


@pytest.mark.parametrize("family", ["bert", "vit"])
def test_checkpoint_from_before_the_model_types_loads_with_load_model(
    tmp_path: Any, family: str
) -> None:
    # what build_model saved before the hopfield model types: the stock class, the variant in
    # config.hopfield_attention and the gates added afterwards
    stock = getattr(
        transformers, {"bert": "BertForMaskedLM", "vit": "ViTForImageClassification"}[family]
    )
    config = getattr(transformers, {"bert": "BertConfig", "vit": "ViTConfig"}[family])(
        **TINY[family]
    )
    configure_attention(config, "gated_clipped_softmax1", gamma=-0.0625, zeta=1.0, pi_init=0.25)
    old = stock(config)
    add_gates(old, pi_init=0.25)
    trained_looking(old).save_pretrained(tmp_path / "old")
    assert json.loads((tmp_path / "old" / "config.json").read_text())["model_type"] == family
    with pytest.warns(UserWarning, match="before the hopfield model types"):
        loaded = load_model(tmp_path / "old").eval()
    assert type(loaded).__name__ == f"Hopfield{stock.__name__}"
    assert loaded.config._attn_implementation == "hopfield_gated_clipped_softmax1"
    assert_same_state(loaded, old)
    batch = inputs(family)
    assert torch.equal(outputs(loaded, batch), outputs(old, batch))
    loaded.save_pretrained(tmp_path / "new")  # saved again: transformers' loaders restore it
    again = AUTO[family].from_pretrained(tmp_path / "new").eval()
    assert torch.equal(outputs(again, batch), outputs(old, batch))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert type(load_model(tmp_path / "new")) is type(loaded)


def test_bad_hopfield_attention_in_config_json_is_refused(tmp_path: Any) -> None:
    build_model("opt", "softmax1", **TINY["opt"]).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["hopfield_attention"]["variant"] = "softmax2"
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="hopfield_attention: variant must be one of"):
        AutoConfig.from_pretrained(tmp_path)
    config["hopfield_attention"] = {"variant": "clipped"}
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="needs gamma and zeta"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


# --- load_model: the saved class, its key renames, and no silent mismatch ---------------------

FAMILY_OF_STOCK = {
    stock: family for family, autos in AUTO_CLASSES.items() for stock in autos.values()
}


def built(family: str, variant: str, stock: str | None = None) -> nn.Module:
    """A tiny model of ``family`` with ``variant``: the family's default class, or the (hopfield or
    stock) class of ``stock`` built from the same config."""
    model = build_model(family, variant, **TINY[family])
    if stock is not None:
        cls = MODEL_CLASSES[stock] if variant in VARIANTS else getattr(transformers, stock)
        torch.manual_seed(0)
        model = cls(model.config)
    return trained_looking(model)


@pytest.mark.parametrize("variant", [*sorted(VARIANTS), "sdpa"])
@pytest.mark.parametrize("family", sorted(TINY))
def test_load_model_round_trip_every_family_and_variant(
    tmp_path: Any, family: str, variant: str
) -> None:
    model = built(family, variant)
    model.save_pretrained(tmp_path)
    loaded = load_model(tmp_path).eval()  # strict: any missing/unexpected key would raise
    assert type(loaded) is type(model)
    assert loaded.config._attn_implementation == model.config._attn_implementation
    assert_same_state(loaded, model)
    batch = inputs(family)
    assert torch.equal(outputs(loaded, batch), outputs(model, batch))


@pytest.mark.parametrize("hopfield", [True, False], ids=["gated_clipped_softmax1", "sdpa"])
@pytest.mark.parametrize("stock", sorted(FAMILY_OF_STOCK))
def test_load_model_keeps_every_saved_class(tmp_path: Any, stock: str, hopfield: bool) -> None:
    # every class of the Auto classes, hopfield and stock: a saved BertModel is no BertForMaskedLM,
    # and a HopfieldViTModel is saved with ViTModel's renamed keys (encoder.layer.*)
    family = FAMILY_OF_STOCK[stock]
    model = built(family, "gated_clipped_softmax1" if hopfield else "sdpa", stock)
    model.save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    assert type(loaded) is type(model)
    assert type(loaded).__name__ == ("Hopfield" if hopfield else "") + stock
    assert_same_state(loaded, model)


def test_hopfield_vit_base_model_uses_vit_key_renames(tmp_path: Any) -> None:
    from safetensors import safe_open

    classifier = built("vit", "gated")
    classifier.save_pretrained(tmp_path / "head")
    with safe_open(str(tmp_path / "head" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert any(k.startswith("vit.encoder.layer.0.attention.gate.") for k in keys)
    base, info = AutoModel.from_pretrained(tmp_path / "head", output_loading_info=True)
    assert type(base).__name__ == "HopfieldViTModel"
    assert info["missing_keys"] == {"pooler.dense.weight", "pooler.dense.bias"}  # only the head
    assert info["unexpected_keys"] == {"classifier.weight", "classifier.bias"}
    encoder = {k: v for k, v in classifier.vit.state_dict().items() if not k.startswith("pooler")}
    assert all(torch.equal(base.state_dict()[k], v) for k, v in encoder.items())
    base.save_pretrained(tmp_path / "base")
    with safe_open(str(tmp_path / "base" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert any(k.startswith("encoder.layer.0.attention.gate.") for k in keys)


def test_load_model_reports_missing_and_unexpected_weights(tmp_path: Any) -> None:
    from safetensors.torch import load_file, save_file

    model = built("bert", "gated")
    model.save_pretrained(tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    gate = next(k for k in weights if ".gate." in k)
    weights["bert.surplus"] = torch.zeros(2)
    del weights[gate]
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing keys: .*\.gate\..*unexpected keys: .*surplus"):
        load_model(tmp_path)
    with pytest.warns(UserWarning, match="missing weights are newly initialised"):
        loaded = load_model(tmp_path, strict=False)
    assert type(loaded) is type(model)
    with pytest.raises(TypeError, match="output_loading_info"):
        load_model(tmp_path, output_loading_info=True)

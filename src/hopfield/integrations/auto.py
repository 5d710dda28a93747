"""Hopfield model types for ``transformers``' Auto classes: checkpoints that load back exactly.

``transformers`` does not save ``attn_implementation`` and builds a checkpoint's modules from its
``config.json`` alone, so a stock ``OPTForCausalLM`` with a Softmax_1 variant and gates comes back
from ``AutoModelForCausalLM.from_pretrained`` as plain SDPA attention without gates. This module
follows the documented way of adding models to the Auto classes (``AutoConfig.register``,
``AutoModel*.register``):

* a config class per family (:class:`HopfieldBertConfig`, :class:`HopfieldOPTConfig`,
  :class:`HopfieldViTConfig`): the stock config with its own ``model_type`` (``"hopfield_bert"``,
  ``"hopfield_opt"``, ``"hopfield_vit"``) and the field ``hopfield_attention`` (variant, clipping
  parameters, gate design). Built or loaded, the config selects its variant as attention
  implementation unless one is asked for explicitly (``attn_implementation=...`` wins);
* a model class per stock model class (``HopfieldBertForMaskedLM``, ``HopfieldOPTForCausalLM``,
  ``HopfieldViTForImageClassification``, the base models and the other heads, see
  :data:`AUTO_CLASSES`): the stock class plus the gates that the config's variant asks for, added in
  ``__init__`` so that ``from_pretrained`` finds them before it loads the weights.

:func:`register_auto_classes` (run when :mod:`hopfield.integrations` is imported) registers the
configs with ``AutoConfig`` and the models with their Auto classes. A saved model's ``config.json``
names the hopfield model type, so after ``import hopfield.integrations`` every
``AutoModel*.from_pretrained`` rebuilds the same modules, attention function,
clipping parameters and gate weights. Without the import, ``transformers`` refuses the unknown
model type instead of silently building another model.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from transformers import BertConfig, OPTConfig, ViTConfig

from hopfield.integrations.attention import (
    CONFIG_KEY,
    VARIANTS,
    attention_name,
    check_settings,
    variant_name,
)
from hopfield.integrations.gates import add_gates
from hopfield.nn.gates import GatedAttention

__all__ = [
    "AUTO_CLASSES",
    "CONFIG_CLASSES",
    "MODEL_CLASSES",
    "HopfieldBertConfig",
    "HopfieldOPTConfig",
    "HopfieldViTConfig",
    "family_of",
    "interface_model_class",
    "register_auto_classes",
]


class _HopfieldConfig:
    """Shared part of the hopfield configs: checks ``hopfield_attention`` and selects its variant."""

    def __post_init__(self, **kwargs: Any) -> None:
        config: Any = self
        super().__post_init__(**kwargs)  # type: ignore[misc]
        settings = config.hopfield_attention
        if settings is not None:
            check_settings(settings)
            if config._attn_implementation is None:  # an explicit attn_implementation wins
                config._attn_implementation = attention_name(settings["variant"])


class HopfieldBertConfig(_HopfieldConfig, BertConfig):
    """``BertConfig`` with ``hopfield_attention`` (see :func:`configure_attention`)."""

    model_type = "hopfield_bert"
    hopfield_attention: dict[str, Any] | None = None


class HopfieldOPTConfig(_HopfieldConfig, OPTConfig):
    """``OPTConfig`` with ``hopfield_attention`` (see :func:`configure_attention`)."""

    model_type = "hopfield_opt"
    hopfield_attention: dict[str, Any] | None = None


class HopfieldViTConfig(_HopfieldConfig, ViTConfig):
    """``ViTConfig`` with ``hopfield_attention`` (see :func:`configure_attention`)."""

    model_type = "hopfield_vit"
    hopfield_attention: dict[str, Any] | None = None


#: The hopfield config class of each family.
CONFIG_CLASSES: dict[str, Any] = {
    "bert": HopfieldBertConfig,
    "opt": HopfieldOPTConfig,
    "vit": HopfieldViTConfig,
}

#: Per family, the Auto classes (by name) and the stock model class each one builds for the family
#: in ``transformers``; each gets a hopfield subclass registered for the family's hopfield config.
AUTO_CLASSES: dict[str, dict[str, str]] = {
    "bert": {
        "AutoModel": "BertModel",
        "AutoModelForTextEncoding": "BertModel",
        "AutoModelForPreTraining": "BertForPreTraining",
        "AutoModelForMaskedLM": "BertForMaskedLM",
        "AutoModelForCausalLM": "BertLMHeadModel",
        "AutoModelForNextSentencePrediction": "BertForNextSentencePrediction",
        "AutoModelForSequenceClassification": "BertForSequenceClassification",
        "AutoModelForMultipleChoice": "BertForMultipleChoice",
        "AutoModelForTokenClassification": "BertForTokenClassification",
        "AutoModelForQuestionAnswering": "BertForQuestionAnswering",
    },
    "opt": {
        "AutoModel": "OPTModel",
        "AutoModelForCausalLM": "OPTForCausalLM",
        "AutoModelForSequenceClassification": "OPTForSequenceClassification",
        "AutoModelForQuestionAnswering": "OPTForQuestionAnswering",
    },
    "vit": {
        "AutoModel": "ViTModel",
        "AutoModelForImageClassification": "ViTForImageClassification",
        "AutoModelForMaskedImageModeling": "ViTForMaskedImageModeling",
    },
}


class _HopfieldModel:
    """Shared part of the hopfield model classes: the gates of a gated variant.

    The gates are added at the end of ``__init__`` (after the stock model's own initialisation,
    so a model built from a config draws the same random numbers as the stock model followed by
    :func:`add_gates`). When ``from_pretrained`` finds no gate weights in a checkpoint (a stock
    checkpoint loaded with a gated config), the gates get their own initialisation
    (``pi_init``), not the stock model's.
    """

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]
        settings = getattr(config, CONFIG_KEY, None)
        if settings is not None and VARIANTS[str(variant_name(settings["variant"]))].gated:
            add_gates(
                self,  # type: ignore[arg-type]
                hidden=settings.get("gate_hidden"),
                pi_init=settings.get("pi_init"),
            )

    def initialize_weights(self) -> None:
        model: Any = self
        gates: list[Any] = [m for m in model.modules() if isinstance(m, GatedAttention)]
        with torch.no_grad():
            for gate in gates:
                if getattr(gate, "_is_hf_initialized", False):
                    continue
                if not all(getattr(p, "_is_hf_initialized", False) for p in gate.parameters()):
                    gate.reset_parameters()  # not loaded from the checkpoint
                gate._is_hf_initialized = True  # the stock model's initialisation skips it
        super().initialize_weights()  # type: ignore[misc]


def _model_class(stock: str, config_class: Any) -> Any:
    """The hopfield subclass ``Hopfield<stock>`` of ``transformers.<stock>`` for ``config_class``."""
    name = f"Hopfield{stock}"
    cls = type(
        name,
        (_HopfieldModel, getattr(transformers, stock)),
        {
            "config_class": config_class,
            "__module__": __name__,
            "__qualname__": name,
            "__doc__": f"``transformers.{stock}`` with the attention variant and gates of "
            f"``config.{CONFIG_KEY}`` (config class :class:`{config_class.__name__}`).",
        },
    )
    globals()[name] = cls  # importable by name (pickle, ``architectures`` in config.json)
    return cls


#: The hopfield model class of each stock model class name (``"BertForMaskedLM"`` →
#: ``HopfieldBertForMaskedLM``), for the families of :data:`AUTO_CLASSES`.
MODEL_CLASSES: dict[str, Any] = {
    stock: _model_class(stock, CONFIG_CLASSES[family])
    for family, autos in AUTO_CLASSES.items()
    for stock in dict.fromkeys(autos.values())
}
__all__ += sorted(cls.__name__ for cls in MODEL_CLASSES.values())

_FAMILY_OF_MODEL_TYPE = {cls.model_type: family for family, cls in CONFIG_CLASSES.items()}

#: The hopfield subclasses made by :func:`interface_model_class` for stock model types.
_INTERFACE_CLASSES: dict[str, Any] = {}


def interface_model_class(stock: str) -> Any:
    """The hopfield subclass of ``transformers.<stock>`` for a model type without a hopfield
    config (Llama, Qwen2, Mistral, gpt-oss, ...): the stock class plus the gates that its
    config's ``hopfield_attention`` asks for, with the stock config class (so it reads a stock
    ``config.json``) and the stock class's checkpoint key renames. Made once per class.

    Raises:
        ValueError: ``stock`` is no ``transformers`` model class, or one whose attention does not
            go through ``transformers``' attention interface (``_supports_attention_backend``).
    """
    if stock in _INTERFACE_CLASSES:
        return _INTERFACE_CLASSES[stock]
    base = getattr(transformers, stock, None)
    if not (isinstance(base, type) and issubclass(base, transformers.PreTrainedModel)):
        raise ValueError(f"{stock!r} is no transformers model class")
    if not getattr(base, "_supports_attention_backend", False):
        raise ValueError(
            f"{stock} ({getattr(base.config_class, 'model_type', '?')!r}) does not use "
            "transformers' attention interface (_supports_attention_backend is False), so the "
            "hopfield attention variants cannot reach it"
        )
    cls = _model_class(stock, base.config_class)
    _copy_key_renames(stock, cls)
    _INTERFACE_CLASSES[stock] = cls
    return cls


def family_of(config: Any) -> str | None:
    """The family (``"bert"``, ``"opt"``, ``"vit"``) of a stock or hopfield config, else ``None``."""
    model_type = getattr(config, "model_type", None)
    if model_type in CONFIG_CLASSES:
        return str(model_type)
    return _FAMILY_OF_MODEL_TYPE.get(str(model_type))


def _register_key_renames() -> None:
    """Give each hopfield model class the checkpoint key renames of its stock class.

    ``transformers`` 5 renames weights between a model's modules and its checkpoint by class name
    (or ``model_type``), e.g. ``ViTModel``'s ``layers.*`` are saved as ``encoder.layer.*``. It skips
    classes defined outside ``transformers`` unless their names are registered, so without this a
    ``HopfieldViTModel`` saves and expects other keys than a ``ViTModel``, and a
    ``HopfieldViTForImageClassification`` checkpoint (whose inner ``ViTModel`` is renamed) does not
    load into it. The renames are looked up, not copied: whatever ``transformers`` version is
    installed defines them.
    """
    for stock, cls in MODEL_CLASSES.items():
        _copy_key_renames(stock, cls)


def _copy_key_renames(stock: str, cls: Any) -> None:
    """Register the checkpoint key renames of ``transformers.<stock>`` (by class name, else by
    model type) for the hopfield class ``cls``."""
    from transformers.conversion_mapping import (
        get_checkpoint_conversion_mapping,
        register_checkpoint_conversion_mapping,
    )

    renames = get_checkpoint_conversion_mapping(stock)
    if renames is None:
        renames = get_checkpoint_conversion_mapping(
            getattr(transformers, stock).config_class.model_type
        )
    if renames is not None:
        register_checkpoint_conversion_mapping(cls.__name__, renames, overwrite=True)


def register_auto_classes() -> None:
    """Register the hopfield configs with ``AutoConfig``, the models with their Auto classes
    (:data:`AUTO_CLASSES`) and the stock classes' checkpoint key renames for the hopfield
    classes; idempotent."""
    for family, autos in AUTO_CLASSES.items():
        config_class: Any = CONFIG_CLASSES[family]
        transformers.AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        for auto, stock in autos.items():
            getattr(transformers, auto).register(config_class, MODEL_CLASSES[stock], exist_ok=True)
    _register_key_renames()

"""BERT, OPT and ViT with any attention variant, built from a config (no download).

``build_model(family, variant, **config)`` gives the paper's models by default:

* ``"bert"``: BERT-base-uncased masked LM (12 layers, d 768, 12 heads, FFN 3072, post-LN);
  encoder + embeddings = 108,891,648 parameters ("108.9m"); gated: MLP gate
  ``Linear(64, 16) → ReLU → Linear(16, 1)`` per head (+152,208, "109m").
* ``"opt"``: OPT-125m causal LM with 512 positions (the authors' ``opt-12L12H`` config,
  ``init_std`` 0.006): 124,059,648 parameters ("124.06m"); gated: linear gate per head,
  ``pi_init`` 0.25 (+9,360, "124.07m").
* ``"vit"``: ViT-S/16 image classifier (224², patch 16, d 384, 6 heads, FFN 1536, 1000 classes):
  22,050,664 parameters (the paper prints "22.03m"); gated: linear gate, ``pi_init`` 0.25 (+4,680).

Clipping defaults are the authors' per model (spec §3.2): BERT ``gamma = -0.025`` with ``zeta = 1``
(``zeta = 1.1`` for ``clipped_softmax1``, as in their mapping), OPT ``alpha = 12`` over ``T = 512``
(``gamma = -0.0234375``), ViT ``gamma = -1e-5``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from hopfield.integrations.attention import (
    CONFIG_KEY,
    PREFIX,
    SAVED_KEY,
    VARIANTS,
    attention_name,
    check_settings,
    configure_attention,
    variant_name,
)

__all__ = ["FAMILIES", "Family", "build_model", "load_model", "paper_parameter_count"]


@dataclass(frozen=True)
class Family:
    """A model family: its ``transformers`` classes, paper config and per-variant defaults."""

    name: str
    config_class: str
    model_class: str
    defaults: dict[str, Any]
    clip: dict[str, dict[str, float]]
    gate_hidden_fraction: int | None  # MLP gate width = d_head // fraction; None = linear gate
    pi_init: float | None
    counted: str | None = None  # submodule whose parameters the paper counts (None = all)
    length_key: str = field(default="max_position_embeddings")


FAMILIES: dict[str, Family] = {
    "bert": Family(
        name="bert",
        config_class="BertConfig",
        model_class="BertForMaskedLM",
        defaults={},  # BertConfig() is bert-base-uncased
        clip={
            "clipped": {"gamma": -0.025, "zeta": 1.0},
            "clipped_softmax1": {"gamma": -0.025, "zeta": 1.1},
        },
        gate_hidden_fraction=4,
        pi_init=None,
        counted="bert",
    ),
    "opt": Family(
        name="opt",
        config_class="OPTConfig",
        model_class="OPTForCausalLM",
        defaults={"max_position_embeddings": 512, "init_std": 0.006},
        clip={
            "clipped": {"alpha": 12.0, "zeta": 1.0},
            "clipped_softmax1": {"alpha": 12.0, "zeta": 1.0},
        },
        gate_hidden_fraction=None,
        pi_init=0.25,
    ),
    "vit": Family(
        name="vit",
        config_class="ViTConfig",
        model_class="ViTForImageClassification",
        defaults={
            "hidden_size": 384,
            "num_hidden_layers": 12,
            "num_attention_heads": 6,
            "intermediate_size": 1536,
            "image_size": 224,
            "patch_size": 16,
            "num_labels": 1000,
        },
        clip={
            "clipped": {"gamma": -1e-5, "zeta": 1.0},
            "clipped_softmax1": {"gamma": -1e-5, "zeta": 1.0},
        },
        gate_hidden_fraction=None,
        pi_init=0.25,
    ),
}


def _family(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}, got {name!r}")
    return FAMILIES[name]


def _classes(family: Family, hopfield: bool) -> tuple[Any, Any]:
    """The config and model class: the hopfield ones (saved models load back through
    ``transformers``' Auto classes, see :mod:`hopfield.integrations.auto`) or the stock ones."""
    import transformers

    from hopfield.integrations.attention import register_attention_functions
    from hopfield.integrations.auto import CONFIG_CLASSES, MODEL_CLASSES, register_auto_classes

    register_attention_functions()
    register_auto_classes()
    if hopfield:
        return CONFIG_CLASSES[family.name], MODEL_CLASSES[family.model_class]
    return getattr(transformers, family.config_class), getattr(transformers, family.model_class)


def build_model(
    family: str,
    variant: str = "softmax",
    *,
    gamma: float | None = None,
    zeta: float | None = None,
    alpha: float | None = None,
    gate_hidden: int | None = None,
    pi_init: float | None = None,
    **config: Any,
) -> nn.Module:
    """A randomly initialised ``transformers`` model of ``family`` with attention ``variant``.

    Args:
        family: ``"bert"`` (masked LM), ``"opt"`` (causal LM) or ``"vit"`` (image classifier).
        variant: ``"softmax"`` (vanilla), ``"softmax1"`` (OutEffHop), ``"clipped"``,
            ``"clipped_softmax1"``, ``"gated"``, ``"gated_softmax1"``, ``"gated_clipped"``,
            ``"gated_clipped_softmax1"`` (or the registered ``"hopfield_<name>"``; the model's
            ``config._attn_implementation`` is the registered name), or any attention
            implementation ``transformers`` knows (``"sdpa"``, ``"eager"``) for the untouched
            model.
        gamma, zeta, alpha: clipping parameters (default: the family's, see the module docstring);
            ``alpha`` gives ``gamma = -alpha / T`` with ``T = max_position_embeddings``.
        gate_hidden, pi_init: gate design (default: the family's).
        **config: overrides of the family's ``transformers`` config (e.g. ``num_hidden_layers=2``).

    Returns:
        The model (in training mode, float32, on CPU): for a hopfield variant an instance of the
        hopfield subclass of the family's class (``HopfieldBertForMaskedLM``,
        ``HopfieldOPTForCausalLM``, ``HopfieldViTForImageClassification``, see
        :mod:`hopfield.integrations.auto`), whose ``save_pretrained`` checkpoints load back
        exactly with ``transformers``' Auto classes; for ``"sdpa"``/``"eager"`` the stock class.
    """
    fam = _family(family)
    short = variant_name(variant)
    if short is None:
        _check_stock_implementation(variant)
    config_class, model_class = _classes(fam, hopfield=short is not None)
    cfg = config_class(**{**fam.defaults, **config})
    if short is not None:
        spec = VARIANTS[short]
        options: dict[str, Any] = {}
        if spec.clipped:
            clip: dict[str, Any] = dict(fam.clip["clipped_softmax1" if spec.n else "clipped"])
            if gamma is not None or alpha is not None:
                clip.pop("gamma", None)
                clip.pop("alpha", None)
                clip.update({"gamma": gamma} if gamma is not None else {"alpha": alpha})
            if zeta is not None:
                clip["zeta"] = zeta
            if "alpha" in clip:
                clip["length"] = getattr(cfg, fam.length_key)
            options.update(clip)
        if spec.gated:
            head = cfg.hidden_size // cfg.num_attention_heads
            default_hidden = head // fam.gate_hidden_fraction if fam.gate_hidden_fraction else None
            options["gate_hidden"] = default_hidden if gate_hidden is None else gate_hidden
            options["pi_init"] = fam.pi_init if pi_init is None else pi_init
        configure_attention(cfg, variant, **options)
    else:
        if any(x is not None for x in (gamma, zeta, alpha, gate_hidden, pi_init)):
            raise ValueError(f"clipping/gate options need a hopfield variant, not {variant!r}")
        cfg._attn_implementation = variant
    return model_class(cfg)


def _check_stock_implementation(variant: object) -> None:
    """A ``ValueError`` listing our variants and ``transformers``' attention implementations
    when ``variant`` is neither (``transformers`` would list only its own)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    stock = [
        "eager",
        *(k for k in ALL_ATTENTION_FUNCTIONS.valid_keys() if not k.startswith(PREFIX)),
    ]
    if variant not in stock:
        raise ValueError(
            f"variant must be a hopfield variant ({', '.join(VARIANTS)}, or the same with the "
            f"prefix {PREFIX!r}) or an attention implementation of transformers "
            f"({', '.join(stock)}), got {variant!r}"
        )


def load_model(path: str | Path, *, strict: bool = True, **kwargs: Any) -> nn.Module:
    """Load a model saved with ``save_pretrained`` as the class it was saved from, with its
    attention variant, clipping parameters, gates and learned sinks.

    Reads any family whose attention goes through ``transformers``' attention interface (the
    model class's ``_supports_attention_backend``): BERT, OPT, ViT and their hopfield model types
    (``"hopfield_bert"``, ``"hopfield_opt"``, ``"hopfield_vit"``, which load as well with the
    matching ``transformers.AutoModel*.from_pretrained`` once :mod:`hopfield.integrations` is
    imported), and stock model types such as Llama, Qwen2, Mistral and gpt-oss configured with
    :func:`~hopfield.integrations.configure_attention` (and :func:`add_gates`): those come back as
    the hopfield subclass of their class
    (:func:`~hopfield.integrations.auto.interface_model_class`, which builds the gates before the
    weights load). gpt-oss's learned sinks are parameters of its attention modules, saved and
    loaded with the other weights. ``load_model`` picks the class named in ``config.json``
    (``architectures``: a saved ``BertModel`` comes back as a ``BertModel``, a
    ``HopfieldViTModel`` as a ``HopfieldViTModel``) and passes ``kwargs`` on to its
    ``from_pretrained``; a checkpoint without ``hopfield_attention`` loads as the stock class.
    Checkpoint keys are renamed as ``transformers`` renames them for the stock class (e.g. ViT's
    ``encoder.layer.*`` ↔ ``layers.*``, see
    :func:`hopfield.integrations.auto.register_auto_classes`). The loaded config carries
    ``attn_implementation`` again, so a checkpoint saved from the loaded model restores the variant
    through ``AutoModel*.from_pretrained`` too.

    Args:
        path: the directory written by ``save_pretrained``.
        strict: a checkpoint whose weights do not match the model (missing, unexpected or
            mismatched keys, loader errors) raises ``ValueError`` listing them; ``False``
            warns (``UserWarning``) and returns the model with the missing weights initialised.
        **kwargs: passed to ``from_pretrained`` (not ``output_loading_info``: the loading info
            is checked here); ``attn_implementation`` overrides the saved variant.

    Raises:
        ValueError: the family does not use the attention interface (naming it), the
            architecture is unknown, ``hopfield_attention`` in ``config.json`` is malformed, or
            (``strict``) the weights do not match.

    Checkpoints saved before the hopfield model types existed (``model_type`` ``"bert"``/``"opt"``/
    ``"vit"`` with ``hopfield_attention`` in ``config.json``) are still read, into the hopfield
    class of their architecture (variant, clipping parameters and gate weights), with a warning:
    ``transformers``' own loaders would give them back as the stock model without the gates;
    saving the loaded model again writes a checkpoint that they restore.
    """
    import transformers

    from hopfield.integrations.attention import register_attention_functions
    from hopfield.integrations.auto import register_auto_classes

    register_attention_functions()
    register_auto_classes()
    if "output_loading_info" in kwargs:
        raise TypeError(
            "load_model checks the loading info itself (strict=True raises on missing or "
            "unexpected weights, strict=False warns): do not pass output_loading_info"
        )
    config = transformers.AutoConfig.from_pretrained(path)
    settings: Any = getattr(config, CONFIG_KEY, None)
    if settings is not None:
        try:
            check_settings(settings)
        except ValueError as error:
            raise ValueError(f"path: {path}/config.json: {error}") from None
    model_class = _class_to_load(path, config, settings, kwargs)
    if settings is not None:
        kwargs.setdefault("attn_implementation", attention_name(settings["variant"]))
    model, info = model_class.from_pretrained(path, output_loading_info=True, **kwargs)
    _check_loading_info(path, model_class, info, strict)
    if settings is not None and model.config._attn_implementation == attention_name(
        settings["variant"]
    ):
        setattr(model.config, SAVED_KEY, model.config._attn_implementation)
    return model


def _class_to_load(path: str | Path, config: Any, settings: Any, kwargs: dict[str, Any]) -> Any:
    """The class ``load_model`` builds for a checkpoint's ``config`` (see there); a legacy
    BERT/OPT/ViT checkpoint sets ``kwargs["config"]`` to its hopfield config."""
    import warnings

    import transformers

    from hopfield.integrations.auto import (
        CONFIG_CLASSES,
        MODEL_CLASSES,
        family_of,
        interface_model_class,
    )

    architectures = getattr(config, "architectures", None) or []
    name = family_of(config)
    if name is None:
        if not architectures:
            raise ValueError(f"path: {path}/config.json names no architecture to load")
        stock = architectures[0].removeprefix("Hopfield")
        try:
            hopfield_class = interface_model_class(stock)
        except ValueError as error:
            raise ValueError(
                f"path: {path} holds a {config.model_type!r} model ({architectures[0]}); "
                f"load_model reads {sorted(FAMILIES)}, their hopfield model types and the "
                f"families whose attention goes through transformers' attention interface: "
                f"{error}"
            ) from None
        return hopfield_class if settings is not None else getattr(transformers, stock)
    stock = (architectures or [_family(name).model_class])[0].removeprefix("Hopfield")
    legacy = config.model_type == name and isinstance(settings, dict)
    if legacy:
        hopfield_type = CONFIG_CLASSES[name].model_type
        warnings.warn(
            f"{path}: checkpoint saved before the hopfield model types (model_type "
            f"{name!r}); loaded as {hopfield_type!r} with its attention {settings['variant']!r}. "
            "transformers' own loaders would drop the gates: save the loaded model "
            "again (save_pretrained) to get a checkpoint they restore",
            UserWarning,
            stacklevel=3,
        )
        values = {k: v for k, v in config.to_dict().items() if k != "model_type"}
        kwargs.setdefault("config", CONFIG_CLASSES[name].from_dict(values))
    if config.model_type == name and not legacy:
        return getattr(transformers, stock)
    if stock in MODEL_CLASSES:
        return MODEL_CLASSES[stock]
    raise ValueError(f"path: no hopfield class for the architecture {architectures[0]!r}")


def _check_loading_info(
    path: str | Path, model_class: Any, info: dict[str, Any], strict: bool
) -> None:
    """Raise (``strict``) or warn when the checkpoint's weights do not match the model."""
    import warnings

    problems = {key: sorted(map(str, found)) for key, found in info.items() if found}
    if not problems:
        return
    listed = "; ".join(f"{key.replace('_', ' ')}: {', '.join(v)}" for key, v in problems.items())
    message = f"{path}: the checkpoint does not match {model_class.__name__} ({listed})" + (
        "" if strict else "; the missing weights are newly initialised"
    )
    if strict:
        raise ValueError(message + " (strict=False loads it anyway, with a warning)")
    warnings.warn(message, UserWarning, stacklevel=3)


def paper_parameter_count(model: nn.Module) -> int:
    """Parameters as the paper counts them (BERT: encoder and embeddings, without the MLM head
    and pooler; OPT and ViT: the whole model, tied embeddings counted once)."""
    from hopfield.integrations.auto import family_of

    family = FAMILIES.get(family_of(getattr(model, "config", None)) or "")
    counted = getattr(model, family.counted) if family and family.counted else model
    return sum(p.numel() for p in counted.parameters())

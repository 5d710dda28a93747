"""Hugging Face ``transformers`` integration (extra ``hf``): outlier-efficient attention variants.

Importing this package registers the attention functions (``softmax``, ``softmax1``, ``clipped``,
``clipped_softmax1``, ``gated``, ``gated_softmax1``, ``gated_clipped``, ``gated_clipped_softmax1``)
with ``transformers.AttentionInterface`` under namespaced names (``hopfield_softmax1``, ...:
:func:`attention_names`; this package's functions accept the short names too), and the hopfield model types (``hopfield_bert``,
``hopfield_opt``, ``hopfield_vit``: :mod:`hopfield.integrations.auto`) with ``AutoConfig`` and the
``AutoModel*`` classes, so that ``AutoModel*.from_pretrained`` restores a saved model's attention
variant, clipping parameters and gates. See ``docs/outliers.md``.

On an install without ``transformers`` the import fails with one line that names the extra.
"""

from hopfield._install import install_command

try:
    import transformers  # noqa: F401  (the package this one extends)
except ModuleNotFoundError as missing:
    if missing.name != "transformers":
        raise
    raise ImportError(
        f"hopfield.integrations needs transformers (extra hf): {install_command('hf')}"
    ) from missing

from hopfield.integrations.attention import (
    VARIANTS,
    AttentionProbe,
    AttentionVariant,
    attention_forward,
    attention_name,
    attention_names,
    configure_attention,
    register_attention_functions,
    variant_name,
)
from hopfield.integrations.auto import (
    CONFIG_CLASSES,
    MODEL_CLASSES,
    HopfieldBertConfig,
    HopfieldOPTConfig,
    HopfieldViTConfig,
    register_auto_classes,
)
from hopfield.integrations.gates import ATTENTION_CLASSES, add_gates, attention_modules
from hopfield.integrations.models import (
    FAMILIES,
    build_model,
    load_model,
    paper_parameter_count,
)

register_attention_functions()
register_auto_classes()

__all__ = [
    "ATTENTION_CLASSES",
    "CONFIG_CLASSES",
    "FAMILIES",
    "MODEL_CLASSES",
    "VARIANTS",
    "AttentionProbe",
    "AttentionVariant",
    "HopfieldBertConfig",
    "HopfieldOPTConfig",
    "HopfieldViTConfig",
    "add_gates",
    "attention_forward",
    "attention_modules",
    "attention_name",
    "attention_names",
    "build_model",
    "configure_attention",
    "load_model",
    "paper_parameter_count",
    "register_attention_functions",
    "register_auto_classes",
    "variant_name",
]

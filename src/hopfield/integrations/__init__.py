"""Hugging Face ``transformers`` integration (extra ``hf``): outlier-efficient attention variants.

Importing this package registers the attention functions (``softmax``, ``softmax1``, ``clipped``,
``clipped_softmax1``, ``gated``, ``gated_softmax1``, ``gated_clipped``, ``gated_clipped_softmax1``)
with ``transformers.AttentionInterface``. See ``docs/outliers.md``.
"""

from hopfield.integrations.attention import (
    VARIANTS,
    AttentionProbe,
    AttentionVariant,
    attention_forward,
    configure_attention,
    register_attention_functions,
)
from hopfield.integrations.gates import ATTENTION_CLASSES, add_gates, attention_modules
from hopfield.integrations.models import (
    FAMILIES,
    build_model,
    load_model,
    paper_parameter_count,
)

register_attention_functions()

__all__ = [
    "ATTENTION_CLASSES",
    "FAMILIES",
    "VARIANTS",
    "AttentionProbe",
    "AttentionVariant",
    "add_gates",
    "attention_forward",
    "attention_modules",
    "build_model",
    "configure_attention",
    "load_model",
    "paper_parameter_count",
    "register_attention_functions",
]

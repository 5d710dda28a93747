"""Outlier metrics (kurtosis, infinity norms, attention diagnostics, sinks) and fake quantization.

See ``docs/outliers.md``. :class:`AttentionRecorder` needs the ``hf`` extra (``transformers``).
"""

from hopfield.outliers.attention import DEAD_ROW_SUM, AttentionRecorder
from hopfield.outliers.metrics import (
    MODULE_SELECTIONS,
    ActivationRecorder,
    ModuleSelection,
    inf_norm,
    kurtosis,
)
from hopfield.outliers.quantize import (
    QUANTIZER_KINDS,
    ActivationQuantizer,
    AttentionQuantizer,
    WeightQuantizer,
    activation_quantizers,
    fake_quantize_asymmetric,
    fake_quantize_fp8,
    fake_quantize_weight,
    quantize_w8a8,
    quantizer_ablation,
    quantizer_kinds,
    symmetric_scale,
)
from hopfield.outliers.sinks import (
    SINK_EPSILON,
    residual_peak,
    sink_mass,
    sink_rate,
    value_norm_ratio,
)

__all__ = [
    "DEAD_ROW_SUM",
    "MODULE_SELECTIONS",
    "QUANTIZER_KINDS",
    "SINK_EPSILON",
    "ActivationQuantizer",
    "ActivationRecorder",
    "AttentionQuantizer",
    "AttentionRecorder",
    "ModuleSelection",
    "WeightQuantizer",
    "activation_quantizers",
    "fake_quantize_asymmetric",
    "fake_quantize_fp8",
    "fake_quantize_weight",
    "inf_norm",
    "kurtosis",
    "quantize_w8a8",
    "quantizer_ablation",
    "quantizer_kinds",
    "residual_peak",
    "sink_mass",
    "sink_rate",
    "symmetric_scale",
    "value_norm_ratio",
]

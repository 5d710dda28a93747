"""W8A8 post-training fake quantization (spec §4.3; Bondarenko et al.'s "full INT8 activations").

Everything is simulated in floating point: a quantized tensor holds values of the 8-bit grid.

* **Weights** (``nn.Linear``, ``nn.Embedding``, ``nn.Conv2d``): INT8 symmetric per-tensor min–max,
  ``scale = max(|w_min|, |w_max|) / 127``, ``q = clamp(round(w / scale), -128, 127)``
  (``/ 255`` on the unsigned grid ``[0, 255]`` for a non-negative tensor).
* **Activations**: INT8 asymmetric per-tensor, ``x_min <- min(x_min, 0)``,
  ``x_max <- max(x_max, 1e-8)``, ``scale = (x_max - x_min) / 255``,
  ``zero_point = clamp(round(-x_min / scale), 0, 255)``,
  ``x̂ = (clamp(round(x / scale) + zero_point, 0, 255) - zero_point) · scale``.
  Ranges are calibrated on the first batches, with a running min–max of momentum 0.9 (the first
  batch initialises) or per-batch percentiles, on the float model, then frozen.
* **FP8** (``fmt="fp8_e4m3"``): per-tensor absmax scaling to 448, rounding through
  ``torch.float8_e4m3fn``, for weights and activations.

Quantizer placement (:func:`quantize_w8a8`): the input and output of every linear layer, the
outputs of embeddings and activation functions (FFN intermediate), the input (residual or
embedding sum) and output of every LayerNorm, the output of every transformer block (the residual
stream of pre-LN models), and, through an attention probe, the attention scores (before the mask)
and probabilities (after the separation). Modules under ``keep_fp`` (the LM/classification head)
stay in floating point. :func:`quantizer_ablation` measures the error of each kind of quantizer
alone (e.g. the residual stream's block outputs), to see where an outlier costs precision.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

__all__ = [
    "FORMATS",
    "QUANTIZER_KINDS",
    "ActivationQuantizer",
    "AttentionQuantizer",
    "WeightQuantizer",
    "activation_quantizers",
    "fake_quantize_asymmetric",
    "fake_quantize_fp8",
    "fake_quantize_weight",
    "quantize_w8a8",
    "quantizer_ablation",
    "quantizer_kinds",
    "symmetric_scale",
]

FORMATS = ("int8", "fp8_e4m3")
FP8_MAX = 448.0


def _check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    return fmt


def _check_bits(bits: int, fmt: str = "int8") -> int:
    """``bits`` of an integer grid, 2 to 16; FP8 has 8 bits only."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 16:
        raise ValueError(f"bits must be an int in [2, 16], got {bits!r}")
    if fmt == "fp8_e4m3" and bits != 8:
        raise ValueError(f"fmt 'fp8_e4m3' has 8 bits, got bits={bits}")
    return bits


def symmetric_scale(w: Tensor, bits: int = 8) -> tuple[Tensor, bool]:
    """Per-tensor symmetric scale of ``w`` and whether the unsigned grid is used.

    ``max(|w_min|, |w_max|) / (2^(b-1) - 1)`` (``/ (2^b - 1)`` with the grid ``[0, 2^b - 1]`` if
    ``w >= 0``); ``b = 8`` gives ``/ 127`` and ``/ 255``.
    """
    _check_bits(bits)
    unsigned = bool(w.min() >= 0)
    absmax = w.detach().abs().max().clamp_min(1e-8)
    return absmax / float(2**bits - 1 if unsigned else 2 ** (bits - 1) - 1), unsigned


def fake_quantize_fp8(x: Tensor, absmax: Tensor | float) -> Tensor:
    """Round ``x`` through FP8 e4m3 after per-tensor scaling of ``absmax`` to 448 (saturating)."""
    scale = torch.as_tensor(absmax, dtype=x.dtype, device=x.device).clamp_min(1e-8) / FP8_MAX
    scaled = (x / scale).clamp(-FP8_MAX, FP8_MAX)
    return scaled.to(torch.float8_e4m3fn).to(x.dtype) * scale


def fake_quantize_weight(w: Tensor, fmt: str = "int8", bits: int = 8) -> Tensor:
    """Weights on the per-tensor grid (symmetric ``bits``-bit integer min–max, or FP8 e4m3)."""
    if _check_format(fmt) == "fp8_e4m3":
        _check_bits(bits, fmt)
        return fake_quantize_fp8(w, w.detach().abs().max())
    scale, unsigned = symmetric_scale(w, bits)
    low, high = (0, 2**bits - 1) if unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return torch.clamp(torch.round(w / scale), low, high) * scale


def fake_quantize_asymmetric(
    x: Tensor, x_min: Tensor | float, x_max: Tensor | float, bits: int = 8
) -> Tensor:
    """Asymmetric ``bits``-bit integer fake quantization of ``x`` with the range
    ``[x_min, x_max]`` (scalars for per-tensor ranges, or tensors broadcasting against ``x``,
    e.g. ``(..., 1)`` for one range per token).

    The range is first widened to contain 0 (``x_min <= 0 < x_max``); values outside it saturate.
    """
    levels = float(2 ** _check_bits(bits) - 1)
    lo = torch.as_tensor(x_min, dtype=x.dtype, device=x.device).clamp_max(0.0)
    hi = torch.as_tensor(x_max, dtype=x.dtype, device=x.device).clamp_min(1e-8)
    scale = (hi - lo) / levels
    zero_point = torch.clamp(torch.round(-lo / scale), 0, levels)
    return (torch.clamp(torch.round(x / scale) + zero_point, 0, levels) - zero_point) * scale


class WeightQuantizer(nn.Module):
    """A parametrization (:func:`torch.nn.utils.parametrize.register_parametrization`) that
    fake-quantizes a weight per tensor. The original stays in floating point, so a tied copy (an LM
    head sharing the embedding matrix) is unaffected."""

    def __init__(self, fmt: str = "int8", bits: int = 8) -> None:
        super().__init__()
        self.fmt = _check_format(fmt)
        self.bits = _check_bits(bits, fmt)

    def forward(self, weight: Tensor) -> Tensor:
        """The weight on the ``bits``-bit grid."""
        return fake_quantize_weight(weight, self.fmt, self.bits)

    def extra_repr(self) -> str:
        return f"fmt={self.fmt!r}, bits={self.bits}"


class ActivationQuantizer(nn.Module):
    """Per-tensor activation quantizer with calibrated, then frozen, range (or per token).

    States: ``"calibrate"`` (pass through unchanged, update the range), ``"quantize"``
    (fake-quantize with the frozen range), ``"off"`` (pass through).

    Args:
        fmt: ``"int8"`` (asymmetric) or ``"fp8_e4m3"`` (absmax of the range).
        momentum: running min–max ``r <- momentum · r + (1 - momentum) · batch`` (first batch
            initialises).
        percentile: use the ``(100 - p)``-th and ``p``-th percentiles of each batch instead of its
            min and max (e.g. ``99.999``); ``None`` = min–max.
        bits: width of the integer grid (``"int8"`` format; 8 gives INT8).
        per_token: quantize each vector along the last dimension (a token's channels) with its
            own dynamic min–max range instead of the calibrated per-tensor one (integer grids).
    """

    x_min: Tensor
    x_max: Tensor
    batches: Tensor

    def __init__(
        self,
        fmt: str = "int8",
        momentum: float = 0.9,
        percentile: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        bits: int = 8,
        per_token: bool = False,
    ) -> None:
        super().__init__()
        self.fmt = _check_format(fmt)
        self.bits = _check_bits(bits, fmt)
        if per_token and fmt != "int8":
            raise ValueError(f"per_token quantization needs the integer grid, not {fmt!r}")
        self.per_token = bool(per_token)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
        if percentile is not None and not 50.0 < percentile <= 100.0:
            raise ValueError(f"percentile must lie in (50, 100], got {percentile}")
        self.momentum, self.percentile = momentum, percentile
        self.state = "calibrate"
        real = dtype or torch.float32
        self.register_buffer("x_min", torch.zeros((), device=device, dtype=real))
        self.register_buffer("x_max", torch.zeros((), device=device, dtype=real))
        self.register_buffer("batches", torch.zeros((), dtype=torch.long, device=device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Forget the calibrated range."""
        self.x_min.zero_()
        self.x_max.zero_()
        self.batches.zero_()

    def _batch_range(self, x: Tensor) -> tuple[Tensor, Tensor]:
        flat = x.detach().reshape(-1).float()
        if self.percentile is None or flat.numel() < 2:
            return flat.min(), flat.max()
        n = flat.numel()
        k_low = max(1, round(n * (100.0 - self.percentile) / 100.0))
        k_high = max(1, min(n, round(n * self.percentile / 100.0)))
        return flat.kthvalue(k_low).values, flat.kthvalue(k_high).values

    def observe(self, x: Tensor) -> None:
        """Update the running range with one batch."""
        lo, hi = self._batch_range(x)
        lo, hi = lo.to(self.x_min.dtype), hi.to(self.x_max.dtype)
        if int(self.batches) == 0:
            self.x_min.copy_(lo)
            self.x_max.copy_(hi)
        else:
            self.x_min.mul_(self.momentum).add_((1 - self.momentum) * lo)
            self.x_max.mul_(self.momentum).add_((1 - self.momentum) * hi)
        self.batches += 1

    def forward(self, x: Tensor) -> Tensor:
        """``x`` of any shape; quantized only in state ``"quantize"``."""
        if self.state == "calibrate":
            self.observe(x)
            return x
        if self.state == "off":
            return x
        if int(self.batches) == 0:
            raise RuntimeError("ActivationQuantizer: quantizing before any calibration batch")
        if self.fmt == "fp8_e4m3":
            return fake_quantize_fp8(x, torch.maximum(self.x_min.abs(), self.x_max.abs()))
        if self.per_token:
            low = x.detach().amin(dim=-1, keepdim=True)
            high = x.detach().amax(dim=-1, keepdim=True)
            return fake_quantize_asymmetric(x, low, high, self.bits)
        return fake_quantize_asymmetric(x, self.x_min, self.x_max, self.bits)

    def extra_repr(self) -> str:
        return (
            f"fmt={self.fmt!r}, bits={self.bits}, per_token={self.per_token}, "
            f"state={self.state!r}, range=[{float(self.x_min):.4g}, {float(self.x_max):.4g}]"
        )


def _quantize_value(quantizer: ActivationQuantizer, value: Any) -> Any:
    if isinstance(value, Tensor) and value.is_floating_point():
        return quantizer(value)
    if isinstance(value, tuple) and value and isinstance(value[0], Tensor):
        return (_quantize_value(quantizer, value[0]), *value[1:])
    return value


def _input_hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    if not args:
        return None
    return (_quantize_value(module.input_quantizer, args[0]), *args[1:])  # type: ignore[arg-type]


def _output_hook(module: nn.Module, args: Any, output: Any) -> Any:
    return _quantize_value(module.output_quantizer, output)  # type: ignore[arg-type]


class AttentionQuantizer(nn.Module):
    """Quantizers of an attention module's scores (before the mask) and probabilities.

    Used as a probe of :mod:`hopfield.integrations.attention` (the registered attention functions
    call :meth:`scores` and :meth:`weights`).
    """

    def __init__(
        self,
        fmt: str = "int8",
        momentum: float = 0.9,
        percentile: float | None = None,
        *,
        bits: int = 8,
        per_token: bool = False,
    ) -> None:
        super().__init__()
        grid: dict[str, Any] = {"bits": bits, "per_token": per_token}
        self.score_quantizer = ActivationQuantizer(fmt, momentum, percentile, **grid)
        self.weight_quantizer = ActivationQuantizer(fmt, momentum, percentile, **grid)

    def scores(self, module: nn.Module, scores: Tensor) -> Tensor:
        """Quantized raw scores ``(B, H, L, S)``."""
        return self.score_quantizer(scores)

    def weights(self, module: nn.Module, weights: Tensor, masked_scores: Tensor) -> Tensor:
        """Quantized attention probabilities ``(B, H, L, S)``."""
        return self.weight_quantizer(weights)


def activation_quantizers(model: nn.Module) -> dict[str, ActivationQuantizer]:
    """Every :class:`ActivationQuantizer` of ``model`` by name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, ActivationQuantizer)}


_BLOCK = re.compile(r".*\.(?:layer|layers)\.\d+")
_LINEAR_LIKE = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding)
_ACTIVATIONS = (nn.GELU, nn.ReLU, nn.SiLU, nn.Tanh)


def _is_activation(module: nn.Module) -> bool:
    return isinstance(module, _ACTIVATIONS) or type(module).__name__.endswith("Activation")


def _run(model: nn.Module, batch: Any) -> None:
    if isinstance(batch, dict):
        model(**batch)
    elif isinstance(batch, tuple | list):
        model(*batch)
    else:
        model(batch)


def quantize_w8a8(
    model: nn.Module,
    calibration_batches: Iterable[Any],
    *,
    num_batches: int = 16,
    fmt: str = "int8",
    momentum: float = 0.9,
    percentile: float | None = None,
    keep_fp: Sequence[str] = ("cls", "lm_head", "classifier"),
    inplace: bool = False,
    weight_bits: int = 8,
    activation_bits: int = 8,
    per_token: bool = False,
) -> nn.Module:
    """A W8A8 fake-quantized copy of ``model``, its activation ranges calibrated and frozen
    (or, with ``weight_bits``/``activation_bits``/``per_token``, another integer scheme such as
    W4A8 or W6A6 with per-token activations).

    Args:
        model: a ``transformers`` BERT/OPT/ViT model (any attention implementation; models not on
            one of this package's attention functions are switched to the equivalent ``"softmax"``
            one, so scores and probabilities can be quantized), or any ``nn.Module``.
        calibration_batches: batches for range estimation: dicts (``model(**batch)``), tuples
            (``model(*batch)``) or tensors (``model(batch)``).
        num_batches: how many calibration batches to use (the spec: 16 for BERT, 4 for OPT).
        fmt: ``"int8"`` (the Bondarenko/Qualcomm protocol) or ``"fp8_e4m3"``.
        momentum: running min–max momentum.
        percentile: per-batch percentile range (e.g. ``99.999`` for OPT); ``None`` = min–max.
        keep_fp: name prefixes (first component, or dotted path) of modules left in floating
            point (the MLM head ``cls``, ``lm_head``, the ViT ``classifier``).
        inplace: modify ``model`` instead of a deep copy.
        weight_bits, activation_bits: integer grid widths (8 = INT8; only 8 with FP8).
        per_token: every activation quantizer uses one dynamic range per token (per vector along
            the last dimension) instead of a calibrated per-tensor range.

    Returns:
        The quantized model in eval mode: evaluating it gives the W8A8 metric.
    """
    _check_format(fmt)
    _check_bits(weight_bits, fmt)
    _check_bits(activation_bits, fmt)
    if per_token and fmt != "int8":
        raise ValueError(f"per_token quantization needs the integer grid, not {fmt!r}")
    if not isinstance(num_batches, int) or num_batches < 1:
        raise ValueError(f"num_batches must be a positive int, got {num_batches!r}")
    model = model if inplace else copy.deepcopy(model)
    model.eval()

    def kept(name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in keep_fp)

    grid: dict[str, Any] = {"bits": activation_bits, "per_token": per_token}

    def quantizer() -> ActivationQuantizer:
        return ActivationQuantizer(fmt, momentum, percentile, **grid)

    attention_like = _attention_modules(model)
    with torch.no_grad():
        for name, module in list(model.named_modules()):
            if not name or kept(name) or ".parametrizations." in name:
                continue
            weight = getattr(module, "weight", None)
            quant_in = quant_out = False
            if isinstance(module, _LINEAR_LIKE) and isinstance(weight, Tensor):
                parametrize.register_parametrization(
                    module, "weight", WeightQuantizer(fmt, weight_bits)
                )
                quant_in, quant_out = not isinstance(module, nn.Embedding), True
            elif isinstance(module, nn.LayerNorm):
                quant_in = quant_out = True
            elif _is_activation(module) or _BLOCK.fullmatch(name):
                quant_out = True
            if quant_in:
                module.add_module("input_quantizer", quantizer())
                module.register_forward_pre_hook(_input_hook)
            if quant_out:
                module.add_module("output_quantizer", quantizer())
                module.register_forward_hook(_output_hook)
        for name, module in attention_like:
            if kept(name):
                continue
            probe = AttentionQuantizer(fmt, momentum, percentile, **grid)
            module.add_module("attention_quantizer", probe)
            module.__dict__.setdefault("_hopfield_probes", []).append(probe)
        quantizers = activation_quantizers(model)
        for q in quantizers.values():
            q.state = "calibrate"
        used = 0
        for batch in calibration_batches:
            _run(model, batch)
            used += 1
            if used >= num_batches:
                break
        if used == 0:
            raise ValueError("calibration_batches is empty")
        for q in quantizers.values():
            q.state = "quantize" if int(q.batches) > 0 else "off"
    return model


def _attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's attention modules, switched to a probe-aware attention function if needed."""
    try:
        from hopfield.integrations import attention_modules
        from hopfield.integrations.attention import attention_name, variant_name
    except ImportError:  # transformers not installed: no attention modules to probe
        return []
    found = attention_modules(model)
    config = getattr(model, "config", None)
    if found and config is not None and variant_name(config._attn_implementation) is None:
        model.set_attn_implementation(attention_name("softmax"))  # type: ignore[operator]
    return found


#: The kinds of activation quantizer :func:`quantizer_kinds` tells apart (placement of
#: :func:`quantize_w8a8`).
QUANTIZER_KINDS = (
    "embedding output",
    "linear input",
    "linear output",
    "LayerNorm input",
    "LayerNorm output",
    "FFN activation",
    "block output",
    "attention scores",
    "attention probabilities",
)


def quantizer_kinds(model: nn.Module) -> dict[str, str]:
    """The kind (one of :data:`QUANTIZER_KINDS`) of every activation quantizer of a model made by
    :func:`quantize_w8a8`, by quantizer name."""
    modules = dict(model.named_modules())
    kinds = {}
    for name in activation_quantizers(model):
        owner_name, _, attribute = name.rpartition(".")
        owner = modules[owner_name]
        if isinstance(owner, AttentionQuantizer):
            kind = (
                "attention scores" if attribute == "score_quantizer" else "attention probabilities"
            )
        elif isinstance(owner, nn.Embedding):
            kind = "embedding output"
        elif isinstance(owner, nn.LayerNorm):
            kind = "LayerNorm input" if attribute == "input_quantizer" else "LayerNorm output"
        elif isinstance(owner, _LINEAR_LIKE):
            kind = "linear input" if attribute == "input_quantizer" else "linear output"
        elif _is_activation(owner):
            kind = "FFN activation"
        else:
            kind = "block output"
        kinds[name] = kind
    return kinds


def quantizer_ablation(
    quantized: nn.Module, metric: Callable[[nn.Module], float]
) -> dict[str, float]:
    """Where the W8A8 error comes from: ``metric`` with one kind of activation quantizer at a time.

    Args:
        quantized: a model returned by :func:`quantize_w8a8` (its weights stay quantized
            throughout).
        metric: ``metric(model) -> float`` (e.g. a perplexity over fixed batches).

    Returns:
        ``{"weights only": ..., <kind>: ..., "all": ...}``: the metric with no activation
        quantizer on, with only the quantizers of each kind present in the model on
        (:data:`QUANTIZER_KINDS` order), and with all on. The quantizers' states are restored.
    """
    quantizers = activation_quantizers(quantized)
    kinds = quantizer_kinds(quantized)
    states = {name: q.state for name, q in quantizers.items()}
    calibrated = {name for name, q in quantizers.items() if int(q.batches) > 0}

    def measure(selected: set[str]) -> float:
        for name, q in quantizers.items():
            q.state = "quantize" if name in calibrated and name in selected else "off"
        return float(metric(quantized))

    try:
        out = {"weights only": measure(set())}
        for kind in QUANTIZER_KINDS:
            if kind in kinds.values():
                out[kind] = measure({name for name, k in kinds.items() if k == kind})
        out["all"] = measure(set(quantizers))
    finally:
        for name, q in quantizers.items():
            q.state = states[name]
    return out

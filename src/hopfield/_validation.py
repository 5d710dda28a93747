"""Argument checks shared by the functional core and the layers.

Every check names the argument in its message: ``TypeError`` for a value of the wrong kind
(a list where a tensor belongs, an int64 mask, a float64 input into a float32 layer, a string
for a bool), ``ValueError`` for a value of the right kind out of its range (a NaN, a negative
count). Data (scores, patterns) are not checked for NaN or inf: they propagate as in torch.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
from torch import Tensor, nn


def _kind(value: Any) -> str:
    return type(value).__name__


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool (a string, an int or a tensor is not: ``"no"`` would be true)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {_kind(value)} {value!r}")
    return value


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` if it is an int (not a bool) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {_kind(value)}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return int(value)


def check_real(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a finite float within the given bounds (``low_open``: ``> low``, else ``>=``).

    A bool is not a number here; NaN and inf are always rejected.
    """
    if type(value) is not float and (  # a float needs no walk through the numbers ABCs
        isinstance(value, bool) or not isinstance(value, numbers.Real)
    ):
        raise TypeError(f"{name} must be a real number, got {_kind(value)}")
    number = float(value)
    too_low = low is not None and (number <= low if low_open else number < low)
    too_high = high is not None and (number >= high if high_open else number > high)
    if math.isfinite(number) and not too_low and not too_high:
        return number
    if low is not None and high is not None:
        bounds = f"lie in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        bounds = f"be finite and {'>' if low_open else '>='} {low:g}"
    elif high is not None:
        bounds = f"be finite and {'<' if high_open else '<='} {high:g}"
    else:
        bounds = "be finite"
    raise ValueError(f"{name} must {bounds}, got {value}")


def check_tensor(name: str, value: Any) -> Tensor:
    """``value`` if it is a tensor."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a Tensor, got {_kind(value)}")
    return value


def check_mask(name: str, mask: Any) -> Tensor | None:
    """``None``, or a boolean or floating-point tensor (the masks ``nn.MultiheadAttention`` takes).

    An integer mask is refused: added to the scores it would shift them by 1 instead of masking.
    """
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a Tensor or None, got {_kind(mask)}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(
            f"{name} must be a boolean or floating-point Tensor (as in nn.MultiheadAttention), "
            f"got {mask.dtype}"
        )
    return mask


def parameter_dtype(*modules: nn.Module | None) -> torch.dtype | None:
    """The dtype of the first floating-point parameter of ``modules`` (``None`` if they have none)."""
    for module in modules:
        if module is None:
            continue
        for parameter in module.parameters():
            if parameter.is_floating_point():
                return parameter.dtype
    return None


def check_patterns(name: str, value: Any, dtype: torch.dtype | None) -> Tensor:
    """``value`` if it is a floating-point tensor of the layer's ``dtype``.

    Any floating dtype passes when ``dtype`` is ``None`` (a layer without parameters) or when
    autocast is on for the tensor's device (mixed precision mixes dtypes on purpose).
    """
    check_tensor(name, value)
    if not value.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {value.dtype}")
    if (
        dtype is not None
        and value.dtype != dtype
        and not torch.is_autocast_enabled(value.device.type)
    ):
        raise TypeError(
            f"{name} is {value.dtype} but the layer's parameters are {dtype}: convert the input "
            f"({name}.to({dtype})) or the layer (layer.to({value.dtype}))"
        )
    return value

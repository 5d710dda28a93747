"""Sink attention on every path, with the same numbers: explicit, SDPA, flash log-sum-exp, Flex.

A :class:`~hopfield.functional.Sink` (softmax with a sink logit ``s`` and an optional value
sink ``v_s``) retrieves ``Σ_i p_i v_i + p_s v_s``. Each path computes it differently:

* ``"explicit"``: the scores ``(B, H, L, S)``, :meth:`Sink.split`, the weighted sum;
* ``"sdpa"``: :func:`~torch.nn.functional.scaled_dot_product_attention` with one extra zero key
  whose additive mask column is ``s`` (so its score is ``s`` whatever the scale) and whose value
  is ``v_s`` (any device, dropout);
* ``"lse"``: the CPU flash kernel's output ``O`` and log-sum-exp: ``σ(lse - s) · O + σ(s - lse) v_s``
  (no ``L × S`` matrix, exact gradients from the kernel's backward);
* ``"flex"``: :func:`torch.nn.attention.flex_attention.flex_attention` with its log-sum-exp, then
  the same combination (autograd through ``O`` and ``lse``). In torch 2.13 FlexAttention runs on
  the CPU only eagerly and without gradients (``torch.compile`` on the CPU has no log-sum-exp);
  its log-sum-exp is the natural one there (see :func:`flex_lse_is_natural`).

:class:`~hopfield.functional.Dense` (and so :func:`~hopfield.functional.associate`) takes
``"lse"`` on the CPU without dropout and ``"sdpa"`` elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor

from hopfield._validation import check_bool, check_real
from hopfield.functional.associate import _check_patterns, normalize_mask, normalize_scale
from hopfield.functional.separation import Sink, SoftmaxN
from hopfield.functional.structures import (
    Scale,
    _flash_applies,
    apply_mask,
    explicit_association,
    flash_sink,
    sdpa_sink,
    sink_inputs,
    with_causal,
)

Path = Literal["auto", "explicit", "sdpa", "lse", "flex"]
PATHS = ("auto", "explicit", "sdpa", "lse", "flex")

__all__ = ["PATHS", "TOLERANCES", "flex_available", "flex_lse_is_natural", "sink_attention"]

#: Largest absolute error of every path's output against the float64 oracle on the same (rounded)
#: inputs, for patterns of unit scale, and of its gradients relative to the largest gradient (or
#: 1) (the half dtypes' scores are computed in float32 by the explicit path, in the kernels' own
#: accumulation elsewhere): tested in ``tests/test_sink.py``.
TOLERANCES = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 4e-3,
    torch.bfloat16: 3e-2,
}


def flex_available() -> bool:
    """Whether :func:`torch.nn.attention.flex_attention.flex_attention` can be imported."""
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


_COMPILED: dict[str, Callable[..., Any]] = {}


def _flex_kernel(compiled: bool) -> Callable[..., Any]:
    """``flex_attention``, eager or compiled once per process (``torch.compile``)."""
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if "flex" not in _COMPILED:
        _COMPILED["flex"] = torch.compile(flex_attention)
    return _COMPILED["flex"]


def _flex(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, scale: float, compiled: bool = False
) -> tuple[Tensor, Tensor]:
    """FlexAttention's ``(output (B, H, L, Ev), log-sum-exp (B, H, L))``."""
    score_mod = None
    if bias is not None:
        table = bias

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + table[b, h, q_idx, kv_idx]

    out, lse = _flex_kernel(compiled)(q, k, v, score_mod=score_mod, scale=scale, return_lse=True)
    return out, lse


def flex_lse_is_natural(device: torch.device | str = "cpu", compiled: bool = False) -> bool:
    """Whether FlexAttention's log-sum-exp on ``device`` (eager or ``compiled``) is the natural
    one, not base 2: checked on a row of two keys whose log-sum-exp is ``ln 2`` (``1`` in base 2).
    """
    q = torch.zeros(1, 1, 16, 16, device=device)
    zeros = q.new_zeros(1, 1, 2, 16)
    _, lse = _flex(q, zeros, zeros, None, 1.0, compiled)
    return abs(float(lse.flatten()[0]) - math.log(2.0)) < 1e-3


def flex_sink(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sink: Sink,
    scale: Scale,
    mask: Tensor | None,
    causal: bool,
    compiled: bool = False,
) -> Tensor:
    """:class:`Sink` attention from FlexAttention's output and log-sum-exp (``out · σ(lse - s)``
    plus ``σ(s - lse) · v_s``); arguments as :meth:`~hopfield.functional.Dense.forward`,
    ``compiled``: through ``torch.compile(flex_attention)`` (GPU; the CPU has no compiled
    log-sum-exp in torch 2.13)."""
    batch, heads, length = q.shape[:3]
    size = k.shape[-2]
    q, scale, mask, logit, value_sink = sink_inputs(q, k, v, sink, scale, mask, causal)
    bias = None
    if mask is not None:
        zeros = q.new_zeros(batch, heads, length, size)
        bias = apply_mask(zeros, mask).expand(batch, heads, length, size)
    out, lse = _flex(q, k, v, bias, scale, compiled)
    rows = logit if logit.dim() == 0 else logit.squeeze(-1)  # () or (H, 1), as lse (B, H, L)
    kept = torch.sigmoid(lse.to(rows.dtype) - rows).unsqueeze(-1)
    result = out * kept.to(out.dtype)
    if value_sink is not None:
        result = result + (torch.sigmoid(rows - lse.to(rows.dtype)).unsqueeze(-1) * value_sink)
    return result.to(q.dtype)


def sink_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sink: Sink,
    *,
    path: Path = "auto",
    scale: float | Tensor | None = None,
    mask: Tensor | None = None,
    causal: bool = False,
    dropout: float = 0.0,
    compile_flex: bool = False,
) -> Tensor:
    """``Σ_i p_i v_i + p_s v_s`` for ``q (B, H, L, E)``, ``k (B, H, S, E)``, ``v (B, H, S, Ev)``
    on the chosen ``path`` (module docstring); arguments as
    :func:`~hopfield.functional.associate`.

    ``"auto"`` is the path :func:`~hopfield.functional.associate` takes. ``"lse"`` needs the CPU,
    ``Ev = E``, no dropout and a mask without gradient; ``"flex"`` needs no dropout. A path that
    cannot serve the inputs raises a ValueError naming what it needs. ``compile_flex`` runs the
    ``"flex"`` path through ``torch.compile(flex_attention)``.
    """
    _check_patterns(q, k, v)
    if not isinstance(sink, Sink):
        raise TypeError(f"sink must be a hopfield.functional.Sink, got {type(sink).__name__}")
    if isinstance(sink, SoftmaxN) and sink.n == 0:
        raise ValueError("sink is Softmax(), which has no sink: use associate for it")
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    causal = check_bool("causal", causal)
    compile_flex = check_bool("compile_flex", compile_flex)
    dropout = check_real("dropout", dropout, low=0.0, high=1.0, high_open=True)
    scale_, mask_ = normalize_scale(scale, q), normalize_mask(mask, q, k)
    if path == "auto":
        path = "lse" if _flash_applies(q, v, mask_, dropout) and k.shape[-2] > 0 else "sdpa"
        path = "explicit" if q.shape[-2] == 0 or k.shape[-2] == 0 else path
    if path == "explicit":
        if causal:
            mask_ = with_causal(mask_, q.shape[-2], k.shape[-2], q.device)
        out, _ = explicit_association(
            q, k, v, separation=sink, scale=scale_, mask=mask_, dropout=dropout
        )
        return out
    if path == "sdpa":
        return sdpa_sink(q, k, v, sink, scale_, mask_, causal, dropout)
    if dropout > 0:
        raise ValueError(f"path={path!r} has no dropout; use path='sdpa' or 'explicit'")
    if path == "lse":
        if not _flash_applies(q, v, mask_, dropout):
            raise ValueError(
                "path='lse' needs CPU tensors, Ev = E, a float dtype the flash kernel takes and "
                "a mask without gradient"
            )
        return flash_sink(q, k, v, sink, scale_, mask_, causal)
    if not flex_available():
        raise ValueError("path='flex' needs torch.nn.attention.flex_attention (torch >= 2.5)")
    return flex_sink(q, k, v, sink, scale_, mask_, causal, compile_flex)

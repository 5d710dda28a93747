"""``RMSNorm``: :class:`torch.nn.RMSNorm` whose CPU float32/float64 forward and backward run in
one pass each over the rows (:func:`hopfield.functional.native.rms_forward`).

PyTorch's CPU RMS norm is a composite of some ten elementwise passes forward and backward; the
Hyper-SET layer normalises twice per iteration, so those passes were a measurable share of its
cost. Parameters, state dict, ``eps`` and results are those of :class:`torch.nn.RMSNorm` (tested
in float64 against it); elsewhere (GPUs, half precision, ``HOPFIELD_NATIVE=0``, a
``normalized_shape`` over more than the last dimension) the forward is
:func:`torch.nn.functional.rms_norm` itself. A second derivative (``create_graph``)
recomputes the backward from PyTorch operations, so it stays differentiable.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hopfield.functional import native


def _reference_backward(
    grad: Tensor, x: Tensor, weight: Tensor | None, eps: float
) -> tuple[Tensor, Tensor | None]:
    """The backward pass in differentiable PyTorch operations, the normaliser recomputed from
    ``x`` so that its own dependence on ``x`` is differentiated too (for ``create_graph``)."""
    r = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    g = grad if weight is None else grad * weight
    gx = (g * x).sum(-1, keepdim=True)
    dx = r * g - x * (r**3 * gx / x.shape[-1])
    dw = None if weight is None else (grad * x * r).flatten(0, -2).sum(0)
    return dx, dw


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
        y, inv = native.rms_forward(x, weight, eps)
        ctx.save_for_backward(x, weight, inv)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        x, weight, inv = ctx.saved_tensors
        weight_grad = weight is not None and ctx.needs_input_grad[1]
        if torch.is_grad_enabled():  # create_graph: stay differentiable
            dx, dw = _reference_backward(grad, x, weight, ctx.eps)
        else:
            dx, dw = native.rms_backward(grad, x, weight, inv, weight_grad=weight_grad)
        return dx, (dw if weight_grad else None), None


def rms_norm(
    x: Tensor, normalized_shape: list[int], weight: Tensor | None, eps: float | None
) -> Tensor:
    """:func:`torch.nn.functional.rms_norm` over the last dimension, on the native kernels where
    they apply (see the module docstring); anything else, a ``normalized_shape`` or ``weight``
    that does not match ``x`` included, goes to PyTorch, which also raises its errors."""
    last = [x.shape[-1]] if x.dim() else None
    if (
        list(normalized_shape) == last
        and (weight is None or list(weight.shape) == last)
        and native.available(x, *([] if weight is None else [weight]))
    ):
        return _RMSNormFunction.apply(x, weight, torch.finfo(x.dtype).eps if eps is None else eps)
    return F.rms_norm(x, normalized_shape, weight, eps)


class RMSNorm(nn.RMSNorm):
    """:class:`torch.nn.RMSNorm` with the one-pass CPU kernels (see the module docstring)."""

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, list(self.normalized_shape), self.weight, self.eps)

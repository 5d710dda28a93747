"""``associate``: one Hopfield retrieval step (one attention head per ``H``), validated and dispatched."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hopfield._validation import check_bool, check_real
from hopfield.functional.separation import Separation, Softmax
from hopfield.functional.structures import (
    Dense,
    Scale,
    Structure,
    explicit_association,
    with_causal,
)

_DEFAULT_SEPARATION = Softmax()
_DEFAULT_STRUCTURE = Dense()


def _check_patterns(q: Tensor, k: Tensor, v: Tensor) -> None:
    if not (
        isinstance(q, Tensor)
        and isinstance(k, Tensor)
        and isinstance(v, Tensor)
        and q.dim() == k.dim() == v.dim() == 4
        and q.dtype == k.dtype == v.dtype
        and q.is_floating_point()
    ):  # the common case in one test; the loop below names what is wrong
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a Tensor, got {type(t).__name__}")
            if t.dim() != 4:
                raise ValueError(f"{name} must be 4-D (B, H, N, E), got shape {tuple(t.shape)}")
            if not t.is_floating_point():
                raise TypeError(f"{name} must be floating point, got {t.dtype}")
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    (batch, heads, _, size), (k_batch, k_heads, memories, k_size) = q.shape, k.shape
    v_batch, v_heads, v_memories, _ = v.shape
    if not (batch == k_batch == v_batch and heads == k_heads == v_heads):
        raise ValueError(
            f"q, k, v must share (B, H), got {tuple(q.shape[:2])}, {tuple(k.shape[:2])}, "
            f"{tuple(v.shape[:2])}"
        )
    if size != k_size:
        raise ValueError(f"q and k must share the pattern size E, got {size} and {k_size}")
    if memories != v_memories:
        raise ValueError(
            f"k and v must hold the same number of memories, got {memories} and {v_memories}"
        )


def normalize_scale(scale: float | Tensor | None, q: Tensor) -> Scale:
    """``scale`` as a float or a tensor broadcastable to ``(B, H, L, S)``; ``None`` is ``1/sqrt(E)``.

    A 1-D tensor of length ``H`` is read as one scale per head. A number must be finite and
    positive; a tensor is data (it may be learned) and is not inspected.
    """
    if scale is None:
        return 1.0 / math.sqrt(q.shape[-1])
    if isinstance(scale, bool):
        raise TypeError("scale must be a float or a Tensor, got bool")
    if isinstance(scale, int | float):
        return check_real("scale", scale, low=0.0, low_open=True)
    if not isinstance(scale, Tensor):
        raise TypeError(f"scale must be a float or a Tensor, got {type(scale).__name__}")
    heads = q.shape[1]
    if scale.dim() == 1 and scale.shape[0] == heads:
        scale = scale.view(heads, 1, 1)
    target = (q.shape[0], heads, q.shape[2], 1)
    try:
        if torch.broadcast_shapes(scale.shape, target) != target:
            raise RuntimeError
    except RuntimeError:
        raise ValueError(
            f"scale must be a scalar, (H,) = ({heads},) or broadcastable to (B, H, L, 1), "
            f"got shape {tuple(scale.shape)}"
        ) from None
    return scale.to(q.dtype)


def normalize_mask(mask: Tensor | None, q: Tensor, k: Tensor) -> Tensor | None:
    """``mask`` as a 4-D boolean (``True`` = may take part) or additive float tensor."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"mask must be boolean or floating point, got {mask.dtype}")
    if mask.dim() > 4:
        raise ValueError(f"mask must have at most 4 dims, got shape {tuple(mask.shape)}")
    target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    try:
        if torch.broadcast_shapes(mask.shape, target) != target:
            raise RuntimeError
    except RuntimeError:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to (B, H, L, S) = {target}"
        ) from None
    return mask if mask.dtype == torch.bool else mask.to(q.dtype)


def associate(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    separation: Separation | None = None,
    structure: Structure | None = None,
    scale: float | Tensor | None = None,
    mask: Tensor | None = None,
    causal: bool = False,
    dropout: float = 0.0,
    training: bool = True,
    return_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor | None]:
    """One retrieval ``separation(scale · q kᵀ + mask) v`` per batch and head.

    Args:
        q: state (query) patterns ``(B, H, L, E)``.
        k: stored (key) patterns ``(B, H, S, E)``.
        v: pattern projections (values) ``(B, H, S, Ev)``.
        separation: the map from scores to weights (default :class:`Softmax`).
        structure: which memories take part (default :class:`Dense`: all of them).
        scale: the inverse temperature beta: a finite positive float, a per-head tensor
            ``(H,)``, or a tensor broadcastable to ``(B, H, L, 1)`` (may require grad); default
            ``1/sqrt(E)``.
        mask: boolean (``True`` = may take part) or additive float, broadcastable to
            ``(B, H, L, S)`` as in :func:`torch.nn.functional.scaled_dot_product_attention`.
        causal: query ``i`` sees only keys ``j <= i + S - L`` (a bool).
        dropout: dropout probability on the weights, applied when ``training``.
        training: whether dropout is active.
        return_weights: also return the weights ``(B, H, L, S)`` (forces the explicit path for
            the dense structure; ``None`` for structures without explicit weights).

    Returns:
        The retrieved patterns ``(B, H, L, Ev)``, or ``(retrieved, weights)`` when
        ``return_weights``. Without memories (``S = 0``) the retrieved patterns are zeros. NaN
        in the patterns propagates as in torch (the fused softmax paths as
        :func:`~torch.nn.functional.scaled_dot_product_attention`).
    """
    _check_patterns(q, k, v)
    separation = _DEFAULT_SEPARATION if separation is None else separation
    structure = _DEFAULT_STRUCTURE if structure is None else structure
    if not isinstance(separation, Separation):
        raise TypeError(f"separation must be a Separation, got {type(separation).__name__}")
    if not isinstance(structure, Structure):
        raise TypeError(f"structure must be a Structure, got {type(structure).__name__}")
    if getattr(separation, "value", None) is not None and not isinstance(structure, Dense):
        # The sparse and kernel structures weight their own keys only: the sink's value is Dense's.
        raise ValueError(
            f"separation {type(separation).__name__} has a value sink, which only the Dense "
            f"structure retrieves; got structure {type(structure).__name__}"
        )
    dropout = check_real("dropout", dropout, low=0.0, high=1.0, high_open=True)
    causal = check_bool("causal", causal)
    dropout = dropout if check_bool("training", training) else 0.0
    return_weights = check_bool("return_weights", return_weights)
    scale, mask = normalize_scale(scale, q), normalize_mask(mask, q, k)
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        # No queries or no memories: the explicit path gives torch's answer (empty weights, zero
        # outputs, finite gradients) for every structure; fused kernels fail on empty sequences.
        if causal:
            mask = with_causal(mask, q.shape[-2], k.shape[-2], q.device)
        out, weights = explicit_association(
            q, k, v, separation=separation, scale=scale, mask=mask, dropout=dropout
        )
        return (out, weights) if return_weights else out
    out, weights = structure(
        q,
        k,
        v,
        separation=separation,
        scale=scale,
        mask=mask,
        causal=causal,
        dropout=dropout,
        return_weights=return_weights,
    )
    return (out, weights) if return_weights else out

"""Structures: which memories take part in an association (or which kernel stands in for the scores).

A structure receives normalised arguments from :func:`hopfield.functional.associate`:

* ``q`` ``(B, H, L, E)``, ``k`` ``(B, H, S, E)``, ``v`` ``(B, H, S, Ev)``;
* ``scale``: a float, or a tensor broadcastable to ``(B, H, L, S)`` (e.g. ``(H, 1, 1)`` per head);
* ``mask``: ``None`` or a 4-D tensor broadcastable to ``(B, H, L, S)``: boolean (``True`` = the key
  may take part, as in :func:`torch.nn.functional.scaled_dot_product_attention`) or additive float;
* ``causal``: query ``i`` sees keys ``j <= i + S - L``;
* ``dropout``: the dropout probability on the association weights (already 0 in eval mode).

It returns ``(output (B, H, L, Ev), weights (B, H, L, S) or None)``; weights are returned only when
asked for and when the structure has them.
"""

from __future__ import annotations

import contextlib
import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hopfield.functional.blockwise import blockwise_entmax_attention
from hopfield.functional.native import (
    abstract_tensors,
    capturing_graph,
    reading_waits,
    transforming,
)
from hopfield.functional.separation import (
    HALF_DTYPES,
    Entmax,
    EntmaxSink,
    Separation,
    Sink,
    SoftmaxN,
    Sparsemax,
)

Scale = float | Tensor
Result = tuple[Tensor, Tensor | None]
_Forward = TypeVar("_Forward", bound=Callable[..., Result])


@contextlib.contextmanager
def kept_across_calls() -> Iterator[None]:
    """Build tensors that later calls reuse (caches, buffers drawn on first use) as ordinary
    tensors without a graph, whatever the caller's mode.

    Under :func:`torch.inference_mode` new tensors are inference tensors, which autograd cannot
    save: one kept from an inference call would fail the first later call that needs a gradient
    through it ("Inference tensors cannot be saved for backward"). Ordinary tensors serve both.
    """
    with torch.inference_mode(False), torch.no_grad():
        yield


class Structure(nn.Module, ABC):
    """Base class of structures. Subclasses implement :meth:`forward`."""

    def initialize(self, pattern_size: int, device: torch.device | str | None = None) -> None:
        """Create now what this structure would otherwise create on its first call with
        queries and keys of ``pattern_size`` features (nothing for most structures; the
        projection of :class:`~hopfield.functional.RandomFeatures`), on ``device`` where the
        structure was given none of its own. A layer calls it when it is built, so that the
        state exists when the model is wrapped for several processes: ``DistributedDataParallel``
        broadcasts the buffers that exist then, and a buffer drawn at the first call is drawn by
        each process from its own random stream."""

    @abstractmethod
    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        separation: Separation,
        scale: Scale,
        mask: Tensor | None,
        causal: bool,
        dropout: float,
        return_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Associate queries with memories; see the module docstring for shapes."""


def causal_mask(length: int, size: int, device: torch.device | None = None) -> Tensor:
    """Boolean ``(L, S)`` mask, ``True`` where query ``i`` may see key ``j`` (``j <= i + S - L``)."""
    rows = torch.arange(length, device=device)[:, None]
    cols = torch.arange(size, device=device)[None, :]
    return cols <= rows + (size - length)


def with_causal(mask: Tensor | None, length: int, size: int, device: torch.device) -> Tensor:
    """``mask`` combined with the causal mask (boolean in, boolean out; float in, float out)."""
    allowed = causal_mask(length, size, device)
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed
    return mask.masked_fill(~allowed, -math.inf)


def apply_mask(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Scores with ``mask`` applied: boolean ``False`` entries become ``-inf``, floats are added."""
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, -math.inf)
    return scores + mask


def _float32(scale: Scale, mask: Tensor | None) -> tuple[Scale, Tensor | None]:
    """A tensor ``scale`` and a float ``mask`` in float32 (boolean masks and numbers as given)."""
    if isinstance(scale, Tensor):
        scale = scale.float()
    if mask is not None and mask.is_floating_point():
        mask = mask.float()
    return scale, mask


def _cast_back(result: Result, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    out, weights = result
    return out.to(dtype), None if weights is None else weights.to(dtype)


def computed_in_float32(forward: _Forward) -> _Forward:
    """Run a structure's ``forward(q, k, v, *, scale, mask, ...)`` in float32 for half inputs.

    Float16 scores overflow where ``q kᵀ`` is formed before the scale (a scaled score of 3e4 is
    an unscaled 2.4e5 for ``E = 64``) and sums over many keys overflow or lose their small
    terms; the output and weights are cast back to the input dtype. Other dtypes pass unchanged.
    """

    @functools.wraps(forward)
    def wrapper(
        self: Structure,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: Scale,
        mask: Tensor | None,
        **options: Any,
    ) -> tuple[Tensor, Tensor | None]:
        if q.dtype not in HALF_DTYPES:
            return forward(self, q, k, v, scale=scale, mask=mask, **options)
        scale, mask = _float32(scale, mask)
        result = forward(self, q.float(), k.float(), v.float(), scale=scale, mask=mask, **options)
        return _cast_back(result, q.dtype)

    return cast(_Forward, wrapper)


def recomputing_in_backward() -> bool:
    """Whether this forward call runs inside a backward pass with gradients recorded: activation
    checkpointing (:func:`torch.utils.checkpoint.checkpoint`, reentrant or not; Hugging Face's
    ``gradient_checkpointing_enable()``) recomputing a forward to differentiate it.

    The recomputation must draw what the first call drew: checkpointing restores torch's global
    random state for it, but not a module's own generator or call counter. (Read from
    ``torch._C._current_graph_task_id``, -1 outside a backward pass; ``False`` if this torch
    build lacks it.)
    """
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and torch.is_grad_enabled() and task() != -1


def explicit_association(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    separation: Separation,
    scale: Scale,
    mask: Tensor | None,
    dropout: float,
) -> tuple[Tensor, Tensor]:
    """The reference path: explicit scores ``(B, H, L, S)``, weights, dropout, weighted sum.

    Half-precision inputs are computed in float32 (see :func:`computed_in_float32`).
    """
    if q.dtype in HALF_DTYPES:
        scale, mask = _float32(scale, mask)
        out, weights = explicit_association(
            q.float(),
            k.float(),
            v.float(),
            separation=separation,
            scale=scale,
            mask=mask,
            dropout=dropout,
        )
        return out.to(q.dtype), weights.to(q.dtype)
    scores = apply_mask(torch.matmul(q, k.transpose(-1, -2)) * scale, mask)
    return weigh_values(scores, v, separation=separation, dropout=dropout)


def weigh_values(
    scores: Tensor, v: Tensor, *, separation: Separation, dropout: float
) -> tuple[Tensor, Tensor]:
    """The explicit association from its masked scores ``(B, H, L, S)``: the separation's
    weights (a value sink's share added), dropout, and the weighted sum of ``v (B, H, S, Ev)``.
    Returns ``(out (B, H, L, Ev), weights (B, H, L, S))``."""
    if isinstance(separation, Sink | EntmaxSink):
        value_sink = separation.value_sink(scores, v.shape[-1])
        if value_sink is not None:  # also for S = 0: all the mass is on the value sink then
            weights, abstained = separation.split(scores)
            dropped = F.dropout(weights, dropout) if dropout > 0 else weights
            return torch.matmul(dropped, v) + abstained * value_sink, weights
    weights = separation(scores)
    dropped = F.dropout(weights, dropout) if dropout > 0 else weights
    return torch.matmul(dropped, v), weights


def _append_zero_keys(k: Tensor, v: Tensor, count: int) -> tuple[Tensor, Tensor]:
    zeros_k = k.new_zeros(*k.shape[:-2], count, k.shape[-1])
    zeros_v = v.new_zeros(*v.shape[:-2], count, v.shape[-1])
    return torch.cat([k, zeros_k], dim=-2), torch.cat([v, zeros_v], dim=-2)


def _extend_mask(mask: Tensor, size: int, extra: Tensor) -> Tensor:
    """``mask`` with its key dim expanded to ``size`` and ``extra`` columns appended."""
    mask = mask.expand(*mask.shape[:-1], size)
    extra = extra.expand(*mask.shape[:-1], extra.shape[-1])
    return torch.cat([mask, extra], dim=-1)


class Dense(Structure):
    """Every memory takes part (the modern Hopfield update / full attention).

    Softmax and Softmax_n run through fused attention kernels without an ``L × S`` matrix:

    * on the CPU without dropout, PyTorch's flash kernel gives the softmax output ``O`` and the
      log-sum-exp ``lse`` of each row; Softmax_n is exactly ``sigmoid(lse - log n) · O``, and its
      gradient is the kernel's backward evaluated at the augmented ``log(n + exp(lse))`` (the
      weights of the n no-op memories never reach a key or value), for any real ``n >= 0``;
    * elsewhere (other devices, dropout) :func:`torch.nn.functional.scaled_dot_product_attention`
      with ``n`` zero keys and zero values appended (integer ``n``) and the mask padded so they
      are never masked; fully masked rows of a plain softmax get one zero key that only they
      can see, so they return zeros instead of NaN.

    A :class:`~hopfield.functional.Sink` (a fixed or learned sink logit, a value sink) takes the
    flash kernel's log-sum-exp on the CPU without dropout (``σ(lse - s) · O + σ(s - lse) · v_s``,
    the sink's gradients from the same quantities) and elsewhere SDPA with one zero key whose
    mask column is the sink logit and whose value is the value sink (see
    :mod:`hopfield.functional.sink`); the explicit path while a graph is captured for export.

    Sparsemax and α-entmax with a fixed α (``Sparsemax()``, ``Entmax(alpha)``) run blockwise
    (:mod:`hopfield.functional.blockwise`: streamed key tiles, no ``L × S`` matrix, scores
    recomputed in the backward pass) when there is no dropout, no ``return_weights``, the mask
    needs no gradient and ``B · H · L · S >= blockwise_from``.

    Every other separation, and ``return_weights=True``, takes the explicit reference path.

    Args:
        blockwise_from: the smallest ``B · H · L · S`` that takes the blockwise sparse path
            (``None``: never).
        key_block: keys per tile of the blockwise path.
        max_tile_elements: bound on ``B · H · rows · key_block`` per tile of the blockwise path.
    """

    def __init__(
        self,
        *,
        blockwise_from: int | None = 1 << 18,
        key_block: int = 512,
        max_tile_elements: int = 1 << 21,
    ) -> None:
        super().__init__()
        if blockwise_from is not None and blockwise_from < 0:
            raise ValueError(f"blockwise_from must be >= 0 or None, got {blockwise_from}")
        if key_block < 1 or max_tile_elements < 1:
            raise ValueError("key_block and max_tile_elements must be positive")
        self.blockwise_from = blockwise_from
        self.key_block = key_block
        self.max_tile_elements = max_tile_elements

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        separation: Separation,
        scale: Scale,
        mask: Tensor | None,
        causal: bool,
        dropout: float,
        return_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        length, size = q.shape[-2], k.shape[-2]
        if (
            not return_weights
            and isinstance(separation, SoftmaxN)
            and _flash_applies(q, v, mask, dropout)
        ):
            return _flash_softmax_n(q, k, v, separation.n, scale, mask, causal), None
        if (
            not return_weights
            and isinstance(separation, Sink)
            and not isinstance(separation, SoftmaxN)
            and not capturing_graph()  # ONNX's SDPA decomposition: a layout later views refuse
        ):
            if _flash_applies(q, v, mask, dropout):
                return flash_sink(q, k, v, separation, scale, mask, causal), None
            return sdpa_sink(q, k, v, separation, scale, mask, causal, dropout), None
        alpha = _blockwise_alpha(separation)
        if (
            alpha is not None
            and not return_weights
            and dropout == 0.0
            and self.blockwise_from is not None
            and (mask is None or not mask.requires_grad)
            and q.shape[0] * q.shape[1] * length * size >= self.blockwise_from
            and not transforming()  # its autograd function is not written for torch.func
        ):
            bias = mask
            if mask is not None and mask.dtype == torch.bool:
                zero = torch.zeros((), dtype=q.dtype, device=q.device)
                bias = torch.where(mask, zero, torch.full_like(zero, -math.inf))
            out = blockwise_entmax_attention(
                q,
                k,
                v,
                alpha=alpha,
                scale=scale,
                bias=bias,
                causal=causal,
                key_block=self.key_block,
                max_tile_elements=self.max_tile_elements,
            )
            return out, None
        if separation.zero_keys is None or return_weights:
            if causal:
                mask = with_causal(mask, length, size, q.device)
            return explicit_association(
                q, k, v, separation=separation, scale=scale, mask=mask, dropout=dropout
            )
        return self._fused(q, k, v, separation.zero_keys, scale, mask, causal, dropout), None

    @staticmethod
    def _fused(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        zero_keys: int,
        scale: Scale,
        mask: Tensor | None,
        causal: bool,
        dropout: float,
    ) -> Tensor:
        length, size = q.shape[-2], k.shape[-2]
        if isinstance(scale, Tensor):
            q, scale = q * scale, 1.0
        if causal and mask is None and zero_keys == 0 and length == size:
            return F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, is_causal=True, scale=scale
            )
        if causal:
            mask = with_causal(mask, length, size, q.device)
        if zero_keys > 0:
            k, v = _append_zero_keys(k, v, zero_keys)
            if mask is not None:
                keep = torch.ones(1, dtype=torch.bool, device=mask.device)
                extra = (
                    keep
                    if mask.dtype == torch.bool
                    else torch.zeros(1, dtype=mask.dtype, device=mask.device)
                )
                mask = _extend_mask(mask, size, extra.expand(zero_keys))
        elif mask is not None:
            allowed = mask if mask.dtype == torch.bool else mask > -math.inf
            blocked_rows = ~allowed.any(dim=-1, keepdim=True)
            if abstract_tensors() or reading_waits(q) or bool(blocked_rows.any()):
                # the extra key changes no other row: taken unread in a graph or transform,
                # and on an accelerator, where reading would wait for the device (a sync)
                k, v = _append_zero_keys(k, v, 1)
                extra = (
                    blocked_rows
                    if mask.dtype == torch.bool
                    else torch.zeros_like(blocked_rows, dtype=mask.dtype).masked_fill(
                        ~blocked_rows, -math.inf
                    )
                )
                mask = _extend_mask(mask, size, extra)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale
        )


def _blockwise_alpha(separation: Separation) -> float | None:
    """The fixed α of a sparsemax / entmax separation the blockwise path serves, else ``None``."""
    if type(separation) is Sparsemax:
        return 2.0
    if type(separation) is Entmax and separation.alpha_logit is None:
        return separation.initial_alpha
    return None


_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
#: Whether this torch build has the CPU flash kernel that gives its log-sum-exp (read once).
CPU_FLASH_AVAILABLE = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def unit_stride(x: Tensor) -> Tensor:
    """``x`` with its last dimension stored with stride 1 (copied only if it is not).

    The CPU flash kernels (``_scaled_dot_product_flash_attention_for_cpu`` and its backward),
    called directly, read every row of ``q``, ``k``, ``v`` (and, backward, ``out``) as if its
    last dimension had stride 1, whatever its stride says: keys stored feature-major (a
    ``(B, H, E, S)`` tensor transposed) gave silently wrong outputs and gradients. (PyTorch's
    ``scaled_dot_product_attention`` checks strides before it chooses the kernel.) Other
    strides, broadcast (stride 0) ones included, and masks of any strides are read correctly.
    """
    return x if x.stride(-1) == 1 or x.shape[-1] <= 1 else x.contiguous()


def _flash_applies(q: Tensor, v: Tensor, mask: Tensor | None, dropout: float) -> bool:
    """Whether the CPU flash kernel (with its log-sum-exp) can serve this association."""
    return (
        CPU_FLASH_AVAILABLE
        and q.is_cpu
        and q.shape[-1] == v.shape[-1]
        and q.dtype in _FLASH_DTYPES
        and dropout == 0.0
        and (mask is None or not mask.requires_grad)
        and not capturing_graph()
    )


class _FlashSink(torch.autograd.Function):
    """Sink attention from the CPU flash kernel's output ``O`` and log-sum-exp ``lse``.

    With ``A = logaddexp(lse, s)`` the output is ``exp(lse - A) · O + exp(s - A) · v_s``
    (``sigmoid(lse - s) · O`` without a value sink). The gradients of ``q, k, v`` are the kernel's
    backward at the augmented ``A`` with the sink's output (the sink column never reaches a key
    or value); ``d out / d s = p_s (v_s - out)`` and ``d out / d v_s = p_s`` with
    ``p_s = exp(s - A)``.

    Written for :mod:`torch.func` (``forward`` without ``ctx``, :meth:`setup_context`, a generated
    vmap rule): ``apply`` returns ``(out, A)``, ``A`` without a gradient.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        sink: Tensor | None,
        value_sink: Tensor | None,
        mask: Tensor | None,
        is_causal: bool,
        scale: float,
    ) -> tuple[Tensor, Tensor]:
        return _flash_sink_forward(q, k, v, sink, value_sink, mask, is_causal, scale)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
        q, k, v, sink, value_sink, mask, is_causal, scale = inputs
        out, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, out, lse, mask, sink, value_sink)
        ctx.is_causal, ctx.scale = is_causal, scale

    @staticmethod
    def backward(ctx: Any, grad: Tensor, _: Tensor | None) -> tuple[Tensor | None, ...]:
        if torch.is_grad_enabled():  # create_graph: this backward is differentiated in turn
            return _differentiable_sink_grads(ctx, grad)
        q, k, v, out, lse, mask, sink, value_sink = ctx.saved_tensors
        grad = grad.contiguous()
        grads = flash_attention_backward(grad, q, k, v, out, lse, ctx.is_causal, ctx.scale, mask)
        grad_sink = grad_value = None
        if ctx.needs_input_grad[3] or ctx.needs_input_grad[4]:
            abstained = torch.exp(sink.to(lse.dtype) - lse).unsqueeze(-1)  # p_s
            weighted = abstained * grad.to(lse.dtype)
            if ctx.needs_input_grad[3]:
                target = (
                    -out.to(lse.dtype) if value_sink is None else value_sink - out.to(lse.dtype)
                )
                grad_sink = (weighted * target).sum(-1).sum_to_size(sink.shape).to(sink.dtype)
            if ctx.needs_input_grad[4]:
                grad_value = weighted.sum_to_size(value_sink.shape).to(value_sink.dtype)
        return (*grads, grad_sink, grad_value, None, None, None)


def _differentiable_sink_grads(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    """:class:`_FlashSink`'s gradients as a differentiable graph (``create_graph=True``: double
    backward, gradient penalties, Hessian-vector products, :mod:`torch.func` transforms), from
    the attention written out (:func:`_explicit_sink_attention`): the flash kernel's backward
    has no derivative of its own."""
    q, k, v, out, lse, mask, sink, value_sink = ctx.saved_tensors
    inputs = (q, k, v, sink, value_sink)
    wanted = [i for i in range(len(inputs)) if ctx.needs_input_grad[i]]
    with torch.enable_grad():
        # One view per role, differentiated for that role alone: one tensor may fill several
        # (keys that are the values, associate(q, k, k)), and the gradient of the tensor itself
        # would count every role in each position (before 29 Nov: twice the key gradient).
        roles = [None if t is None else t.view_as(t) for t in inputs]
        recomputed = _explicit_sink_attention(
            (roles[0], roles[1], roles[2], out, lse, mask, roles[3], roles[4]),
            ctx.is_causal,
            ctx.scale,
            lse.dtype,
        )
    found = torch.autograd.grad(
        recomputed,
        cast(list[Tensor], [roles[i] for i in wanted]),  # those needing a gradient exist
        grad.to(recomputed.dtype),
        create_graph=True,
        allow_unused=True,
    )
    grads: list[Tensor | None] = [None] * len(inputs)
    for i, value in zip(wanted, found, strict=True):
        grads[i] = None if value is None else value.to(inputs[i].dtype)
    return (*grads, None, None, None)


def _explicit_sink_attention(
    saved: tuple[Tensor | None, ...], is_causal: bool, scale: float, dtype: torch.dtype
) -> Tensor:
    """:class:`_FlashSink`'s output ``(B, H, L, Ev)`` in ``dtype`` from differentiable operations,
    from its saved tensors ``(q, k, v, out, lse, mask, sink, value_sink)``: the scores with the
    sink as one more column, a softmax, the values and the value sink. A row with no finite
    score (fully masked, no sink) gets zero weights, as from the kernel."""
    q, k, v, _, _, mask, sink, value_sink = saved
    assert q is not None and k is not None and v is not None
    size = k.shape[-2]
    scores = torch.matmul(q.to(dtype), k.to(dtype).transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.to(dtype)
    if is_causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2], size, q.device), -math.inf)
    if sink is not None:
        column = sink.to(dtype).unsqueeze(-1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, column], dim=-1)
    blocked = (scores == -math.inf).all(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(blocked, 0.0), dim=-1).masked_fill(blocked, 0.0)
    out = torch.matmul(weights[..., :size], v.to(dtype))
    if value_sink is not None:
        out = out + weights[..., size:] * value_sink.to(dtype)
    return out


def _flash_sink_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sink: Tensor | None,
    value_sink: Tensor | None,
    mask: Tensor | None,
    is_causal: bool,
    scale: float,
) -> tuple[Tensor, Tensor]:
    """:class:`_FlashSink`'s forward pass: ``(out, lse of the augmented scores)``."""
    out, lse = flash_attention(q, k, v, mask, is_causal, scale)
    if sink is not None:
        if mask is not None:  # the kernel gives lse = 0 to a fully masked row: it has none
            blocked = (mask == -math.inf).all(dim=-1)
            lse = lse.masked_fill(blocked.expand_as(lse), -math.inf)
        augmented = torch.logaddexp(lse, sink.to(lse.dtype).expand_as(lse))
        out.mul_(torch.exp(lse - augmented).unsqueeze(-1).to(out.dtype))  # the kernel's buffer
        abstained = torch.exp(sink.to(lse.dtype) - augmented).unsqueeze(-1)
        if value_sink is not None:
            out.add_((abstained * value_sink.to(lse.dtype)).to(out.dtype))
        lse = augmented
    return out, lse


#: The fewest keys a part of a split-key flash call gets (smaller parts cost more to merge
#: than the balance they bring).
KEYS_PER_PART = 1024


def _key_parts(q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool) -> int:
    """Into how many parts :func:`flash_attention` splits the keys (1: none)."""
    if mask is not None or is_causal:
        return 1
    batch_heads = q.shape[0] * q.shape[1]
    threads = torch.get_num_threads()
    if not 0 < batch_heads < threads:
        return 1
    parts = min(threads // batch_heads, k.shape[-2] // KEYS_PER_PART)
    if parts < 2 or (q.shape[1] > 1 and k.shape[-2] % parts):  # views of the keys only
        return 1
    return parts


#: The query counts whose scores :func:`flash_attention` computes as whole matrix products (where
#: they are no larger than the keys). The CPU flash kernel works in blocks of 32 queries below
#: 192 and of 64 below 768 (then 256); from about 96 queries one head's ``(L, E) × (E, S)``
#: product runs faster in one BLAS call than block by block. ``retrieve`` from 10,000 patterns
#: of width 784 on two threads, ÷ ``softmax(βQMᵀ)M`` (two runs each, 28 Nov): 600 queries
#: 1.06–1.14 in the kernel, 1.02 whole; 100–300 queries 0.98–1.05 either way; 64 queries 0.81–0.83
#: in the kernel's split-key calls, where the whole product would be the formula's 1.0.
PRODUCT_QUERIES = range(96, 768)


def _stored_elements(x: Tensor) -> int:
    """How many elements of ``x`` occupy memory: a broadcast dimension (stride 0) counts once."""
    return math.prod(size for size, stride in zip(x.shape, x.stride(), strict=True) if stride)


def _by_products(q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool) -> bool:
    """Whether :func:`flash_attention` takes :func:`_attention_by_products`: no mask, not
    causal, float32 or float64, ``L`` in :data:`PRODUCT_QUERIES`, at least one key, and the
    scores ``(B, H, L, S)`` no larger than the keys as stored (``L <= E`` for keys of their own;
    keys broadcast over a batch count once)."""
    length = q.shape[-2]
    return (
        mask is None
        and not is_causal
        and q.dtype in (torch.float32, torch.float64)
        and length in PRODUCT_QUERIES
        and k.shape[-2] > 0
        and q.shape[:-1].numel() * k.shape[-2] <= _stored_elements(k)
    )


def _attention_by_products(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """Softmax attention ``(out (B, H, L, Ev), lse (B, H, L))`` from the whole score matrix:
    two matrix products and the row-wise shift, exponential and sum in place (a transient
    ``(B, H, L, S)``), as the kernel's forward gives them up to rounding."""
    scores = torch.matmul(q * scale if scale != 1.0 else q, k.transpose(-2, -1))
    top = scores.amax(dim=-1, keepdim=True)
    weights = scores.sub_(top).exp_()
    total = weights.sum(dim=-1, keepdim=True)
    out = torch.matmul(weights, v).div_(total)
    return out, (top + total.log()).squeeze(-1)


def flash_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, scale: float
) -> tuple[Tensor, Tensor]:
    """The CPU flash kernel's ``(out (B, H, L, Ev), lse (B, H, L))`` of softmax attention.

    Between 96 and 767 queries, when the scores are no larger than the keys as stored (at most
    as many queries as pattern dimensions), the scores are computed whole instead (:data:`PRODUCT_QUERIES`, :func:`_attention_by_products`): the same ``out`` and
    ``lse`` up to rounding, which the kernel's backward takes as its own.

    The kernel shares its work among threads by batch, head and block of queries only, so few
    heads with few queries leave threads idle or unbalanced (100 queries of one head on two
    threads: blocks of 32, 32, 32 and 4 rows, one thread doing 64 rows and the other 36). With
    fewer batch-heads than threads and no mask, the keys are split into parts that run as
    extra heads over views of ``k`` and ``v``, and the parts' outputs are merged by their
    log-sum-exps (``lse = logsumexp_t lse_t``, ``out = Σ_t exp(lse_t - lse) out_t``; split-KV,
    as in flash decoding). Every key is still read once per query block; the result is the
    kernel's up to rounding, and ``lse`` is what its backward takes.
    """
    if _by_products(q, k, mask, is_causal):
        return _attention_by_products(q, k, v, scale)
    q, k, v = unit_stride(q), unit_stride(k), unit_stride(v)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    parts = _key_parts(q, k, mask, is_causal)
    if parts < 2:
        out, lse = flash(q, k, v, 0.0, is_causal, attn_mask=mask, scale=scale)
        return out, lse
    batch, heads = q.shape[:2]
    size = k.shape[-2] // parts
    used = parts * size

    def split(x: Tensor) -> Tensor:  # (B, H, S, ·) -> (B, H * parts, size, ·)
        return x[..., :used, :].unflatten(-2, (parts, size)).flatten(1, 2)

    queries = q.unsqueeze(2).expand(batch, heads, parts, *q.shape[2:]).flatten(1, 2)
    out, lse = flash(queries, split(k), split(v), 0.0, False, scale=scale)
    outs, lses = out.unflatten(1, (heads, parts)), lse.unflatten(1, (heads, parts))
    if used < k.shape[-2]:  # the last keys, fewer than parts: one more small part
        rest, rest_lse = flash(q, k[..., used:, :], v[..., used:, :], 0.0, False, scale=scale)
        outs = torch.cat([outs, rest.unsqueeze(2)], dim=2)
        lses = torch.cat([lses, rest_lse.unsqueeze(2)], dim=2)
    total = torch.logsumexp(lses, dim=2)
    weights = torch.exp(lses - total.unsqueeze(2)).unsqueeze(-1)
    merged = (weights * outs.to(weights.dtype)).sum(dim=2)
    return merged.to(q.dtype), total


def flash_attention_backward(
    grad: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    is_causal: bool,
    scale: float,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The CPU flash kernel's backward pass ``(dq, dk, dv)`` of ``out = softmax(scale q kᵀ +
    mask) v`` with log-sum-exp ``lse`` and output gradient ``grad``; every tensor the kernel
    reads row by row is given a unit last stride first (:func:`unit_stride`)."""
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        *map(unit_stride, (grad, q, k, v, out)), lse, 0.0, is_causal, attn_mask=mask, scale=scale
    )
    return dq, dk, dv


def _flash_inputs(
    q: Tensor, scale: Scale, mask: Tensor | None, causal: bool, size: int
) -> tuple[Tensor, float, Tensor | None, bool]:
    """``(q, scale, additive mask, is_causal)`` as the CPU flash kernel takes them."""
    length = q.shape[-2]
    if isinstance(scale, Tensor):
        q, scale = q * scale, 1.0
    is_causal = causal and mask is None and length == size
    if causal and not is_causal:
        mask = with_causal(mask, length, size, q.device)
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, -math.inf)
    elif mask is not None:
        mask = mask.to(q.dtype)
    return q, scale, mask, is_causal


def _flash_softmax_n(
    q: Tensor, k: Tensor, v: Tensor, n: float, scale: Scale, mask: Tensor | None, causal: bool
) -> Tensor:
    q, scale, mask, is_causal = _flash_inputs(q, scale, mask, causal, k.shape[-2])
    sink = torch.full((), math.log(n), dtype=torch.float64) if n > 0 else None
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        # inference: the same kernel calls without the autograd function's bookkeeping
        return _flash_sink_forward(q, k, v, sink, None, mask, is_causal, scale)[0]
    out, _ = _FlashSink.apply(q, k, v, sink, None, mask, is_causal, scale)
    return cast(Tensor, out)


def flash_sink(
    q: Tensor, k: Tensor, v: Tensor, sink: Sink, scale: Scale, mask: Tensor | None, causal: bool
) -> Tensor:
    """:class:`Sink` attention ``(B, H, L, Ev)`` from the CPU flash kernel's log-sum-exp
    (``Ev = E``; no dropout); arguments as :meth:`Dense.forward`."""
    work = torch.float32 if q.dtype in HALF_DTYPES else q.dtype  # as the kernel's lse
    logit = sink.sink_logit(q, work)  # () or (H, 1, 1)
    value_sink = sink.value_sink(q, v.shape[-1], work)
    q, scale, mask, is_causal = _flash_inputs(q, scale, mask, causal, k.shape[-2])
    sink_rows = logit if logit.dim() == 0 else logit.squeeze(-1)  # broadcastable to lse (B, H, L)
    out, _ = _FlashSink.apply(q, k, v, sink_rows, value_sink, mask, is_causal, scale)
    return cast(Tensor, out)


def sink_inputs(
    q: Tensor, k: Tensor, v: Tensor, sink: Sink, scale: Scale, mask: Tensor | None, causal: bool
) -> tuple[Tensor, float, Tensor | None, Tensor, Tensor | None]:
    """What the SDPA and FlexAttention sink paths start from: ``(q, scale, mask, logit,
    value_sink)`` with a tensor scale folded into ``q``, the causal rule into the mask, the
    sink logit (``()`` or ``(H, 1, 1)``) and the value sink (or ``None``) in the scores'
    dtype."""
    logit, value_sink = sink.sink_logit(q), sink.value_sink(q, v.shape[-1])
    if isinstance(scale, Tensor):
        q, scale = q * scale, 1.0
    if causal:
        mask = with_causal(mask, q.shape[-2], k.shape[-2], q.device)
    return q, scale, mask, logit, value_sink


def sdpa_sink(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sink: Sink,
    scale: Scale,
    mask: Tensor | None,
    causal: bool,
    dropout: float,
) -> Tensor:
    """:class:`Sink` attention ``(B, H, L, Ev)`` through
    :func:`~torch.nn.functional.scaled_dot_product_attention`: one zero key whose value is the
    value sink (or zero) and whose additive mask column is the sink logit, so its score is the
    logit whatever the scale; arguments as :meth:`Dense.forward`."""
    batch, heads, length = q.shape[:3]
    size = k.shape[-2]
    q, scale, mask, logit, value_sink = sink_inputs(q, k, v, sink, scale, mask, causal)
    if mask is None:
        bias = q.new_zeros(1, 1, 1, 1)
    elif mask.dtype == torch.bool:
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, -math.inf)
    else:
        bias = mask.to(q.dtype)
    column = logit.expand(batch, heads, length, 1)
    bias = torch.cat([bias.expand(batch, heads, length, size), column], dim=-1)
    extra_v = (
        v.new_zeros(batch, heads, 1, v.shape[-1])
        if value_sink is None
        else value_sink.to(v.dtype).expand(batch, heads, 1, v.shape[-1])
    )
    k = torch.cat([k, k.new_zeros(batch, heads, 1, k.shape[-1])], dim=-2)
    v = torch.cat([v, extra_v], dim=-2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, scale=scale)

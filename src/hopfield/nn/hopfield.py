"""Hopfield layers: ``Hopfield``, ``HopfieldPooling``, ``HopfieldLayer`` and their OutEffHop forms.

A layer projects raw stored patterns ``Y``, state patterns ``R`` and pattern projections into
``H`` heads of a Hopfield (association) space, retrieves with
:func:`hopfield.functional.associate` (optionally iterating in key space) and projects back:

    Z = separation(beta · R W_Q (Y W_K)ᵀ) · V,   V = Y_proj W_V  (or (Y W_K) W_V when tied).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hopfield._validation import (
    check_int,
    check_mask,
    check_patterns,
    check_real,
    parameter_dtype,
)
from hopfield.functional.associate import associate
from hopfield.functional.native import abstract_tensors
from hopfield.functional.separation import Separation, Softmax, SoftmaxN
from hopfield.functional.structures import Dense, Structure, kept_across_calls
from hopfield.nn.gates import GatedAttention

Patterns = Tensor | tuple[Tensor, Tensor, Tensor]


class HopfieldOutput(NamedTuple):
    """What a layer returns when weights or heads are asked for.

    Attributes:
        output: ``(B, L, output_size)`` (``(L, B, ·)`` when not ``batch_first``).
        weights: association weights ``(B, H, L, S)`` of the last step, or ``None``.
        heads: per-head retrieved patterns ``(B, H, L, Ev)`` (after the gate), or ``None``.
    """

    output: Tensor
    weights: Tensor | None
    heads: Tensor | None


def _weight_and_bias(layer: nn.Linear) -> tuple[Tensor, Tensor | None]:
    """``(layer.weight, layer.bias)``, read from ``_parameters`` for a plain ``nn.Linear`` (a
    dict read instead of ``nn.Module.__getattr__``); a subclass or a parametrized layer (whose
    ``weight`` is computed on every read) is asked through its attributes."""
    if type(layer) is nn.Linear:
        parameters = layer._parameters
        return cast(Tensor, parameters["weight"]), parameters["bias"]
    return layer.weight, layer.bias


def _calls_plain_linear(module: nn.Module | None) -> bool:
    """Whether calling ``module`` computes ``F.linear(x, module.weight, module.bias)`` and
    nothing else, hooks for every module aside (:func:`_global_module_hooks`): an ``nn.Linear``
    (or a parametrized one) with ``nn.Linear``'s own ``forward`` and no hooks. Only then may a
    layer read its weights and skip the call: a subclass with a forward of its own (QAT's
    fake-quantized ``Linear``), or hooks (W8A8 activation quantizers, activation recorders,
    pruning), must run.
    """
    return (
        isinstance(module, nn.Linear)
        and type(module).forward is nn.Linear.forward
        and not (
            module._forward_hooks
            or module._forward_pre_hooks
            or module._backward_hooks
            or module._backward_pre_hooks
        )
    )


def _global_module_hooks() -> bool:
    """Whether hooks for every module are registered (``nn.modules.module.register_module_*``)."""
    registered = nn.modules.module
    return bool(
        registered._global_forward_hooks
        or registered._global_forward_pre_hooks
        or registered._global_backward_hooks
        or registered._global_backward_pre_hooks
    )


def _stacked(
    weights_and_biases: list[tuple[Tensor, Tensor | None]],
) -> tuple[Tensor, Tensor | None]:
    """The weights ``(out_i, in)`` of several linear maps stacked into one ``(Σ out_i, in)``,
    and their biases into one (``None`` when they have none)."""
    weight = torch.cat([w for w, _ in weights_and_biases])
    biases = [b for _, b in weights_and_biases]
    return weight, None if biases[0] is None else torch.cat(cast(list[Tensor], biases))


def _mha_masks_to_allowed(
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    batch: int,
    heads: int,
    length: int,
    size: int,
    dtype: torch.dtype,
) -> Tensor | None:
    """Masks in the ``nn.MultiheadAttention`` convention (``True`` = ignore, or additive floats)
    as one mask in the ``associate`` convention (``True`` = may take part, or additive floats)."""
    key_padding_mask = check_mask("key_padding_mask", key_padding_mask)
    attn_mask = check_mask("attn_mask", attn_mask)
    parts: list[Tensor] = []
    if key_padding_mask is not None:
        if key_padding_mask.shape != (batch, size):
            raise ValueError(
                f"key_padding_mask must be (B, S) = ({batch}, {size}), got {tuple(key_padding_mask.shape)}"
            )
        parts.append(key_padding_mask.view(batch, 1, 1, size))
    if attn_mask is not None:
        if attn_mask.shape == (length, size):
            parts.append(attn_mask.view(1, 1, length, size))
        elif attn_mask.shape == (batch * heads, length, size):
            parts.append(attn_mask.view(batch, heads, length, size))
        else:
            raise ValueError(
                f"attn_mask must be (L, S) = ({length}, {size}) or (B·H, L, S) = "
                f"({batch * heads}, {length}, {size}), got {tuple(attn_mask.shape)}"
            )
    if not parts:
        return None
    if all(p.dtype == torch.bool for p in parts):
        allowed = ~parts[0]
        for p in parts[1:]:
            allowed = allowed & ~p
        return allowed
    additive = [
        torch.zeros(p.shape, dtype=dtype, device=p.device).masked_fill(p, -math.inf)
        if p.dtype == torch.bool
        else p.to(dtype)
        for p in parts
    ]
    total = additive[0]
    for p in additive[1:]:
        total = total + p
    return total


class Hopfield(nn.Module):
    """A modern Hopfield layer (association of state patterns with stored patterns).

    Args:
        input_size: size of the raw patterns (default for stored, state and projection sizes).
        num_heads: number of heads ``H``.
        hidden_size: per-head size ``E`` of the Hopfield (key) space; default ``input_size // H``.
        pattern_size: per-head size ``Ev`` of the retrieved patterns; default ``hidden_size``.
        output_size: size of the output; default ``input_size``.
        stored_size, state_size, projection_size: raw sizes of the three inputs
            (default ``input_size``).
        separation: map from scores to weights (default :class:`~hopfield.functional.Softmax`).
        structure: which memories take part (default :class:`~hopfield.functional.Dense`).
        scale: the inverse temperature beta: a float or one per head (sequence of ``H``);
            default ``1/sqrt(hidden_size)``.
        scale_learnable: learn beta (one parameter per head, started at ``scale``).
        update_steps: maximum number of retrieval steps (1 = one attention step); the first
            ``update_steps - 1`` iterate the state in key space, ``q <- sep(beta q Kᵀ) K``.
        update_eps: a head stops iterating once no state pattern moves more than this (L2).
        static: no projections at all (pure memory retrieval): raw patterns are split into heads
            and the heads are concatenated at the output.
        tie_values_to_keys: values are a projection of the projected keys, ``V = (Y W_K) W_V``
            (the papers' Hopfield layer) instead of ``V = Y_proj W_V``.
        normalize_inputs: LayerNorm on the stored, state and projection inputs.
        normalize_hopfield_space: LayerNorm over ``E`` on the projected queries and keys.
        bias: biases in the projections.
        dropout: dropout on the association weights.
        batch_first: inputs and outputs are ``(B, N, ·)``; else ``(N, B, ·)``.
        gate: an optional :class:`~hopfield.nn.GatedAttention`, conditioned on the state input,
            applied to each head's retrieved patterns before the output projection.
    """

    def __init__(
        self,
        input_size: int,
        num_heads: int = 1,
        *,
        hidden_size: int | None = None,
        pattern_size: int | None = None,
        output_size: int | None = None,
        stored_size: int | None = None,
        state_size: int | None = None,
        projection_size: int | None = None,
        separation: Separation | None = None,
        structure: Structure | None = None,
        scale: float | Sequence[float] | None = None,
        scale_learnable: bool = False,
        update_steps: int = 1,
        update_eps: float = 1e-4,
        static: bool = False,
        tie_values_to_keys: bool = False,
        normalize_inputs: bool = False,
        normalize_hopfield_space: bool = False,
        bias: bool = True,
        dropout: float = 0.0,
        batch_first: bool = True,
        gate: GatedAttention | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.input_size = check_int("input_size", input_size)
        self.num_heads = check_int("num_heads", num_heads)
        self.stored_size = check_int("stored_size", stored_size or input_size)
        self.state_size = check_int("state_size", state_size or input_size)
        self.projection_size = check_int("projection_size", projection_size or input_size)
        self.static = bool(static)
        if self.static:
            self._check_static(hidden_size, pattern_size, output_size, tie_values_to_keys)
            hidden_size = self.stored_size // num_heads
            pattern_size = self.projection_size // num_heads
            output_size = pattern_size * num_heads
        elif hidden_size is None:
            if input_size % num_heads:
                raise ValueError(
                    f"input_size ({input_size}) must be divisible by num_heads ({num_heads}) "
                    "unless hidden_size is given"
                )
            hidden_size = input_size // num_heads
        self.hidden_size = check_int("hidden_size", hidden_size)
        self.pattern_size = check_int("pattern_size", pattern_size or self.hidden_size)
        self.output_size = check_int("output_size", output_size or input_size)
        self.update_steps = check_int("update_steps", update_steps)
        update_eps = check_real("update_eps", update_eps, low=0.0)
        dropout = check_real("dropout", dropout, low=0.0, high=1.0, high_open=True)
        self.update_eps, self.dropout, self.batch_first = update_eps, dropout, batch_first
        self.tie_values_to_keys = bool(tie_values_to_keys)
        if separation is not None and not isinstance(separation, Separation):
            raise TypeError(f"separation must be a Separation, got {type(separation).__name__}")
        if structure is not None and not isinstance(structure, Structure):
            raise TypeError(f"structure must be a Structure, got {type(structure).__name__}")
        if gate is not None and not isinstance(gate, GatedAttention):
            raise TypeError(f"gate must be a GatedAttention, got {type(gate).__name__}")
        if gate is not None and (gate.num_heads != num_heads or gate.input_size != self.state_size):
            raise ValueError(
                f"gate must have num_heads={num_heads} and input_size={self.state_size}, "
                f"got {gate.num_heads} and {gate.input_size}"
            )
        self.separation = separation if separation is not None else self._default_separation()
        self.structure = structure if structure is not None else Dense()
        self.gate = gate
        self._init_scale(scale, scale_learnable, factory)

        inner_k, inner_v = num_heads * self.hidden_size, num_heads * self.pattern_size
        self.q_proj = self.k_proj = self.v_proj = self.out_proj = None
        if not self.static:
            self.q_proj = nn.Linear(self.state_size, inner_k, bias=bias, **factory)
            self.k_proj = nn.Linear(self.stored_size, inner_k, bias=bias, **factory)
            v_in = inner_k if self.tie_values_to_keys else self.projection_size
            self.v_proj = nn.Linear(v_in, inner_v, bias=bias, **factory)
            self.out_proj = nn.Linear(inner_v, self.output_size, bias=bias, **factory)
        self.norm_stored = self.norm_state = self.norm_projection = None
        if normalize_inputs:
            self.norm_stored = nn.LayerNorm(self.stored_size, **factory)
            self.norm_state = nn.LayerNorm(self.state_size, **factory)
            self.norm_projection = nn.LayerNorm(self.projection_size, **factory)
        self.norm_q = self.norm_k = None
        if normalize_hopfield_space:
            self.norm_q = nn.LayerNorm(self.hidden_size, **factory)
            self.norm_k = nn.LayerNorm(self.hidden_size, **factory)
        self.reset_parameters()
        device = self.scale.device  # where the layer was built (factory or default device)
        if device.type != "meta":  # meta: drawn on first use, after to_empty(); otherwise now,
            # so that a wrapper for several processes (DistributedDataParallel) finds it
            self.structure.initialize(self.hidden_size, device)

    @staticmethod
    def _default_separation() -> Separation:
        return Softmax()

    def _check_static(
        self, hidden: int | None, pattern: int | None, output: int | None, tied: bool
    ) -> None:
        if hidden is not None or pattern is not None or output is not None or tied:
            raise ValueError(
                "static=True has no projections: hidden_size, pattern_size, output_size and "
                "tie_values_to_keys must be left at their defaults"
            )
        if self.stored_size != self.state_size:
            raise ValueError(
                f"static=True needs stored_size == state_size, got {self.stored_size} and {self.state_size}"
            )
        for name, size in (
            ("stored_size", self.stored_size),
            ("projection_size", self.projection_size),
        ):
            if size % self.num_heads:
                raise ValueError(
                    f"static=True needs {name} ({size}) divisible by num_heads ({self.num_heads})"
                )

    def _init_scale(
        self, scale: float | Sequence[float] | None, learnable: bool, factory: dict[str, Any]
    ) -> None:
        default = 1.0 / math.sqrt(self.hidden_size)
        values = [default] * self.num_heads if scale is None else scale
        if isinstance(values, int | float):
            values = [float(values)] * self.num_heads
        try:
            values = [float(v) for v in values]
        except (TypeError, ValueError):
            raise TypeError(
                f"scale must be a float or {self.num_heads} floats, got {scale!r}"
            ) from None
        if len(values) != self.num_heads:
            raise ValueError(f"scale must be a float or {self.num_heads} floats, got {len(values)}")
        if any(v <= 0 or not math.isfinite(v) for v in values):
            raise ValueError(f"scale must be positive and finite, got {values}")
        self._initial_scale = values
        initial = torch.tensor(values, **{k: v for k, v in factory.items() if v is not None})
        if learnable:
            self.scale: Tensor | nn.Parameter = nn.Parameter(initial)
        else:
            self.register_buffer("scale", initial)

    #: Per-call caches in ``__dict__`` (:meth:`_packed_projections`, :meth:`_scale_argument`),
    #: keyed by data pointers that mean nothing in another process or copy.
    _CACHES = ("_packed_cache", "_scale_cache")

    def __getstate__(self) -> dict[str, Any]:
        """The module's state without its per-call caches: a copy or an unpickled module
        (``copy.deepcopy``, ``torch.save(module)``) builds them anew. Kept, their keys name
        addresses of the original's tensors, which a new tensor of the copy could take once the
        original is gone, and then a stale cache would be read as current."""
        state = dict(super().__getstate__())
        for name in self._CACHES:
            state.pop(name, None)
        return state

    def reset_parameters(self) -> None:
        """Xavier-uniform projections with zero biases, unit LayerNorms, the initial scale; the
        separation, structure and gate reset their own parameters (e.g. a learnable alpha)."""
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            if proj is not None:
                nn.init.xavier_uniform_(proj.weight)
                if proj.bias is not None:
                    nn.init.zeros_(proj.bias)
        for norm in (
            self.norm_stored,
            self.norm_state,
            self.norm_projection,
            self.norm_q,
            self.norm_k,
        ):
            if norm is not None:
                norm.reset_parameters()
        with torch.no_grad():
            self.scale.copy_(torch.tensor(self._initial_scale, dtype=self.scale.dtype))
        for part in (self.separation, self.structure, self.gate):
            reset = getattr(part, "reset_parameters", None)
            if callable(reset):
                reset()

    # ------------------------------------------------------------------------------------------

    def _split_inputs(self, input: Patterns) -> tuple[Tensor, Tensor, Tensor]:
        if isinstance(input, Tensor):
            stored = state = projection = input
        elif isinstance(input, tuple | list) and len(input) == 3:
            stored, state, projection = input
        else:
            raise TypeError("input must be a Tensor or a tuple (stored, state, projection)")
        expected = (
            ("stored", stored, self.stored_size),
            ("state", state, self.state_size),
            ("projection", projection, self.projection_size),
        )
        for name, t, size in expected:
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} patterns must be a Tensor, got {type(t).__name__}")
            if t.dim() != 3 or t.shape[-1] != size:
                raise ValueError(
                    f"{name} patterns must be 3-D (or all 2-D, unbatched) with last dim {size}, "
                    f"got {tuple(t.shape)}"
                )
        dtype = self._input_dtype()
        if isinstance(input, Tensor):  # one tensor in all three roles: checked and moved once
            check_patterns("input", input, dtype)
            if not self.batch_first:
                input = input.transpose(0, 1)
            return input, input, input
        for name, t, _ in expected:
            check_patterns(f"{name} patterns", t, dtype)
        if not self.batch_first:
            stored, state, projection = (t.transpose(0, 1) for t in (stored, state, projection))
        if stored.shape[:2] != projection.shape[:2]:
            raise ValueError(
                f"stored and projection patterns must share (B, S), got {tuple(stored.shape[:2])} "
                f"and {tuple(projection.shape[:2])}"
            )
        if stored.shape[0] != state.shape[0]:
            raise ValueError(
                f"batch sizes differ: stored {stored.shape[0]}, state {state.shape[0]}"
            )
        return stored, state, projection

    def _input_dtype(self) -> torch.dtype | None:
        """The dtype inputs must have (that of the projections, input norms or gate; ``None`` for
        a static layer without them); any floating dtype under autocast."""
        q_proj = self._modules.get("q_proj")  # a dict read, as in _project
        if isinstance(q_proj, nn.Linear):  # the common case, without walking parameters
            return q_proj.weight.dtype
        return parameter_dtype(self.q_proj, self.norm_stored, self.norm_q, self.gate)

    def _heads(self, x: Tensor, size: int) -> Tensor:
        return x.view(x.shape[0], x.shape[1], self.num_heads, size).transpose(1, 2)

    def _split_heads(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Projected ``(B, N, H·E)`` queries, keys and values as ``(B, H, N, E)`` head views."""
        return (
            self._heads(q, self.hidden_size),
            self._heads(k, self.hidden_size),
            self._heads(v, self.pattern_size),
        )

    def _project(
        self, stored: Tensor, state: Tensor, projection: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        # dict reads: nn.Module's attribute lookup costs a microsecond; an unset (None) layer
        # lives outside _modules, where .get finds None as well
        modules = self._modules
        norm_stored, norm_state, norm_projection = (
            modules.get("norm_stored"),
            modules.get("norm_state"),
            modules.get("norm_projection"),
        )
        if norm_stored is not None and norm_state is not None and norm_projection is not None:
            stored, state, projection = (
                norm_stored(stored),
                norm_state(state),
                norm_projection(projection),
            )
        q_proj, k_proj, v_proj = modules.get("q_proj"), modules.get("k_proj"), modules.get("v_proj")
        if (
            stored is state
            and state is projection
            and not self.tie_values_to_keys
            and not _global_module_hooks()
            and _calls_plain_linear(q_proj)
            and _calls_plain_linear(k_proj)
            and _calls_plain_linear(v_proj)
        ):
            q, k, v = self._packed_projections(state)  # already split into heads
        else:
            if q_proj is None or k_proj is None or v_proj is None:
                q, k, v = state, stored, projection
            else:
                q, k = q_proj(state), k_proj(stored)
                v = v_proj(k if self.tie_values_to_keys else projection)
            q, k, v = self._split_heads(q, k, v)
        norm_q, norm_k = modules.get("norm_q"), modules.get("norm_k")
        if norm_q is not None and norm_k is not None:
            q, k = norm_q(q), norm_k(k)
        return q, k, v

    def _packed_projections(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The per-head query, key and value projections ``(B, H, N, ·)`` of one input
        ``x (B, N, ·)`` (self-association).

        Without gradients to the projections (and when calling them would compute nothing
        else: :func:`_calls_plain_linear`) they run as one matrix product with the three
        weights stacked, whose output is viewed as the heads (no copies); the stacked weights
        are kept between calls and rebuilt when a weight or bias changes: its version (in-place
        updates) or its data pointer (``.data =``, ``load_state_dict`` into new tensors,
        ``.to()``). The cache holds the tensors it was built from, so no other tensor can take
        their addresses while it stands; its tensors are ordinary ones in every mode
        (:func:`~hopfield.functional.structures.kept_across_calls`). The per-call cost is that
        of one ``nn.Linear``. With gradients (training) or while a graph is captured (tracing,
        export, :func:`torch.compile`: no data pointers there): three ``nn.Linear`` calls.
        """
        modules = self._modules  # dict reads: nn.Module's attribute lookup costs a microsecond
        layers = cast(
            tuple[nn.Linear, nn.Linear, nn.Linear],
            (modules["q_proj"], modules["k_proj"], modules["v_proj"]),
        )
        weights_and_biases = [_weight_and_bias(p) for p in layers]
        tensors = [t for pair in weights_and_biases for t in pair if t is not None]
        if (
            torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        ) or abstract_tensors():  # no data pointers in a graph or transform
            q_proj, k_proj, v_proj = layers
            return self._split_heads(q_proj(x), k_proj(x), v_proj(x))
        if any(t.is_inference() for t in tensors):  # made under inference mode: no version
            # counter to see an in-place update by, so nothing is kept
            packed = F.linear(x, *_stacked(weights_and_biases))
        else:
            key = [(t.data_ptr(), t._version) for t in tensors]
            cached = self.__dict__.get("_packed_cache")
            if cached is None or cached[0] != key:
                with kept_across_calls():  # ordinary tensors, also built under inference mode
                    weight, bias = _stacked(weights_and_biases)
                cached = (key, weight, bias, [t.detach() for t in tensors])
                self.__dict__["_packed_cache"] = cached
            packed = F.linear(x, cached[1], cached[2])
        batch, length, heads = x.shape[0], x.shape[1], self.num_heads
        if self.hidden_size == self.pattern_size:  # (B, N, 3, H, E) -> three (B, H, N, E) views
            heads_first = packed.view(batch, length, 3, heads, self.hidden_size).permute(
                2, 0, 3, 1, 4
            )
            q, k, v = heads_first.unbind(0)
            return q, k, v
        q, k, v = packed.split([p.out_features for p in layers], -1)
        return self._split_heads(q, k, v)

    def _scale_argument(self) -> Tensor | float:
        """``self.scale`` for :func:`associate`: a fixed scale that every head shares as its
        float (read once per version of the buffer), which spares the per-call checks of a
        tensor scale and its ``q · β`` product; otherwise (learnable, per-head values, a graph
        being captured) the tensor."""
        scale = self.scale
        if (
            scale.requires_grad
            or scale.is_meta  # priced without data (hopfield.plan)
            or abstract_tensors()  # no data pointers; before is_inference(), which dynamo
            # cannot trace
            or scale.is_inference()  # made under inference mode: no version counter
        ):
            return scale
        key = (scale.data_ptr(), scale._version)
        cached = self.__dict__.get("_scale_cache")
        if cached is None or cached[0] != key:
            values = scale.tolist()
            shared = bool(values) and all(v == values[0] for v in values)
            cached = (key, values[0] if shared else None, scale.detach())  # holds the address
            self.__dict__["_scale_cache"] = cached
        return scale if cached[1] is None else cached[1]

    def _iterate(self, q: Tensor, k: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """``update_steps - 1`` retrieval steps in key space; each head stops at ``update_eps``."""
        if q.numel() == 0:  # an empty batch or no state patterns: nothing moves
            return q
        active = torch.ones(self.num_heads, dtype=torch.bool, device=q.device)
        for _ in range(self.update_steps - 1):
            new_q = associate(
                q,
                k,
                k,
                separation=self.separation,
                structure=self.structure,
                scale=self._scale_argument(),
                mask=mask,
                causal=causal,
            )
            assert isinstance(new_q, Tensor)
            moved = (new_q - q).detach().norm(dim=-1).amax(dim=(0, 2))
            q = torch.where(active.view(1, -1, 1, 1), new_q, q)
            active = active & (moved > self.update_eps)
            if not abstract_tensors() and not bool(active.any()):
                # stopped heads stay put anyway: the check only saves the remaining steps
                break
        return q

    def forward(
        self,
        input: Patterns,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        causal: bool = False,
        return_weights: bool = False,
        return_heads: bool = False,
    ) -> Tensor | HopfieldOutput:
        """Retrieve.

        Args:
            input: ``x (B, N, input_size)`` for self-association, or the triple
                ``(stored (B, S, ·), state (B, L, ·), projection (B, S, ·))``; ``(N, B, ·)`` when
                not ``batch_first``. Unbatched, as :class:`torch.nn.MultiheadAttention` takes it:
                ``x (N, input_size)`` or a triple of 2-D tensors (``batch_first`` then plays no
                role).
            key_padding_mask: ``(B, S)`` (unbatched: ``(S,)``); ``True`` (or ``-inf``) marks
                stored patterns to ignore.
            attn_mask: ``(L, S)`` or ``(B·H, L, S)`` (unbatched: ``(L, S)`` or ``(H, L, S)``);
                ``True`` (or ``-inf``) forbids a pair.
            causal: state ``i`` sees stored patterns ``j <= i + S - L`` only.
            return_weights: also return the association weights of the last step.
            return_heads: also return the per-head retrieved patterns.

        Returns:
            ``(B, L, output_size)``, or a :class:`HopfieldOutput` when weights or heads are asked
            for. Unbatched: ``(L, output_size)``, weights ``(H, L, S)``, heads ``(H, L, Ev)``
            (the per-head weights, as ``nn.MultiheadAttention(average_attn_weights=False)``).
        """
        if isinstance(input, Tensor):
            unbatched = input.dim() == 2
        else:
            unbatched = isinstance(input, tuple | list) and all(
                isinstance(t, Tensor) and t.dim() == 2 for t in input
            )
        if unbatched:
            batch_dim = 0 if self.batch_first else 1
            input = (
                input.unsqueeze(batch_dim)
                if isinstance(input, Tensor)
                else tuple(t.unsqueeze(batch_dim) for t in input)  # type: ignore[assignment]
            )
            if isinstance(key_padding_mask, Tensor) and key_padding_mask.dim() == 1:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        result = self._forward(
            input,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            causal=causal,
            return_weights=return_weights,
            return_heads=return_heads,
        )
        if not unbatched:
            return result
        if isinstance(result, HopfieldOutput):
            return HopfieldOutput(
                result.output.squeeze(batch_dim),
                None if result.weights is None else result.weights.squeeze(0),
                None if result.heads is None else result.heads.squeeze(0),
            )
        return result.squeeze(batch_dim)

    def _forward(
        self,
        input: Patterns,
        *,
        key_padding_mask: Tensor | None,
        attn_mask: Tensor | None,
        causal: bool,
        return_weights: bool,
        return_heads: bool,
    ) -> Tensor | HopfieldOutput:
        stored, state, projection = self._split_inputs(input)
        q, k, v = self._project(stored, state, projection)
        mask = _mha_masks_to_allowed(
            key_padding_mask, attn_mask, q.shape[0], self.num_heads, q.shape[2], k.shape[2], q.dtype
        )
        if self.update_steps > 1:
            q = self._iterate(q, k, mask, causal)
        result = associate(
            q,
            k,
            v,
            separation=self.separation,
            structure=self.structure,
            scale=self._scale_argument(),
            mask=mask,
            causal=causal,
            dropout=self.dropout,
            training=self.training,
            return_weights=return_weights,
        )
        heads, weights = result if isinstance(result, tuple) else (result, None)
        if self.gate is not None:
            heads = self.gate(state, heads)
        batch, _, length, size = heads.shape  # sizes spelled out: -1 fails on empty tensors
        merged = heads.transpose(1, 2).reshape(batch, length, self.num_heads * size)
        output = self.out_proj(merged) if self.out_proj is not None else merged
        if not self.batch_first:
            output = output.transpose(0, 1)
        if return_weights or return_heads:
            return HopfieldOutput(output, weights, heads if return_heads else None)
        return output

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, num_heads={self.num_heads}, hidden_size={self.hidden_size}, "
            f"pattern_size={self.pattern_size}, output_size={self.output_size}, static={self.static}, "
            f"update_steps={self.update_steps}"
        )


class HopfieldPooling(nn.Module):
    """Pooling by association: ``quantity`` learned state patterns retrieve from the input.

    Args:
        input_size: size of the input (stored) patterns.
        quantity: number of learned state (query) patterns, i.e. of pooled outputs.
        **kwargs: the :class:`Hopfield` arguments (``num_heads``, ``separation``, ...);
            ``state_size`` sets the size of the learned patterns (default ``input_size``).

    ``forward(input (B, S, input_size) | (stored, projection), key_padding_mask=...)`` returns
    ``(B, quantity, output_size)``.
    """

    association: type[Hopfield] = Hopfield  # the inner layer's class

    def __init__(self, input_size: int, quantity: int = 1, **kwargs: Any) -> None:
        super().__init__()
        self.quantity = check_int("quantity", quantity)
        self.hopfield = self.association(input_size, **kwargs)
        factory = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
        self.state_patterns = nn.Parameter(
            torch.empty(1, quantity, self.hopfield.state_size, **factory)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Learned state patterns ~ N(0, 0.02²); the association layer's own initialisation."""
        nn.init.normal_(self.state_patterns, std=0.02)
        self.hopfield.reset_parameters()

    def forward(
        self,
        input: Tensor | tuple[Tensor, Tensor],
        *,
        key_padding_mask: Tensor | None = None,
        return_weights: bool = False,
        return_heads: bool = False,
    ) -> Tensor | HopfieldOutput:
        if isinstance(input, Tensor):
            stored = projection = check_patterns("input", input, self.hopfield._input_dtype())
        elif (
            isinstance(input, tuple | list)
            and len(input) == 2
            and all(isinstance(t, Tensor) for t in input)
        ):
            stored, projection = input
        else:
            raise TypeError("input must be a Tensor or a pair (stored, projection) of Tensors")
        batch = stored.shape[0 if self.hopfield.batch_first else 1]
        state = self.state_patterns.expand(batch, -1, -1)
        if not self.hopfield.batch_first:
            state = state.transpose(0, 1)
        return self.hopfield(
            (stored, state, projection),
            key_padding_mask=key_padding_mask,
            return_weights=return_weights,
            return_heads=return_heads,
        )


class HopfieldLayer(nn.Module):
    """Lookup by association: the input state patterns retrieve from ``quantity`` learned memories.

    Args:
        input_size: size of the input (state) patterns.
        quantity: number of learned stored patterns.
        separate_targets: learn pattern projections (values) apart from the stored patterns
            (keys); otherwise the stored patterns serve as both.
        **kwargs: the :class:`Hopfield` arguments; ``stored_size`` / ``projection_size`` set the
            sizes of the learned patterns (default ``input_size``).

    ``forward(input (B, L, input_size))`` returns ``(B, L, output_size)``.
    """

    association: type[Hopfield] = Hopfield  # the inner layer's class

    def __init__(
        self, input_size: int, quantity: int, *, separate_targets: bool = False, **kwargs: Any
    ) -> None:
        super().__init__()
        self.quantity = check_int("quantity", quantity)
        self.hopfield = self.association(input_size, **kwargs)
        factory = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
        self.stored_patterns = nn.Parameter(
            torch.empty(1, quantity, self.hopfield.stored_size, **factory)
        )
        self.target_patterns: nn.Parameter | None = None
        if separate_targets:
            self.target_patterns = nn.Parameter(
                torch.empty(1, quantity, self.hopfield.projection_size, **factory)
            )
        elif self.hopfield.stored_size != self.hopfield.projection_size:
            raise ValueError("stored_size and projection_size differ: set separate_targets=True")
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Learned memories ~ N(0, 0.02²); the association layer's own initialisation."""
        nn.init.normal_(self.stored_patterns, std=0.02)
        if self.target_patterns is not None:
            nn.init.normal_(self.target_patterns, std=0.02)
        self.hopfield.reset_parameters()

    def forward(
        self,
        input: Tensor,
        *,
        attn_mask: Tensor | None = None,
        return_weights: bool = False,
        return_heads: bool = False,
    ) -> Tensor | HopfieldOutput:
        check_patterns("input", input, self.hopfield._input_dtype())
        batch = input.shape[0 if self.hopfield.batch_first else 1]
        stored = self.stored_patterns.expand(batch, -1, -1)
        targets = self.target_patterns if self.target_patterns is not None else self.stored_patterns
        projection = targets.expand(batch, -1, -1)
        if not self.hopfield.batch_first:
            stored, projection = stored.transpose(0, 1), projection.transpose(0, 1)
        return self.hopfield(
            (stored, input, projection),
            attn_mask=attn_mask,
            return_weights=return_weights,
            return_heads=return_heads,
        )


class OutEffHop(Hopfield):
    """The outlier-efficient Hopfield layer: :class:`Hopfield` with Softmax_1 by default."""

    @staticmethod
    def _default_separation() -> Separation:
        return SoftmaxN(1.0)


class OutEffHopPooling(HopfieldPooling):
    """:class:`HopfieldPooling` with Softmax_1 by default."""

    association = OutEffHop


class OutEffHopLayer(HopfieldLayer):
    """:class:`HopfieldLayer` with Softmax_1 by default."""

    association = OutEffHop

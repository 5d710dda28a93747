"""Hyper-SET: a Transformer layer derived from hyperspherical energy minimisation.

One iteration (spec §2.7, tokens are rows, ``X`` ``(B, N, d)``)::

    α, γ = step_sizes(t, X_0 or X_t)                             # each (B, N, d), zero at init
    Z    = RMSNorm_p(split_heads(X Wᵀ))                          # Q = K = V, one shared norm
    X    = X - α ⊙ merge((softmax(A,-1) + softmax(A,-2)) Z) W   # A = Z Zᵀ/√p, tied output
    X    = X + γ ⊙ act(RMSNorm_M(X Dᵀ)) D                        # tied feedforward, no biases

:class:`HyperSETLayer` holds ``W`` (``qkv``) and ``D`` (``mlp``); :class:`StepSizeNetwork` makes
the learned per-token, per-channel step sizes from a sinusoidal iteration embedding;
:class:`HyperSETEncoder` applies K distinct layers, each ``L/K`` times (one shared layer for
``K = 1``), optionally with depth-wise LoRA. :class:`SharedTransformerEncoder` is the paper's
baseline, a pre-norm Transformer layer applied ``L`` times. Task models (Sudoku, image
classification, masked token modelling) and the paper configurations live in
:mod:`hopfield.models.hyperset`.
"""

from __future__ import annotations

from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hopfield.nn.hyperset_energy import (
    ATTENTION_KINDS,
    FEEDFORWARD_KINDS,
    attention_energy_of_projections,
    attention_operator,
    feedforward_energy_of_projections,
    feedforward_operator,
    merge_heads,
    split_heads,
    time_embedding,
)
from hopfield.nn.rms_norm import RMSNorm

StepStyle = Literal["plain", "normed", "direct"]
Condition = Literal["input", "state"]

__all__ = [
    "CRATELayer",
    "HyperSETEncoder",
    "HyperSETLayer",
    "SharedTransformerEncoder",
    "StepSizeNetwork",
    "TransformerLayer",
    "WeightSharedEncoder",
    "count_parameters",
    "flops_per_iteration",
]


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


class _StepUpdate(torch.autograd.Function):
    """``x + size ⊙ update``: one pass forward and one product per input backward
    (``addcmul``'s own backward also multiplies by its scalar ``value``, a pass each)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, size: Tensor, update: Tensor) -> Tensor:
        ctx.save_for_backward(size, update)
        return torch.addcmul(x, size, update)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        size, update = ctx.saved_tensors
        d_size = (grad * update).sum_to_size(size.shape) if ctx.needs_input_grad[1] else None
        d_update = (grad * size).sum_to_size(update.shape) if ctx.needs_input_grad[2] else None
        return grad, d_size, d_update


def _take_step(x: Tensor, size: Tensor | float, update: Tensor) -> Tensor:
    """``x + size ⊙ update`` (``size`` a tensor broadcastable to ``x`` or a float)."""
    if isinstance(size, Tensor):
        return cast(Tensor, _StepUpdate.apply(x, size, update))
    return torch.add(x, update, alpha=size)


class HyperSETLayer(nn.Module):
    """The shared Hyper-SET layer: attention and feedforward energy-descent steps.

    Args:
        d_model: token width d.
        num_heads: number of subspaces H (``p = d/H``).
        ff_size: feedforward width M (default ``d``).
        attention: ``"bisoftmax"`` (paper), ``"sigmoid"`` or ``"linear"`` (Table 18).
        feedforward: ``"relu"`` (paper), ``"gelu"`` (the classification code), ``"softmax"`` or
            ``"gated"`` (Table 19).
        separate_qkv_norms: three RMSNorms for the Q, K, V roles (classification code; ``A`` is
            then only approximately symmetric) instead of one shared norm (Sudoku, MIM code).
        norm_eps: RMSNorm epsilon (``None``: ``torch.finfo(dtype).eps``).

    Attributes:
        qkv: ``Linear(d, d, bias=False)``; ``qkv.weight = Wᵀ`` (all heads).
        mlp: ``Linear(d, M, bias=False)``; ``mlp.weight = Dᵀ``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        ff_size: int | None = None,
        *,
        attention: str = "bisoftmax",
        feedforward: str = "relu",
        separate_qkv_norms: bool = False,
        norm_eps: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.d_model = _positive_int("d_model", d_model)
        self.num_heads = _positive_int("num_heads", num_heads)
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        self.head_size = d_model // num_heads
        self.ff_size = _positive_int("ff_size", d_model if ff_size is None else ff_size)
        self.attention = _choice("attention", attention, ATTENTION_KINDS)
        self.feedforward = _choice("feedforward", feedforward, FEEDFORWARD_KINDS)
        self.separate_qkv_norms = bool(separate_qkv_norms)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.qkv = nn.Linear(d_model, d_model, bias=False, **factory)
        self.mlp = nn.Linear(d_model, self.ff_size, bias=False, **factory)
        roles = 3 if self.separate_qkv_norms else 1
        self.qkv_norms = nn.ModuleList(
            RMSNorm(self.head_size, eps=norm_eps, **factory) for _ in range(roles)
        )
        self.ff_norm = RMSNorm(self.ff_size, eps=norm_eps, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default Linear initialisation, unit norm gains."""
        self.qkv.reset_parameters()
        self.mlp.reset_parameters()
        for norm in (*self.qkv_norms, self.ff_norm):
            norm.reset_parameters()

    def _check_input(self, x: Tensor) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a Tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (B, N, {self.d_model}), got {tuple(x.shape)}")

    def projections(self, x: Tensor, weight_delta: Tensor | None = None) -> tuple[Tensor, ...]:
        """The normalised per-head projections ``(zq, zk, zv)``, each ``(B, H, N, p)``."""
        weight = self.qkv.weight if weight_delta is None else self.qkv.weight + weight_delta
        # Normalised as (B, N, H, p), whose rows are contiguous, then viewed as (B, H, N, p): the
        # same values as normalising the transposed view, at two thirds of the cost.
        z = F.linear(x, weight).unflatten(-1, (self.num_heads, self.head_size))
        if not self.separate_qkv_norms:
            zn = self.qkv_norms[0](z).transpose(1, 2)
            return zn, zn, zn
        return tuple(norm(z).transpose(1, 2) for norm in self.qkv_norms)

    def attention_step(self, x: Tensor, weight_delta: Tensor | None = None) -> Tensor:
        """The attention update ``(B, N, d)`` of eq. (9) (``X ← X - α ⊙ attention_step(X)``).

        Args:
            x: tokens ``(B, N, d)``.
            weight_delta: optional ``(d, d)`` addition to ``qkv.weight`` (depth-wise LoRA), used
                for the projection and the tied output projection alike.
        """
        self._check_input(x)
        return self._attention_update(x, weight_delta, negate=False)

    def _attention_update(self, x: Tensor, weight_delta: Tensor | None, *, negate: bool) -> Tensor:
        """:meth:`attention_step`, or its negative through the (d, d) output weight."""
        zq, zk, zv = self.projections(x, weight_delta)
        y = attention_operator(zq, zk, zv, self.attention, symmetric=not self.separate_qkv_norms)
        weight = self.qkv.weight if weight_delta is None else self.qkv.weight + weight_delta
        return merge_heads(y) @ (-weight if negate else weight)

    def feedforward_step(self, x: Tensor, weight_delta: Tensor | None = None) -> Tensor:
        """The feedforward update ``(B, N, d)`` of eq. (11): ``X ← X + γ ⊙ feedforward_step(X)``."""
        self._check_input(x)
        weight = self.mlp.weight if weight_delta is None else self.mlp.weight + weight_delta
        hidden = self.ff_norm(F.linear(x, weight))
        return feedforward_operator(hidden, self.feedforward) @ weight

    def forward(
        self,
        x: Tensor,
        alpha: Tensor | float,
        gamma: Tensor | float,
        *,
        attention_delta: Tensor | None = None,
        feedforward_delta: Tensor | None = None,
    ) -> Tensor:
        """One iteration: ``X - α ⊙ attention_step``, then ``+ γ ⊙ feedforward_step``.

        Args:
            x: tokens ``(B, N, d)``.
            alpha, gamma: step sizes broadcastable to ``(B, N, d)`` (or floats).
            attention_delta, feedforward_delta: optional LoRA weight additions.
        """
        self._check_input(x)
        x = _take_step(x, alpha, self._attention_update(x, attention_delta, negate=True))
        return _take_step(x, gamma, self.feedforward_step(x, feedforward_delta))

    @torch.no_grad()
    def energies(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(E_ATTN, E_FF)`` per sample, each ``(B,)``, on gain-free normalised projections."""
        self._check_input(x)
        z = split_heads(F.linear(x, self.qkv.weight), self.num_heads)
        e_attn = attention_energy_of_projections(F.rms_norm(z, (self.head_size,)), self.attention)
        u = F.rms_norm(F.linear(x, self.mlp.weight), (self.ff_size,))
        return e_attn, feedforward_energy_of_projections(u, self.feedforward)

    @torch.no_grad()
    def subspace_tokens(self, x: Tensor) -> Tensor:
        """Gain-free normalised projections ``(B, H, N, p)`` for effective rank and angles."""
        self._check_input(x)
        z = split_heads(F.linear(x, self.qkv.weight), self.num_heads)
        return F.rms_norm(z, (self.head_size,))

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, ff_size={self.ff_size}, "
            f"attention={self.attention!r}, feedforward={self.feedforward!r}, "
            f"separate_qkv_norms={self.separate_qkv_norms}"
        )


class StepSizeNetwork(nn.Module):
    """Learned step sizes ``α_t, γ_t`` ``(B, N, d)`` from the iteration index and the tokens.

    Styles (spec §2.6; every Linear zero-initialised, so ``α = γ = 0`` at initialisation):

    * ``"plain"`` (Sudoku, Table 5): ``c_t = Lin(GELU(Lin(emb_F(t))))``,
      ``[α, γ] = Lin(GELU(c_t + cond))``;
    * ``"normed"`` (image classification): ``c_t = RMS(Lin(RMS(GELU(RMS(Lin(emb_F(t)))))))``,
      ``[α, γ] = Lin(GELU(c_t + RMS(cond)))``;
    * ``"direct"`` (masked image modelling, ``F = d``): ``c_t = emb_d(t)``,
      ``[α, γ] = Lin(GELU(RMS(c_t + cond)))``.

    ``cond`` is the input ``X_0`` (``condition="input"``) or the current state ``X_t``
    (``condition="state"``).
    """

    def __init__(
        self,
        d_model: int,
        frequency: int = 512,
        *,
        style: str = "plain",
        condition: str = "input",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.d_model = _positive_int("d_model", d_model)
        self.frequency = _positive_int("frequency", frequency)
        if frequency % 2 or frequency < 4:
            raise ValueError(f"frequency must be an even int >= 4, got {frequency}")
        self.style = _choice("style", style, ("plain", "normed", "direct"))
        self.condition = _choice("condition", condition, ("input", "state"))
        if self.style == "direct" and frequency != d_model:
            raise ValueError(f"style='direct' needs frequency == d_model, got {frequency}")
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.time_in: nn.Linear | None = None
        self.time_out: nn.Linear | None = None
        self.time_norms = nn.ModuleList()
        self.cond_norm: nn.RMSNorm | None = None
        if self.style != "direct":
            self.time_in = nn.Linear(frequency, d_model, **factory)
            self.time_out = nn.Linear(d_model, d_model, **factory)
        if self.style == "normed":
            self.time_norms.extend(RMSNorm(d_model, **factory) for _ in range(3))
        if self.style != "plain":
            self.cond_norm = RMSNorm(d_model, **factory)
        self.step = nn.Linear(d_model, 2 * d_model, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Zero every Linear (ReZero: the encoder is the identity at initialisation)."""
        for linear in (self.time_in, self.time_out, self.step):
            if linear is not None:
                nn.init.zeros_(linear.weight)
                nn.init.zeros_(linear.bias)
        for norm in self.time_norms:
            cast(nn.RMSNorm, norm).reset_parameters()
        if self.cond_norm is not None:
            self.cond_norm.reset_parameters()

    def time_condition(self, t: Tensor) -> Tensor:
        """``c_t`` ``(..., d)`` for 1-based iteration indices ``t``."""
        weight = self.step.weight
        emb = time_embedding(t, self.frequency).to(device=weight.device, dtype=weight.dtype)
        if self.time_in is None or self.time_out is None:
            return emb
        h = self.time_in(emb)
        if self.style == "normed":
            n0, n1, n2 = self.time_norms
            return n2(self.time_out(n1(F.gelu(n0(h)))))
        return self.time_out(F.gelu(h))

    def forward(self, c_t: Tensor, x0: Tensor, xt: Tensor) -> tuple[Tensor, Tensor]:
        """``(α, γ)`` each ``(B, N, d)`` from ``c_t`` ``(d,)`` and tokens ``(B, N, d)``."""
        cond = x0 if self.condition == "input" else xt
        if self.style == "plain":
            h = F.gelu(c_t + cond)
        elif self.style == "normed":
            assert self.cond_norm is not None
            h = F.gelu(c_t + self.cond_norm(cond))
        else:
            assert self.cond_norm is not None
            h = F.gelu(self.cond_norm(c_t + cond))
        alpha, gamma = self.step(h).chunk(2, dim=-1)
        return alpha, gamma


class HyperSETEncoder(nn.Module):
    """K distinct :class:`HyperSETLayer` s, each applied ``L/K`` times, with learned step sizes.

    Args:
        d_model, num_heads, ff_size, attention, feedforward, separate_qkv_norms: as in
            :class:`HyperSETLayer`.
        iterations: training iterations L (``forward(..., iterations=L')`` may use more).
        num_layers: K distinct layers (the iteration index restarts at 1 for each).
        step_size: ``None`` for the learned step-size network, or a fixed ``α = γ = c``.
        step_style, condition, time_frequency: the :class:`StepSizeNetwork` (shared by layers).
        lora_rank: r > 0 adds depth-wise LoRA: per iteration t, ``ΔW_t = s·B_t A_t`` on ``W``
            and ``ΔD_t`` on ``D`` with ``s = lora_scale / r`` (``A, B ~ N(0, 0.02²)``).
        lora_scale: the LoRA ``α`` numerator; the paper's scale is ``lora_scale / r = 4``, so by
            default ``lora_scale = 4·r`` (``None``).
        init_std: ``N(0, init_std²)`` for ``W`` and ``D`` (Sudoku code: 0.02); ``None`` keeps
            PyTorch's Linear default (classification code).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        ff_size: int | None = None,
        *,
        iterations: int = 12,
        num_layers: int = 1,
        attention: str = "bisoftmax",
        feedforward: str = "relu",
        separate_qkv_norms: bool = False,
        step_size: float | None = None,
        step_style: str = "plain",
        condition: str = "input",
        time_frequency: int = 512,
        lora_rank: int = 0,
        lora_scale: float | None = None,
        init_std: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.d_model = _positive_int("d_model", d_model)
        self.iterations = _positive_int("iterations", iterations)
        self.num_layers = _positive_int("num_layers", num_layers)
        if iterations % num_layers:
            raise ValueError(f"num_layers={num_layers} must divide iterations={iterations}")
        if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or lora_rank < 0:
            raise ValueError(f"lora_rank must be a non-negative int, got {lora_rank!r}")
        if step_size is not None and (
            isinstance(step_size, bool) or not isinstance(step_size, int | float)
        ):
            raise TypeError(f"step_size must be None or a number, got {type(step_size).__name__}")
        self.init_std = init_std
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.layers = nn.ModuleList(
            HyperSETLayer(
                d_model,
                num_heads,
                ff_size,
                attention=attention,
                feedforward=feedforward,
                separate_qkv_norms=separate_qkv_norms,
                **factory,
            )
            for _ in range(num_layers)
        )
        self.fixed_step = None if step_size is None else float(step_size)
        self.step_sizes: StepSizeNetwork | None = None
        if step_size is None:
            self.step_sizes = StepSizeNetwork(
                d_model, time_frequency, style=step_style, condition=condition, **factory
            )
        self.lora_rank = lora_rank
        self.lora_scale = float(4 * lora_rank if lora_scale is None else lora_scale)
        m = self.hyperset_layers()[0].ff_size
        if lora_rank:
            self.lora_attn_a = nn.Parameter(torch.empty(iterations, lora_rank, d_model, **factory))
            self.lora_attn_b = nn.Parameter(torch.empty(iterations, d_model, lora_rank, **factory))
            self.lora_ff_a = nn.Parameter(torch.empty(iterations, lora_rank, d_model, **factory))
            self.lora_ff_b = nn.Parameter(torch.empty(iterations, m, lora_rank, **factory))
        self.reset_parameters()

    def hyperset_layers(self) -> list[HyperSETLayer]:
        """The K distinct layers."""
        return [cast(HyperSETLayer, layer) for layer in self.layers]

    def reset_parameters(self) -> None:
        """Layers (``init_std`` or default), zero step-size network, LoRA ``N(0, 0.02²)``."""
        for layer in self.hyperset_layers():
            layer.reset_parameters()
            if self.init_std is not None:
                nn.init.normal_(layer.qkv.weight, std=self.init_std)
                nn.init.normal_(layer.mlp.weight, std=self.init_std)
        if self.step_sizes is not None:
            self.step_sizes.reset_parameters()
        if self.lora_rank:
            for p in (self.lora_attn_a, self.lora_attn_b, self.lora_ff_a, self.lora_ff_b):
                nn.init.normal_(p, std=0.02)

    def _lora(self, index: int) -> tuple[Tensor | None, Tensor | None]:
        if not self.lora_rank:
            return None, None
        if index >= self.iterations:
            raise ValueError(
                f"depth-wise LoRA has {self.iterations} iterations of adapters; "
                f"cannot run iteration {index + 1}"
            )
        scale = self.lora_scale / self.lora_rank
        attn = scale * self.lora_attn_b[index] @ self.lora_attn_a[index]
        ff = scale * self.lora_ff_b[index] @ self.lora_ff_a[index]
        return attn, ff

    def forward(
        self, x0: Tensor, iterations: int | None = None, *, return_states: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Run ``iterations`` (default L) iterations from ``x0`` ``(B, N, d)``.

        Returns ``X_L`` ``(B, N, d)``, or ``(X_L, [X_1, ..., X_L])`` with ``return_states``.
        """
        x, states, _ = self._run(x0, iterations, record=return_states)
        return (x, states) if return_states else x

    @torch.no_grad()
    def trajectory(
        self, x0: Tensor, iterations: int | None = None
    ) -> tuple[list[Tensor], list[tuple[Tensor, Tensor]]]:
        """States ``[X_1..X_L]`` and the step sizes ``[(α_t, γ_t)]`` each ``(B, N, d)`` used."""
        _, states, steps = self._run(x0, iterations, record=True)
        return states, steps

    def _run(
        self, x0: Tensor, iterations: int | None, *, record: bool
    ) -> tuple[Tensor, list[Tensor], list[tuple[Tensor, Tensor]]]:
        if not isinstance(x0, Tensor) or x0.dim() != 3 or x0.shape[-1] != self.d_model:
            raise ValueError(f"x0 must be a (B, N, {self.d_model}) tensor")
        total = self.iterations if iterations is None else _positive_int("iterations", iterations)
        if total % self.num_layers:
            raise ValueError(f"num_layers={self.num_layers} must divide iterations={total}")
        per_layer = total // self.num_layers
        conditions = None
        if self.step_sizes is not None:
            t = torch.arange(1, per_layer + 1, device=x0.device)
            conditions = self.step_sizes.time_condition(t)  # (per_layer, d)
        x, index = x0, 0
        states: list[Tensor] = []
        steps: list[tuple[Tensor, Tensor]] = []
        for layer in self.hyperset_layers():
            for step in range(per_layer):
                if self.step_sizes is not None and conditions is not None:
                    alpha, gamma = self.step_sizes(conditions[step], x0, x)
                else:
                    alpha = gamma = torch.full_like(x, cast(float, self.fixed_step))
                attn_delta, ff_delta = self._lora(index)
                x = layer(x, alpha, gamma, attention_delta=attn_delta, feedforward_delta=ff_delta)
                index += 1
                if record:
                    states.append(x)
                    steps.append((alpha, gamma))
        return x, states, steps

    def layer_at(self, index: int, iterations: int | None = None) -> HyperSETLayer:
        """The layer used at (0-based) iteration ``index`` of a run of ``iterations`` (L)."""
        total = self.iterations if iterations is None else iterations
        per_layer = total // self.num_layers
        return self.hyperset_layers()[min(index // per_layer, self.num_layers - 1)]


class CRATELayer(nn.Module):
    """A CRATE layer (Yu et al. 2023), the white-box baseline of the paper's Table 1.

    ``z = x + MSSA(LN(x))``, then ``x = ISTA(LN(z))`` with
    ``ISTA(u) = ReLU(u + η(u D - u Dᵀ D) - ηλ)`` (D is ``d×d``, η = λ = 0.1). MSSA uses one shared
    bias-free projection for Q, K and V and a separate output Linear with bias; CRATE-T
    (``tied_output=True``) re-projects with the shared projection instead.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        tied_output: bool = False,
        step: float = 0.1,
        sparsity: float = 0.1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.d_model = _positive_int("d_model", d_model)
        self.num_heads = _positive_int("num_heads", num_heads)
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.step, self.sparsity = float(step), float(sparsity)
        self.norm1 = nn.LayerNorm(d_model, **factory)
        self.norm2 = nn.LayerNorm(d_model, **factory)
        self.qkv = nn.Linear(d_model, d_model, bias=False, **factory)
        self.out = None if tied_output else nn.Linear(d_model, d_model, **factory)
        self.dictionary = nn.Parameter(torch.empty(d_model, d_model, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch defaults; the dictionary Kaiming-uniform like a Linear weight."""
        for module in (self.norm1, self.norm2, self.qkv):
            module.reset_parameters()
        if self.out is not None:
            self.out.reset_parameters()
        nn.init.kaiming_uniform_(self.dictionary, a=5**0.5)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, d) -> (B, N, d)``."""
        w = split_heads(self.qkv(self.norm1(x)), self.num_heads)
        y = merge_heads(F.scaled_dot_product_attention(w, w, w))
        y = self.out(y) if self.out is not None else y @ self.qkv.weight
        u = self.norm2(x + y)
        ud = u @ self.dictionary
        residual = ud @ self.dictionary.T
        return F.relu(u + self.step * (ud - residual) - self.step * self.sparsity)


class TransformerLayer(nn.Module):
    """Pre-norm Transformer layer without biases: ``x + MHSA(N(x))``, then ``x + MLP(N(x))``.

    Separate Q, K, V and output projections, ReLU MLP of width ``mlp_ratio·d``; the norm N is
    RMSNorm (``norm="rms"``, Sudoku/MIM) or LayerNorm (``norm="layer"``, classification code).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        *,
        norm: str = "rms",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.d_model = _positive_int("d_model", d_model)
        self.num_heads = _positive_int("num_heads", num_heads)
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        _choice("norm", norm, ("rms", "layer"))
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        hidden = round(mlp_ratio * d_model)
        make_norm = (
            (lambda: nn.RMSNorm(d_model, **factory))
            if norm == "rms"
            else (lambda: nn.LayerNorm(d_model, **factory))
        )
        self.norm1, self.norm2 = make_norm(), make_norm()
        self.q, self.k, self.v, self.out = (
            nn.Linear(d_model, d_model, bias=False, **factory) for _ in range(4)
        )
        self.fc1 = nn.Linear(d_model, hidden, bias=False, **factory)
        self.fc2 = nn.Linear(hidden, d_model, bias=False, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch defaults."""
        for module in (self.norm1, self.norm2, self.q, self.k, self.v, self.out):
            module.reset_parameters()
        self.fc1.reset_parameters()
        self.fc2.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, d) -> (B, N, d)``."""
        h = self.norm1(x)
        q, k, v = (split_heads(proj(h), self.num_heads) for proj in (self.q, self.k, self.v))
        x = x + self.out(merge_heads(F.scaled_dot_product_attention(q, k, v)))
        return x + self.fc2(F.relu(self.fc1(self.norm2(x))))


class WeightSharedEncoder(nn.Module):
    """K layers each applied ``L/K`` times: the iteration loop of the weight-shared baselines.

    Subclasses build ``self.layers`` (an ``nn.ModuleList`` of K ``(B, N, d) -> (B, N, d)``
    layers); the Hyper-SET task models (:mod:`hopfield.models.hyperset`) accept any of them.

    Args:
        d_model: token width d. iterations: L. num_layers: K (must divide L).
    """

    layers: nn.ModuleList

    def __init__(self, d_model: int, *, iterations: int, num_layers: int) -> None:
        super().__init__()
        self.d_model = _positive_int("d_model", d_model)
        self.iterations = _positive_int("iterations", iterations)
        self.num_layers = _positive_int("num_layers", num_layers)
        if iterations % num_layers:
            raise ValueError(f"num_layers={num_layers} must divide iterations={iterations}")

    def forward(
        self, x0: Tensor, iterations: int | None = None, *, return_states: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """As :meth:`HyperSETEncoder.forward`."""
        total = self.iterations if iterations is None else _positive_int("iterations", iterations)
        if total % self.num_layers:
            raise ValueError(f"num_layers={self.num_layers} must divide iterations={total}")
        x, states = x0, []
        for layer in self.layers:
            for _ in range(total // self.num_layers):
                x = layer(x)
                if return_states:
                    states.append(x)
        return (x, states) if return_states else x


class SharedTransformerEncoder(WeightSharedEncoder):
    """The weight-shared baseline: K :class:`TransformerLayer` s each applied ``L/K`` times.

    Args:
        d_model, num_heads, mlp_ratio, norm: as in :class:`TransformerLayer`.
        iterations: L; ``num_layers``: K.
        init_std: ``N(0, init_std²)`` for every Linear (Sudoku code), or PyTorch defaults.
        kind: ``"transformer"``, or ``"crate"`` / ``"crate-t"`` for :class:`CRATELayer` s
            (``mlp_ratio`` and ``norm`` unused).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        *,
        iterations: int = 12,
        num_layers: int = 1,
        norm: str = "rms",
        init_std: float | None = None,
        kind: str = "transformer",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(d_model, iterations=iterations, num_layers=num_layers)
        self.kind = _choice("kind", kind, ("transformer", "crate", "crate-t"))
        self.init_std = init_std

        def make() -> nn.Module:
            if kind == "transformer":
                return TransformerLayer(
                    d_model, num_heads, mlp_ratio, norm=norm, device=device, dtype=dtype
                )
            return CRATELayer(
                d_model, num_heads, tied_output=kind == "crate-t", device=device, dtype=dtype
            )

        self.layers = nn.ModuleList(make() for _ in range(num_layers))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Layer defaults, or ``N(0, init_std²)`` Linear weights."""
        for layer in self.layers:
            cast(TransformerLayer | CRATELayer, layer).reset_parameters()
            if self.init_std is not None:
                for module in layer.modules():
                    if isinstance(module, nn.Linear):
                        nn.init.normal_(module.weight, std=self.init_std)


def flops_per_iteration(
    model: str, tokens: int, d_model: int, ff_size: int, *, backward: bool = False
) -> float:
    """Approximate FLOPs of one iteration for one sample (spec §9.1), matmuls only.

    ``model="hyperset"``: ``2·(2Nd² + 2NdM + 2N²d)``; ``"transformer"`` (MLP width ``ff_size``):
    ``2·(4Nd² + 2NdM + 2N²d)``. ``backward=True`` gives forward + backward (3×).
    """
    _choice("model", model, ("hyperset", "transformer"))
    n, d, m = tokens, d_model, ff_size
    proj = 2 * n * d * d if model == "hyperset" else 4 * n * d * d
    forward = 2.0 * (proj + 2 * n * d * m + 2 * n * n * d)
    return 3.0 * forward if backward else forward


def count_parameters(module: nn.Module) -> int:
    """Number of trainable parameters (buffers such as fixed positional codes excluded)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)

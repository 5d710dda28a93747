"""A small pre-LN causal language model whose attention map is one of the sink-removal candidates.

The model of the ``outlier-benchmark`` experiment: token and learned position embeddings,
``num_layers`` pre-LN blocks (``x + attn(LN(x))``, ``x + fc2(GELU(fc1(LN(x))))``), a final
LayerNorm and an untied LM head. Module names follow :func:`hopfield.outliers.quantize_w8a8`'s
placement rules (``decoder.layers.<i>`` are the blocks, ``lm_head`` stays in floating point).

Attention maps (``attention``), every one over causal scores ``z = q kᵀ / √E``:

========================= ==========================================================================
``softmax``               the vanilla map
``softmax1``              Softmax_1 = exp(z) / (1 + Σ exp z) (OutEffHop)
``clipped``               clipped softmax of Bondarenko et al. (``clip_gamma``, ``clip_zeta``)
``gated``                 softmax, each head's output times a per-token sigmoid gate (Bondarenko)
``sink_logit``            :class:`~hopfield.functional.Sink` with a learnable logit ``b_h`` per
                          head: softmax over ``[b_h, z]`` whose sink weight is dropped (a learnable
                          Softmax_1; gpt-oss's sinks), ``b_h = 0`` at initialisation
``relu``                  ``ReLU(z) / T`` without normalisation (Guo et al.'s ReLU attention; the
                          1/T keeps the output's scale independent of the length)
``kv_bias``               softmax over ``[q·k'_h / √E, z]`` with a learnable key ``k'_h`` and value
                          ``v'_h`` per head (Sun et al.'s explicit attention bias), zero at
                          initialisation
========================= ==========================================================================

The weights on the model's own keys are what :mod:`hopfield.outliers.sinks` measures: a map that
gives mass to an extra slot (Softmax_1's zero logit, a sink logit, the bias key) has rows summing
to less than 1. Parameters beyond the vanilla model's are initialised from a forked RNG, so the
same seed gives every map the same initial shared weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hopfield.functional import ClippedSoftmax, Separation, Sink, Softmax, SoftmaxN
from hopfield.nn.gates import GatedAttention

__all__ = ["ATTENTIONS", "Capture", "SinkLM", "SinkLMConfig"]

ATTENTIONS = ("softmax", "softmax1", "clipped", "gated", "sink_logit", "relu", "kv_bias")


@dataclass(frozen=True)
class SinkLMConfig:
    """Shape and attention map of a :class:`SinkLM`.

    Attributes:
        vocab_size, seq_len: vocabulary and the longest sequence (position embeddings).
        d_model, num_layers, num_heads, ffn_size: widths and depth.
        attention: one of :data:`ATTENTIONS`.
        clip_gamma, clip_zeta: clipped softmax stretch (``attention="clipped"``).
    """

    vocab_size: int
    seq_len: int
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 1
    ffn_size: int = 256
    attention: str = "softmax"
    clip_gamma: float = -0.03
    clip_zeta: float = 1.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "d_model", "num_layers", "num_heads", "ffn_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.seq_len < 2:
            raise ValueError(f"seq_len must be >= 2, got {self.seq_len}")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})"
            )
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")


#: One block's captured states: ``weights (B, H, T, T)`` on the model's keys, ``values
#: (B, H, T, E)`` and the block output ``hidden (B, T, D)`` (the residual stream).
Capture = dict[str, Tensor]


def _separation(config: SinkLMConfig) -> Separation | None:
    """The separation map of the maps that are one (``None`` for ReLU and the extra-slot maps)."""
    if config.attention == "softmax1":
        return SoftmaxN(1.0)
    if config.attention == "clipped":
        return ClippedSoftmax(gamma=config.clip_gamma, zeta=config.clip_zeta)
    if config.attention in ("softmax", "gated"):
        return Softmax()
    if config.attention == "sink_logit":
        return Sink(0.0, learnable=True, heads=config.num_heads)
    return None


class SinkAttention(nn.Module):
    """Causal multi-head self-attention with the map of ``config.attention`` (module docstring)."""

    def __init__(self, config: SinkLMConfig) -> None:
        super().__init__()
        d, heads = config.d_model, config.num_heads
        self.kind, self.num_heads, self.head_size = config.attention, heads, d // heads
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.v_proj, self.out_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.separation = _separation(config)
        with torch.random.fork_rng():
            if self.kind == "kv_bias":
                self.key_bias = nn.Parameter(torch.zeros(heads, self.head_size))
                self.value_bias = nn.Parameter(torch.zeros(heads, self.head_size))
            elif self.kind == "gated":
                self.gate = GatedAttention(d, heads)

    def _heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_size).transpose(1, 2)

    def _with_slot(self, extra: Tensor, masked: Tensor) -> tuple[Tensor, Tensor]:
        """Softmax over ``[extra, masked]``: ``(weight of the extra slot, weights on keys)``."""
        p = torch.softmax(torch.cat([extra, masked], dim=-1), dim=-1)
        return p[..., :1], p[..., 1:]

    def forward(self, x: Tensor, capture: Capture | None = None) -> Tensor:
        """``x (B, T, D) -> (B, T, D)``; with ``capture``, stores the weights and values."""
        q, k, v = (
            self._heads(self.q_proj(x)),
            self._heads(self.k_proj(x)),
            self._heads(self.v_proj(x)),
        )
        length = x.shape[1]
        scale = self.head_size**-0.5
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, H, T, T)
        allowed = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        masked = scores.masked_fill(~allowed, -torch.inf)
        extra_out = None
        if self.separation is not None:
            weights = self.separation(masked)
        elif self.kind == "relu":
            weights = torch.relu(scores) * allowed / length
        else:  # kv_bias
            extra = (q * self.key_bias[None, :, None, :]).sum(-1, keepdim=True) * scale
            slot, weights = self._with_slot(extra, masked)
            extra_out = slot * self.value_bias[None, :, None, :]
        out = torch.matmul(weights, v)
        if extra_out is not None:
            out = out + extra_out
        if self.kind == "gated":
            out = self.gate(x, out)
        if capture is not None:
            capture["weights"], capture["values"] = weights.detach(), v.detach()
        batch = x.shape[0]
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, -1))


class SinkBlock(nn.Module):
    """One pre-LN block: attention and a GELU feed-forward network, each with a residual."""

    def __init__(self, config: SinkLMConfig) -> None:
        super().__init__()
        d = config.d_model
        self.attn_norm, self.attn = nn.LayerNorm(d), SinkAttention(config)
        self.ffn_norm = nn.LayerNorm(d)
        self.fc1, self.act, self.fc2 = (
            nn.Linear(d, config.ffn_size),
            nn.GELU(),
            nn.Linear(config.ffn_size, d),
        )

    def forward(self, x: Tensor, capture: Capture | None = None) -> Tensor:
        x = x + self.attn(self.attn_norm(x), capture)
        return x + self.fc2(self.act(self.fc1(self.ffn_norm(x))))


class _Decoder(nn.Module):
    def __init__(self, config: SinkLMConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.embed_positions = nn.Embedding(config.seq_len, config.d_model)
        self.layers = nn.ModuleList(SinkBlock(config) for _ in range(config.num_layers))
        self.final_norm = nn.LayerNorm(config.d_model)


class SinkLM(nn.Module):
    """The causal LM of the module docstring: ``tokens (B, T) -> logits (B, T, V)``."""

    def __init__(self, config: SinkLMConfig) -> None:
        super().__init__()
        if not isinstance(config, SinkLMConfig):
            raise TypeError(f"config must be a SinkLMConfig, got {type(config).__name__}")
        self.config = config
        self.decoder = _Decoder(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, tokens: Tensor, captures: list[Capture] | None = None) -> Tensor:
        """Logits ``(B, T, V)`` of ``tokens (B, T)`` (int64, ``T <= seq_len``); with a list
        ``captures``, one :data:`Capture` per block is appended to it."""
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"tokens must be int64 of shape (B, T), got {tuple(tokens.shape)}")
        if tokens.shape[1] > self.config.seq_len:
            raise ValueError(f"tokens: length {tokens.shape[1]} > seq_len {self.config.seq_len}")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.decoder.embed_tokens(tokens) + self.decoder.embed_positions(positions)
        for layer in self.decoder.layers:
            capture: Capture | None = None if captures is None else {}
            x = layer(x, capture)
            if capture is not None and captures is not None:
                capture["hidden"] = x.detach()
                captures.append(capture)
        return self.lm_head(self.decoder.final_norm(x))

    def loss(self, tokens: Tensor) -> Tensor:
        """Mean next-token cross entropy over every position after the first."""
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

"""STanHop-Net (Wu et al., ICLR 2024): sparse tandem Hopfield network for multivariate forecasting.

Written from ``shared/specs/stanhop.md``. Data flow for a window ``x (B, T, C)``:

1. :class:`SegmentEmbedding`: front-pad to ``N_in·L`` steps, cut every series into segments of
   ``L`` steps, ``Linear(L → d)``; add a learned ``(C, N_in, d)`` position table; LayerNorm.
2. Encoder: ``E`` blocks; block ``k ≥ 2`` first merges ``w`` neighbouring segments
   (:class:`SegmentMerging`) when ``w > 1``, then runs one :class:`STHMBlock`.
3. Decoder: ``E + 1`` :class:`DecoderLayer` objects; layer ``j`` cross-associates the decoder
   segments with encoder output ``j`` and predicts ``(B, C, N_out, L)``; the predictions are
   **summed** and reordered to ``(B, τ, C)``.

Every association is a :class:`~hopfield.nn.Hopfield` layer with values tied to keys
(``V = Y W_K W_V``) and ``β = 1/sqrt(d/H)``; its separation (and gate) come from an
:class:`Association`: GSH (learnable-α entmax, the STanHop default), dense, sparse, OutEffHop,
clipped or gated variants.

Deviations from the authors' code, on purpose (spec §15): heads are concatenated per position
(no scrambling reshape, D3); the cross-series stage is the router form of spec §6.2 (learned
queries pool the series, each series retrieves from the pooled patterns, residual on the series,
D4/D5); every learned pattern is initialised N(0, 1) (D1); exactly one α per GSH module (D6);
the values are the memory's (D2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from hopfield.functional import ClippedSoftmax, Entmax, Separation, Softmax, SoftmaxN, Sparsemax
from hopfield.nn.gates import GatedAttention
from hopfield.nn.hopfield import Hopfield

__all__ = [
    "ASSOCIATION_KINDS",
    "Association",
    "DecoderLayer",
    "STHMBlock",
    "STanHopNet",
    "SegmentEmbedding",
    "SegmentMerging",
    "figure_layer",
]

ASSOCIATION_KINDS = (
    "dense",
    "sparse",
    "gsh",
    "outeffhop",
    "clipped",
    "clipped_outeffhop",
    "gated",
    "gated_outeffhop",
)


@dataclass(frozen=True)
class Association:
    """Which association every Hopfield module of STanHop-Net uses.

    Attributes:
        kind: ``"gsh"`` (α-entmax with a learnable α per module, STanHop), ``"dense"`` (softmax,
            the "Hopfield" rows), ``"sparse"`` (sparsemax), ``"outeffhop"`` (Softmax_1),
            ``"clipped"`` / ``"clipped_outeffhop"`` (clipped softmax / Softmax_1), ``"gated"`` /
            ``"gated_outeffhop"`` (per-head, per-token sigmoid gates on softmax / Softmax_1).
        alpha: initial α of GSH, in ``(1, 2)``.
        clip_gamma, clip_zeta: clipped-softmax stretch (STanHop code: γ = -0.1, ζ = 1.1).
        gate_init: initial gate probability ``π_init`` of the gated kinds.
    """

    kind: str = "gsh"
    alpha: float = 1.5
    clip_gamma: float = -0.1
    clip_zeta: float = 1.1
    gate_init: float = 0.25

    def __post_init__(self) -> None:
        if self.kind not in ASSOCIATION_KINDS:
            raise ValueError(f"kind must be one of {ASSOCIATION_KINDS}, got {self.kind!r}")

    @property
    def gated(self) -> bool:
        return self.kind.startswith("gated")

    def separation(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> Separation:
        """A fresh separation map (each module owns its own, e.g. its own learnable α)."""
        one = self.kind.endswith("outeffhop")
        if self.kind == "gsh":
            return Entmax(alpha=self.alpha, learnable=True, device=device, dtype=dtype)
        if self.kind == "sparse":
            return Sparsemax()
        if self.kind.startswith("clipped"):
            base = SoftmaxN(1.0) if one else Softmax()
            return ClippedSoftmax(gamma=self.clip_gamma, zeta=self.clip_zeta, base=base)
        return SoftmaxN(1.0) if one else Softmax()

    def layer_kwargs(self, d_model: int, num_heads: int, factory: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments of one :class:`~hopfield.nn.Hopfield` module with this association."""
        kwargs: dict[str, Any] = {"separation": self.separation(**factory)}
        if self.gated:
            kwargs["gate"] = GatedAttention(
                d_model, num_heads, kind="conditional_per_token", pi_init=self.gate_init, **factory
            )
        return kwargs


def _hopfield(
    d_model: int, num_heads: int, dropout: float, association: Association, factory: dict[str, Any]
) -> nn.Module:
    head = d_model // num_heads
    return Hopfield(
        d_model,
        num_heads=num_heads,
        hidden_size=head,
        pattern_size=head,
        output_size=d_model,
        tie_values_to_keys=True,
        dropout=dropout,
        **association.layer_kwargs(d_model, num_heads, factory),
        **factory,
    )


class SegmentEmbedding(nn.Module):
    """Dimension-segment-wise embedding: ``(B, T, C) -> (B, C, N, d)``, ``N = ceil(T / L)``.

    If ``T`` is not a multiple of ``L``, the first step is repeated at the front. One shared
    ``Linear(L → d)`` embeds every segment of every series.
    """

    def __init__(
        self,
        seg_len: int,
        d_model: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if seg_len < 1 or d_model < 1:
            raise ValueError(f"seg_len and d_model must be >= 1, got {seg_len}, {d_model}")
        self.seg_len = seg_len
        self.linear = nn.Linear(seg_len, d_model, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        self.linear.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3:
            raise ValueError(f"x must be (B, T, C), got shape {tuple(x.shape)}")
        pad = -x.shape[1] % self.seg_len
        if pad:
            x = torch.cat([x[:, :1].expand(-1, pad, -1), x], dim=1)
        b, t, c = x.shape
        segments = x.transpose(1, 2).reshape(b, c, t // self.seg_len, self.seg_len)
        return self.linear(segments)


class SegmentMerging(nn.Module):
    """Coarse-graining: ``(B, C, N, d) -> (B, C, ceil(N / w), d)``.

    When ``N`` is not a multiple of ``w``, the last ``w - N mod w`` segments are repeated at the
    end; each group of ``w`` consecutive segments is concatenated (segment ``i`` of the group in
    feature block ``i``), normalised with ``LayerNorm(w·d)`` and mapped by ``Linear(w·d → d)``.
    """

    def __init__(
        self,
        d_model: int,
        win_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if win_size < 2:
            raise ValueError(f"win_size must be >= 2 (1 means no merging), got {win_size}")
        self.win_size = win_size
        self.norm = nn.LayerNorm(win_size * d_model, device=device, dtype=dtype)
        self.linear = nn.Linear(win_size * d_model, d_model, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        self.norm.reset_parameters()
        self.linear.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        b, c, n, d = x.shape
        pad = -n % self.win_size
        if pad:
            x = torch.cat([x, x[:, :, n - pad :]], dim=2)
        x = x.reshape(b, c, -1, self.win_size * d)
        return self.linear(self.norm(x))


def _reset_children(module: nn.Module) -> None:
    """Re-initialise each direct child with its own ``reset_parameters`` (recursing otherwise),
    then every learnable separation (e.g. GSH's α), which the layers do not reset themselves."""
    for child in module.children():
        reset = getattr(child, "reset_parameters", None)
        if callable(reset):
            reset()
        else:
            _reset_children(child)
    for sub in module.modules():
        if isinstance(sub, Entmax):
            sub.reset_parameters()


def _mlp(d_in: int, d_hidden: int, factory: dict[str, Any]) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(d_in, d_hidden, **factory), nn.GELU(), nn.Linear(d_hidden, d_in, **factory)
    )


class STHMBlock(nn.Module):
    """One STanHop block: a cross-time Hopfield stage, then a cross-series router stage.

    Input and output ``(B, C, N, d)``.

    * Time stage, per series over its ``N`` segments: ``U₁ = LN(U + Drop(GSH(U, U)))``,
      ``U₂ = LN(U₁ + Drop(MLP(U₁)))``.
    * Series stage, per segment over the ``C`` series: ``c`` learned queries pool the series,
      ``Z = GSH(P, S)`` ``(c, d)``; every series retrieves from them, ``R = GSH(S, Z)``;
      ``V₁ = LN(S + Drop(R))``, ``V₂ = LN(V₁ + Drop(MLP(V₁)))``. Linear in ``C``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        factor: int,
        dropout: float = 0.0,
        association: Association | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        if factor < 1:
            raise ValueError(f"factor must be >= 1, got {factor}")
        association = Association() if association is None else association
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.cross_time = _hopfield(d_model, num_heads, dropout, association, factory)
        self.series_pool = _hopfield(d_model, num_heads, dropout, association, factory)
        self.series_receive = _hopfield(d_model, num_heads, dropout, association, factory)
        self.routers = nn.Parameter(torch.empty(factor, d_model, **factory))
        self.norm1, self.norm2, self.norm3, self.norm4 = (
            nn.LayerNorm(d_model, **factory) for _ in range(4)
        )
        self.mlp_time = _mlp(d_model, d_ff, factory)
        self.mlp_series = _mlp(d_model, d_ff, factory)
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Routers ~ N(0, 1) (never constant: equal patterns would stay equal); the rest default."""
        nn.init.normal_(self.routers)
        _reset_children(self)

    def forward(self, x: Tensor) -> Tensor:
        b, c, n, d = x.shape
        u = x.reshape(b * c, n, d)
        u = self.norm1(u + self.dropout(self.cross_time(u)))
        u = self.norm2(u + self.dropout(self.mlp_time(u)))
        s = u.reshape(b, c, n, d).transpose(1, 2).reshape(b * n, c, d)
        routers = self.routers.unsqueeze(0).expand(b * n, -1, -1)
        pooled = self.series_pool((s, routers, s))  # (B·N, factor, d)
        received = self.series_receive((pooled, s, pooled))  # (B·N, C, d)
        v = self.norm3(s + self.dropout(received))
        v = self.norm4(v + self.dropout(self.mlp_series(v)))
        return v.reshape(b, n, c, d).transpose(1, 2)


class DecoderLayer(nn.Module):
    """Decoder layer ``j``: STHM block, cross association with encoder output ``j``, prediction.

    ``forward(z (B, C, N_out, d), memory (B, C, N_j, d)) -> (z (B, C, N_out, d),
    prediction (B, C, N_out, L))``.
    """

    def __init__(
        self,
        seg_len: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        factor: int,
        dropout: float = 0.0,
        association: Association | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        association = Association() if association is None else association
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.block = STHMBlock(d_model, num_heads, d_ff, factor, dropout, association, **factory)
        self.cross = _hopfield(d_model, num_heads, dropout, association, factory)
        self.norm1 = nn.LayerNorm(d_model, **factory)
        self.norm2 = nn.LayerNorm(d_model, **factory)
        self.mlp = _mlp(d_model, d_model, factory)
        self.dropout = nn.Dropout(dropout)
        self.predict = nn.Linear(d_model, seg_len, **factory)

    def reset_parameters(self) -> None:
        _reset_children(self)

    def forward(self, z: Tensor, memory: Tensor) -> tuple[Tensor, Tensor]:
        z = self.block(z)
        b, c, n, d = z.shape
        queries = z.reshape(b * c, n, d)
        stored = memory.reshape(b * c, memory.shape[2], d)
        z1 = self.norm1(queries + self.dropout(self.cross((stored, queries, stored))))
        z2 = self.norm2(z1 + self.mlp(z1))
        return z2.reshape(b, c, n, d), self.predict(z2).reshape(b, c, n, -1)


class STanHopNet(nn.Module):
    """STanHop-Net: ``(B, T, C) -> (B, τ, C)`` for fixed ``T`` (``in_len``) and ``τ`` (``out_len``).

    Args:
        num_series: number of series ``C``.
        in_len, out_len: window lengths ``T`` and ``τ`` (fixed: the position tables depend on them).
        seg_len: segment length ``L``.
        win_size: merge window ``w`` (1: no coarse-graining, as in every OutEffHop run).
        factor: learned router patterns ``c`` per block.
        d_model, d_ff, num_heads: widths.
        e_layers: encoder blocks ``E`` (the decoder has ``E + 1`` layers).
        dropout: dropout of residual branches and association weights.
        association: the association of every Hopfield module (GSH by default).
        baseline: add the per-series input mean to the output.
    """

    def __init__(
        self,
        num_series: int,
        in_len: int,
        out_len: int,
        seg_len: int,
        win_size: int = 4,
        factor: int = 10,
        d_model: int = 512,
        d_ff: int = 1024,
        num_heads: int = 8,
        e_layers: int = 3,
        dropout: float = 0.0,
        association: Association | None = None,
        baseline: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if min(num_series, in_len, out_len, seg_len, win_size, e_layers) < 1:
            raise ValueError(
                "num_series, in_len, out_len, seg_len, win_size, e_layers must be >= 1"
            )
        association = Association() if association is None else association
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.num_series, self.in_len, self.out_len = num_series, in_len, out_len
        self.seg_len, self.baseline, self.association = seg_len, baseline, association
        n_in, n_out = math.ceil(in_len / seg_len), math.ceil(out_len / seg_len)
        self.embedding = SegmentEmbedding(seg_len, d_model, **factory)
        self.encoder_position = nn.Parameter(torch.empty(1, num_series, n_in, d_model, **factory))
        self.decoder_position = nn.Parameter(torch.empty(1, num_series, n_out, d_model, **factory))
        self.pre_norm = nn.LayerNorm(d_model, **factory)
        self.merges = nn.ModuleList(
            SegmentMerging(d_model, win_size, **factory) if win_size > 1 else nn.Identity()
            for _ in range(e_layers - 1)
        )
        block_args = (d_model, num_heads, d_ff, factor, dropout, association)
        self.encoder = nn.ModuleList(STHMBlock(*block_args, **factory) for _ in range(e_layers))
        self.decoder = nn.ModuleList(
            DecoderLayer(seg_len, *block_args, **factory) for _ in range(e_layers + 1)
        )
        nn.init.normal_(self.encoder_position)
        nn.init.normal_(self.decoder_position)

    def reset_parameters(self) -> None:
        """Re-initialise everything: position tables and routers N(0, 1), layers by default."""
        nn.init.normal_(self.encoder_position)
        nn.init.normal_(self.decoder_position)
        _reset_children(self)

    def encode(self, x: Tensor) -> list[Tensor]:
        """Encoder outputs ``[e_0, …, e_E]``, ``e_k (B, C, N_k, d)``; ``e_0`` is the embedding."""
        h = self.pre_norm(self.embedding(x) + self.encoder_position)
        outputs = [h]
        for k, block in enumerate(self.encoder):
            if k > 0:
                h = self.merges[k - 1](h)
            h = block(h)
            outputs.append(h)
        return outputs

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[1:] != (self.in_len, self.num_series):
            raise ValueError(
                f"x must be (B, {self.in_len}, {self.num_series}) (in_len and num_series are fixed "
                f"at construction), got {tuple(x.shape)}"
            )
        memories = self.encode(x)
        z = self.decoder_position.expand(x.shape[0], -1, -1, -1)
        prediction = torch.zeros((), dtype=x.dtype, device=x.device)
        for layer, memory in zip(self.decoder, memories, strict=True):
            z, y = layer(z, memory)
            prediction = prediction + y  # (B, C, N_out, L), summed over layers
        b, c, n, length = prediction.shape
        out = prediction.reshape(b, c, n * length).transpose(1, 2)[:, : self.out_len]
        if self.baseline:
            out = out + x.mean(dim=1, keepdim=True)
        return out

    def alphas(self) -> dict[str, float]:
        """The effective α of every learnable-entmax module, by module name (empty otherwise)."""
        found: dict[str, float] = {}
        for name, module in self.named_modules():
            alpha = module.alpha if isinstance(module, Entmax) else None
            if isinstance(alpha, Tensor):
                found[name] = float(alpha.detach().float().mean())
        return found

    def parameter_counts(self) -> dict[str, int]:
        """``{"total", "without_position_tables"}`` (the latter is OutEffHop Table 1's "35.13M")."""
        total = sum(p.numel() for p in self.parameters())
        tables = self.encoder_position.numel() + self.decoder_position.numel()
        return {"total": total, "without_position_tables": total - tables}


def figure_layer(e_layers: int) -> int:
    """The decoder layer Figure 2(d) draws: the paper's layer 9 of the 12 decoder layers (E = 11),
    read as index 9 (as the ``outliers`` experiment reads BERT's layer 10 of 12), i.e. the third
    from the top at any depth; index 0 when there are fewer than three."""
    return max(0, e_layers - 2)

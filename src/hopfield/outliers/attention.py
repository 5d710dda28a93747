"""Attention diagnostics per layer and head: the Softmax_1 "missing mass", sink attention, logit range.

:class:`AttentionRecorder` attaches a probe to every attention module of a model that runs on one
of the attention functions of :mod:`hopfield.integrations` (the probe makes them take the explicit
path, so weights exist). Per layer and head it streams:

* ``row_sum``: mean ``Σ_j p_ij`` over query rows (1 for softmax; ``γ < 1`` for Softmax_1 heads that
  "abstain"),
* ``special_mass``: mean attention mass on special keys (delimiters, BOS/CLS): by default the first
  position, or the boolean ``special_mask (B, S)`` set before each forward,
* ``logit_range``: mean over rows of ``max_j z_ij - min_j z_ij`` over unmasked keys,
* ``max_logit``: the largest unmasked logit seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from hopfield.tables import Table

__all__ = ["DEAD_ROW_SUM", "AttentionRecorder"]

#: Mean ``row_sum`` below which a model's attention carries no weight: every weight clipped to 0
#: (a :class:`~hopfield.functional.ClippedSoftmax` whose threshold lies above the model's initial
#: weights), so no gradient reaches its queries and keys and comparisons with it are not about
#: attention. Softmax rows sum to 1; Softmax_1 rows to 0.77–0.99 in the committed BERT and ViT runs.
DEAD_ROW_SUM = 0.01


@dataclass
class _HeadStats:
    rows: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    row_sum: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    special: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    logit_range: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    max_logit: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))

    def update(self, weights: Tensor, masked: Tensor, special: Tensor) -> None:
        valid = torch.isfinite(masked)  # (B, H, L, S)
        rows = valid.any(dim=-1)  # (B, H, L)
        w = weights.detach().double()
        row_sum = torch.where(rows, w.sum(-1), 0.0)
        mass = torch.where(rows, (w * special[:, None, None, :]).sum(-1), 0.0)
        z = masked.detach().double()
        high = torch.where(valid, z, -torch.inf).amax(-1)
        low = torch.where(valid, z, torch.inf).amin(-1)
        spread = torch.where(rows, high - low, 0.0)
        top = torch.where(rows, high, -torch.inf).amax(dim=(0, 2))
        sums = [
            rows.double().sum((0, 2)),
            row_sum.sum((0, 2)),
            mass.sum((0, 2)),
            spread.sum((0, 2)),
        ]
        if self.rows.numel() == 0:
            self.rows, self.row_sum, self.special, self.logit_range = sums
            self.max_logit = top
        else:
            self.rows += sums[0]
            self.row_sum += sums[1]
            self.special += sums[2]
            self.logit_range += sums[3]
            self.max_logit = torch.maximum(self.max_logit, top)

    def means(self) -> dict[str, Tensor]:
        count = self.rows.clamp_min(1)
        return {
            "row_sum": self.row_sum / count,
            "special_mass": self.special / count,
            "logit_range": self.logit_range / count,
            "max_logit": self.max_logit,
        }


class _Probe:
    def __init__(self, recorder: AttentionRecorder, name: str) -> None:
        self.recorder, self.name = recorder, name

    def scores(self, module: nn.Module, scores: Tensor) -> Tensor:
        return scores

    def weights(self, module: nn.Module, weights: Tensor, masked_scores: Tensor) -> Tensor:
        self.recorder._update(self.name, weights, masked_scores)
        return weights


class AttentionRecorder:
    """Per-layer, per-head attention statistics of a ``transformers`` model (see module docstring).

    Args:
        model: a model built by :func:`hopfield.integrations.build_model` (any variant, including
            ``"softmax"``); models on ``"sdpa"``/``"eager"`` must first be switched with
            ``model.set_attn_implementation("hopfield_softmax")``.

    Attributes:
        special_mask: ``None`` (the first key position is special) or a boolean ``(B, S)`` tensor
            marking special keys of the next forward passes.

    Use as a context manager or :meth:`attach` / :meth:`remove`.
    """

    def __init__(self, model: nn.Module) -> None:
        from hopfield.integrations import attention_modules
        from hopfield.integrations.attention import attention_names, variant_name

        config = getattr(model, "config", None)
        implementation = getattr(config, "_attn_implementation", None)
        if variant_name(implementation) is None:  # type: ignore[arg-type]
            raise ValueError(
                f"model: attention {implementation!r} has no probes; use a hopfield variant "
                f"({list(attention_names())}), e.g. "
                "model.set_attn_implementation('hopfield_softmax')"
            )
        self.modules = attention_modules(model)
        self.special_mask: Tensor | None = None
        self.stats: dict[str, _HeadStats] = {name: _HeadStats() for name, _ in self.modules}
        self._probes = {name: _Probe(self, name) for name, _ in self.modules}
        self.attach()

    def attach(self) -> AttentionRecorder:
        """Install the probes (idempotent)."""
        for name, module in self.modules:
            probes = module.__dict__.setdefault("_hopfield_probes", [])
            if self._probes[name] not in probes:
                probes.append(self._probes[name])
        return self

    def remove(self) -> None:
        """Remove the probes; statistics are kept."""
        for name, module in self.modules:
            probes = module.__dict__.get("_hopfield_probes", [])
            if self._probes[name] in probes:
                probes.remove(self._probes[name])

    def __enter__(self) -> AttentionRecorder:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def _update(self, name: str, weights: Tensor, masked: Tensor) -> None:
        batch, size = weights.shape[0], weights.shape[-1]
        if self.special_mask is None:
            special = torch.zeros(batch, size, dtype=torch.float64, device=weights.device)
            special[:, 0] = 1.0
        else:
            if self.special_mask.shape != (batch, size):
                raise ValueError(
                    f"special_mask must have shape (B, S) = {(batch, size)}, "
                    f"got {tuple(self.special_mask.shape)}"
                )
            special = self.special_mask.to(device=weights.device, dtype=torch.float64)
        self.stats[name].update(weights, masked, special)

    def per_head(self) -> dict[str, dict[str, Tensor]]:
        """Layer name -> statistic -> per-head values ``(H,)``."""
        return {name: s.means() for name, s in self.stats.items() if s.rows.numel()}

    def per_layer(self) -> dict[str, dict[str, float]]:
        """Layer name -> statistic -> mean over heads (``max_logit``: max over heads)."""
        out = {}
        for name, stats in self.per_head().items():
            out[name] = {
                k: float(v.max() if k == "max_logit" else v.mean()) for k, v in stats.items()
            }
        return out

    def table(self, name: str = "attention diagnostics") -> Table:
        """One row per layer and head."""
        rows = [
            [
                layer,
                head,
                *(
                    float(stats[k][head])
                    for k in ("row_sum", "special_mass", "logit_range", "max_logit")
                ),
            ]
            for layer, stats in self.per_head().items()
            for head in range(stats["row_sum"].numel())
        ]
        return Table(
            name=name,
            columns=["layer", "head", "row sum", "special mass", "logit range", "max logit"],
            rows=rows,
            caption="Mean attention row sum (Softmax_1 abstention), mass on special keys, and logit range.",
        )

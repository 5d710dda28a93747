"""Multiple-instance learning with Hopfield pooling: the model, the pooling methods, evaluation.

The network of the nonparametric Hopfield paper (Hu et al., ICML 2025, Appendix G.2-G.3) and of its
official code::

    instances (B, S, F) -> Linear(F, D) -> LayerNorm -> Dropout
        -> HopfieldPooling(D, quantity=Q, num_heads=H)        # Q learned state patterns
        -> GELU -> LayerNorm -> Dropout -> flatten (B, Q·D) -> Linear(Q·D, 1)  -> logit (B,)

Padding (``padding_mask`` ``True`` = padded instance) is handled by the pooling's
``key_padding_mask``, so variable-size bags are batched without a Python loop over bags. The
dropout at both places is the paper's "bag dropout"; the association weights have their own
``attention_dropout`` (0 in the real-world MIL experiments of the paper).

:func:`pooling_method` maps the names of the paper's model family (``"dense"``, ``"sparse"``,
``"topk-20"``, ``"random-mask-50"``, ``"linear"``, ``"random-features"``, ``"outeffhop"``, ...)
to a separation and a structure; :func:`evaluate` gives loss, accuracy and ROC-AUC. Training
runs through :class:`hopfield.training.Trainer`
(:func:`hopfield.experiments.mil_common.train_mil_model` holds the experiments' recipe).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hopfield.data.mil import BagBatches
from hopfield.functional import Dense, Entmax, Separation, Softmax, SoftmaxN, Sparsemax, Structure
from hopfield.functional.efficient import RandomMask, TopK
from hopfield.functional.efficient_kernel import Linear, RandomFeatures
from hopfield.nn.hopfield import HopfieldPooling

__all__ = [
    "POOLING_METHODS",
    "GeneratorState",
    "MILNet",
    "evaluate",
    "pooling_method",
    "predict",
    "roc_auc",
    "standardize",
]

POOLING_METHODS = (
    "dense",
    "sparse",
    "entmax",
    "outeffhop",
    "topk-20",
    "topk-50",
    "topk-80",
    "random-mask-20",
    "random-mask-50",
    "random-mask-80",
    "linear",
    "random-features",
)
"""Names accepted by :func:`pooling_method` (``topk-P`` and ``random-mask-P`` take any P in 1..100)."""


def pooling_method(name: str, *, seed: int | None = None) -> tuple[Separation, Structure]:
    """The ``(separation, structure)`` pair of a named member of the Hopfield model family.

    * ``"dense"``: softmax over all instances (Ramsauer et al.);
    * ``"sparse"``: sparsemax (Hu et al. 2023); ``"entmax"``: 1.5-entmax;
    * ``"outeffhop"``: Softmax_1 (OutEffHop's no-op memory);
    * ``"topk-P"``: softmax over the ``max(1, int(P/100 · valid))`` largest scores (P in 1..100);
    * ``"random-mask-P"``: each query sees a random ``(100 - P)%`` of the instances, i.e. ``P`` is
      the masking probability of the paper (fixed subsets in eval mode, seeded by ``seed``; in
      training drawn from a CPU generator seeded with ``seed``, whose state :class:`MILNet`
      keeps in its state dict, or from torch's global generator without a seed);
    * ``"linear"``: the ``elu + 1`` kernel; ``"random-features"``: positive random features.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    match = re.fullmatch(r"(topk|random-mask)-(\d+)", name)
    if match:
        percent = int(match.group(2))
        if not 1 <= percent <= 100 or (match.group(1) == "random-mask" and percent == 100):
            raise ValueError(f"the percentage in {name!r} must lie in 1..100 (below 100 for masks)")
        if match.group(1) == "topk":
            return Softmax(), TopK(fraction=percent / 100)
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        return Softmax(), RandomMask(fraction=1 - percent / 100, seed=seed, generator=generator)
    simple: dict[str, Callable[[], Separation]] = {
        "dense": Softmax,
        "sparse": Sparsemax,
        "entmax": lambda: Entmax(alpha=1.5),
        "outeffhop": lambda: SoftmaxN(1.0),
    }
    if name in simple:
        return simple[name](), Dense()
    if name == "linear":
        return Softmax(), Linear()
    if name == "random-features":
        return Softmax(), RandomFeatures(seed=seed)
    raise ValueError(f"name must be one of {', '.join(POOLING_METHODS)}, got {name!r}")


class GeneratorState(nn.Module):
    """Keeps the state of ``generator`` in the state dict of the model it belongs to (as
    ``<name>._extra_state``, a ``uint8`` tensor), so that a checkpoint of the model resumes its
    random draws (the random-mask subsets of training) where they were."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        self.generator = generator

    def get_extra_state(self) -> Tensor:
        return self.generator.get_state()

    def set_extra_state(self, state: Tensor) -> None:
        self.generator.set_state(state.cpu())


class MILNet(nn.Module):
    """Bag classifier: embedding, Hopfield pooling, and a linear head (see the module docstring).

    Args:
        input_size: instance feature size ``F``.
        embedding_size: the width ``D`` of the embedding (the paper's "layer width").
        num_heads: heads of the pooling ``H``.
        head_size: per-head size of the Hopfield space; default ``D // H``.
        quantity: number of learned state patterns ``Q`` ("num of pattern").
        method: a name for :func:`pooling_method`; ignored for what ``separation`` /
            ``structure`` give explicitly.
        separation, structure: explicit association parts (override ``method``).
        scale: the inverse temperature beta of the pooling ("scaling factor").
        scale_learnable: learn beta per head.
        dropout: bag dropout after the embedding and after the pooling.
        attention_dropout: dropout on the association weights.
        tie_values_to_keys: values ``V = (Y W_K) W_V`` as in the papers' layer (eq. F.2).
        seed: seed of the random-mask structure (its training draws then come from a generator
            whose state is in the state dict, :class:`GeneratorState`) and of random features.
    """

    def __init__(
        self,
        input_size: int,
        *,
        embedding_size: int = 256,
        num_heads: int = 4,
        head_size: int | None = None,
        quantity: int = 1,
        method: str = "dense",
        separation: Separation | None = None,
        structure: Structure | None = None,
        scale: float = 0.1,
        scale_learnable: bool = False,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        tie_values_to_keys: bool = True,
        seed: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for arg, value in (("input_size", input_size), ("embedding_size", embedding_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive int, got {value!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        named_separation, named_structure = pooling_method(method, seed=seed)
        self.method = method
        self.embedding = nn.Linear(input_size, embedding_size, **factory)
        self.norm_embedding = nn.LayerNorm(embedding_size, **factory)
        self.pooling = HopfieldPooling(
            embedding_size,
            quantity,
            num_heads=num_heads,
            hidden_size=head_size,
            pattern_size=head_size,
            separation=separation if separation is not None else named_separation,
            structure=structure if structure is not None else named_structure,
            scale=scale,
            scale_learnable=scale_learnable,
            dropout=attention_dropout,
            tie_values_to_keys=tie_values_to_keys,
            **factory,
        )
        self.norm_pooled = nn.LayerNorm(embedding_size, **factory)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(quantity * embedding_size, 1, **factory)
        chosen = structure if structure is not None else named_structure
        if isinstance(chosen, RandomMask) and chosen.generator is not None:
            self.mask_draws = GeneratorState(chosen.generator)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Default initialisation of the linear layers and LayerNorms; the pooling's own."""
        self.embedding.reset_parameters()
        self.norm_embedding.reset_parameters()
        self.pooling.reset_parameters()
        self.norm_pooled.reset_parameters()
        self.head.reset_parameters()

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """Bag logits.

        Args:
            x: ``(B, S, F)`` instances (padded).
            padding_mask: ``(B, S)`` bool, ``True`` at padded instances; ``None`` for full bags.

        Returns:
            ``(B,)`` logits (positive bag when > 0).
        """
        if x.dim() != 3:
            raise ValueError(f"x must be (B, S, F), got shape {tuple(x.shape)}")
        if padding_mask is not None and padding_mask.shape != x.shape[:2]:
            raise ValueError(
                f"padding_mask must be {tuple(x.shape[:2])}, got {tuple(padding_mask.shape)}"
            )
        h = self.dropout(self.norm_embedding(self.embedding(x)))
        pooled = self.pooling(h, key_padding_mask=padding_mask)
        assert isinstance(pooled, Tensor)
        out = self.dropout(self.norm_pooled(F.gelu(pooled)))
        return self.head(out.flatten(1)).squeeze(-1)


def roc_auc(scores: Tensor | np.ndarray, labels: Tensor | np.ndarray) -> float:
    """Area under the ROC curve (the Mann-Whitney statistic, ties counted one half).

    Returns ``nan`` when ``labels`` hold a single class.
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel() > 0.5
    if s.shape != y.shape:
        raise ValueError(f"scores {s.shape} and labels {y.shape} must have the same length")
    positives, negatives = int(y.sum()), int((~y).sum())
    if positives == 0 or negatives == 0:
        return math.nan
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    average_rank = (upper - (counts - 1) / 2.0)[inverse]  # 1-based average ranks of ties
    return float(
        (average_rank[y].sum() - positives * (positives + 1) / 2) / (positives * negatives)
    )


@torch.no_grad()
def predict(model: nn.Module, data: BagBatches, batch_size: int = 256) -> Tensor:
    """Logits ``(len(data),)`` of ``model`` (in eval mode) over ``data``, in order, on the device
    of the model's parameters."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    outputs = []
    for start in range(0, len(data), batch_size):
        x, mask, _ = data.batch(torch.arange(start, min(start + batch_size, len(data))))
        outputs.append(model(x.to(device), None if mask is None else mask.to(device)))
    model.train(was_training)
    return torch.cat(outputs)


def evaluate(model: nn.Module, data: BagBatches, batch_size: int = 256) -> dict[str, float]:
    """``{"loss": BCE, "accuracy": at logit > 0, "auc": ROC-AUC}`` of ``model`` on ``data``."""
    logits = predict(model, data, batch_size)
    labels = data.labels.to(logits.device, logits.dtype)
    return {
        "loss": float(F.binary_cross_entropy_with_logits(logits, labels)),
        "accuracy": float(((logits > 0).to(labels.dtype) == labels).float().mean()),
        "auc": roc_auc(logits.cpu(), labels.cpu()),
    }


def standardize(train: Tensor, *others: Tensor, eps: float = 1e-6) -> list[Tensor]:
    """Standardise features ``(N, F)`` with the mean and std of ``train`` (no test leakage)."""
    mean, std = train.mean(dim=0), train.std(dim=0).clamp_min(eps)
    return [(t - mean) / std for t in (train, *others)]

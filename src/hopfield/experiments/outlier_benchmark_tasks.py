"""The tasks of ``outlier-benchmark``: Bigram-Backcopy and a fixed-BOS WikiText-2 language model.

**Bigram-Backcopy** (Guo et al. 2024, *Active-Dormant Attention Heads*, §2): every sequence starts
with the BOS token ``0``; the other tokens ``1 … V−1`` follow a fixed Markov chain (bigram
transition matrix), except after one of a few **trigger** tokens, where the next token copies the
token just before the trigger. A one-to-three-layer transformer solves it with a head that is
*active* on triggers (attends to the previous token) and *dormant* elsewhere, where it parks its
attention on the BOS token: the attention sink, with a value-state drain and a residual-state
peak on BOS. Here the transition rows are drawn from a Dirichlet distribution (concentration
``alpha``; small values give peaked, learnable bigrams) and the triggers are the ``triggers``
tokens of highest stationary probability, both from a fixed ``chain_seed``; the token after BOS is
drawn from the stationary distribution of the non-trigger tokens, so a backcopy never copies BOS.

**Fixed-BOS language model** (Gu et al., ICLR 2025: a fixed first token gives the strongest
sink): WikiText-2 through the project's byte-level BPE (:mod:`hopfield.data.text`), packed into
blocks of ``length − 1`` tokens, each preceded by ``<s>`` (which occurs nowhere else; lines start
with ``</s>`` as in OPT).

Generation is vectorised over sequences and seeded by a :class:`torch.Generator`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["BOS", "BigramBackcopy", "bigram_backcopy", "wikitext_with_bos"]

#: The BOS token of Bigram-Backcopy (position 0 of every sequence).
BOS = 0


@dataclass(frozen=True)
class BigramBackcopy:
    """The Markov chain of the task: ``transition (V, V)`` (row BOS unused), ``triggers``."""

    transition: Tensor
    triggers: Tensor
    start: Tensor


def _chain(vocab_size: int, triggers: int, alpha: float, chain_seed: int) -> BigramBackcopy:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 4:
        raise ValueError(f"vocab_size must be an int >= 4, got {vocab_size!r}")
    if (
        isinstance(triggers, bool)
        or not isinstance(triggers, int)
        or not 1 <= triggers < vocab_size - 2
    ):
        raise ValueError(f"triggers must be an int in [1, vocab_size - 3], got {triggers!r}")
    if not alpha > 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    g = torch.Generator().manual_seed(chain_seed)
    n = vocab_size - 1  # tokens 1 … V−1
    gamma = torch._standard_gamma(torch.full((n, n), float(alpha), dtype=torch.float64), g)
    rows = gamma / gamma.sum(dim=1, keepdim=True)
    stationary = torch.full((n,), 1.0 / n, dtype=torch.float64)
    for _ in range(200):
        stationary = stationary @ rows
    chosen = torch.argsort(stationary, descending=True, stable=True)[:triggers]
    start = stationary.clone()
    start[chosen] = 0.0
    transition = torch.zeros(vocab_size, vocab_size, dtype=torch.float64)
    transition[1:, 1:] = rows
    return BigramBackcopy(transition, chosen + 1, torch.cat([torch.zeros(1), start / start.sum()]))


def _draw(cdf: Tensor, u: Tensor) -> Tensor:
    """Row-wise inverse-CDF sampling: ``cdf (N, V)``, ``u (N,)`` -> indices ``(N,)``."""
    return torch.searchsorted(cdf, u[:, None]).squeeze(1).clamp_max(cdf.shape[1] - 1)


def bigram_backcopy(
    count: int,
    length: int,
    *,
    vocab_size: int = 64,
    triggers: int = 3,
    alpha: float = 0.2,
    chain_seed: int = 0,
    seed: int = 0,
) -> tuple[Tensor, BigramBackcopy]:
    """``count`` Bigram-Backcopy sequences ``(count, length)`` int64 and their chain.

    Args:
        count, length: sequences and tokens per sequence (BOS included), ``length >= 3``.
        vocab_size: ``V`` (BOS and ``V − 1`` ordinary tokens).
        triggers: how many trigger tokens.
        alpha: Dirichlet concentration of the transition rows.
        chain_seed: seed of the chain (the same task for every split).
        seed: seed of the sequences.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int, got {count!r}")
    if isinstance(length, bool) or not isinstance(length, int) or length < 3:
        raise ValueError(f"length must be an int >= 3, got {length!r}")
    chain = _chain(vocab_size, triggers, alpha, chain_seed)
    g = torch.Generator().manual_seed(seed)
    cdf = chain.transition.cumsum(dim=1)
    start_cdf = chain.start.cumsum(dim=0).expand(count, -1).contiguous()
    is_trigger = torch.zeros(vocab_size, dtype=torch.bool)
    is_trigger[chain.triggers] = True
    out = torch.empty(count, length, dtype=torch.long)
    out[:, 0] = BOS
    out[:, 1] = _draw(start_cdf, torch.rand(count, generator=g, dtype=torch.float64))
    for t in range(2, length):
        current = out[:, t - 1]
        u = torch.rand(count, generator=g, dtype=torch.float64)
        bigram = _draw(cdf[current], u)
        out[:, t] = torch.where(is_trigger[current], out[:, t - 2], bigram)
    return out, chain


def wikitext_with_bos(
    data_dir: Any,
    vocab_size: int,
    length: int,
    train_blocks: int,
    eval_blocks: int,
    max_lines: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``(train, held-out)`` WikiText-2 blocks ``(N, length)`` starting with ``<s>``.

    The tokenizer is trained on the training split (cached; the main process first under
    several processes); ``max_lines`` keeps the first lines of each split (quick runs).
    """
    from hopfield.data.text import load_text, token_blocks, train_tokenizer
    from hopfield.experiments.outliers_tasks import main_process_first

    if isinstance(length, bool) or not isinstance(length, int) or length < 3:
        raise ValueError(f"length must be an int >= 3, got {length!r}")
    splits = load_text("wikitext-2", data_dir, max_lines=max_lines)
    tokenizer = main_process_first(lambda: train_tokenizer("bpe", splits.train, vocab_size))
    bos = tokenizer.token_to_id("<s>")

    def blocks(lines: list[str], count: int) -> Tensor:
        body = token_blocks(tokenizer, lines, "bpe", length - 1, max_blocks=count)
        return torch.cat([torch.full((body.shape[0], 1), bos, dtype=torch.long), body], dim=1)

    return blocks(splits.train, train_blocks), blocks(splits.validation, eval_blocks)

"""Synthetic token streams in which most positions must not be updated by attention.

Bondarenko et al. (2023) trace attention outliers to heads that learn to "do nothing": where the
residual stream already holds what the next layer needs, a softmax head can only approximate a
no-op by putting its mass on low-information tokens (delimiters, ``[SEP]``, punctuation), which
needs a wide logit range and grows outliers. This module generates language-like sequences that
make that behaviour useful and frequent (OutEffHop spec §1.8, §7.4):

* **Markov content**: every content token has ``branching`` possible successors from a fixed,
  seeded table (probabilities ``∝ 1/rank``); the next content token depends only on the current
  one, so attention is not needed to predict it (a head should abstain);
* **delimiters** (rate ``delimiter_rate`` after a content token) end a "sentence";
* **filler tokens** (rate ``filler_rate``) carry no information and do not change the Markov state;
* **recall**: a new sentence starts, with probability ``recall_rate``, with a ``QUERY`` token
  followed by a copy of the first content token of the previous sentence: the only positions
  where attention is needed (any other sentence starts with a uniform random content token).

Token ids: ``PAD = 0`` (never generated), ``BOS = 1`` (position 0), ``DELIM = 2``, ``FILLER = 3``,
``QUERY = 4``, content tokens ``5 .. vocab_size - 1``. Everything is deterministic under the seeds
(``grammar_seed`` fixes the table, the ``seed`` of :func:`generate` the samples).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.data import Dataset

__all__ = [
    "BOS",
    "DELIM",
    "FILLER",
    "FIRST_CONTENT",
    "PAD",
    "QUERY",
    "SyntheticSample",
    "SyntheticText",
    "SyntheticTextDataset",
    "generate",
    "transition_table",
]

PAD, BOS, DELIM, FILLER, QUERY = 0, 1, 2, 3, 4
FIRST_CONTENT = 5


@dataclass(frozen=True)
class SyntheticText:
    """The grammar of a synthetic token stream (see the module docstring).

    Attributes:
        vocab_size: total vocabulary including the five special tokens (``>= 8``).
        seq_len: tokens per sequence, ``BOS`` included (``>= 4``).
        delimiter_rate: probability of a delimiter after a content token, in ``[0, 1)``.
        filler_rate: probability of a filler token at any position, in ``[0, 1)``.
        recall_rate: probability that a sentence starts with ``QUERY`` + recalled token, ``[0, 1]``.
        branching: successors per content token (``1 .. number of content tokens``).
        grammar_seed: seed of the successor table.
    """

    vocab_size: int = 64
    seq_len: int = 64
    delimiter_rate: float = 0.15
    filler_rate: float = 0.1
    recall_rate: float = 0.5
    branching: int = 3
    grammar_seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.vocab_size, int) or self.vocab_size < FIRST_CONTENT + 3:
            raise ValueError(
                f"vocab_size must be an int >= {FIRST_CONTENT + 3}, got {self.vocab_size!r}"
            )
        if not isinstance(self.seq_len, int) or self.seq_len < 4:
            raise ValueError(f"seq_len must be an int >= 4, got {self.seq_len!r}")
        for name in ("delimiter_rate", "filler_rate"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {value!r}")
        if not 0.0 <= self.recall_rate <= 1.0:
            raise ValueError(f"recall_rate must lie in [0, 1], got {self.recall_rate!r}")
        if not isinstance(self.branching, int) or not 1 <= self.branching <= self.num_content:
            raise ValueError(
                f"branching must be an int in [1, {self.num_content}], got {self.branching!r}"
            )

    @property
    def num_content(self) -> int:
        """Number of content tokens."""
        return self.vocab_size - FIRST_CONTENT


@dataclass(frozen=True)
class SyntheticSample:
    """Generated sequences and per-position labels of what they are.

    Attributes:
        tokens: ``(N, T)`` token ids.
        special: ``(N, T)`` bool, ``True`` at low-information tokens (``BOS``, ``DELIM``,
            ``FILLER``): the keys a no-op head may attend to.
        recall: ``(N, T)`` bool, ``True`` at the recalled tokens (the positions whose prediction
            needs attention).
    """

    tokens: Tensor
    special: Tensor
    recall: Tensor


def transition_table(grammar: SyntheticText) -> tuple[Tensor, Tensor]:
    """The successor table of the Markov content.

    Returns:
        ``successors (C, branching)`` token ids (distinct per row) and ``probs (branching,)``
        (``∝ 1/rank``), with ``C = grammar.num_content``.
    """
    g = torch.Generator().manual_seed(grammar.grammar_seed)
    c = grammar.num_content
    ranks = torch.argsort(torch.rand(c, c, generator=g), dim=1)[:, : grammar.branching]
    probs = 1.0 / torch.arange(1, grammar.branching + 1, dtype=torch.float64)
    return ranks + FIRST_CONTENT, probs / probs.sum()


def generate(grammar: SyntheticText, num_sequences: int, seed: int) -> SyntheticSample:
    """``num_sequences`` sequences of the grammar, deterministic under ``seed``.

    Vectorised over sequences (one step per position; the random numbers are drawn up front).
    """
    if not isinstance(num_sequences, int) or num_sequences < 1:
        raise ValueError(f"num_sequences must be a positive int, got {num_sequences!r}")
    successors, probs = transition_table(grammar)
    g = torch.Generator().manual_seed(int(seed))
    n, length, c = num_sequences, grammar.seq_len, grammar.num_content
    tokens = torch.full((length, n), PAD, dtype=torch.long)  # position-major while generating
    recall = torch.zeros(length, n, dtype=torch.bool)
    tokens[0] = BOS
    # Markov state: current content token (-1 = sentence start), first content token of the
    # current and of the previous sentence (-1 = none yet), and whether QUERY was just emitted.
    current = torch.full((n,), -1, dtype=torch.long)
    first_now = torch.full((n,), -1, dtype=torch.long)
    first_prev = torch.full((n,), -1, dtype=torch.long)
    queried = torch.zeros(n, dtype=torch.bool)
    uniforms = torch.rand(length, 3, n, generator=g)
    choices = torch.multinomial(probs, n * length, replacement=True, generator=g).view(length, n)
    fresh_all = torch.randint(FIRST_CONTENT, grammar.vocab_size, (length, n), generator=g)
    for t in range(1, length):
        u_filler, u_delim, u_recall = uniforms[t]
        choice, fresh = choices[t], fresh_all[t]
        markov = successors[(current - FIRST_CONTENT).clamp(0, c - 1), choice]
        starting = current < 0
        emit = torch.where(starting, fresh, markov)
        emit = torch.where(queried, first_prev, emit)  # the recalled token
        is_recall = queried.clone()
        is_query = starting & ~queried & (first_prev >= 0) & (u_recall < grammar.recall_rate)
        is_delim = ~starting & ~queried & (u_delim < grammar.delimiter_rate)
        is_filler = ~queried & ~is_query & ~is_delim & (u_filler < grammar.filler_rate)
        is_content = ~(is_query | is_delim | is_filler)
        emit = torch.where(is_query, QUERY, emit)
        emit = torch.where(is_delim, DELIM, emit)
        emit = torch.where(is_filler, FILLER, emit)
        tokens[t] = emit
        recall[t] = is_recall
        # update the state
        first_now = torch.where(is_content & starting & ~is_recall, emit, first_now)
        first_now = torch.where(is_recall, emit, first_now)
        current = torch.where(is_content, emit, current)
        first_prev = torch.where(is_delim, first_now, first_prev)
        first_now = torch.where(is_delim, -1, first_now)
        current = torch.where(is_delim, -1, current)
        queried = is_query
    tokens, recall = tokens.T.contiguous(), recall.T.contiguous()
    special = (tokens == BOS) | (tokens == DELIM) | (tokens == FILLER)
    return SyntheticSample(tokens=tokens, special=special, recall=recall)


class SyntheticTextDataset(Dataset[dict[str, Tensor]]):
    """A causal-LM dataset over generated sequences: items ``{"input_ids": (T,), "labels": (T,)}``.

    ``labels`` equal ``input_ids`` (a ``transformers`` causal LM shifts them itself).

    Args:
        sample: the sequences (e.g. ``generate(grammar, n, seed)``).
    """

    def __init__(self, sample: SyntheticSample) -> None:
        if not isinstance(sample, SyntheticSample):
            raise TypeError(f"sample must be a SyntheticSample, got {type(sample).__name__}")
        self.sample = sample

    def __len__(self) -> int:
        return int(self.sample.tokens.shape[0])

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        ids = self.sample.tokens[index]
        return {"input_ids": ids, "labels": ids.clone()}

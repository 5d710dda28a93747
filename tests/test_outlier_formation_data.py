"""Synthetic token streams for the outlier-formation experiment: grammar, determinism, errors."""

from __future__ import annotations

import pytest
import torch

from hopfield.data.synthetic_text import (
    BOS,
    DELIM,
    FILLER,
    FIRST_CONTENT,
    PAD,
    QUERY,
    SyntheticText,
    SyntheticTextDataset,
    generate,
    transition_table,
)


def _check_sequence(seq: list[int], recall: list[bool], successors: dict[int, set[int]]) -> None:
    """A reference parser of one sequence: every grammar rule of the module docstring."""
    assert seq[0] == BOS
    current, first_now, first_prev = None, None, None
    after_query = False
    for token, is_recall in zip(seq[1:], recall[1:], strict=True):
        assert token != PAD
        assert is_recall == after_query
        if after_query:
            assert token == first_prev  # the recalled token
            first_now = current = token
            after_query = False
        elif token == QUERY:
            assert current is None and first_prev is not None  # only at a sentence start
            after_query = True
        elif token == DELIM:
            assert current is not None  # a sentence has at least one content token
            first_prev, first_now, current = first_now, None, None
        elif token == FILLER:
            pass  # no change of state
        else:
            assert token >= FIRST_CONTENT
            if current is None:
                first_now = token
            else:
                assert token in successors[current]  # Markov content
            current = token


def test_sequences_follow_the_grammar() -> None:
    grammar = SyntheticText(vocab_size=20, seq_len=48, delimiter_rate=0.25, recall_rate=0.7)
    succ, probs = transition_table(grammar)
    assert succ.shape == (15, 3) and torch.allclose(
        probs.sum(), torch.tensor(1.0, dtype=probs.dtype)
    )
    assert all(len(set(row.tolist())) == 3 for row in succ)
    successors = {FIRST_CONTENT + i: set(row.tolist()) for i, row in enumerate(succ)}
    sample = generate(grammar, 64, seed=3)
    assert sample.tokens.shape == (64, 48) and sample.tokens.dtype == torch.long
    for seq, rec in zip(sample.tokens.tolist(), sample.recall.tolist(), strict=True):
        _check_sequence(seq, rec, successors)
    expected_special = (sample.tokens == BOS) | (sample.tokens == DELIM) | (sample.tokens == FILLER)
    assert torch.equal(sample.special, expected_special)
    assert sample.recall.any()  # recall positions occur


def test_deterministic_under_seed_and_rates_matter() -> None:
    grammar = SyntheticText(seq_len=32)
    a, b, c = generate(grammar, 16, 0), generate(grammar, 16, 0), generate(grammar, 16, 1)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.recall, b.recall)
    assert not torch.equal(a.tokens, c.tokens)
    other_grammar = SyntheticText(seq_len=32, grammar_seed=1)
    assert not torch.equal(transition_table(grammar)[0], transition_table(other_grammar)[0])
    rare = generate(SyntheticText(seq_len=64, delimiter_rate=0.05), 256, 0).tokens
    frequent = generate(SyntheticText(seq_len=64, delimiter_rate=0.4), 256, 0).tokens
    assert (frequent == DELIM).float().mean() > 2 * (rare == DELIM).float().mean()
    none = generate(SyntheticText(seq_len=64, filler_rate=0.0, recall_rate=0.0), 64, 0)
    assert not (none.tokens == FILLER).any() and not (none.tokens == QUERY).any()


def test_dataset_items() -> None:
    sample = generate(SyntheticText(vocab_size=10, seq_len=8), 5, seed=0)
    dataset = SyntheticTextDataset(sample)
    assert len(dataset) == 5
    item = dataset[2]
    assert torch.equal(item["input_ids"], sample.tokens[2])
    assert torch.equal(item["labels"], item["input_ids"])
    with pytest.raises(TypeError, match="sample"):
        SyntheticTextDataset(sample.tokens)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"vocab_size": 7}, "vocab_size"),
        ({"seq_len": 3}, "seq_len"),
        ({"delimiter_rate": 1.0}, "delimiter_rate"),
        ({"filler_rate": -0.1}, "filler_rate"),
        ({"recall_rate": 1.5}, "recall_rate"),
        ({"vocab_size": 10, "branching": 6}, "branching"),
    ],
)
def test_bad_grammar(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        SyntheticText(**kwargs)  # type: ignore[arg-type]


def test_bad_count() -> None:
    with pytest.raises(ValueError, match="num_sequences"):
        generate(SyntheticText(), 0, seed=0)

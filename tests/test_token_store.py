"""The memory-mapped token store equals the in-memory token blocks, block for block."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hopfield.data.text import special_ids, token_blocks, train_tokenizer
from hopfield.data.token_store import TokenBlockStore, build_once, stream_lines

LINES = [
    f"the {w} sat on mat number {i} , said the {w} ."
    for i, w in zip(range(400), ["cat", "dog", "owl", "fox"] * 100, strict=True)
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    cache = tmp_path_factory.mktemp("tok")
    return {
        kind: train_tokenizer(kind, LINES, 300, cache_dir=cache) for kind in ("wordpiece", "bpe")
    }


def _delimiters(tokenizer: object, kind: str) -> tuple[list[int], list[int]]:
    ids = special_ids(tokenizer, kind)
    return ([ids["cls"]], [ids["sep"]]) if kind == "wordpiece" else ([ids["bos"]], [])


def _encoder(tokenizer: object):  # type: ignore[no-untyped-def]
    return lambda batch: [e.ids for e in tokenizer.encode_batch(batch, add_special_tokens=False)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
@pytest.mark.parametrize("batch_lines", [1, 7, 10_000])
def test_store_equals_token_blocks(
    tokenizers: dict, kind: str, batch_lines: int, tmp_path: Path
) -> None:
    tokenizer = tokenizers[kind]
    before, after = _delimiters(tokenizer, kind)
    lines = [*LINES[:50], "", "   ", *LINES[50:120]]
    store = TokenBlockStore.build(
        tmp_path / "store",
        iter(lines),
        _encoder(tokenizer),
        16,
        vocab_size=300,
        before=before,
        after=after,
        batch_lines=batch_lines,
        description="test",
    )
    expected = token_blocks(tokenizer, lines, kind, 16)
    assert len(store) == len(expected) and store.meta["dtype"] == "uint16"
    assert torch.equal(store.tensor(), expected)
    assert all(torch.equal(store[i], expected[i]) for i in (0, 3, len(store) - 1, -1))
    assert store[0].dtype == torch.int64
    assert store.meta["lines"] == 120 and store.meta["description"] == "test"
    again = TokenBlockStore(tmp_path / "store")  # reopened: the same memory-mapped blocks
    assert torch.equal(again.tensor(5), expected[:5])
    with pytest.raises(IndexError):
        store[len(store)]


def test_max_blocks_wide_vocabularies_and_bad_input(tokenizers: dict, tmp_path: Path) -> None:
    tokenizer = tokenizers["bpe"]
    encode = _encoder(tokenizer)
    store = TokenBlockStore.build(
        tmp_path / "a", LINES, encode, 8, vocab_size=70_000, max_blocks=5, batch_lines=3
    )
    assert len(store) == 5 and store.meta["dtype"] == "uint32" and store.meta["lines"] < 400
    reference = torch.tensor(
        [i for e in tokenizer.encode_batch(LINES, add_special_tokens=False) for i in e.ids][:40]
    ).view(5, 8)
    assert torch.equal(store.tensor(), reference)
    with pytest.raises(ValueError, match="length"):
        TokenBlockStore.build(tmp_path / "b", LINES, encode, 1, vocab_size=300)
    with pytest.raises(ValueError, match="not one block"):
        TokenBlockStore.build(tmp_path / "c", ["cat"], encode, 64, vocab_size=300)
    assert not (tmp_path / "c").exists()
    with pytest.raises(FileNotFoundError, match="no finished token store"):
        TokenBlockStore(tmp_path / "missing")
    with pytest.raises(ValueError, match="name"):
        next(stream_lines("bookcorpus", "train"))
    with pytest.raises(ValueError, match="split"):
        next(stream_lines("wikitext-103", "test"))


def test_build_once_builds_only_when_unfinished(tokenizers: dict, tmp_path: Path) -> None:
    calls = []
    encode = _encoder(tokenizers["bpe"])

    def build() -> None:
        calls.append(1)
        TokenBlockStore.build(tmp_path / "s", LINES, encode, 8, vocab_size=300)

    first = build_once(tmp_path / "s", build)
    second = build_once(tmp_path / "s", build)
    assert calls == [1] and len(first) == len(second) > 0

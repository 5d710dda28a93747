"""The memory-mapped token store equals the in-memory token blocks, block for block."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hopfield.data.files import DataNotFoundError
from hopfield.data.text import special_ids, token_blocks, train_tokenizer
from hopfield.data.token_store import (
    TokenBlockStore,
    build_once,
    corpus_store,
    sample_lines,
    stream_lines,
)
from hopfield.experiments.outliers import ModelSettings
from hopfield.experiments.outliers_tasks import build_task

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


# --- streamed corpora ---------------------------------------------------------------------------

BOOKS = [f"book line {i} : the {w} read a page ." for i, w in enumerate(["cat", "owl"] * 150)]
WIKI = [f"wiki line {i} : the {w} is an animal ." for i, w in enumerate(["fox", "dog"] * 150)]
SOURCES = {"bookcorpus/bookcorpus": BOOKS, "google/wiki40b": WIKI}


class FakeHub:
    """``hub_dataset`` of a Hub that holds two small corpora; counts what it streamed."""

    def __init__(self, reachable: bool = True) -> None:
        self.reachable = reachable
        self.opened: list[str] = []

    def __call__(
        self, corpus: str, dataset: str, config: str | None, *, split: str, streaming: bool
    ) -> Iterator[dict[str, str]]:
        assert streaming, "a streamed corpus must not be downloaded whole"
        if not self.reachable:
            raise DataNotFoundError(f"corpus {corpus!r}: {dataset} is not reachable")
        self.opened.append(f"{dataset}/{split}")
        lines = SOURCES[dataset]
        part = lines[:200] if split == "train" else lines[200:]
        return iter([{"text": f"  {line} "} for line in ["", *part]])


def test_sample_lines_takes_every_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hopfield.data.text.hub_dataset", FakeHub())
    assert sample_lines("bookcorpus-wiki40b", "train", 6) == [*BOOKS[:3], *WIKI[:3]]
    assert list(stream_lines("bookcorpus-wiki40b", "validation")) == WIKI[200:]
    with pytest.raises(ValueError, match="count"):
        sample_lines("bookcorpus-wiki40b", "train", 1)


def test_corpus_store_equals_token_blocks(tokenizers: dict, tmp_path: Path) -> None:
    tokenizer = tokenizers["wordpiece"]
    store = corpus_store(tmp_path / "s", iter(LINES), tokenizer, "wordpiece", 16, max_blocks=9)
    assert torch.equal(store.tensor(), token_blocks(tokenizer, LINES, "wordpiece", 16)[:9])
    with pytest.raises(RuntimeError, match="no finished store"):
        build_once(tmp_path / "never", lambda: None)


def _text_settings(cache: Path, **changes: object) -> ModelSettings:
    settings = ModelSettings(
        family="bert", dataset="bookcorpus-wiki40b", layers=1, hidden=16, heads=2, ffn=32,
        steps=2, batch_size=4, lr=1e-3, warmup_steps=0, weight_decay=0.0, seq_len=16,
        vocab_size=120, eval_batches=2, eval_batch_size=2, cache_dir=str(cache),
    )  # fmt: skip
    return replace(settings, **changes)


def test_the_outlier_study_streams_bookcorpus_into_token_stores(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The paper corpus goes through memory-mapped stores built once, block for block the
    in-memory blocks of the same lines and tokenizer."""
    hub = FakeHub()
    monkeypatch.setattr("hopfield.data.text.hub_dataset", hub)
    settings = _text_settings(tmp_path)
    task = build_task(settings, None)
    assert isinstance(task.train, TokenBlockStore) and not task.stand_in
    assert "streamed" in task.description
    tokenizer = train_tokenizer("wordpiece", [*BOOKS[:200], *WIKI[:200]], 120, cache_dir=tmp_path)
    expected = token_blocks(tokenizer, [*BOOKS[:200], *WIKI[:200]], "wordpiece", 16)
    assert torch.equal(task.train.tensor(), expected)
    opened = len(hub.opened)
    again = build_task(settings, None)  # only the tokenizer's sample is streamed again
    assert hub.opened[opened:] == ["bookcorpus/bookcorpus/train", "google/wiki40b/train"]
    assert torch.equal(again.train.tensor(), expected)
    first = build_task(replace(settings, max_train=50), None)  # first lines; sampled tokenizer
    tokenizer = train_tokenizer("wordpiece", [*BOOKS[:25], *WIKI[:25]], 120, cache_dir=tmp_path)
    assert torch.equal(first.train.tensor(), token_blocks(tokenizer, BOOKS[:50], "wordpiece", 16))


def test_an_unreachable_streamed_corpus_is_absent_or_stood_in(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("hopfield.data.text.hub_dataset", FakeHub(reachable=False))
    settings = _text_settings(tmp_path, family="opt")
    with pytest.raises(DataNotFoundError, match="not reachable"):
        build_task(settings, None)
    task = build_task(settings, None, stand_in=True)
    assert task.stand_in and "STAND-IN" in task.description and len(task.train) == 8

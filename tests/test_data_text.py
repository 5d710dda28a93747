"""hopfield.data.text: WikiText-2 splits, offline tokenizers (cached), token blocks, masking."""

from __future__ import annotations

import builtins
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("tokenizers")

from hopfield.data import DataNotFoundError
from hopfield.data.text import (
    TextSplits,
    load_text,
    mask_tokens,
    special_ids,
    token_blocks,
    train_tokenizer,
)

LINES = [
    " = Heading = ",
    "",
    "the cat sat on the mat . the dog sat on the log .",
    "a <unk> word appears here , and the cat ran .",
    "dogs and cats are animals ; the mat is red .",
] * 6


def test_wikitext2_split_without_train_file(shared_data: Path) -> None:
    splits = load_text("wikitext-2", shared_data)
    assert "train on valid.txt, evaluate on test.txt" in splits.description
    assert len(splits.train) == 3760 and len(splits.validation) == 4358
    assert splits.train[1] == "= Homarus gammarus ="
    words = sum(len(line.split()) + 1 for line in splits.train)
    assert words == 217_646  # the WikiText-2 paper's validation token count
    short = load_text("wikitext-2", shared_data, max_lines=10)
    assert short.train == splits.train[:10] and short.validation == splits.validation[:10]
    with pytest.raises(DataNotFoundError, match=r"train\.txt"):
        load_text("wikitext-2", shared_data, scheme="standard")


def test_wikitext2_standard_split_when_train_exists(shared_data: Path, tmp_path: Path) -> None:
    folder = tmp_path / "text" / "wikitext-2"
    folder.mkdir(parents=True)
    for name in ("valid.txt", "test.txt"):
        shutil.copy(shared_data / "text" / "wikitext-2" / name, folder / name)
    (folder / "train.txt").write_text(" one line \n two \n")
    splits = load_text("wikitext-2", tmp_path)
    assert splits.train == ["one line", "two"] and len(splits.validation) == 3760
    assert load_text("wikitext-2", tmp_path, scheme="valid-test").train[1] == "= Homarus gammarus ="


def test_missing_data_and_bad_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DataNotFoundError, match=r"valid\.txt"):
        load_text("wikitext-2", tmp_path)
    with pytest.raises(ValueError, match="name"):
        load_text("ptb", tmp_path)
    with pytest.raises(ValueError, match="scheme"):
        load_text("wikitext-2", tmp_path, scheme="other")
    with pytest.raises(ValueError, match="max_lines"):
        load_text("wikitext-2", tmp_path, max_lines=0)
    real_import = builtins.__import__

    def no_datasets(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "datasets":
            raise ImportError("no datasets")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    for corpus in ("wikitext-103", "bookcorpus-wiki40b"):
        with pytest.raises(ImportError, match="pip install datasets"):
            load_text(corpus)


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_tokenizer_training_is_cached(kind: str, tmp_path: Path) -> None:
    tok = train_tokenizer(kind, LINES, 300, cache_dir=tmp_path)
    files = list((tmp_path / "tokenizers").glob(f"{kind}-300-*.json"))
    assert len(files) == 1
    assert tok.get_vocab_size() <= 300
    ids = special_ids(tok, kind)
    expected = (
        {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
        if kind == "wordpiece"
        else {"pad": 1, "unk": 3, "bos": 2, "eos": 2}
    )
    assert ids == expected
    stamp = files[0].stat().st_mtime_ns
    again = train_tokenizer(kind, LINES, 300, cache_dir=tmp_path)
    assert files[0].stat().st_mtime_ns == stamp  # loaded from the cache, not retrained
    assert again.encode("the cat sat").ids == tok.encode("the cat sat").ids
    other = train_tokenizer(kind, [*LINES, "new words zebra"], 300, cache_dir=tmp_path)
    assert other.get_vocab_size() > 0
    assert len(list((tmp_path / "tokenizers").glob(f"{kind}-300-*.json"))) == 2
    # <unk> in WikiText maps to the unknown token, not to '<', 'unk', '>'
    encoded = tok.encode(LINES[3].replace("<unk>", "[UNK]" if kind == "wordpiece" else "<unk>"))
    assert ids["unk"] in encoded.ids
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(kind, LINES, 3, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="lines"):
        train_tokenizer(kind, ["", " "], 300, cache_dir=tmp_path)


def test_cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOPFIELD_CACHE", str(tmp_path / "env"))
    train_tokenizer("wordpiece", LINES, 200)
    assert list((tmp_path / "env" / "tokenizers").glob("wordpiece-200-*.json"))
    with pytest.raises(ValueError, match="kind"):
        train_tokenizer("unigram", LINES, 200)


def test_token_blocks_delimiters(tmp_path: Path) -> None:
    bert = train_tokenizer("wordpiece", LINES, 300, cache_dir=tmp_path)
    blocks = token_blocks(bert, LINES, "wordpiece", 16)
    ids = special_ids(bert, "wordpiece")
    assert blocks.dtype == torch.long and blocks.shape[1] == 16
    flat = blocks.flatten().tolist()
    assert flat[0] == ids["cls"]
    lines = [line for line in LINES if line.strip()]
    assert flat.count(ids["cls"]) in (len(lines), len(lines) - 1)
    first = bert.encode(lines[0], add_special_tokens=False).ids
    assert flat[1 : 1 + len(first)] == first and flat[1 + len(first)] == ids["sep"]
    assert token_blocks(bert, LINES, "wordpiece", 16, max_blocks=2).shape == (2, 16)
    opt = train_tokenizer("bpe", LINES, 300, cache_dir=tmp_path)
    blocks = token_blocks(opt, LINES, "bpe", 8)
    assert blocks[0, 0] == special_ids(opt, "bpe")["bos"]
    text = opt.decode(blocks.flatten().tolist()[1:8])
    assert text.strip().startswith("=")
    with pytest.raises(ValueError, match="lines"):
        token_blocks(opt, ["a"], "bpe", 64)
    with pytest.raises(ValueError, match="length"):
        token_blocks(opt, LINES, "bpe", 1)


def test_mask_tokens_80_10_10() -> None:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (200, 64), generator=g)
    ids[:, 0] = 2  # [CLS] never masked
    inputs, labels = mask_tokens(
        ids,
        mask_id=4,
        vocab_size=100,
        special=(0, 2, 3),
        generator=torch.Generator().manual_seed(1),
    )
    selected = labels != -100
    assert not selected[:, 0].any()
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(inputs[~selected], ids[~selected])
    rate = selected[:, 1:].float().mean().item()
    assert 0.13 < rate < 0.17
    masked = (inputs == 4) & selected
    kept = (inputs == ids) & selected
    assert 0.77 < masked.sum() / selected.sum() < 0.83
    assert 0.08 < kept.sum() / selected.sum() < 0.13  # 10% kept (+ random hits of the same id)
    again = mask_tokens(
        ids,
        mask_id=4,
        vocab_size=100,
        special=(0, 2, 3),
        generator=torch.Generator().manual_seed(1),
    )
    assert torch.equal(again[0], inputs) and torch.equal(again[1], labels)
    with pytest.raises(ValueError, match="probability"):
        mask_tokens(ids, mask_id=4, vocab_size=100, special=(), probability=1.0)


def test_text_splits_is_frozen() -> None:
    splits = TextSplits(["a"], ["b"], "d")
    with pytest.raises(AttributeError):
        splits.train = []  # type: ignore[misc]

"""Token blocks of corpora larger than memory: streamed in, memory-mapped out.

The paper presets of the outlier study pre-train BERT and OPT on BookCorpus ∪ wiki40b/en (about
5 billion tokens). :func:`hopfield.data.text.token_blocks` holds a corpus as a Python list, which
does not scale to that. :class:`TokenBlockStore` is the same blocks on disk:

* :meth:`TokenBlockStore.build` reads lines from any iterable (a ``datasets`` corpus opened with
  ``streaming=True``, see :func:`stream_lines`, or a list), encodes them in batches with the
  tokenizer, adds the same delimiters as ``token_blocks`` (BERT ``[CLS] line [SEP]``, OPT
  ``</s> line``) and appends the ids to ``tokens.bin`` (``uint16`` when the vocabulary fits,
  else ``uint32``); ``meta.json`` is written last, so a half-built store is never opened;
* :class:`TokenBlockStore` opens ``tokens.bin`` with :func:`numpy.memmap`: ``len(store)`` blocks
  of ``length`` tokens, ``store[i]`` an ``int64`` tensor read from disk on demand. Memory is
  O(batch), whatever the corpus size, and every process of a multi-process run maps the same
  file (the operating system shares the pages);
* :func:`build_once` builds on the main process while the others wait for the finished file,
  then every process opens it; :func:`corpus_store` does that for a tokenizer and a stream of
  lines with the delimiters of :func:`hopfield.data.text.token_blocks`, and
  :func:`sample_lines` gives a tokenizer's training text from every source of a corpus.

The store is a sized, indexable dataset, so :class:`hopfield.training.Trainer` draws its batches
from it as from a tensor of blocks.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "STREAMED_CORPORA",
    "TokenBlockStore",
    "build_once",
    "corpus_store",
    "sample_lines",
    "stream_lines",
]

TOKENS_FILE = "tokens.bin"
META_FILE = "meta.json"

#: ``name -> [(dataset, config, split), ...]`` of the corpora :func:`stream_lines` streams.
STREAMED_CORPORA: dict[str, dict[str, list[tuple[str, str | None, str]]]] = {
    "bookcorpus-wiki40b": {
        "train": [
            ("bookcorpus/bookcorpus", None, "train"),
            ("google/wiki40b", "en", "train"),
        ],
        "validation": [("google/wiki40b", "en", "validation")],
    },
    "wikitext-103": {
        "train": [("Salesforce/wikitext", "wikitext-103-raw-v1", "train")],
        "validation": [("Salesforce/wikitext", "wikitext-103-raw-v1", "validation")],
    },
}


class TokenBlockStore:
    """Fixed-length token blocks in a memory-mapped file (see the module docstring).

    Args:
        path: the store's folder (``tokens.bin`` and ``meta.json``).

    Attributes:
        length: tokens per block.
        meta: what :meth:`build` recorded (``length``, ``dtype``, ``tokens``, ``blocks``,
            ``lines`` and the caller's ``description``).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        meta_path = self.path / META_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(
                f"path: {self.path} holds no finished token store ({META_FILE} is missing); "
                "build it with TokenBlockStore.build"
            )
        self.meta: dict[str, Any] = json.loads(meta_path.read_text())
        self.length = int(self.meta["length"])
        blocks = int(self.meta["blocks"])
        self._tokens = np.memmap(
            self.path / TOKENS_FILE,
            dtype=np.dtype(self.meta["dtype"]),
            mode="r",
            shape=(blocks, self.length),
        )

    def __len__(self) -> int:
        return int(self._tokens.shape[0])

    def __getitem__(self, index: int) -> Tensor:
        """Block ``index``: ``(length,)`` int64."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} blocks")
        return torch.from_numpy(self._tokens[index].astype(np.int64))

    def tensor(self, count: int | None = None) -> Tensor:
        """The first ``count`` blocks (all when ``None``) in memory: ``(count, length)`` int64;
        for evaluation sets small enough to hold."""
        count = len(self) if count is None else min(count, len(self))
        return torch.from_numpy(np.asarray(self._tokens[:count], dtype=np.int64))

    @classmethod
    def build(
        cls,
        path: str | os.PathLike[str],
        lines: Iterable[str],
        encode: Callable[[list[str]], Sequence[Sequence[int]]],
        length: int,
        *,
        vocab_size: int,
        before: Sequence[int] = (),
        after: Sequence[int] = (),
        max_blocks: int | None = None,
        batch_lines: int = 10_000,
        description: str = "",
    ) -> TokenBlockStore:
        """Encode ``lines`` into a new store at ``path`` (replacing an unfinished one).

        Args:
            lines: the text, one line per item; empty lines are skipped.
            encode: ``list of lines -> list of id lists`` (e.g. a ``tokenizers`` batch encoder
                without special tokens).
            length: tokens per block (the remainder of the stream is dropped).
            vocab_size: decides the stored integer width.
            before, after: ids put around every line (the delimiters).
            max_blocks: stop after this many blocks.
            batch_lines: lines encoded at a time (bounds the memory).
            description: kept in ``meta.json``.
        """
        if not isinstance(length, int) or isinstance(length, bool) or length < 2:
            raise ValueError(f"length must be an int >= 2, got {length!r}")
        if not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        if max_blocks is not None and max_blocks < 1:
            raise ValueError(f"max_blocks must be positive, got {max_blocks}")
        if batch_lines < 1:
            raise ValueError(f"batch_lines must be positive, got {batch_lines}")
        folder = Path(path)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        dtype = np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)
        limit = None if max_blocks is None else max_blocks * length
        written = read = 0
        carry: list[int] = []
        with (folder / TOKENS_FILE).open("wb") as out:
            for batch in _batches((line for line in lines if line.strip()), batch_lines):
                read += len(batch)
                for ids in encode(batch):
                    carry.extend([*before, *ids, *after])
                whole = (len(carry) // length) * length
                if limit is not None:
                    whole = min(whole, limit - written)
                np.asarray(carry[:whole], dtype=dtype).tofile(out)
                written += whole
                carry = carry[whole:]
                if limit is not None and written >= limit:
                    break
        if written == 0:
            shutil.rmtree(folder)
            raise ValueError(f"lines: fewer than {length} tokens, not one block")
        meta = {
            "length": length,
            "dtype": dtype.name,
            "tokens": written,
            "blocks": written // length,
            "lines": read,
            "description": description,
        }
        (folder / META_FILE).write_text(json.dumps(meta, indent=2))
        return cls(folder)


def _batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


def build_once(
    path: str | os.PathLike[str], build: Callable[[], Any], *, poll_seconds: float = 5.0
) -> TokenBlockStore:
    """Open the store at ``path``; if it is not finished, the main process calls ``build()``
    (which writes it) while the other processes of a multi-process run wait for its
    ``meta.json`` by polling the file system, not in a collective, whose timeout (30 minutes
    by default) a corpus of billions of tokens would exceed. ``path`` must be on a file system
    every process sees."""
    import torch.distributed as dist

    folder = Path(path)
    distributed = dist.is_available() and dist.is_initialized()
    main = not distributed or dist.get_rank() == 0
    if not (folder / META_FILE).is_file():
        if main:
            build()
            if not (folder / META_FILE).is_file():
                raise RuntimeError(f"build: left no finished store at {folder}")
        while not (folder / META_FILE).is_file():
            time.sleep(poll_seconds)
    return TokenBlockStore(folder)


def _source_lines(dataset: str, config: str | None, part: str, corpus: str) -> Iterator[str]:
    """The stripped, non-empty ``text`` records of one Hub dataset split, streamed."""
    from hopfield.data.text import hub_dataset

    for record in hub_dataset(corpus, dataset, config, split=part, streaming=True):
        if line := str(record["text"]).strip():
            yield line


def _check_corpus(name: str, split: str) -> list[tuple[str, str | None, str]]:
    if name not in STREAMED_CORPORA:
        raise ValueError(f"name must be one of {sorted(STREAMED_CORPORA)}, got {name!r}")
    if split not in ("train", "validation"):
        raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
    return STREAMED_CORPORA[name][split]


def stream_lines(name: str, split: str) -> Iterator[str]:
    """The non-empty lines of corpus ``name`` (:data:`STREAMED_CORPORA`), split ``"train"`` or
    ``"validation"``, streamed through ``datasets`` (``streaming=True``: nothing is loaded
    into memory or written to disk but the records in flight).

    Raises (when iterated):
        ImportError: ``datasets`` is not installed (``pip install -e ".[corpora]"`` in the clone).
        hopfield.data.DataNotFoundError: the Hub cannot be reached and the corpus is not cached.
    """
    for source in _check_corpus(name, split):
        yield from _source_lines(*source, name)


def sample_lines(name: str, split: str, count: int) -> list[str]:
    """The first ``count // k`` non-empty lines of each of the ``k`` sources of ``split`` (for
    BookCorpus ∪ wiki40b: books and articles alike), e.g. a tokenizer's training text.

    Raises:
        ImportError, hopfield.data.DataNotFoundError: as :func:`stream_lines`.
    """
    sources = _check_corpus(name, split)
    if not isinstance(count, int) or count < len(sources):
        raise ValueError(f"count must be an int >= {len(sources)}, got {count!r}")
    each = count // len(sources)
    lines: list[str] = []
    for source in sources:
        lines += islice(_source_lines(*source, name), each)
    return lines


def corpus_store(
    path: str | os.PathLike[str],
    lines: Iterable[str],
    tokenizer: Any,
    kind: str,
    length: int,
    *,
    max_blocks: int | None = None,
    description: str = "",
) -> TokenBlockStore:
    """The store at ``path`` of ``lines`` tokenized as :func:`hopfield.data.text.token_blocks`
    does (same delimiters, same blocks), built once (:func:`build_once`): on the main process
    while the others wait; opened without reading ``lines`` where it is finished."""
    from hopfield.data.text import line_delimiters, line_encoder

    before, after = line_delimiters(tokenizer, kind)
    return build_once(
        path,
        lambda: TokenBlockStore.build(
            path,
            lines,
            line_encoder(tokenizer, kind),
            length,
            vocab_size=tokenizer.get_vocab_size(),
            before=before,
            after=after,
            max_blocks=max_blocks,
            description=description,
        ),
    )

"""Text corpora, offline-trained tokenizers, and fixed-length token blocks for BERT / OPT.

Corpora (:func:`load_text`, ``name -> TextSplits(train, validation)``, lists of lines):

* ``"wikitext-2"``: the tokenized WikiText-2 (v1) files ``text/wikitext-2/{train,valid,test}.txt``
  below the data root. The project's shared data holds only ``valid.txt`` and ``test.txt``
  (``train.txt`` could not be obtained), so the split is: **train on** ``valid.txt`` (217,646
  words), **evaluate on** ``test.txt`` (245,569 words). A user who has ``train.txt`` selects the
  standard split (train on ``train.txt``, evaluate on ``valid.txt``) with
  ``scheme="standard"``; ``scheme="auto"`` (the default) uses it when ``train.txt`` is present.
  ``<unk>`` in the files is mapped to the tokenizer's unknown token.
* ``"wikitext-103"``: ``Salesforce/wikitext``, ``wikitext-103-raw-v1`` (train / validation),
  through the ``datasets`` package (needs internet or its cache).
* ``"bookcorpus-wiki40b"``: the OutEffHop / Bondarenko et al. setup: train = BookCorpus train ∪
  wiki40b/en train (text column), validation = wiki40b/en validation, through ``datasets``.

``datasets`` is imported only by the last two; where it is missing they raise an ``ImportError``
saying how to install it, and where the Hub cannot be reached (offline, ``HF_HUB_OFFLINE=1``) and
the corpus is not in its cache they raise :class:`hopfield.data.DataNotFoundError`.

Tokenizers (:func:`train_tokenizer`) are trained offline with the ``tokenizers`` package on the
train split: ``"wordpiece"`` (BERT: lower-casing BERT normaliser and pre-tokenizer, special tokens
``[PAD] [UNK] [CLS] [SEP] [MASK]``) or ``"bpe"`` (OPT/GPT-2 byte-level BPE, special tokens
``<s> <pad> </s> <unk>`` with OPT's ids 0–3). They are cached as JSON in a cache folder (argument,
else ``$HOPFIELD_CACHE``, else ``~/.cache/hopfield``) under a name that includes a hash of the
corpus, so a changed corpus trains a new one.

Blocks (:func:`token_blocks`): every line is encoded (BERT: ``[CLS] line [SEP]``; OPT: ``</s>``
before each line, OPT's BOS), the ids are concatenated and cut into blocks of ``length`` tokens
(the remainder is dropped), as Hugging Face's ``run_mlm.py`` / ``run_clm.py`` ``group_texts``.
:func:`mask_tokens` applies BERT's 80/10/10 masking.

Stand-in blocks (:class:`StandInTokenBlocks`): random token blocks of the shape ``token_blocks``
gives (ids in the vocabulary, the delimiters of the tokenizer kind), generated lazily, for runs
that must prove a paper preset trains where its corpus is absent (``hopfield run
--stand-in-data``); :func:`stand_in_special_ids` gives the special ids such blocks use.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hopfield.data.files import DataFile, DataNotFoundError, locate

__all__ = [
    "CORPORA",
    "TOKENIZER_KINDS",
    "WIKITEXT2_FILES",
    "StandInTokenBlocks",
    "TextSplits",
    "cache_root",
    "hub_dataset",
    "line_delimiters",
    "line_encoder",
    "load_text",
    "mask_tokens",
    "special_ids",
    "stand_in_special_ids",
    "token_blocks",
    "train_tokenizer",
]

CORPORA = ("wikitext-2", "wikitext-103", "bookcorpus-wiki40b")
TOKENIZER_KINDS = ("wordpiece", "bpe")
CACHE_ENV = "HOPFIELD_CACHE"

_WIKITEXT2_URL = (
    "https://raw.githubusercontent.com/pytorch/examples/main/word_language_model/data/wikitext-2/"
)
WIKITEXT2_FILES: dict[str, DataFile] = {
    "train": DataFile("text/wikitext-2/train.txt", "", _WIKITEXT2_URL + "train.txt"),
    "valid": DataFile(
        "text/wikitext-2/valid.txt",
        "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
        _WIKITEXT2_URL + "valid.txt",
    ),
    "test": DataFile(
        "text/wikitext-2/test.txt",
        "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",
        _WIKITEXT2_URL + "test.txt",
    ),
}

#: Special tokens per tokenizer kind (in id order) and the roles they play.
_SPECIALS: dict[str, tuple[str, ...]] = {
    "wordpiece": ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
    "bpe": ("<s>", "<pad>", "</s>", "<unk>"),
}
_ROLES: dict[str, dict[str, str]] = {
    "wordpiece": {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
    "bpe": {"pad": "<pad>", "unk": "<unk>", "bos": "</s>", "eos": "</s>"},
}


@dataclass(frozen=True)
class TextSplits:
    """A corpus as lines of text.

    Attributes:
        train: training lines.
        validation: evaluation lines.
        description: which files/datasets the splits are (for reports).
    """

    train: list[str]
    validation: list[str]
    description: str


def _read_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]


def _wikitext2(data_dir: str | os.PathLike[str] | None, scheme: str) -> TextSplits:
    if scheme not in ("auto", "standard", "valid-test"):
        raise ValueError(f"scheme must be 'auto', 'standard' or 'valid-test', got {scheme!r}")
    if scheme in ("auto", "standard"):
        try:
            train = locate(WIKITEXT2_FILES["train"], data_dir)
        except FileNotFoundError:
            if scheme == "standard":
                raise
        else:
            valid = locate(WIKITEXT2_FILES["valid"], data_dir)
            return TextSplits(
                _read_lines(train),
                _read_lines(valid),
                "WikiText-2: train on train.txt, evaluate on valid.txt",
            )
    valid = locate(WIKITEXT2_FILES["valid"], data_dir)
    test = locate(WIKITEXT2_FILES["test"], data_dir)
    return TextSplits(
        _read_lines(valid),
        _read_lines(test),
        "WikiText-2 (train.txt unavailable): train on valid.txt, evaluate on test.txt",
    )


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as error:
        raise ImportError(
            "this corpus is loaded through the Hugging Face `datasets` package, which is not "
            "installed: `pip install datasets` (it downloads the data on first use)"
        ) from error
    return datasets


def _column(dataset: Any) -> list[str]:
    return [str(t).strip() for t in dataset["text"]]


def hub_dataset(name: str, *args: Any, **kwargs: Any) -> Any:
    """``datasets.load_dataset(*args, **kwargs)``; a corpus the Hub cannot deliver (offline and
    not cached, or unknown) raises :class:`DataNotFoundError` naming corpus ``name``."""
    try:
        return _datasets().load_dataset(*args, **kwargs)
    except (ConnectionError, FileNotFoundError) as error:
        raise DataNotFoundError(
            f"corpus {name!r}: {args[0]} is neither in the datasets cache nor reachable on the "
            f"Hugging Face Hub ({error}); run once with internet to cache it"
        ) from error


def load_text(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    scheme: str = "auto",
    max_lines: int | None = None,
) -> TextSplits:
    """The train/validation lines of corpus ``name`` (see the module docstring).

    Args:
        name: one of :data:`CORPORA`.
        data_dir: data root for ``"wikitext-2"`` (else ``$HOPFIELD_DATA``).
        scheme: WikiText-2 split: ``"auto"``, ``"standard"`` (needs ``train.txt``) or
            ``"valid-test"`` (train on ``valid.txt``, evaluate on ``test.txt``).
        max_lines: keep only the first lines of each split (quick runs).

    Raises:
        hopfield.data.DataNotFoundError: WikiText-2 files are absent, or a ``datasets`` corpus
            is neither cached nor reachable.
        ImportError: ``datasets`` is needed and missing.
    """
    if name not in CORPORA:
        raise ValueError(f"name must be one of {CORPORA}, got {name!r}")
    if max_lines is not None and max_lines < 1:
        raise ValueError(f"max_lines must be positive, got {max_lines}")
    if name == "wikitext-2":
        splits = _wikitext2(data_dir, scheme)
    elif name == "wikitext-103":
        ds = hub_dataset(name, "Salesforce/wikitext", "wikitext-103-raw-v1")
        splits = TextSplits(
            _column(ds["train"]), _column(ds["validation"]), "WikiText-103 (raw) train/validation"
        )
    else:
        books = hub_dataset(name, "bookcorpus/bookcorpus", split="train")
        wiki = hub_dataset(name, "google/wiki40b", "en")
        splits = TextSplits(
            _column(books) + _column(wiki["train"]),
            _column(wiki["validation"]),
            "BookCorpus + wiki40b/en train, wiki40b/en validation",
        )
    if max_lines is not None:
        splits = TextSplits(
            splits.train[:max_lines], splits.validation[:max_lines], splits.description
        )
    return splits


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache folder: ``cache_dir``, else ``$HOPFIELD_CACHE``, else ``~/.cache/hopfield``."""
    if cache_dir:
        return Path(cache_dir)
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "hopfield"


def _clean(lines: Sequence[str], kind: str) -> list[str]:
    unk = _ROLES[kind]["unk"]
    return [line.replace("<unk>", unk) for line in lines if line.strip()]


def train_tokenizer(
    kind: str,
    lines: Sequence[str],
    vocab_size: int,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Any:
    """A ``tokenizers.Tokenizer`` of ``kind`` trained on ``lines`` (loaded from the cache if there).

    Args:
        kind: ``"wordpiece"`` (BERT) or ``"bpe"`` (OPT, byte-level).
        lines: the training text.
        vocab_size: target vocabulary size including the special tokens.
        cache_dir: cache folder (see :func:`cache_root`); the file is
            ``tokenizers/<kind>-<vocab_size>-<corpus hash>.json``.

    Returns:
        The tokenizer (no post-processor: :func:`token_blocks` adds the special tokens).
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"kind must be one of {TOKENIZER_KINDS}, got {kind!r}")
    specials = _SPECIALS[kind]
    if not isinstance(vocab_size, int) or vocab_size <= len(specials) + 1:
        raise ValueError(f"vocab_size must be an int > {len(specials) + 1}, got {vocab_size!r}")
    text = _clean(lines, kind)
    if not text:
        raise ValueError("lines: no non-empty line to train the tokenizer on")
    digest = hashlib.sha256()
    for line in text:
        digest.update(line.encode("utf-8") + b"\n")
    path = (
        cache_root(cache_dir) / "tokenizers" / f"{kind}-{vocab_size}-{digest.hexdigest()[:16]}.json"
    )
    if path.is_file():
        return Tokenizer.from_file(str(path))
    if kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer: Any = trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=list(specials), show_progress=False
        )
    else:
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(specials),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    tokenizer.train_from_iterator(text, trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tokenizer.save(str(tmp))
    os.replace(tmp, path)
    return tokenizer


def special_ids(tokenizer: Any, kind: str) -> dict[str, int]:
    """Role -> token id (``pad``, ``unk`` and ``cls``/``sep``/``mask`` or ``bos``/``eos``)."""
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"kind must be one of {TOKENIZER_KINDS}, got {kind!r}")
    ids = {role: tokenizer.token_to_id(token) for role, token in _ROLES[kind].items()}
    missing = [role for role, i in ids.items() if i is None]
    if missing:
        raise ValueError(f"tokenizer lacks the special tokens for {missing}")
    return ids


def line_delimiters(tokenizer: Any, kind: str) -> tuple[list[int], list[int]]:
    """The ids put before and after every line: BERT ``([CLS], [SEP])``, OPT ``([</s>], [])``."""
    ids = special_ids(tokenizer, kind)
    return ([ids["cls"]], [ids["sep"]]) if kind == "wordpiece" else ([ids["bos"]], [])


def line_encoder(tokenizer: Any, kind: str) -> Callable[[list[str]], list[list[int]]]:
    """``lines -> id lists``: empty lines dropped, ``<unk>`` mapped to the unknown token, no
    special tokens (:func:`line_delimiters` gives those)."""

    def encode(lines: list[str]) -> list[list[int]]:
        encodings = tokenizer.encode_batch(_clean(lines, kind), add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    return encode


def token_blocks(
    tokenizer: Any, lines: Sequence[str], kind: str, length: int, max_blocks: int | None = None
) -> Tensor:
    """Lines encoded, delimited, concatenated and cut into blocks: ``(N, length)`` int64.

    BERT (``"wordpiece"``): each line becomes ``[CLS] tokens [SEP]``; OPT (``"bpe"``): ``</s> tokens``.
    """
    if not isinstance(length, int) or length < 2:
        raise ValueError(f"length must be an int >= 2, got {length!r}")
    before, after = line_delimiters(tokenizer, kind)
    stream: list[int] = []
    limit = None if max_blocks is None else max_blocks * length
    for ids in line_encoder(tokenizer, kind)(list(lines)):
        stream.extend(before + ids + after)
        if limit is not None and len(stream) >= limit:
            break
    count = len(stream) // length
    if max_blocks is not None:
        count = min(count, max_blocks)
    if count == 0:
        raise ValueError(f"lines: fewer than {length} tokens, not one block")
    return torch.tensor(stream[: count * length], dtype=torch.long).view(count, length)


def mask_tokens(
    input_ids: Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    special: Sequence[int],
    probability: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT masking: ``(inputs, labels)`` from ``input_ids (B, T)``.

    Each non-special token is selected with ``probability``; of the selected, 80% become
    ``mask_id``, 10% a random token, 10% stay. ``labels`` hold the original ids at selected
    positions and ``-100`` elsewhere (ignored by the loss). Randomness from ``generator`` (default:
    the global torch RNG).
    """
    if not 0.0 < probability < 1.0:
        raise ValueError(f"probability must lie in (0, 1), got {probability}")
    device = input_ids.device

    def uniform(shape: torch.Size) -> Tensor:
        return torch.rand(shape, generator=generator, device=device)

    is_special = torch.zeros_like(input_ids, dtype=torch.bool)
    for token in special:
        is_special |= input_ids == token
    selected = (uniform(input_ids.shape) < probability) & ~is_special
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))
    roll = uniform(input_ids.shape)
    to_mask = selected & (roll < 0.8)
    to_random = selected & (roll >= 0.8) & (roll < 0.9)
    random_ids = torch.randint(
        vocab_size, input_ids.shape, generator=generator, device=device, dtype=input_ids.dtype
    )
    inputs = torch.where(to_mask, torch.full_like(input_ids, mask_id), input_ids)
    inputs = torch.where(to_random, random_ids, inputs)
    return inputs, labels


def stand_in_special_ids(kind: str) -> dict[str, int]:
    """Role -> id of the special tokens as :func:`train_tokenizer` numbers them, without training
    a tokenizer: the specials come first (BERT ``[PAD] [UNK] [CLS] [SEP] [MASK]`` = 0–4, OPT
    ``<s> <pad> </s> <unk>`` = 0–3)."""
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"kind must be one of {TOKENIZER_KINDS}, got {kind!r}")
    order = _SPECIALS[kind]
    return {role: order.index(token) for role, token in _ROLES[kind].items()}


class StandInTokenBlocks:
    """Random token blocks in place of an absent corpus, shaped as :func:`token_blocks` output.

    Block ``i`` is drawn from its own generator (seeded with ``seed`` and ``i``), so the blocks
    are the same on every process and nothing is held in memory: content ids are uniform over the
    non-special part of the vocabulary, and each block starts with the line delimiter of ``kind``
    (BERT ``[CLS]``, OPT ``</s>``; BERT blocks also end with ``[SEP]``). The numbers a model
    learns on them mean nothing; they only prove that a recipe runs.

    Args:
        count: number of blocks.
        length: tokens per block (>= 2).
        kind: ``"wordpiece"`` (BERT) or ``"bpe"`` (OPT).
        vocab_size: the vocabulary size (> number of special tokens).
        seed: the data seed.
    """

    def __init__(self, count: int, length: int, kind: str, vocab_size: int, seed: int = 0) -> None:
        if kind not in TOKENIZER_KINDS:
            raise ValueError(f"kind must be one of {TOKENIZER_KINDS}, got {kind!r}")
        for name, value, low in (("count", count, 1), ("length", length, 2)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        specials = len(_SPECIALS[kind])
        if not isinstance(vocab_size, int) or vocab_size <= specials:
            raise ValueError(f"vocab_size must be an int > {specials}, got {vocab_size!r}")
        self.count, self.length, self.kind, self.vocab_size = count, length, kind, vocab_size
        self.seed = seed
        ids = stand_in_special_ids(kind)
        self.first = ids["cls"] if kind == "wordpiece" else ids["bos"]
        self.last = ids["sep"] if kind == "wordpiece" else None
        self.low = specials

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> Tensor:
        """Block ``index``: ``(length,)`` int64."""
        if not -self.count <= index < self.count:
            raise IndexError(f"index {index} out of range for {self.count} blocks")
        index %= self.count
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        block = torch.randint(self.low, self.vocab_size, (self.length,), generator=generator)
        block[0] = self.first
        if self.last is not None:
            block[-1] = self.last
        return block

    def tensor(self, count: int | None = None) -> Tensor:
        """The first ``count`` blocks (all when ``None``): ``(count, length)`` int64."""
        count = self.count if count is None else min(count, self.count)
        return torch.stack([self[i] for i in range(count)])

"""Tasks of the outlier study: BERT masked LM, OPT causal LM, ViT image classification.

A :class:`Task` bundles, for one model family, the training examples, the training loss, fixed
evaluation batches per evaluation seed, the task metric (perplexity or top-1 accuracy) and the
modules whose ``max |x|`` is logged during training (the Figure 2–4 curves). Used by
:mod:`hopfield.experiments.outliers`.

Data:

* BERT / OPT: :mod:`hopfield.data.text` (WikiText-2 by default: train on ``valid.txt``, evaluate on
  ``test.txt``), a WordPiece (BERT) or byte-level BPE (OPT) tokenizer trained on the train split
  and cached, blocks of ``seq_len`` tokens. OPT also takes ``dataset="synthetic"``: the
  delimiter streams of :mod:`hopfield.data.synthetic_text` (``max_train`` training sequences,
  4096 when 0), the data of the ``outlier-formation`` recipe. BERT masks 15% of the tokens (80/10/10) with the
  global RNG during training (checkpointed by the trainer) and with the evaluation seed's
  generator for evaluation.
* ViT: :func:`hopfield.data.images.load_image_dataset` (``digits``, ``mnist``,
  ``fashion-mnist``, ``cifar10``) or an ImageNet-style folder (``imagenet``:
  ``images/imagenet/{train,val}/<class>/<image>``, read with Pillow, resized and centre-cropped to
  ``image_size``), normalised to mean 0.5 / std 0.5 per channel. Where a dataset has no train split
  in the data root (the shared data holds only MNIST's 10k test images), its test split is divided:
  all but the last ``eval_examples`` images train, the last ``eval_examples`` evaluate.

Stand-in data (``hopfield run --stand-in-data``): where a corpus or image set is absent
(:class:`hopfield.data.DataNotFoundError`), ``build_task(..., stand_in=True)`` trains and
evaluates on random data of the real shapes instead (:class:`hopfield.data.text.StandInTokenBlocks`:
``steps × batch_size`` training blocks, one pass without repetition as a large corpus gives;
:class:`hopfield.data.images.StandInImages`: as many images as the real split, ImageNet lazily), and
the task's description says so. Without it the error propagates.

Several processes (``torchrun``): every process builds the same task. Files shared between
processes are written once: a tokenizer is trained on the main process first (the others then
read its cache, :func:`main_process_first`), and :func:`same_run` lets every process decide alike
whether a run folder's checkpoints belong to the run about to train.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hopfield.data.files import DataNotFoundError, data_root
from hopfield.experiments.registry import ConfigError
from hopfield.experiments.results import RunContext
from hopfield.outliers.metrics import COMPONENTS

__all__ = [
    "COMPONENTS",
    "FAMILY_PREFIX",
    "Batch",
    "ImageFolder",
    "Task",
    "barrier",
    "build_task",
    "component_name",
    "image_splits",
    "load_image_folder",
    "main_process_first",
    "same_run",
    "stand_in_model_config",
]

#: Regular expression of layer ``{j}`` of each family's ``transformers`` model.
FAMILY_PREFIX = {
    "bert": r"bert\.encoder\.layer\.{j}",
    "opt": r"model\.decoder\.layers\.{j}",
    "vit": r"vit\.layers\.{j}",
}


def component_name(family: str, layer: int, component: str) -> str:
    """The module name of ``component`` (a :data:`COMPONENTS` label) in layer ``layer``."""
    prefix = FAMILY_PREFIX[family].format(j=layer).replace("\\", "")
    return prefix + COMPONENTS[family][component]


@dataclass
class Batch:
    """One evaluation batch: ``inputs`` (model keyword arguments), ``targets`` and the
    ``special`` key mask ``(B, S)`` (delimiters / BOS / CLS) for the attention diagnostics."""

    inputs: dict[str, Tensor]
    targets: Tensor
    special: Tensor


@dataclass
class Task:
    """Everything the study needs to train and evaluate one model family.

    Attributes:
        family: ``"bert"``, ``"opt"`` or ``"vit"``.
        model_config: keyword arguments of :func:`hopfield.integrations.build_model`.
        train: training examples (token blocks ``(T,)`` or ``(image, label)`` pairs).
        loss_fn: ``loss_fn(model, batch) -> scalar`` for :class:`hopfield.training.Trainer`.
        eval_batches: ``eval_batches(seed) -> list[Batch]``.
        calibration_batches: ``calibration_batches(seed) -> list[dict]`` (model inputs).
        metric_name: ``"perplexity"`` or ``"top-1 (%)"``.
        higher_is_better: direction of the metric.
        description: the data used (for the report).
        stand_in: whether the data are random stand-ins for an absent dataset.
    """

    family: str
    model_config: dict[str, Any]
    train: Sequence[Any]
    loss_fn: Callable[[nn.Module, Any], Tensor]
    eval_batches: Callable[[int], list[Batch]]
    calibration_batches: Callable[[int], list[dict[str, Tensor]]]
    metric_name: str
    higher_is_better: bool
    description: str
    stand_in: bool = False

    def monitor_patterns(self, layers: int) -> list[str]:
        """Every component of every layer (regular expressions for the trainer's monitor)."""
        prefix = FAMILY_PREFIX[self.family]
        return [
            prefix.format(j=j) + suffix.replace(".", r"\.")
            for j in range(layers)
            for suffix in COMPONENTS[self.family].values()
        ]

    def evaluate(
        self, model: nn.Module, batches: Sequence[Batch], before: Callable[[Batch], None] | None
    ) -> float:
        """The task metric of ``model`` over ``batches`` (``before(batch)`` runs before each
        forward pass, e.g. to set the attention recorder's special mask)."""
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for batch in batches:
                if before is not None:
                    before(batch)
                logits = model(**batch.inputs).logits.float()
                if self.family == "vit":
                    total += float((logits.argmax(-1) == batch.targets).sum())
                    count += batch.targets.numel()
                    continue
                if self.family == "opt":
                    logits, targets = logits[:, :-1], batch.targets[:, 1:]
                else:
                    targets = batch.targets
                loss = F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]),
                    targets.reshape(-1),
                    ignore_index=-100,
                    reduction="sum",
                )
                total += float(loss)
                count += int((targets != -100).sum())
        if count == 0:
            raise ValueError("batches: nothing to evaluate")
        if self.family == "vit":
            return 100.0 * total / count
        return math.exp(total / count)


def barrier() -> None:
    """Wait for every process of a multi-process run (nothing in a single process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def main_process_first(build: Callable[[], Any]) -> Any:
    """``build()`` on the main process, then (after a barrier) on the others: for builders that
    write a cache file (a trained tokenizer), which the other processes then only read."""
    import torch.distributed as dist

    main = not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
    result = build() if main else None
    barrier()
    return result if main else build()


def same_run(ctx: RunContext, name: str, identity: Any) -> str:
    """Compare ``identity`` (what defines a training run: settings and data, JSON-serialisable)
    with the one recorded in the JSON file ``name`` below ``ctx.out_dir``, then record it there.

    Returns ``"new"`` (nothing recorded), ``"same"`` (the run folder's checkpoints belong to this
    run and may be resumed) or ``"changed"`` (they belong to another run: start over). Every
    process reads the file before the main process rewrites it (a barrier between them), so all
    processes get the same answer.
    """
    previous = ctx.load_json(name)
    barrier()
    ctx.save_json(name, identity)
    if previous is None:
        return "new"
    return "same" if previous == json.loads(json.dumps(identity)) else "changed"


def _chunks(n: int, size: int, limit: int) -> list[slice]:
    out = [slice(i, i + size) for i in range(0, n - size + 1, size)]
    return out[:limit]


def _pick(items: Sequence[Any], count: int, seed: int) -> list[Any]:
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed)).tolist()
    return [items[i] for i in order[:count]]


@dataclass
class _Corpus:
    """Token blocks of a text task: ``train`` (``N`` blocks ``(T,)``: a tensor ``(N, T)`` or a
    lazy dataset), ``valid`` ``(M, T)``, the special-token ``ids`` by role, the vocabulary size,
    the ``delimiters`` of the attention diagnostics, a description of where the blocks come from
    and whether they are stand-ins."""

    train: Any  # sized and indexable: block i is (T,)
    valid: Tensor
    ids: dict[str, int]
    vocab: int
    delimiters: list[int]
    description: str
    stand_in: bool = False


def _kind(family: str) -> str:
    return "wordpiece" if family == "bert" else "bpe"


def _delimiters(family: str, ids: dict[str, int]) -> list[int]:
    return [ids["cls"], ids["sep"]] if family == "bert" else [ids["bos"]]


#: Lines of a streamed corpus (:data:`hopfield.data.token_store.STREAMED_CORPORA`) its
#: tokenizer is trained on: the first half million of every source (books and articles alike).
TOKENIZER_SAMPLE_LINES = 1_000_000


def _streamed_corpus(settings: Any, limit: int, stand_in: bool) -> _Corpus:
    """BookCorpus ∪ wiki40b or WikiText-103 streamed from the Hub into memory-mapped token
    stores below the cache folder (built once by the main process; a second run opens them), so
    a corpus of billions of tokens costs no memory. ``max_train`` keeps the first lines."""
    from hopfield.data.text import cache_root, special_ids, train_tokenizer
    from hopfield.data.token_store import corpus_store, sample_lines, stream_lines

    kind, name = _kind(settings.family), settings.dataset
    sample_size = min(TOKENIZER_SAMPLE_LINES, settings.max_train or TOKENIZER_SAMPLE_LINES)
    try:  # every process asks, so all of them take the same branch
        sample = sample_lines(name, "train", max(sample_size, 2))
    except (DataNotFoundError, ImportError) as missing:
        if not stand_in:
            raise
        return _stand_in_corpus(settings, limit, DataNotFoundError(str(missing)))
    cache = settings.cache_dir or None
    tokenizer = main_process_first(
        lambda: train_tokenizer(kind, sample, settings.vocab_size, cache_dir=cache)
    )
    digest = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()[:12]
    root = cache_root(cache) / "token-blocks" / f"{name}-{settings.seq_len}-{digest}"
    train_lines = stream_lines(name, "train")
    if settings.max_train:
        train_lines = islice(train_lines, settings.max_train)
        root = root.with_name(f"{root.name}-first{settings.max_train}")
    store = partial(corpus_store, tokenizer=tokenizer, kind=kind, length=settings.seq_len)
    train = store(root / "train", train_lines, description=f"{name} train")
    valid = store(root / "validation", stream_lines(name, "validation"), max_blocks=limit)
    ids = special_ids(tokenizer, kind)
    vocab = tokenizer.get_vocab_size()
    return _Corpus(
        train=train,
        valid=valid.tensor(),
        ids=ids,
        vocab=vocab,
        delimiters=_delimiters(settings.family, ids),
        description=(
            f"{name} streamed from the Hugging Face Hub into memory-mapped token blocks "
            f"({len(train):,} training blocks of {settings.seq_len}, {root}); {kind} tokenizer "
            f"({vocab} tokens) trained on {len(sample):,} training lines"
        ),
    )


def _tokenized_corpus(settings: Any, data_dir: Path | None, limit: int, stand_in: bool) -> _Corpus:
    from hopfield.data.text import load_text, special_ids, token_blocks, train_tokenizer
    from hopfield.data.token_store import STREAMED_CORPORA

    if settings.dataset in STREAMED_CORPORA:
        return _streamed_corpus(settings, limit, stand_in)
    kind = _kind(settings.family)
    try:
        splits = load_text(settings.dataset, data_dir, max_lines=settings.max_train or None)
    except DataNotFoundError as missing:
        if not stand_in:
            raise
        return _stand_in_corpus(settings, limit, missing)
    tokenizer = main_process_first(
        lambda: train_tokenizer(
            kind, splits.train, settings.vocab_size, cache_dir=settings.cache_dir
        )
    )
    ids = special_ids(tokenizer, kind)
    vocab = tokenizer.get_vocab_size()
    return _Corpus(
        train=token_blocks(tokenizer, splits.train, kind, settings.seq_len),
        valid=token_blocks(tokenizer, splits.validation, kind, settings.seq_len, max_blocks=limit),
        ids=ids,
        vocab=vocab,
        delimiters=_delimiters(settings.family, ids),
        description=f"{splits.description}; {kind} tokenizer ({vocab} tokens) trained on the train split",
    )


def _stand_in_corpus(settings: Any, limit: int, missing: DataNotFoundError) -> _Corpus:
    """Random blocks in place of the absent corpus (``steps × batch_size`` training blocks: one
    pass over distinct blocks, as a corpus larger than the run gives; ``limit`` evaluation
    blocks)."""
    from hopfield.data.text import StandInTokenBlocks, stand_in_special_ids

    kind = _kind(settings.family)
    ids = stand_in_special_ids(kind)
    count = settings.steps * settings.batch_size
    train = StandInTokenBlocks(count, settings.seq_len, kind, settings.vocab_size, seed=1)
    valid = StandInTokenBlocks(limit, settings.seq_len, kind, settings.vocab_size, seed=2)
    return _Corpus(
        train=train,
        valid=valid.tensor(),
        ids=ids,
        vocab=settings.vocab_size,
        delimiters=_delimiters(settings.family, ids),
        description=(
            f"STAND-IN random token blocks ({settings.vocab_size} ids, {kind} specials) in place "
            f"of {settings.dataset}, which is absent ({missing}); the numbers mean nothing"
        ),
        stand_in=True,
    )


#: Training sequences of the synthetic data when ``max_train`` is 0.
SYNTHETIC_TRAIN_SEQUENCES = 4096


def _synthetic_corpus(settings: Any, limit: int) -> _Corpus:
    """The token streams of :mod:`hopfield.data.synthetic_text` (``vocab_size``, ``seq_len``,
    ``delimiter_rate``, ``branching``; training data seed 1, validation seed 2, as in the
    ``outlier-formation`` experiment)."""
    from hopfield.data import synthetic_text as st

    if settings.family != "opt":
        raise ConfigError(
            f"dataset 'synthetic' is a causal-LM task: model must be 'opt', got {settings.family!r}"
        )
    grammar = st.SyntheticText(
        vocab_size=settings.vocab_size,
        seq_len=settings.seq_len,
        delimiter_rate=settings.delimiter_rate,
        branching=settings.branching,
    )
    count = settings.max_train or SYNTHETIC_TRAIN_SEQUENCES
    return _Corpus(
        train=st.generate(grammar, count, seed=1).tokens,
        valid=st.generate(grammar, limit, seed=2).tokens,
        ids={"pad": st.PAD, "bos": st.BOS, "eos": st.DELIM},
        vocab=settings.vocab_size,
        delimiters=[st.BOS, st.DELIM, st.FILLER],
        description=f"synthetic delimiter streams ({grammar})",
    )


def _text_task(settings: Any, data_dir: Path | None, stand_in: bool) -> Task:
    from hopfield.data.text import mask_tokens

    family = settings.family
    limit = settings.eval_batches * settings.eval_batch_size
    if settings.dataset == "synthetic":
        corpus = _synthetic_corpus(settings, limit)
    else:
        corpus = _tokenized_corpus(settings, data_dir, limit, stand_in)
    train, valid, ids, vocab = corpus.train, corpus.valid, corpus.ids, corpus.vocab
    slices = _chunks(len(valid), settings.eval_batch_size, settings.eval_batches)
    if not slices:
        raise ConfigError(
            f"eval_batch_size: the validation split has {len(valid)} blocks, fewer than one batch"
        )
    special = sorted({ids[r] for r in ids if r != "unk"})

    def special_mask(block: Tensor) -> Tensor:
        return torch.isin(block, torch.tensor(corpus.delimiters))

    if family == "bert":
        common = {"vocab_size": vocab, "pad_token_id": ids["pad"]}

        def mask(block: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
            return mask_tokens(
                block, mask_id=ids["mask"], vocab_size=vocab, special=special, generator=generator
            )

        def loss_fn(model: nn.Module, batch: Tensor) -> Tensor:
            inputs, labels = mask(batch, None)
            return model(input_ids=inputs, labels=labels).loss

        def eval_batches(seed: int) -> list[Batch]:
            generator = torch.Generator().manual_seed(seed)
            out = []
            for part in slices:
                inputs, labels = mask(valid[part], generator)
                out.append(Batch({"input_ids": inputs}, labels, special_mask(inputs)))
            return out

    else:
        common = {
            "vocab_size": vocab,
            "pad_token_id": ids["pad"],
            "bos_token_id": ids["bos"],
            "eos_token_id": ids["eos"],
        }

        def loss_fn(model: nn.Module, batch: Tensor) -> Tensor:
            return model(input_ids=batch, labels=batch).loss

        def eval_batches(seed: int) -> list[Batch]:
            return [
                Batch({"input_ids": valid[p]}, valid[p], special_mask(valid[p])) for p in slices
            ]

    def calibration_batches(seed: int) -> list[dict[str, Tensor]]:
        if settings.calibrate_on == "validation":
            return [b.inputs for b in _pick(eval_batches(seed), settings.calib_batches, seed)]
        generator = torch.Generator().manual_seed(seed)
        rows = torch.randperm(len(train), generator=generator).tolist()
        n = settings.eval_batch_size
        out = []
        for k in range(settings.calib_batches):
            block = torch.stack([train[i] for i in rows[k * n : (k + 1) * n]])
            out.append({"input_ids": mask(block, generator)[0] if family == "bert" else block})
        return out

    return Task(
        family=family,
        model_config={
            **common,
            "max_position_embeddings": settings.max_positions or settings.seq_len,
        },
        train=train,
        loss_fn=loss_fn,
        eval_batches=eval_batches,
        calibration_batches=calibration_batches,
        metric_name="perplexity",
        higher_is_better=False,
        description=(
            f"{corpus.description}; {len(train)} training blocks and {len(slices) * settings.eval_batch_size} "
            f"evaluation blocks of {settings.seq_len} tokens"
        ),
        stand_in=corpus.stand_in,
    )


class ImageFolder:
    """An ImageNet-style folder ``root/<class>/<file>``, read lazily: ``folder[i] = (image
    (3, S, S) in [0, 1], label)``. Classes are the sorted sub-folder names; each image is resized
    (shorter side to ``image_size · 8/7``, as the usual 256/224) and centre-cropped to ``S``.

    Args:
        root: the split folder.
        image_size: output side ``S``.
        limit: use at most this many images (in sorted order).
    """

    def __init__(self, root: str | os.PathLike[str], image_size: int, limit: int | None = None):
        self.root = Path(root)
        if not self.root.is_dir():
            raise DataNotFoundError(
                f"image folder {self.root} not found: expected <data root>/images/imagenet/"
                "{train,val}/<class>/<image> (ImageNet-1k from https://image-net.org/)"
            )
        self.classes = sorted(p.name for p in self.root.iterdir() if p.is_dir())
        self.files = [
            (f, c)
            for c, name in enumerate(self.classes)
            for f in sorted((self.root / name).iterdir())
        ][:limit]
        if not self.files:
            raise DataNotFoundError(f"image folder {self.root} holds no images")
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        from PIL import Image

        path, label = self.files[index]
        size = self.image_size
        with Image.open(path) as image:
            rgb = image.convert("RGB")
        w, h = rgb.size
        scale = round(size * 8 / 7) / min(w, h)
        rgb = rgb.resize((max(size, round(w * scale)), max(size, round(h * scale))))
        w, h = rgb.size
        left, top = (w - size) // 2, (h - size) // 2
        rgb = rgb.crop((left, top, left + size, top + size))
        data = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8)
        image_tensor = data.view(size, size, 3).permute(2, 0, 1).float() / 255.0
        return image_tensor, torch.tensor(label)


def load_image_folder(
    root: str | os.PathLike[str], image_size: int, limit: int | None = None
) -> tuple[Tensor, Tensor]:
    """All images of an :class:`ImageFolder` at once: ``(N, 3, S, S)`` and labels ``(N,)``."""
    folder = ImageFolder(root, image_size, limit)
    items = [folder[i] for i in range(len(folder))]
    return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


class _Normalized:
    """``(x, y) -> ((x - 0.5) / 0.5, y)`` over an indexable dataset, lazily."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        x, y = self.dataset[index]
        return (x - 0.5) / 0.5, y


def image_splits(
    dataset: str,
    data_dir: Path | None,
    eval_examples: int,
    image_size: int | None = None,
    max_train: int | None = None,
    stand_in: bool = False,
) -> tuple[Any, tuple[Tensor, Tensor], str]:
    """``(train, (eval images, labels), description)`` of an image dataset.

    ``train`` is an ``(images, labels)`` pair of tensors, or for ``"imagenet"`` a lazy
    :class:`ImageFolder` of ``<data root>/images/imagenet/train`` (evaluation: the first
    ``eval_examples`` images of ``.../val``). With ``stand_in``, an absent dataset is replaced by
    random images of its shape: ``train`` is then a lazy
    :class:`hopfield.data.images.StandInImages` (:func:`hopfield.data.images.stand_in_images`).
    """
    train, evaluation, description, _ = _image_data(
        dataset, data_dir, eval_examples, image_size, max_train, stand_in
    )
    return train, evaluation, description


def _image_data(
    dataset: str,
    data_dir: Path | None,
    eval_examples: int,
    image_size: int | None,
    max_train: int | None,
    stand_in: bool,
) -> tuple[Any, tuple[Tensor, Tensor], str, bool]:
    """:func:`image_splits` and whether the data are stand-ins."""
    try:
        if dataset == "imagenet":
            return (*_imagenet(data_dir, eval_examples, image_size or 224, max_train), False)
        return (*_tensor_splits(dataset, data_dir, eval_examples, max_train), False)
    except DataNotFoundError as missing:
        if not stand_in:
            raise
        return (*_stand_in_splits(dataset, eval_examples, image_size, max_train, missing), True)


def _imagenet(
    data_dir: Path | None, eval_examples: int, size: int, max_train: int | None
) -> tuple[Any, tuple[Tensor, Tensor], str]:
    root = data_root(data_dir)
    folder = (root or Path("$DATA")) / "images" / "imagenet"
    lazy = ImageFolder(folder / "train", size, max_train)
    evaluation = load_image_folder(folder / "val", size, eval_examples)
    return lazy, evaluation, f"ImageNet folder {folder}: train / val"


def _tensor_splits(
    dataset: str, data_dir: Path | None, eval_examples: int, max_train: int | None
) -> tuple[Any, tuple[Tensor, Tensor], str]:
    from hopfield.data.images import load_image_dataset

    test = load_image_dataset(dataset, "test", data_dir)
    try:
        train = load_image_dataset(dataset, "train", data_dir)
    except DataNotFoundError:
        if len(test[0]) <= eval_examples:
            raise ConfigError(
                f"eval_examples (eval_batches x eval_batch_size = {eval_examples}): {dataset} has "
                f"only {len(test[0])} test images and no train split"
            ) from None
        cut = len(test[0]) - eval_examples
        train, test = (test[0][:cut], test[1][:cut]), (test[0][cut:], test[1][cut:])
        description = (
            f"{dataset}: train split absent; the first {cut} test images train, the last "
            f"{eval_examples} evaluate"
        )
    else:
        test = (test[0][:eval_examples], test[1][:eval_examples])
        description = f"{dataset}: train split; the first {len(test[0])} test images evaluate"
    if max_train:
        train = (train[0][:max_train], train[1][:max_train])
    return train, test, description


def _stand_in_splits(
    dataset: str,
    eval_examples: int,
    image_size: int | None,
    max_train: int | None,
    missing: DataNotFoundError,
) -> tuple[Any, tuple[Tensor, Tensor], str]:
    """Random images of ``dataset``'s shape and classes: the training set a lazy
    :class:`hopfield.data.images.StandInImages` (``max_train`` images, else as many as the real
    split), the evaluation images in memory."""
    from hopfield.data.images import stand_in_images

    size = image_size if dataset == "imagenet" else None
    train = stand_in_images(dataset, "train", size=size, count=max_train or None)
    test = stand_in_images(dataset, "test", size=size, count=eval_examples).tensors()
    description = (
        f"STAND-IN random images of {dataset}'s shape ({train.channels}x{train.size}x"
        f"{train.size}, {train.classes} classes) in place of the absent data ({missing}); the "
        "numbers mean nothing"
    )
    return train, test, description


def _image_task(settings: Any, data_dir: Path | None, stand_in: bool) -> Task:
    from hopfield.data.images import StandInImages

    eval_examples = settings.eval_batches * settings.eval_batch_size
    train_data, (x_eval, y_eval), description, stood_in = _image_data(
        settings.dataset,
        data_dir,
        eval_examples,
        settings.image_size,
        settings.max_train or None,
        stand_in,
    )
    x_eval = (x_eval - 0.5) / 0.5
    if isinstance(train_data, ImageFolder):
        train: Any = _Normalized(train_data)
        classes = len(train_data.classes)
    elif isinstance(train_data, StandInImages):
        train = _Normalized(train_data)
        classes = train_data.classes
    else:
        x_train, y_train = train_data
        train = list(zip((x_train - 0.5) / 0.5, y_train, strict=True))
        classes = int(max(int(y_train.max()), int(y_eval.max())) + 1)
    channels, size = x_eval.shape[1], x_eval.shape[-1]
    if size % settings.patch_size:
        raise ConfigError(f"patch_size {settings.patch_size} does not divide the image size {size}")
    tokens = (size // settings.patch_size) ** 2 + 1
    slices = _chunks(len(x_eval), settings.eval_batch_size, settings.eval_batches)
    if not slices:
        raise ConfigError(
            f"eval_batch_size: the {len(x_eval)} evaluation images are fewer than one batch "
            f"({settings.eval_batch_size})"
        )

    def loss_fn(model: nn.Module, batch: Any) -> Tensor:
        images, labels = batch
        return model(pixel_values=images, labels=labels).loss

    def eval_batches(seed: int) -> list[Batch]:
        special = torch.zeros(settings.eval_batch_size, tokens, dtype=torch.bool)
        special[:, 0] = True  # [CLS]
        return [Batch({"pixel_values": x_eval[p]}, y_eval[p], special) for p in slices]

    def calibration_batches(seed: int) -> list[dict[str, Tensor]]:
        if settings.calibrate_on == "validation":
            return [b.inputs for b in _pick(eval_batches(seed), settings.calib_batches, seed)]
        rows = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()
        n = settings.eval_batch_size
        return [
            {"pixel_values": torch.stack([train[i][0] for i in rows[k * n : (k + 1) * n]])}
            for k in range(settings.calib_batches)
        ]

    return Task(
        family="vit",
        model_config={
            "image_size": size,
            "patch_size": settings.patch_size,
            "num_channels": channels,
            "num_labels": classes,
        },
        train=train,
        loss_fn=loss_fn,
        eval_batches=eval_batches,
        calibration_batches=calibration_batches,
        metric_name="top-1 (%)",
        higher_is_better=True,
        description=(
            f"{description}; {len(train)} training and {len(slices) * settings.eval_batch_size} "
            f"evaluation images, {size}x{size}x{channels}, {tokens} tokens"
        ),
        stand_in=stood_in,
    )


def stand_in_model_config(settings: Any) -> dict[str, Any]:
    """The :func:`hopfield.integrations.build_model` keywords the text task of ``settings`` (BERT
    or OPT) gives (vocabulary, special ids, positions), with the special ids of the stand-in or
    synthetic data, without reading a corpus or training a tokenizer (the sizes are what
    matter: ``hopfield plan``, ``outlier-cost``)."""
    from hopfield.data import synthetic_text as st
    from hopfield.data.text import stand_in_special_ids

    if settings.dataset == "synthetic":
        ids = {"pad": st.PAD, "bos": st.BOS, "eos": st.DELIM}
    else:
        ids = stand_in_special_ids("wordpiece" if settings.family == "bert" else "bpe")
    config: dict[str, Any] = {"vocab_size": settings.vocab_size, "pad_token_id": ids["pad"]}
    if settings.family == "opt":
        config.update(bos_token_id=ids["bos"], eos_token_id=ids["eos"])
    config["max_position_embeddings"] = settings.max_positions or settings.seq_len
    return config


def build_task(settings: Any, data_dir: Path | None, stand_in: bool = False) -> Task:
    """The :class:`Task` of ``settings.family`` (``settings``: the study's resolved per-model
    settings, see :class:`hopfield.experiments.outliers.ModelSettings`); ``stand_in``: random
    data of the real shapes where the dataset is absent (see the module docstring)."""
    if settings.family in ("bert", "opt"):
        return _text_task(settings, data_dir, stand_in)
    if settings.family == "vit":
        return _image_task(settings, data_dir, stand_in)
    raise ValueError(f"model must be 'bert', 'opt' or 'vit', got {settings.family!r}")

"""Image datasets as tensors: scikit-learn digits, MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100.

:func:`load_image_dataset` returns ``(images, labels)`` with ``images`` float32 ``(N, C, H, W)`` in
``[0, 1]`` and ``labels`` int64 ``(N,)``, for

* ``"digits"``: scikit-learn's bundled 8x8 digits (1797 images, always present). A fixed,
  deterministic split: the first 1437 images are ``"train"``, the last 360 ``"test"``;
* ``"mnist"``: the LeCun IDX files ``images/mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``
  below the data root (the project's shared data holds only the 10k test split; its SHA-256 is
  verified);
* ``"fashion-mnist"``: the same IDX format, from Debian's ``dataset-fashion-mnist`` package
  (``/usr/share/datasets/fashion-mnist/``) or ``images/fashion-mnist/`` below the data root;
* ``"cifar10"``: the python batches ``images/cifar-10-batches-py/{data_batch_1..5,test_batch}``
  (read with a restricted unpickler that only rebuilds NumPy arrays).

The data root is the ``data_dir`` argument, else ``$HOPFIELD_DATA``
(see :func:`hopfield.data.files.locate`).
"""

from __future__ import annotations

import gzip
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from hopfield.data.files import DataFile, locate

__all__ = [
    "IMAGENET_TRAIN_IMAGES",
    "IMAGE_DATASETS",
    "SPLITS",
    "STAND_IN_SHAPES",
    "StandInImages",
    "image_files",
    "load_image_dataset",
    "read_cifar_batch",
    "read_idx",
    "stand_in_images",
]

SPLITS = ("train", "test")

DIGITS_TRAIN_SIZE = 1437
"""Digits ``[0, 1437)`` of scikit-learn's set form the train split, the other 360 the test split."""

MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
"""The torchvision mirror of http://yann.lecun.com/exdb/mnist/ (same files, same md5)."""
FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
FASHION_MNIST_SYSTEM = "/usr/share/datasets/fashion-mnist/"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"

# SHA-256 of the files in the project's shared data (see its README); files the project does not
# hold are located without a checksum ("").
_MNIST_SHA256 = {
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}

_IDX_PREFIX = {"train": "train", "test": "t10k"}
_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _idx_files(folder: str, url: str, split: str, system: str | None) -> tuple[DataFile, DataFile]:
    prefix = _IDX_PREFIX[split]
    names = (f"{prefix}-images-idx3-ubyte.gz", f"{prefix}-labels-idx1-ubyte.gz")
    return tuple(  # type: ignore[return-value]
        DataFile(
            relative_path=f"images/{folder}/{name}",
            sha256=_MNIST_SHA256.get(name, "") if folder == "mnist" else "",
            url=url + name,
            system_paths=(system + name,) if system else (),
        )
        for name in names
    )


def image_files(name: str, split: str = "train") -> tuple[DataFile, ...]:
    """The :class:`DataFile` objects that ``load_image_dataset(name, split)`` reads.

    ``"digits"`` is bundled with scikit-learn and has none (an empty tuple).
    """
    _check(name, split)
    if name == "mnist":
        return _idx_files("mnist", MNIST_URL, split, None)
    if name == "fashion-mnist":
        return _idx_files("fashion-mnist", FASHION_MNIST_URL, split, FASHION_MNIST_SYSTEM)
    if name == "cifar10":
        batches = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
        return tuple(
            DataFile(f"images/cifar-10-batches-py/{b}", sha256="", url=CIFAR10_URL) for b in batches
        )
    if name == "cifar100":
        return (DataFile(f"images/cifar-100-python/{split}", sha256="", url=CIFAR100_URL),)
    return ()


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (gzip-compressed or not) into an array of its stored dtype and shape.

    The format: two zero bytes, a type byte (``0x08`` uint8 ... ``0x0E`` float64), the number of
    dimensions, then each dimension as a big-endian uint32, then the data in C order.
    """
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (magic bytes {raw[:4].hex()})")
    dtype, ndim = _IDX_DTYPES[raw[2]], raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int(d) for d in np.frombuffer(raw[4:header], dtype=">u4"))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(
            f"{path}: IDX header promises shape {shape} ({expected} bytes), "
            f"the file holds {len(raw) - header} bytes (truncated or damaged)"
        )
    array = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="))


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles only built-in containers and NumPy arrays (never arbitrary callables)."""

    _ALLOWED = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("_codecs", "encode"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")
        return super().find_class(module, name)


def read_cifar_batch(
    path: str | os.PathLike[str], label_key: str = "labels"
) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR python batch: ``(images uint8 (N, 3, 32, 32), labels int64 (N,))``.

    The batch is a pickled dict with ``data`` (``(N, 3072)`` uint8, channel-major rows) and the
    labels under ``label_key`` (``"labels"`` for CIFAR-10, ``"fine_labels"`` for CIFAR-100);
    keys may be ``bytes`` (the original Python 2 pickles) or ``str``.
    """
    with open(path, "rb") as handle:
        batch = _ArrayUnpickler(handle, encoding="bytes").load()
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: not a CIFAR batch (a pickled {type(batch).__name__})")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or label_key not in batch:
        raise ValueError(
            f"{path}: a CIFAR batch needs 'data' and {label_key!r}, has {sorted(batch)}"
        )
    data = np.asarray(batch["data"], dtype=np.uint8)
    labels = np.asarray(batch[label_key], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.shape[0] != labels.shape[0]:
        raise ValueError(f"{path}: data {data.shape} and labels {labels.shape} do not fit CIFAR-10")
    return data.reshape(-1, 3, 32, 32), labels


def _check(name: str, split: str) -> None:
    if name not in IMAGE_DATASETS:
        raise ValueError(f"name must be one of {sorted(IMAGE_DATASETS)}, got {name!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


Arrays = tuple[np.ndarray, np.ndarray]
PathArg = str | os.PathLike[str] | None


def _load_digits(split: str, data_dir: PathArg) -> Arrays:
    from sklearn.datasets import load_digits

    digits = load_digits()
    part = slice(0, DIGITS_TRAIN_SIZE) if split == "train" else slice(DIGITS_TRAIN_SIZE, None)
    images = digits.images[part].astype(np.float32) / 16.0
    return images[:, None], digits.target[part]


def _load_idx_pair(name: str, split: str, data_dir: PathArg) -> Arrays:
    image_file, label_file = image_files(name, split)
    images = read_idx(locate(image_file, data_dir))
    labels = read_idx(locate(label_file, data_dir))
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"{name} {split}: images {images.shape} and labels {labels.shape} do not match"
        )
    return images[:, None].astype(np.float32) / 255.0, labels


def _load_cifar(name: str, split: str, data_dir: PathArg) -> Arrays:
    label_key = "fine_labels" if name == "cifar100" else "labels"
    parts = [read_cifar_batch(locate(f, data_dir), label_key) for f in image_files(name, split)]
    images = np.concatenate([p[0] for p in parts])
    return images.astype(np.float32) / 255.0, np.concatenate([p[1] for p in parts])


_Loader = Callable[[str, PathArg], Arrays]

IMAGE_DATASETS: dict[str, _Loader] = {
    "digits": _load_digits,
    "mnist": lambda split, data_dir: _load_idx_pair("mnist", split, data_dir),
    "fashion-mnist": lambda split, data_dir: _load_idx_pair("fashion-mnist", split, data_dir),
    "cifar10": lambda split, data_dir: _load_cifar("cifar10", split, data_dir),
    "cifar100": lambda split, data_dir: _load_cifar("cifar100", split, data_dir),
}
"""Loader per dataset name: ``loader(split, data_dir) -> (images (N, C, H, W) float32, labels)``."""


def load_image_dataset(
    name: str, split: str = "train", data_dir: PathArg = None
) -> tuple[Tensor, Tensor]:
    """Load an image dataset as tensors.

    Args:
        name: ``"digits"``, ``"mnist"``, ``"fashion-mnist"``, ``"cifar10"`` or ``"cifar100"``
            (``images/cifar-100-python/{train,test}``, fine labels).
        split: ``"train"`` or ``"test"``.
        data_dir: the data root (else ``$HOPFIELD_DATA``; Fashion-MNIST is also found in its
            Debian location).

    Returns:
        ``images`` float32 ``(N, C, H, W)`` in ``[0, 1]`` (C = 1 except CIFAR's 3) and
        ``labels`` int64 ``(N,)`` in ``0..9``.

    Raises:
        ValueError: unknown ``name`` or ``split``, or a damaged file.
        hopfield.data.DataNotFoundError: a file is missing; the message names it and its URL.
    """
    _check(name, split)
    images, labels = IMAGE_DATASETS[name](split, data_dir)
    return torch.from_numpy(np.ascontiguousarray(images)), torch.from_numpy(labels.astype(np.int64))


# --- stand-in images (hopfield run --stand-in-data) -------------------------------------------

#: Images in ImageNet-1k's training split.
IMAGENET_TRAIN_IMAGES = 1_281_167

#: ``name -> (channels, side, classes, {split: images})`` of the real datasets, for stand-ins;
#: ``"imagenet"`` is ImageNet-1k (its side: the crop a model is trained at, 224 by default).
STAND_IN_SHAPES: dict[str, tuple[int, int, int, dict[str, int]]] = {
    "digits": (1, 8, 10, {"train": DIGITS_TRAIN_SIZE, "test": 1797 - DIGITS_TRAIN_SIZE}),
    "mnist": (1, 28, 10, {"train": 60_000, "test": 10_000}),
    "fashion-mnist": (1, 28, 10, {"train": 60_000, "test": 10_000}),
    "cifar10": (3, 32, 10, {"train": 50_000, "test": 10_000}),
    "cifar100": (3, 32, 100, {"train": 50_000, "test": 10_000}),
    "imagenet": (3, 224, 1000, {"train": IMAGENET_TRAIN_IMAGES, "test": 50_000}),
}


class StandInImages:
    """Random images in place of an absent dataset: ``images[i] = (image (C, S, S) in [0, 1],
    label int64 scalar in [0, classes))``.

    Example ``i`` is drawn from its own generator (seeded with ``seed`` and ``i``), so the
    examples are the same on every process and none is held in memory (ImageNet-sized stand-ins
    cost nothing until drawn). The numbers a model learns on them mean nothing; they only prove
    that a recipe runs.

    Args:
        count: number of images.
        channels, size, classes: the shape of the real data.
        seed: the data seed.
    """

    def __init__(self, count: int, channels: int, size: int, classes: int, seed: int = 0) -> None:
        for name, value in (
            ("count", count),
            ("channels", channels),
            ("size", size),
            ("classes", classes),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.count, self.channels, self.size, self.classes = count, channels, size, classes
        self.seed = seed

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        if not -self.count <= index < self.count:
            raise IndexError(f"index {index} out of range for {self.count} images")
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index % self.count)
        image = torch.rand(self.channels, self.size, self.size, generator=generator)
        return image, torch.randint(self.classes, (), generator=generator)

    def tensors(self, count: int | None = None) -> tuple[Tensor, Tensor]:
        """The first ``count`` examples (all when ``None``) in memory: images ``(N, C, S, S)``
        float32 and labels ``(N,)`` int64, as :func:`load_image_dataset` returns them."""
        count = self.count if count is None else min(count, self.count)
        pairs = [self[i] for i in range(count)]
        return torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs])


def stand_in_images(
    name: str, split: str = "train", *, size: int | None = None, count: int | None = None
) -> StandInImages:
    """A :class:`StandInImages` with the shape of dataset ``name``'s ``split`` (see
    :data:`STAND_IN_SHAPES`): as many images as the real split unless ``count`` is given, side
    ``size`` instead of the real one if given. Train and test splits draw different images."""
    if name not in STAND_IN_SHAPES:
        raise ValueError(f"name must be one of {sorted(STAND_IN_SHAPES)}, got {name!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    channels, side, classes, counts = STAND_IN_SHAPES[name]
    return StandInImages(
        counts[split] if count is None else count,
        channels,
        side if size is None else size,
        classes,
        seed=SPLITS.index(split) + 1,
    )

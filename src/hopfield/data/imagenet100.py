"""ImageNet-100 (the CMC subset of ImageNet-1k) from a standard image-folder tree.

The Hyper-SET paper trains on ImageNet-100 (Tables 1, 4; spec §6.2): the 100 ImageNet classes of
the CMC list (https://github.com/HobbitLong/CMC/blob/master/imagenet100.txt, one WordNet id such
as ``n02869837`` a line), 126,689 training and 5,000 validation images. Neither the images nor
the list can be derived offline, so the user supplies both below the data root::

    <data root>/images/imagenet100/train/<wnid>/*.JPEG
    <data root>/images/imagenet100/val/<wnid>/*.JPEG
    <data root>/images/imagenet100/imagenet100.txt        (the CMC class list)

The tree may hold more classes (a whole ImageNet-1k): only the listed ones are read, labelled
``0..99`` in the order of the list. :func:`load_imagenet100` lists the files of a split (sorted
by class and name), records a SHA-256 of that list (relative paths, sizes, labels), resizes every
image once to ``size × size`` RGB (bilinear, aspect ratio not kept, as the paper's test-time
``Resize(224, 224)``) and caches the result as ``uint8`` ``.npy`` shards of
:data:`SHARD_IMAGES` images with a manifest. Later calls reuse the cache while the checksum
agrees. The returned :class:`ImageFolderCache` holds the shards in memory when they fit in
``memory_limit`` bytes and otherwise memory-maps them, so a batch reads only its own images from
disk (the 224-pixel training split is about 19 GB).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from hopfield._validation import check_int
from hopfield.data.files import DataNotFoundError, data_root

__all__ = [
    "CLASS_LIST",
    "CLASS_LIST_URL",
    "FOLDER",
    "SHARD_IMAGES",
    "SPLIT_FOLDERS",
    "ImageFolderCache",
    "file_list_checksum",
    "list_images",
    "load_imagenet100",
    "read_class_list",
]

#: Folder of the tree below the data root.
FOLDER = "images/imagenet100"
#: Default name of the class-list file in :data:`FOLDER`.
CLASS_LIST = "imagenet100.txt"
CLASS_LIST_URL = "https://github.com/HobbitLong/CMC/blob/master/imagenet100.txt"
#: Sub-folders of the two splits.
SPLIT_FOLDERS = ("train", "val")
#: Images per cache shard.
SHARD_IMAGES = 1024
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
MANIFEST = "manifest.json"
_WNID = re.compile(r"n\d{8}")


def read_class_list(path: str | os.PathLike[str]) -> list[str]:
    """The WordNet ids of a class-list file: the first word of every non-empty line.

    Raises:
        DataNotFoundError: no such file (the message gives the CMC list's address).
        ValueError: a word that is not a WordNet id (``n`` and 8 digits), or a repeated id.
    """
    path = Path(path)
    if not path.is_file():
        raise DataNotFoundError(
            f"class list {path} not found: save the CMC ImageNet-100 list ({CLASS_LIST_URL}, one "
            "WordNet id a line) there, or pass class_list"
        )
    wnids = [line.split()[0] for line in path.read_text().splitlines() if line.strip()]
    bad = [w for w in wnids if not _WNID.fullmatch(w)]
    if bad:
        raise ValueError(f"{path}: {bad[0]!r} is not a WordNet id (n followed by 8 digits)")
    if len(set(wnids)) != len(wnids):
        twice = next(w for w in wnids if wnids.count(w) > 1)
        raise ValueError(f"{path}: class {twice} is listed twice")
    if not wnids:
        raise ValueError(f"{path}: the class list is empty")
    return wnids


def list_images(split_dir: Path, classes: Sequence[str]) -> list[tuple[str, int]]:
    """``(path relative to split_dir, label)`` of every image of ``classes`` below ``split_dir``,
    sorted by label and file name.

    Raises:
        DataNotFoundError: ``split_dir`` or a class folder is missing (the message names it).
        ValueError: a class folder holds no image.
    """
    if not split_dir.is_dir():
        raise DataNotFoundError(f"ImageNet-100 split folder {split_dir} not found")
    missing = [w for w in classes if not (split_dir / w).is_dir()]
    if missing:
        raise DataNotFoundError(
            f"class folder {split_dir / missing[0]} not found ({len(missing)} of the "
            f"{len(classes)} listed classes are missing below {split_dir})"
        )
    files = []
    for label, wnid in enumerate(classes):
        names = sorted(
            p.name
            for p in (split_dir / wnid).iterdir()
            if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
        )
        if not names:
            raise ValueError(f"class folder {split_dir / wnid} holds no images")
        files += [(f"{wnid}/{name}", label) for name in names]
    return files


def file_list_checksum(split_dir: Path, files: Sequence[tuple[str, int]]) -> str:
    """SHA-256 of the lines ``relative path, size in bytes, label`` of ``files``."""
    digest = hashlib.sha256()
    for relative, label in files:
        size = (split_dir / relative).stat().st_size
        digest.update(f"{relative}\t{size}\t{label}\n".encode())
    return digest.hexdigest()


class ImageFolderCache:
    """The resized images of one split: ``cache[index]`` is a ``uint8`` tensor
    ``(..., 3, size, size)`` for an int, a slice or a long tensor of indices; ``labels`` int64.

    Args:
        folder: a cache folder written by :func:`load_imagenet100` (manifest and shards).
        memory_limit: shards are read into memory when all of them fit in this many bytes,
            memory-mapped otherwise.
    """

    def __init__(self, folder: str | os.PathLike[str], memory_limit: int = 2**31) -> None:
        self.folder = Path(folder)
        manifest = json.loads((self.folder / MANIFEST).read_text())
        self.size: int = manifest["size"]
        self.checksum: str = manifest["checksum"]
        self.classes: list[str] = manifest["classes"]
        self.shard_images: int = manifest["shard_images"]
        self.labels = torch.from_numpy(np.load(self.folder / "labels.npy"))
        self.in_memory = len(self.labels) * 3 * self.size**2 <= memory_limit
        mode: Literal["r"] | None = None if self.in_memory else "r"
        self._shards = [
            np.load(self.folder / f"shard-{i:05d}.npy", mmap_mode=mode)
            for i in range(manifest["shards"])
        ]

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(images, 3, size, size)``."""
        return (len(self), 3, self.size, self.size)

    def __getitem__(self, index: int | slice | Tensor) -> Tensor:
        positions = np.arange(len(self))[np.asarray(index) if isinstance(index, Tensor) else index]
        flat = np.reshape(positions, -1)
        out = np.empty((len(flat), 3, self.size, self.size), dtype=np.uint8)
        shard_of = flat // self.shard_images
        for shard in np.unique(shard_of):
            rows = np.flatnonzero(shard_of == shard)
            out[rows] = self._shards[shard][flat[rows] % self.shard_images]
        return torch.from_numpy(out.reshape(*np.shape(positions), 3, self.size, self.size))


def _resized(path: Path, size: int) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as image:
        rgb = image.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)


def _write_cache(
    folder: Path,
    split_dir: Path,
    files: Sequence[tuple[str, int]],
    classes: Sequence[str],
    size: int,
    checksum: str,
) -> None:
    """Resize ``files`` into shards below ``folder``; the manifest, written last, marks it whole."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)
    shards = range(0, len(files), SHARD_IMAGES)
    for number, first in enumerate(shards):
        part = files[first : first + SHARD_IMAGES]
        images = np.stack([_resized(split_dir / relative, size) for relative, _ in part])
        _save(folder / f"shard-{number:05d}.npy", images)
    _save(folder / "labels.npy", np.array([label for _, label in files], dtype=np.int64))
    manifest = {"size": size, "checksum": checksum, "classes": list(classes),
                "shards": len(shards), "shard_images": SHARD_IMAGES, "images": len(files)}  # fmt: skip
    (folder / f"{MANIFEST}.tmp").write_text(json.dumps(manifest, indent=1))
    os.replace(folder / f"{MANIFEST}.tmp", folder / MANIFEST)


def _save(path: Path, array: np.ndarray) -> None:
    temporary = path.with_suffix(".tmp.npy")
    np.save(temporary, array)
    os.replace(temporary, path)


def _cached_checksum(folder: Path, size: int) -> str | None:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest.get("checksum") if manifest.get("size") == size else None


def load_imagenet100(
    split: str = "train",
    data_dir: str | os.PathLike[str] | None = None,
    *,
    size: int = 224,
    class_list: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    memory_limit: int = 2**31,
) -> ImageFolderCache:
    """The ``split`` (``"train"`` or ``"val"``) of ImageNet-100, resized and cached.

    Args:
        data_dir: the data root (else ``$HOPFIELD_DATA``); the tree is its :data:`FOLDER`.
        size: side of the resized images.
        class_list: the class-list file (default ``<tree>/imagenet100.txt``).
        cache_dir: where the shards of all splits go (default ``<tree>/cache-<size>``); each
            split has its own sub-folder, rebuilt when the file list's checksum changes.
        memory_limit: see :class:`ImageFolderCache`.

    Raises:
        DataNotFoundError: no data root, or a missing tree, split folder, class folder or
            class list (the message names the path).
        ValueError: a bad ``split`` or ``size``, a bad class list, an empty class folder.
    """
    if split not in SPLIT_FOLDERS:
        raise ValueError(f"split must be one of {SPLIT_FOLDERS}, got {split!r}")
    check_int("size", size)
    root = data_root(data_dir)
    if root is None:
        raise DataNotFoundError(
            f"ImageNet-100 needs a data root (data_dir or $HOPFIELD_DATA) holding {FOLDER}/"
        )
    tree = root / FOLDER
    if not tree.is_dir():
        raise DataNotFoundError(f"ImageNet-100 folder {tree} not found (see {__name__})")
    classes = read_class_list(tree / CLASS_LIST if class_list is None else class_list)
    split_dir = tree / split
    files = list_images(split_dir, classes)
    checksum = file_list_checksum(split_dir, files)
    folder = (tree / f"cache-{size}" if cache_dir is None else Path(cache_dir)) / split
    if _cached_checksum(folder, size) != checksum:
        _write_cache(folder, split_dir, files, classes, size, checksum)
    return ImageFolderCache(folder, memory_limit)

"""ImageNet-100 image-folder loader on a tiny generated tree of PNG and JPEG files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hopfield.data import DataNotFoundError
from hopfield.data.imagenet100 import (
    FOLDER,
    ImageFolderCache,
    list_images,
    load_imagenet100,
    read_class_list,
)

CLASSES = ["n00000002", "n00000001"]  # list order, not folder order, gives the labels
#: (class, file name, colour, width, height): uniform images, so a resize keeps the colour
IMAGES = [
    ("n00000001", "a.JPEG", (250, 10, 10), 40, 30),
    ("n00000001", "b.png", (10, 250, 10), 17, 23),
    ("n00000002", "c.png", (10, 10, 250), 8, 8),
    ("n00000002", "d.JPEG", (128, 128, 128), 64, 48),
    ("n00000002", "e.png", (0, 0, 0), 9, 9),
    ("n00000003", "f.png", (1, 2, 3), 8, 8),  # an unlisted class, never read
]


def _tree(root: Path) -> Path:
    tree = root / FOLDER
    for split in ("train", "val"):
        for wnid, name, colour, w, h in IMAGES:
            (tree / split / wnid).mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (w, h), colour).save(tree / split / wnid / name)
    (tree / "imagenet100.txt").write_text("\n".join(CLASSES) + "\n")
    return tree


def test_loads_resizes_and_labels_in_list_order(tmp_path: Path) -> None:
    _tree(tmp_path)
    data = load_imagenet100("train", tmp_path, size=6, cache_dir=tmp_path / "cache")
    assert data.shape == (5, 3, 6, 6) and data.classes == CLASSES
    assert data.labels.tolist() == [0, 0, 0, 1, 1]  # n00000002 (c, d, e) first, then n00000001
    images = data[torch.arange(5)]
    assert images.dtype == torch.uint8
    colours = [(10, 10, 250), (128, 128, 128), (0, 0, 0), (250, 10, 10), (10, 250, 10)]
    for image, colour in zip(images, colours, strict=True):
        expected = torch.tensor(colour, dtype=torch.float32)[:, None, None].expand(3, 6, 6)
        assert (image.float() - expected).abs().max() <= 3  # JPEG rounding only
    assert torch.equal(data[2], images[2]) and torch.equal(data[1:4], images[1:4])
    assert torch.equal(data[torch.tensor([[4, 0]])][0], images[[4, 0]])


def test_cache_is_reused_and_rebuilt_when_the_files_change(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    first = load_imagenet100("val", tmp_path, size=4)
    shard = tree / "cache-4" / "val" / "shard-00000.npy"
    written = shard.stat().st_mtime_ns
    again = load_imagenet100("val", tmp_path, size=4)
    assert shard.stat().st_mtime_ns == written and again.checksum == first.checksum
    Image.new("RGB", (5, 5), (7, 7, 7)).save(tree / "val" / "n00000001" / "g.png")
    changed = load_imagenet100("val", tmp_path, size=4)
    assert changed.checksum != first.checksum and len(changed) == 6
    assert changed.labels.tolist()[-1] == 1


def test_memory_mapped_shards_give_the_same_images(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path)
    monkeypatch.setattr("hopfield.data.imagenet100.SHARD_IMAGES", 2)  # 3 shards for 5 images
    loaded = load_imagenet100("train", tmp_path, size=5)
    streamed = ImageFolderCache(loaded.folder, memory_limit=0)
    assert loaded.in_memory and not streamed.in_memory
    assert isinstance(streamed._shards[0], np.memmap) and len(streamed._shards) == 3
    order = torch.tensor([4, 0, 3, 1, 2])
    assert torch.equal(streamed[order], loaded[order])


def test_missing_paths_are_named(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="imagenet100 not found"):
        load_imagenet100("train", tmp_path)
    tree = _tree(tmp_path)
    with pytest.raises(DataNotFoundError, match=r"class list .*other\.txt not found.*CMC"):
        load_imagenet100("train", tmp_path, class_list=tmp_path / "other.txt")
    (tmp_path / "more.txt").write_text("n00000001\nn00000009\n")
    with pytest.raises(DataNotFoundError, match=r"class folder .*train/n00000009 not found \(1 of"):
        load_imagenet100("train", tmp_path, class_list=tmp_path / "more.txt")
    with pytest.raises(DataNotFoundError, match=r"split folder .*nosplit not found"):
        list_images(tree / "nosplit", CLASSES)
    (tree / "train" / "n00000004").mkdir()
    (tmp_path / "empty.txt").write_text("n00000004\n")
    with pytest.raises(ValueError, match="n00000004 holds no images"):
        load_imagenet100("train", tmp_path, class_list=tmp_path / "empty.txt")
    with pytest.raises(ValueError, match="split must be one of"):
        load_imagenet100("test", tmp_path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("n0000001\n", "not a WordNet id"),
        ("n00000001\nn00000001\n", "listed twice"),
        ("\n", "empty"),
    ],
)
def test_bad_class_lists(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "list.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_class_list(path)


def test_class_list_takes_the_first_word_of_each_line(tmp_path: Path) -> None:
    path = tmp_path / "list.txt"
    path.write_text("n00000002 stingray\n\nn00000001\tcock\n")
    assert read_class_list(path) == CLASSES

"""Image loaders: IDX and CIFAR fixtures in the real formats, digits, the real MNIST test split."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from hopfield.data import DataNotFoundError
from hopfield.data.images import image_files, load_image_dataset, read_cifar_batch, read_idx


def write_idx_gz(path: Path, array: np.ndarray) -> None:
    """Write ``array`` (uint8) as a gzip-compressed IDX file, as LeCun's MNIST files are."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def write_idx_pair(
    root: Path, folder: str, prefix: str, n: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    write_idx_gz(root / "images" / folder / f"{prefix}-images-idx3-ubyte.gz", images)
    write_idx_gz(root / "images" / folder / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return images, labels


def test_read_idx_roundtrip_and_errors(tmp_path: Path) -> None:
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx_gz(tmp_path / "a.gz", array)
    np.testing.assert_array_equal(read_idx(tmp_path / "a.gz"), array)
    # uncompressed, big-endian int32
    values = np.array([[1, -2], [300000, 4]], dtype=">i4")
    header = bytes([0, 0, 0x0C, 2]) + struct.pack(">II", 2, 2)
    (tmp_path / "b").write_bytes(header + values.tobytes())
    out = read_idx(tmp_path / "b")
    np.testing.assert_array_equal(out, values.astype(np.int32))
    assert out.dtype == np.int32
    (tmp_path / "c").write_bytes(bytes([0, 0, 0x08, 1]) + struct.pack(">I", 10) + b"\x00" * 9)
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "c")
    (tmp_path / "d").write_bytes(b"PK\x03\x04junk")
    with pytest.raises(ValueError, match="not an IDX"):
        read_idx(tmp_path / "d")


def test_mnist_train_split_from_idx_fixture(tmp_path: Path) -> None:
    # The train split has no project checksum, so a fixture in the real format loads.
    images, labels = write_idx_pair(tmp_path, "mnist", "train", 7)
    x, y = load_image_dataset("mnist", "train", data_dir=tmp_path)
    assert x.shape == (7, 1, 28, 28) and x.dtype == torch.float32
    assert y.dtype == torch.int64
    torch.testing.assert_close(x[:, 0], torch.from_numpy(images).float() / 255)
    torch.testing.assert_close(y, torch.from_numpy(labels).long())
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0


def test_mnist_test_split_checksum_is_verified(tmp_path: Path) -> None:
    from hopfield.data import ChecksumError

    write_idx_pair(tmp_path, "mnist", "t10k", 3)
    with pytest.raises(ChecksumError):
        load_image_dataset("mnist", "test", data_dir=tmp_path)


def test_fashion_mnist_from_data_dir(tmp_path: Path) -> None:
    _, labels = write_idx_pair(tmp_path, "fashion-mnist", "t10k", 5, seed=1)
    x, y = load_image_dataset("fashion-mnist", "test", data_dir=tmp_path)
    assert x.shape == (5, 1, 28, 28)
    torch.testing.assert_close(y, torch.from_numpy(labels).long())
    assert image_files("fashion-mnist", "test")[0].system_paths == (
        "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz",
    )


def test_missing_files_raise_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match=r"train-images-idx3-ubyte\.gz"):
        load_image_dataset("mnist", "train", data_dir=tmp_path)
    with pytest.raises(DataNotFoundError, match="cifar-10-python"):
        load_image_dataset("cifar10", "test", data_dir=tmp_path)


def test_mismatched_idx_pair_is_rejected(tmp_path: Path) -> None:
    write_idx_pair(tmp_path, "mnist", "train", 4)
    write_idx_gz(tmp_path / "images/mnist/train-labels-idx1-ubyte.gz", np.zeros(3, np.uint8))
    with pytest.raises(ValueError, match="do not match"):
        load_image_dataset("mnist", "train", data_dir=tmp_path)


def write_cifar_batch(
    path: Path, n: int, seed: int, label_key: bytes = b"labels"
) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, 100, size=n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:  # bytes keys, as the original Python 2 pickles load
        pickle.dump({b"batch_label": b"x", b"data": data, label_key: labels}, handle, protocol=2)
    return data, labels


def test_cifar100_reads_fine_labels(tmp_path: Path) -> None:
    folder = tmp_path / "images" / "cifar-100-python"
    data, labels = write_cifar_batch(folder / "train", 3, seed=7, label_key=b"fine_labels")
    x, y = load_image_dataset("cifar100", "train", data_dir=tmp_path)
    assert x.shape == (3, 3, 32, 32) and y.tolist() == labels
    torch.testing.assert_close(
        x[1, 1].flatten(), torch.from_numpy(data[1, 1024:2048]).float() / 255
    )
    with pytest.raises(DataNotFoundError, match="cifar-100-python"):
        load_image_dataset("cifar100", "test", data_dir=tmp_path)


def test_cifar10_from_pickle_fixture(tmp_path: Path) -> None:
    folder = tmp_path / "images" / "cifar-10-batches-py"
    data, labels = write_cifar_batch(folder / "test_batch", 4, seed=0)
    x, y = load_image_dataset("cifar10", "test", data_dir=tmp_path)
    assert x.shape == (4, 3, 32, 32)
    # channel-major rows: the first 1024 values are the red plane
    torch.testing.assert_close(x[2, 0].flatten(), torch.from_numpy(data[2, :1024]).float() / 255)
    torch.testing.assert_close(x[2, 2].flatten(), torch.from_numpy(data[2, 2048:]).float() / 255)
    assert y.tolist() == labels
    expected = []
    for i in range(1, 6):
        expected += write_cifar_batch(folder / f"data_batch_{i}", 2, seed=i)[1]
    x, y = load_image_dataset("cifar10", "train", data_dir=tmp_path)
    assert x.shape == (10, 3, 32, 32) and y.tolist() == expected


def test_cifar_reader_refuses_code_in_pickles(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.getenv, ("HOME",))

    (tmp_path / "evil").write_bytes(pickle.dumps({"data": Evil(), "labels": []}))
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        read_cifar_batch(tmp_path / "evil")


def test_digits_split_is_deterministic_and_disjoint() -> None:
    x_train, _ = load_image_dataset("digits", "train")
    x_test, y_test = load_image_dataset("digits", "test")
    assert x_train.shape == (1437, 1, 8, 8) and x_test.shape == (360, 1, 8, 8)
    assert float(x_train.max()) == 1.0 and float(x_train.min()) == 0.0
    assert set(y_test.tolist()) == set(range(10))
    again, _ = load_image_dataset("digits", "train")
    assert torch.equal(again, x_train)
    flat_train = {tuple(r) for r in x_train.flatten(1).tolist()}
    overlap = sum(tuple(r) in flat_train for r in x_test.flatten(1).tolist())
    assert overlap == 0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="name"):
        load_image_dataset("svhn")
    with pytest.raises(ValueError, match="split"):
        load_image_dataset("digits", "valid")


def test_real_mnist_test_split(shared_data: Path) -> None:
    x, y = load_image_dataset("mnist", "test", data_dir=shared_data)
    assert x.shape == (10000, 1, 28, 28) and x.dtype == torch.float32
    counts = torch.bincount(y, minlength=10).tolist()
    assert counts == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert abs(float(x.mean()) - 0.1325) < 0.002  # the MNIST test mean intensity

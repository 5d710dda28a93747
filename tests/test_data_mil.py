"""MIL data: real-format fixtures (MATLAB v5 via scipy.io.savemat, CSV), batching, synthetic bags."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import io, sparse

from hopfield.data import ChecksumError, DataNotFoundError
from hopfield.data.mil import (
    MIL_DATASETS,
    MIL_SHAPES,
    MILDataset,
    collate_bags,
    load_mil_dataset,
    load_mnist_bag_pools,
    make_bit_pattern_bags,
    make_mnist_bags,
    pad_bags,
    read_mil_csv,
    read_mil_mat,
    stand_in_mil_dataset,
    stand_in_mnist_bag_pools,
)

# three bags (ids 7, 3, 5; bag 3's instances are not contiguous), sizes 2, 3, 1
BAG_IDS = np.array([7, 3, 7, 3, 5, 3])
LABELS = np.array([1, -1, 1, -1, 1, -1])


def features(n: int = 6, f: int = 4) -> np.ndarray:
    return np.arange(n * f, dtype=np.float64).reshape(n, f) / 10


def write_mat(path: Path) -> None:
    """The layout of S. Andrews' files: sparse features and labels, uint8 bag ids as a row."""
    io.savemat(
        path,
        {
            "features": sparse.csc_matrix(features()),
            "labels": sparse.csc_matrix(LABELS[None, :].astype(np.float64)),
            "bag_ids": BAG_IDS[None, :].astype(np.uint8),
        },
    )


def check_fixture(data: MILDataset) -> None:
    assert len(data) == 3 and data.num_features == 4
    assert data.bag_ids.tolist() == [3, 5, 7]
    assert data.labels.tolist() == [0.0, 1.0, 1.0]
    assert data.bag_sizes.tolist() == [3, 1, 2]
    bag, label = data[0]
    np.testing.assert_allclose(bag.numpy(), features()[[1, 3, 5]].astype(np.float32))
    assert float(label) == 0.0


def test_read_mil_mat_fixture(tmp_path: Path) -> None:
    write_mat(tmp_path / "x.mat")
    check_fixture(read_mil_mat(tmp_path / "x.mat"))


def test_read_mil_csv_fixture(tmp_path: Path) -> None:
    rows = [
        ",".join([str(int(lab > 0)), str(bag), *map(str, feat)])
        for lab, bag, feat in zip(LABELS, BAG_IDS, features(), strict=True)
    ]
    (tmp_path / "x.csv").write_bytes(("\r\n".join(rows) + "\r\n").encode())  # CRLF as UCSB
    check_fixture(read_mil_csv(tmp_path / "x.csv"))


def test_inconsistent_bag_labels_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="labels of some bag"):
        MILDataset.from_arrays(features(), BAG_IDS, np.array([1, -1, -1, -1, 1, -1]))
    io.savemat(tmp_path / "bad.mat", {"features": features()})
    with pytest.raises(ValueError, match="lacks"):
        read_mil_mat(tmp_path / "bad.mat")


def test_load_mil_dataset_errors(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match=r"mil/fox_100x100_matlab\.mat"):
        load_mil_dataset("fox", tmp_path)
    (tmp_path / "mil").mkdir()
    write_mat(tmp_path / "mil" / "tiger_100x100_matlab.mat")
    with pytest.raises(ChecksumError):
        load_mil_dataset("tiger", tmp_path)
    check_fixture(load_mil_dataset("tiger", tmp_path, verify=False))
    with pytest.raises(ValueError, match="name"):
        load_mil_dataset("musk2", tmp_path)


def test_batch_padding_matches_collate_and_subset() -> None:
    data = MILDataset.from_arrays(features(), BAG_IDS, LABELS)
    x, mask, y = data.batch(torch.tensor([2, 0]))
    assert x.shape == (2, 3, 4)
    assert mask.tolist() == [[False, False, True], [False, False, False]]
    assert float(x[0, 2].abs().sum()) == 0.0
    cx, cmask, cy = collate_bags([data[2], data[0]])
    assert torch.equal(x, cx) and torch.equal(mask, cmask) and torch.equal(y, cy)
    sub = data.subset([2, 1])
    assert sub.bag_ids.tolist() == [7, 5] and sub.bag_sizes.tolist() == [2, 1]
    assert torch.equal(sub[0][0], data[2][0])
    loader = torch.utils.data.DataLoader(data, batch_size=3, collate_fn=collate_bags)
    bx, bmask, _ = next(iter(loader))
    assert bx.shape == (3, 3, 4) and int((~bmask).sum()) == 6


def test_pad_bags_and_validation() -> None:
    x, mask = pad_bags([torch.ones(1, 2), torch.ones(3, 2)])
    assert x.shape == (2, 3, 2) and mask.tolist() == [[False, True, True], [False] * 3]
    with pytest.raises(ValueError, match="empty"):
        pad_bags([])
    with pytest.raises(ValueError, match="non-decreasing"):
        MILDataset(torch.zeros(2, 1), torch.tensor([1, 0]), torch.zeros(2), torch.arange(2))


def test_mnist_bags_structure() -> None:
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(200, 1, 4, 4, generator=generator)
    labels = torch.arange(200) % 10
    bags = make_mnist_bags(images, labels, num_pairs=30, bag_size=7, positives_per_bag=2, seed=3)
    assert len(bags) == 60 and bags.num_features == 16
    x, mask, y = bags.batch(torch.arange(60))
    assert x.shape == (60, 7, 16) and mask is None
    targets = (labels[bags.members] == 9).sum(dim=1)
    assert torch.equal(targets, (2 * y).long())  # signal bags hold exactly 2 nines, others none
    assert int(y.sum()) == 30
    again = make_mnist_bags(images, labels, num_pairs=30, bag_size=7, positives_per_bag=2, seed=3)
    assert torch.equal(again.members, bags.members)
    with pytest.raises(ValueError, match="positives_per_bag"):
        make_mnist_bags(images, labels, 3, 2, positives_per_bag=3)


def test_bit_pattern_bags() -> None:
    bags, signals = make_bit_pattern_bags(64, 10, num_bits=6, num_signals=4, signals_per_bag=2)
    x, _, y = bags.batch(torch.arange(64))
    codes = (x.long() << torch.arange(6)).sum(-1)
    holds = torch.isin(codes, signals).sum(dim=1)
    assert torch.equal(holds, (2 * y).long())
    test, same = make_bit_pattern_bags(16, 10, num_bits=6, num_signals=4, seed=1, signals=signals)
    assert torch.equal(same, signals) and len(test) == 16
    with pytest.raises(ValueError, match="num_bits"):
        make_bit_pattern_bags(4, 4, num_bits=30)


def test_digits_bag_pools_are_disjoint() -> None:
    (train_x, train_y), (test_x, _) = load_mnist_bag_pools("digits")
    assert train_x.shape == (1437, 64) and test_x.shape == (360, 64)
    bags = make_mnist_bags(train_x, train_y, num_pairs=5, bag_size=5)
    assert bags.batch(torch.arange(10))[0].shape == (10, 5, 64)
    with pytest.raises(ValueError, match="source"):
        load_mnist_bag_pools("cifar")


def test_stand_in_mil_datasets_have_the_real_shapes() -> None:
    for name, (features, largest, positive, negative) in MIL_SHAPES.items():
        data = stand_in_mil_dataset(name, seed=1)
        assert len(data) == positive + negative and data.num_features == features
        assert int(data.labels.sum()) == positive and int(data.bag_sizes.max()) <= largest
        assert int(data.bag_sizes.min()) >= 1 and "stand-in" in data.name
    first, again = stand_in_mil_dataset("musk1", seed=1), stand_in_mil_dataset("musk1", seed=1)
    assert torch.equal(again.instances, first.instances)  # the same on every process
    assert torch.equal(again.labels, first.labels)
    assert not torch.equal(stand_in_mil_dataset("musk1", seed=2).bag_sizes, first.bag_sizes)
    x, mask, _ = first.batch(torch.arange(4))
    assert x.shape[0] == 4 and mask is not None
    with pytest.raises(ValueError, match="name"):
        stand_in_mil_dataset("musk2")
    assert set(MIL_SHAPES) == set(MIL_DATASETS)


def test_stand_in_mnist_pools_have_the_real_shapes() -> None:
    (train_x, train_y), (test_x, test_y) = stand_in_mnist_bag_pools()
    assert train_x.shape == (8000, 784) and test_x.shape == (2000, 784)
    assert train_y.shape == (8000,) and test_y.shape == (2000,)
    assert float(train_x.min()) >= 0.0 and float(train_x.max()) <= 1.0
    assert set(train_y.unique().tolist()) == set(range(10))
    again = stand_in_mnist_bag_pools()[1][0]
    assert torch.equal(again, test_x)
    bags = make_mnist_bags(train_x, train_y, num_pairs=3, bag_size=5)
    assert bags.batch(torch.arange(6))[0].shape == (6, 5, 784)


def test_real_mil_benchmarks(shared_data: Path) -> None:
    expected = {
        "elephant": (1391, 230, 200, 100),
        "fox": (1320, 230, 200, 100),
        "tiger": (1220, 230, 200, 100),
        "musk1": (476, 166, 92, 47),
    }
    for name, (n, f, b, pos) in expected.items():
        data = load_mil_dataset(name, shared_data)
        assert tuple(data.instances.shape) == (n, f) and len(data) == b
        assert int(data.labels.sum()) == pos
    assert set(MIL_DATASETS) == {*expected, "ucsb"}
    for name, (features, largest, positive, negative) in MIL_SHAPES.items():  # the stand-ins'
        data = load_mil_dataset(name, shared_data)
        assert data.num_features == features and int(data.bag_sizes.max()) == largest
        assert (int(data.labels.sum()), int((1 - data.labels).sum())) == (positive, negative)


def test_real_ucsb_and_mnist_pools(shared_data: Path) -> None:
    data = load_mil_dataset("ucsb", shared_data)
    assert tuple(data.instances.shape) == (2002, 708) and len(data) == 58
    assert int(data.labels.sum()) == 26
    (train_x, train_y), (test_x, _) = load_mnist_bag_pools("mnist", shared_data)
    assert train_x.shape == (8000, 784) and test_x.shape == (2000, 784)
    assert int((train_y == 9).sum()) > 700

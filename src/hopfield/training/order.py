"""The data order: which examples every micro-batch of every optimiser step trains on, a pure
function of the seed and the epoch that does not depend on the process layout."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from hopfield.training.config import micro_batch_layout


class BatchOrder:
    """The examples of every micro-batch: a pure function of ``(seed, epoch)``.

    Epoch ``e`` is ``torch.randperm(size)`` from a generator seeded with ``seed`` and ``e``, cut
    into global batches of ``batch_size`` examples (the incomplete rest is dropped). Optimiser
    step ``s`` trains on global batch ``s``; its ``accumulation = batch_size / (micro_batch_size
    × processes)`` micro-steps take consecutive slices of ``micro_batch_size × processes``
    examples, of which process ``rank`` takes slice ``rank``. The examples of a step therefore do
    not depend on the process layout.

    Args:
        size: number of examples.
        batch_size: global examples per optimiser step.
        micro_batch_size: examples per micro-batch on one process (``None``:
            ``batch_size / processes``).
        seed: data-order seed.
        processes, rank: the process layout.
        shuffle: permute each epoch (else the natural order every epoch).
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        micro_batch_size: int | None = None,
        seed: int = 0,
        processes: int = 1,
        rank: int = 0,
        shuffle: bool = True,
    ) -> None:
        if processes < 1 or not 0 <= rank < processes:
            raise ValueError(
                f"need processes >= 1 and 0 <= rank < processes, got {processes}, {rank}"
            )
        micro = micro_batch_layout(batch_size, micro_batch_size, processes)
        if size < batch_size:
            raise ValueError(
                f"dataset: {size} examples are fewer than one global batch ({batch_size})"
            )
        self.size, self.batch_size, self.micro_batch_size = size, batch_size, micro
        self.accumulation = batch_size // (micro * processes)
        self.seed, self.processes, self.rank, self.shuffle = seed, processes, rank, shuffle
        self.per_epoch = size // batch_size
        self._epoch = -1
        self._perm = torch.arange(size)

    def epoch_of(self, step: int) -> int:
        """The epoch optimiser step ``step`` (0-based over the whole run) belongs to."""
        return step // self.per_epoch

    def indices(self, step: int, micro: int = 0) -> list[int]:
        """Example indices of micro-step ``micro`` of optimiser step ``step`` on this process."""
        if not 0 <= micro < self.accumulation:
            raise ValueError(f"micro must lie in [0, {self.accumulation}), got {micro}")
        epoch, offset = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            if self.shuffle:
                generator = torch.Generator().manual_seed(
                    (self.seed * 1_000_003 + epoch) % (2**63 - 1)
                )
                self._perm = torch.randperm(self.size, generator=generator)
            self._epoch = epoch
        width = self.micro_batch_size
        start = offset * self.batch_size + (micro * self.processes + self.rank) * width
        return self._perm[start : start + width].tolist()


class MicroBatchSampler(Sampler[list[int]]):
    """The example indices of this process's micro-batches from optimiser step ``start`` to
    ``end`` (exclusive), in training order (:meth:`BatchOrder.indices`): the ``batch_sampler``
    of the :class:`~torch.utils.data.DataLoader` that feeds :class:`Trainer`."""

    def __init__(self, order: BatchOrder, start: int, end: int) -> None:
        if not 0 <= start <= end:
            raise ValueError(f"need 0 <= start <= end, got start={start}, end={end}")
        self.order, self.start, self.end = order, start, end

    def __len__(self) -> int:
        return (self.end - self.start) * self.order.accumulation

    def __iter__(self) -> Iterator[list[int]]:
        # a copy, so the permutation cache of a worker-side order never races the trainer's
        order = copy.copy(self.order)
        for step in range(self.start, self.end):
            for micro in range(order.accumulation):
                yield order.indices(step, micro)

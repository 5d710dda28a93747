"""Time-series forecasting data: ETTh1, ETTm1, WTH (plus ECL and Traffic), splits and windows.

The files are the standard Informer/Crossformer CSVs (a ``date`` column, then one column per
series). Two split protocols are implemented, both contiguous in time:

* ``"ratio"`` (nonparametric Hopfield paper, Informer code): train = ``int(0.7·n)``,
  test = ``int(0.2·n)``, validation = the rest;
* ``"stanhop"`` (STanHop and OutEffHop Table 2, Crossformer code): fixed row counts in months of
  30 days, ETT 12/4/4 months, WTH 28/10/10 months (= 14/5/5), ECL 15/3/4 months,
  Traffic 0.7/0.1/0.2.

Standardisation is per column, with the mean and the population standard deviation (ddof = 0)
of the **training rows only**. The first validation and test windows look back ``in_len`` rows
into the previous split for their inputs; every target lies inside its own split.

A :class:`WindowDataset` returns views into one standardised series tensor: no window is ever
copied until a batch is stacked.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from hopfield.data.files import DataFile, locate

__all__ = [
    "DATASETS",
    "ForecastSplits",
    "SeriesSpec",
    "WindowDataset",
    "load_forecasting",
    "load_series",
    "make_splits",
    "read_series_csv",
    "series_count",
    "split_sizes",
    "stand_in_series",
    "synthetic_series",
]

_HOURS_PER_MONTH = 30 * 24


@dataclass(frozen=True)
class SeriesSpec:
    """A forecasting dataset.

    Attributes:
        name: ``"ETTh1"``, ``"ETTm1"``, ``"WTH"``, ``"ECL"`` or ``"Traffic"``.
        file: where the CSV lives below the data root.
        target: the column used in the univariate setting (the nonparametric paper's choice).
        stanhop_rows: ``(train, val, test)`` row counts of the STanHop/Crossformer protocol, or
            ``None`` where that protocol uses the 0.7/0.1/0.2 ratio.
        shape: ``(rows, series)`` of the file (the ``date`` column not counted): the shape of
            its stand-in (:func:`stand_in_series`).
        user_supplied: the project does not ship the file (ECL, Traffic): it is not checksummed,
            and an experiment skips the dataset when it is absent instead of stopping.
    """

    name: str
    file: DataFile
    target: str
    stanhop_rows: tuple[int, int, int] | None
    shape: tuple[int, int]
    user_supplied: bool = False


DATASETS: dict[str, SeriesSpec] = {
    "ETTh1": SeriesSpec(
        "ETTh1",
        DataFile(
            "timeseries/ETTh1.csv",
            "f18de3ad269cef59bb07b5438d79bb3042d3be49bdeecf01c1cd6d29695ee066",
            "https://github.com/zhouhaoyi/ETDataset/raw/main/ETT-small/ETTh1.csv",
        ),
        "OT",
        (12 * _HOURS_PER_MONTH, 4 * _HOURS_PER_MONTH, 4 * _HOURS_PER_MONTH),
        (17_420, 7),
    ),
    "ETTm1": SeriesSpec(
        "ETTm1",
        DataFile(
            "timeseries/ETTm1.csv",
            "6ce1759b1a18e3328421d5d75fadcb316c449fcd7cec32820c8dafda71986c9e",
            "https://github.com/zhouhaoyi/ETDataset/raw/main/ETT-small/ETTm1.csv",
        ),
        "OT",
        (4 * 12 * _HOURS_PER_MONTH, 4 * 4 * _HOURS_PER_MONTH, 4 * 4 * _HOURS_PER_MONTH),
        (69_680, 7),
    ),
    "WTH": SeriesSpec(
        "WTH",
        DataFile(
            "timeseries/WTH.csv",
            "153fead3ea2a83dc5c4127d3994af6b167322f6f5e292c99491f43a2caf14cd4",
            "https://github.com/MAGICS-LAB/STanHop/raw/main/datasets/WTH.csv",
        ),
        "DryBulbFarenheit",
        (28 * _HOURS_PER_MONTH, 10 * _HOURS_PER_MONTH, 10 * _HOURS_PER_MONTH),
        (35_064, 12),
    ),
    # User-supplied files (not shipped with the project): no checksum is enforced.
    "ECL": SeriesSpec(
        "ECL",
        DataFile("timeseries/ECL.csv", "", "https://github.com/zhouhaoyi/Informer2020 (ECL.csv)"),
        "MT_000",
        (15 * _HOURS_PER_MONTH, 3 * _HOURS_PER_MONTH, 4 * _HOURS_PER_MONTH),
        (26_304, 321),
        user_supplied=True,
    ),
    "Traffic": SeriesSpec(
        "Traffic",
        DataFile("timeseries/traffic.csv", "", "https://github.com/thuml/Autoformer (traffic.csv)"),
        "0",
        None,
        (17_544, 862),
        user_supplied=True,
    ),
}


def read_series_csv(path: str | os.PathLike[str]) -> tuple[np.ndarray, list[str]]:
    """Read an Informer-format CSV: a first ``date`` column, then numeric columns.

    Returns:
        ``(values (N, C) float64, column names (C,))``; the date column is dropped.

    Raises:
        ValueError: naming the file, when it is no such CSV: no ``date`` header, no data row, a
            value that is no number, or a value that is NaN or infinite (a gap in the series).
    """
    path = Path(path)
    try:
        with path.open() as handle:
            header = handle.readline().strip().split(",")
        if len(header) < 2 or header[0].strip().lower() != "date":
            raise ValueError(f"expected a header starting with 'date', got {header[:3]}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "no data": refused below
            values = np.loadtxt(
                path,
                delimiter=",",
                skiprows=1,
                usecols=range(1, len(header)),
                dtype=np.float64,
                ndmin=2,
            )
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: {error}") from error
    if values.shape[0] == 0:
        raise ValueError(f"{path}: no data rows below the header")
    bad = np.argwhere(~np.isfinite(values))
    if len(bad):
        row, column = bad[0]
        raise ValueError(
            f"{path}: the value of column {header[column + 1].strip()!r} in data row {row + 1} is "
            f"{values[row, column]}, not a finite number"
        )
    return values, [c.strip() for c in header[1:]]


def load_series(
    name: str, data_dir: str | os.PathLike[str] | None = None
) -> tuple[np.ndarray, list[str]]:
    """The raw values ``(N, C)`` and column names of dataset ``name`` (checksum verified).

    Raises:
        ValueError: unknown ``name``.
        hopfield.data.DataNotFoundError: the file is not in the data directory.
    """
    if name not in DATASETS:
        raise ValueError(f"name must be one of {sorted(DATASETS)}, got {name!r}")
    return read_series_csv(locate(DATASETS[name].file, data_dir))


def synthetic_series(
    n_rows: int, n_channels: int = 7, *, period: int = 24, noise: float = 0.1, seed: int = 0
) -> np.ndarray:
    """A generated multivariate series ``(n_rows, n_channels)`` for tiny presets and tests.

    Each channel is a sum of a daily (``period``) and a weekly sinusoid with random phases and
    amplitudes, a slow trend and Gaussian noise of standard deviation ``noise``.
    """
    if n_rows < 1 or n_channels < 1:
        raise ValueError(f"n_rows and n_channels must be >= 1, got {n_rows}, {n_channels}")
    rng = np.random.default_rng(seed)
    t = np.arange(n_rows, dtype=np.float64)[:, None]
    phase = rng.uniform(0, 2 * math.pi, size=(2, n_channels))
    amp = rng.uniform(0.5, 2.0, size=(2, n_channels))
    trend = rng.normal(0.0, 1.0 / max(n_rows, 1), size=(1, n_channels))
    signal = amp[0] * np.sin(2 * math.pi * t / period + phase[0])
    signal = signal + amp[1] * np.sin(2 * math.pi * t / (7 * period) + phase[1]) + trend * t
    return signal + noise * rng.standard_normal((n_rows, n_channels))


def series_count(dataset: str) -> int:
    """Series (columns besides ``date``) of forecasting dataset ``dataset`` (a name of
    :data:`DATASETS` or ``"synthetic"``), without reading its file."""
    if dataset == "synthetic":
        return int(synthetic_series(2).shape[1])
    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {[*DATASETS, 'synthetic']}, got {dataset!r}")
    return DATASETS[dataset].shape[1]


def stand_in_series(name: str, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """Random values in place of dataset ``name``'s file, of its shape (``hopfield run
    --stand-in-data``: a paper preset runs without the file; the numbers mean nothing).

    Returns:
        ``(values (rows, series) float64, names)``: independent standard normal values (the same
        for a given ``seed`` on every process) and column names, of which the last is the
        dataset's univariate target.
    """
    if name not in DATASETS:
        raise ValueError(f"name must be one of {sorted(DATASETS)}, got {name!r}")
    spec = DATASETS[name]
    rows, series = spec.shape
    values = np.random.default_rng(seed).standard_normal((rows, series))
    return values, [f"series{i}" for i in range(series - 1)] + [spec.target]


def split_sizes(
    n_rows: int,
    protocol: str = "ratio",
    *,
    dataset: str | None = None,
    ratios: Sequence[float] = (0.7, 0.1, 0.2),
) -> tuple[int, int, int]:
    """Row counts ``(train, val, test)`` of a contiguous split.

    Args:
        n_rows: length of the series.
        protocol: ``"ratio"`` (train ``int(r0·n)``, test ``int(r2·n)``, val the rest; ratios are
            normalised, so ``(14, 5, 5)`` works) or ``"stanhop"`` (the month counts of
            :data:`DATASETS`; needs ``dataset``; falls back to 0.7/0.1/0.2 where it has none).
        dataset: dataset name, for ``"stanhop"``.
        ratios: three positive weights for ``"ratio"``.
    """
    if n_rows < 3:
        raise ValueError(f"n_rows must be >= 3, got {n_rows}")
    if protocol == "stanhop":
        if dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {sorted(DATASETS)} for 'stanhop'")
        rows = DATASETS[dataset].stanhop_rows
        if rows is None:
            return split_sizes(n_rows, "ratio", ratios=(0.7, 0.1, 0.2))
        if sum(rows) > n_rows:
            raise ValueError(
                f"the 'stanhop' split of {dataset} needs {sum(rows)} rows, got {n_rows}"
            )
        return rows
    if protocol != "ratio":
        raise ValueError(f"protocol must be 'ratio' or 'stanhop', got {protocol!r}")
    if len(ratios) != 3 or any(r <= 0 for r in ratios):
        raise ValueError(f"ratios must be three positive numbers, got {tuple(ratios)}")
    total = float(sum(ratios))
    n_train = int(n_rows * ratios[0] / total)
    n_test = int(n_rows * ratios[2] / total)
    return n_train, n_rows - n_train - n_test, n_test


class WindowDataset(Dataset[tuple[Tensor, Tensor]]):
    """Sliding windows ``in_len -> out_len`` over rows ``[start, stop)`` of one series, stride 1.

    Sample ``i`` is ``(series[a : a+T, inputs], series[a+T : a+T+τ, targets])`` with
    ``a = start + i``. Items are views of ``series`` (no copy); :meth:`batch` gathers a batch
    with one indexing operation.

    Args:
        series: ``(N, C)`` standardised series (shared by all splits).
        in_len: input length ``T``.
        out_len: horizon ``τ``.
        start, stop: the rows this split may touch (inputs and targets).
        input_columns, target_columns: column indices of inputs and targets (all by default).
    """

    def __init__(
        self,
        series: Tensor,
        in_len: int,
        out_len: int,
        start: int = 0,
        stop: int | None = None,
        input_columns: Sequence[int] | None = None,
        target_columns: Sequence[int] | None = None,
    ) -> None:
        if not isinstance(series, Tensor) or series.dim() != 2:
            raise TypeError("series must be a 2-D Tensor (rows, columns)")
        if in_len < 1 or out_len < 1:
            raise ValueError(f"in_len and out_len must be >= 1, got {in_len}, {out_len}")
        stop = series.shape[0] if stop is None else stop
        if not 0 <= start <= stop <= series.shape[0]:
            raise ValueError(f"need 0 <= start <= stop <= {series.shape[0]}, got {start}, {stop}")
        if stop - start < in_len + out_len:
            raise ValueError(
                f"rows [{start}, {stop}) are too few for in_len={in_len} + out_len={out_len}"
            )
        columns = series.shape[1]
        for name, cols in (("input_columns", input_columns), ("target_columns", target_columns)):
            if cols is not None and (len(cols) == 0 or any(not 0 <= c < columns for c in cols)):
                raise ValueError(f"{name} must be non-empty indices in [0, {columns}), got {cols}")
        self.series = series
        self.in_len = in_len
        self.out_len = out_len
        self.start = start
        self.stop = stop
        self.input_columns = list(range(columns)) if input_columns is None else list(input_columns)
        self.target_columns = (
            list(range(columns)) if target_columns is None else list(target_columns)
        )
        self._all_inputs = self.input_columns == list(range(columns))
        self._all_targets = self.target_columns == list(range(columns))

    def __len__(self) -> int:
        return self.stop - self.start - self.in_len - self.out_len + 1

    def _columns(self, block: Tensor, columns: list[int], everything: bool) -> Tensor:
        if everything:
            return block
        if len(columns) == 1:
            return block[..., columns[0] : columns[0] + 1]
        return block[..., columns]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        """``(x (T, C_in), y (τ, C_out))``, views of the series where the columns allow it."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} windows")
        a = self.start + (index % len(self))
        x = self.series[a : a + self.in_len]
        y = self.series[a + self.in_len : a + self.in_len + self.out_len]
        return (
            self._columns(x, self.input_columns, self._all_inputs),
            self._columns(y, self.target_columns, self._all_targets),
        )

    def batch(self, indices: Tensor) -> tuple[Tensor, Tensor]:
        """A batch ``(x (B, T, C_in), y (B, τ, C_out))`` for window indices ``(B,)``."""
        span = self.in_len + self.out_len
        windows = self.series[self.start : self.stop].unfold(0, span, 1)  # view (n, C, T+τ)
        block = windows[indices].transpose(1, 2)  # (B, T+τ, C), the only copy
        x = self._columns(block[:, : self.in_len], self.input_columns, self._all_inputs)
        y = self._columns(block[:, self.in_len :], self.target_columns, self._all_targets)
        return x, y

    def batches(
        self, batch_size: int, *, shuffle: bool = False, generator: torch.Generator | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """Iterate over batches (the last one may be smaller), shuffled with ``generator``."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        n = len(self)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        for first in range(0, len(self), batch_size):
            yield self.batch(order[first : first + batch_size])


@dataclass
class ForecastSplits:
    """Train, validation and test windows over one standardised series.

    Attributes:
        train, val, test: the three :class:`WindowDataset` objects (they share ``series``).
        series: ``(N, C)`` standardised float32 series.
        mean, std: the per-column statistics of the training rows, ``(C,)``.
        columns: all column names; ``input_columns`` / ``target_columns`` index them.
        sizes: ``(train, val, test)`` row counts.
    """

    train: WindowDataset
    val: WindowDataset
    test: WindowDataset
    series: Tensor
    mean: np.ndarray
    std: np.ndarray
    columns: list[str]
    sizes: tuple[int, int, int]

    @property
    def num_inputs(self) -> int:
        return len(self.train.input_columns)

    @property
    def num_targets(self) -> int:
        return len(self.train.target_columns)


def make_splits(
    values: np.ndarray,
    in_len: int,
    out_len: int,
    sizes: tuple[int, int, int],
    *,
    columns: Sequence[str] | None = None,
    features: str = "M",
    target: str | None = None,
) -> ForecastSplits:
    """Standardise ``values (N, C)`` on the training rows and cut the three window datasets.

    Args:
        values: raw series, rows in time order.
        in_len, out_len: window lengths ``T`` and ``τ``.
        sizes: ``(train, val, test)`` row counts; rows beyond their sum are never used.
        columns: column names (``"0"``, ``"1"``, ... by default).
        features: ``"M"`` (all columns in and out), ``"S"`` (the ``target`` column in and out) or
            ``"MS"`` (all columns in, ``target`` out).
        target: the target column name for ``"S"`` and ``"MS"`` (the last column by default).
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2:
        raise ValueError(f"values must be 2-D (rows, columns), got shape {values.shape}")
    names = [str(i) for i in range(values.shape[1])] if columns is None else list(columns)
    if len(names) != values.shape[1]:
        raise ValueError(f"columns has {len(names)} names for {values.shape[1]} columns")
    n_train, n_val, n_test = sizes
    if min(sizes) < 1 or n_train + n_val + n_test > values.shape[0]:
        raise ValueError(f"sizes must be positive and fit in {values.shape[0]} rows, got {sizes}")
    if features not in ("M", "S", "MS"):
        raise ValueError(f"features must be 'M', 'S' or 'MS', got {features!r}")
    target_name = names[-1] if target is None else target
    if target_name not in names:
        raise ValueError(f"target must be one of the columns {names}, got {target!r}")
    t = names.index(target_name)
    mean = values[:n_train].mean(axis=0)
    std = values[:n_train].std(axis=0)
    if np.any(std == 0):
        raise ValueError(f"columns {[names[i] for i in np.flatnonzero(std == 0)]} are constant")
    series = torch.from_numpy(((values - mean) / std).astype(np.float32))
    inputs = [t] if features == "S" else None
    targets = None if features == "M" else [t]
    b1, b2, b3 = n_train, n_train + n_val, n_train + n_val + n_test
    ranges = ((0, b1), (b1 - in_len, b2), (b2 - in_len, b3))
    train, val, test = (
        WindowDataset(series, in_len, out_len, max(lo, 0), hi, inputs, targets) for lo, hi in ranges
    )
    return ForecastSplits(train, val, test, series, mean, std, names, (n_train, n_val, n_test))


def load_forecasting(
    name: str,
    in_len: int,
    out_len: int,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    protocol: str = "ratio",
    features: str = "M",
    target: str | None = None,
    max_rows: int | None = None,
    stand_in: bool = False,
) -> ForecastSplits:
    """Windows of dataset ``name`` (or ``"synthetic"``) under a split protocol.

    Args:
        name: a key of :data:`DATASETS`, or ``"synthetic"`` (:func:`synthetic_series`, 7 columns,
            ``max_rows`` rows, default 2000).
        in_len, out_len: window lengths.
        data_dir: data root (``$HOPFIELD_DATA`` by default).
        protocol: ``"ratio"`` (70/10/20) or ``"stanhop"`` (month counts); see :func:`split_sizes`.
        features: ``"M"``, ``"S"`` or ``"MS"``; see :func:`make_splits`.
        target: univariate target column (the dataset's :attr:`SeriesSpec.target` by default).
        max_rows: keep only the first ``max_rows`` rows (tiny presets); the split is then the
            ratio split of those rows.
        stand_in: use :func:`stand_in_series` (random values of the file's shape) instead of
            the file (``name`` must be a key of :data:`DATASETS`).
    """
    if name == "synthetic":
        values = synthetic_series(max_rows or 2000)
        names = [f"s{i}" for i in range(values.shape[1])]
        target = names[-1] if target is None else target
    else:
        values, names = stand_in_series(name) if stand_in else load_series(name, data_dir)
        target = DATASETS[name].target if target is None else target
    if max_rows is not None:
        if max_rows < 3:
            raise ValueError(f"max_rows must be >= 3, got {max_rows}")
        values = values[:max_rows]
    use_ratio = protocol == "ratio" or max_rows is not None or name == "synthetic"
    if protocol not in ("ratio", "stanhop"):
        raise ValueError(f"protocol must be 'ratio' or 'stanhop', got {protocol!r}")
    sizes = (
        split_sizes(len(values), "ratio")
        if use_ratio
        else split_sizes(len(values), "stanhop", dataset=name)
    )
    return make_splits(
        values, in_len, out_len, sizes, columns=names, features=features, target=target
    )

"""Time-series data: CSV reading, split protocols, scaling on train rows, window indexing."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from hopfield.data import DataNotFoundError
from hopfield.data.timeseries import (
    DATASETS,
    WindowDataset,
    load_forecasting,
    load_series,
    make_splits,
    read_series_csv,
    series_count,
    split_sizes,
    synthetic_series,
)


def write_ett_csv(path: Path, n_rows: int) -> np.ndarray:
    """A small CSV in the ETT format (date + 7 columns); returns its values."""
    values = np.round(synthetic_series(n_rows, 7, seed=3) * 3 + 10, 6)
    names = ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]
    lines = ["date," + ",".join(names)]
    for i, row in enumerate(values):
        stamp = f"2016-07-{1 + i // 24:02d} {i % 24:02d}:00:00"
        lines.append(stamp + "," + ",".join(repr(float(v)) for v in row))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return values


def test_read_csv_drops_date_and_keeps_order(tmp_path: Path) -> None:
    values = write_ett_csv(tmp_path / "x.csv", 50)
    read, names = read_series_csv(tmp_path / "x.csv")
    assert names[-1] == "OT" and len(names) == 7
    np.testing.assert_allclose(read, values)
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="date"):
        read_series_csv(tmp_path / "bad.csv")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("date,a,b\n", "no data rows below the header"),
        ("date,a,b\n2016-07-01,1,2\n2016-07-02,nan,3\n", "column 'a' in data row 2 is nan"),
        ("date,a,b\n2016-07-01,1,inf\n", "column 'b' in data row 1 is inf"),
        ("date,a,b\n2016-07-01,1,x\n", "could not convert"),
        ("date,a,b\n2016-07-01,1\n", ""),
    ],
)
def test_a_bad_csv_is_refused_naming_the_file(tmp_path: Path, text: str, reason: str) -> None:
    """Header-only files and NaN/inf values were accepted, parse errors did not name the file."""
    path = tmp_path / "series.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: .*{reason}"):
        read_series_csv(path)


def test_split_sizes_protocols() -> None:
    assert split_sizes(1000) == (700, 100, 200)
    assert split_sizes(17420, "stanhop", dataset="ETTh1") == (8640, 2880, 2880)
    assert split_sizes(69680, "stanhop", dataset="ETTm1") == (34560, 11520, 11520)
    assert split_sizes(35064, "stanhop", dataset="WTH") == (20160, 7200, 7200)
    assert split_sizes(1000, "stanhop", dataset="Traffic") == (700, 100, 200)
    assert split_sizes(2400, ratios=(14, 5, 5)) == (1400, 500, 500)
    with pytest.raises(ValueError, match="protocol"):
        split_sizes(100, "months")
    with pytest.raises(ValueError, match="needs"):
        split_sizes(100, "stanhop", dataset="ETTh1")


def test_window_indexing_and_no_copy() -> None:
    series = torch.arange(40.0).reshape(20, 2)
    ds = WindowDataset(series, in_len=4, out_len=3, start=2, stop=15)
    assert len(ds) == 15 - 2 - 7 + 1
    x, y = ds[0]
    assert torch.equal(x[:, 0], torch.tensor([4.0, 6, 8, 10]))  # rows 2..5
    assert torch.equal(y[:, 0], torch.tensor([12.0, 14, 16]))  # rows 6..8
    assert x.data_ptr() == series[2].data_ptr()  # a view, not a copy
    assert y.untyped_storage().data_ptr() == series.untyped_storage().data_ptr()
    _, last_y = ds[len(ds) - 1]
    assert last_y[-1, 0].item() == series[14, 0].item()  # never reaches row `stop`
    bx, by = ds.batch(torch.tensor([0, len(ds) - 1]))
    assert torch.equal(bx[0], x) and torch.equal(by[1], last_y)
    with pytest.raises(IndexError):
        ds[len(ds)]
    with pytest.raises(ValueError, match="too few"):
        WindowDataset(series, 10, 10, 0, 15)


def test_window_columns_and_batches() -> None:
    series = torch.randn(30, 3)
    ds = WindowDataset(series, 5, 2, input_columns=[2], target_columns=[0, 2])
    x, y = ds[3]
    assert x.shape == (5, 1) and y.shape == (2, 2)
    assert torch.equal(x[:, 0], series[3:8, 2]) and torch.equal(y, series[8:10][:, [0, 2]])
    sizes = [b[0].shape[0] for b in ds.batches(10, shuffle=True, generator=torch.Generator())]
    assert sum(sizes) == len(ds) and sizes[-1] == len(ds) % 10
    seen = torch.cat([b[1][:, 0, 0] for b in ds.batches(7)])
    assert torch.equal(seen, series[5 : 5 + len(ds), 0])


def test_splits_scaling_and_no_leakage() -> None:
    values = np.random.default_rng(0).normal(5, 3, size=(200, 3))
    splits = make_splits(values, 12, 4, (140, 20, 40))
    np.testing.assert_allclose(splits.mean, values[:140].mean(0))
    np.testing.assert_allclose(splits.std, values[:140].std(0))  # population std (ddof 0)
    train_part = splits.series[:140].double()
    assert torch.allclose(train_part.mean(0), torch.zeros(3, dtype=torch.float64), atol=1e-5)
    # Targets of each split stay inside its rows; inputs may look back in_len rows.
    assert splits.train.stop == 140 and len(splits.train) == 140 - 16 + 1
    assert splits.val.start == 140 - 12 and splits.val.stop == 160
    assert splits.test.start == 160 - 12 and splits.test.stop == 200
    first_val_target = splits.val[0][1]
    assert torch.equal(first_val_target, splits.series[140:144])
    assert len(splits.val) == 20 - 4 + 1 and len(splits.test) == 40 - 4 + 1


def test_univariate_and_ms_settings() -> None:
    values = synthetic_series(300, 4)
    s = make_splits(values, 8, 2, (200, 40, 60), columns=list("abcd"), features="S", target="b")
    x, _ = s.train[0]
    assert s.num_inputs == 1 and x.shape == (8, 1) and torch.equal(x[:, 0], s.series[:8, 1])
    ms = make_splits(values, 8, 2, (200, 40, 60), features="MS")
    assert ms.train[0][0].shape == (8, 4) and ms.train[0][1].shape == (2, 1)
    with pytest.raises(ValueError, match="target"):
        make_splits(values, 8, 2, (200, 40, 60), features="S", target="zz")


def test_load_from_generated_files(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError):
        load_series("ETTh1", tmp_path)
    values = write_ett_csv(tmp_path / "timeseries" / "ECL.csv", 120)
    splits = load_forecasting("ECL", 10, 5, data_dir=tmp_path, features="S", target="OT")
    assert splits.sizes == (84, 12, 24)
    np.testing.assert_allclose(splits.mean, values[:84].mean(0))
    with pytest.raises(ValueError, match="name"):
        load_series("nope", tmp_path)


def test_synthetic_loader() -> None:
    splits = load_forecasting("synthetic", 24, 12, max_rows=500)
    assert splits.series.shape == (500, 7) and splits.sizes == (350, 50, 100)


def test_real_etth1_stanhop_counts(shared_data: Path) -> None:
    values, names = load_series("ETTh1", shared_data)
    assert values.shape == (17420, 7) and names[-1] == "OT"
    splits = load_forecasting("ETTh1", 168, 24, data_dir=shared_data, protocol="stanhop")
    assert (len(splits.train), len(splits.val), len(splits.test)) == (8449, 2857, 2857)
    np.testing.assert_allclose(splits.std, values[:8640].std(0))
    uni = load_forecasting("ETTh1", 96, 96, data_dir=shared_data, features="S")
    assert uni.sizes == (12194, 1742, 3484) and uni.columns[-1] == DATASETS["ETTh1"].target


def test_series_count_without_reading_files() -> None:
    assert series_count("ETTh1") == DATASETS["ETTh1"].shape[1] == 7
    assert series_count("WTH") == DATASETS["WTH"].shape[1]
    assert series_count("synthetic") == synthetic_series(2).shape[1]
    with pytest.raises(ValueError, match="dataset must be one of"):
        series_count("ETTh9")

"""``timeseries-hopfield``: model families, tiny run with resume, paper numbers, missing data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hopfield.data import DataNotFoundError
from hopfield.experiments import run_experiment
from hopfield.experiments.timeseries_hopfield import (
    MODELS,
    PRESETS,
    build_model,
    paper_value,
    window_size,
)
from hopfield.functional.efficient import TopK, Window
from hopfield.functional.structures import Dense
from hopfield.models.forecasting import HopfieldForecaster


@pytest.mark.parametrize("name", MODELS)
def test_every_model_family_forecasts(name: str) -> None:
    model = build_model(name, 16, 6, 2, PRESETS["tiny"])
    out = model(torch.randn(3, 16, 2))
    assert out.shape == (3, 6, 2) and torch.isfinite(out).all()
    out.sum().backward()


def test_model_structures_follow_the_paper() -> None:
    top = build_model("top50", 96, 96, 1, PRESETS["tiny"])
    assert isinstance(top.hopfield.structure, TopK) and top.hopfield.structure.fraction == 0.5
    window = build_model("window", 720, 720, 1, PRESETS["tiny"])
    assert isinstance(window.hopfield.structure, Window) and window.hopfield.structure.size == 16
    assert isinstance(window.pooling.hopfield.structure, Dense)
    assert [window_size(n) for n in (96, 192, 336, 720, 24)] == [8, 12, 14, 16, 5]
    assert float(top.hopfield.scale[0]) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="model"):
        build_model("favor", 8, 8, 1, PRESETS["tiny"])


def test_forecaster_checks_its_input() -> None:
    model = HopfieldForecaster(4, num_inputs=2, num_targets=1, d_model=8, num_heads=2)
    assert model(torch.randn(5, 12, 2)).shape == (5, 4, 1)
    with pytest.raises(ValueError, match="x must be"):
        model(torch.randn(5, 12, 3))
    with pytest.raises(ValueError, match="divisible"):
        HopfieldForecaster(4, d_model=10, num_heads=4)


def test_paper_numbers() -> None:
    assert paper_value("ETTh1", 96, "dense") == (0.137, 0.307)
    assert paper_value("WTH", 720, "linear") == (1.052, 0.770)
    assert paper_value("ETTm1", 336, "window") == (0.873, 0.334)
    assert paper_value("ETTh1", 96, "outeffhop") == (None, None)


def test_tiny_run_and_resume(tmp_path: Path) -> None:
    path = run_experiment("timeseries-hopfield", "tiny", tmp_path, progress=False)
    record = json.loads(path.read_text())
    tables = record["results"]["tables"]
    assert len(tables[0]["rows"]) == len(MODELS)
    assert record["results"]["figures"] == ["timeseries_time_per_epoch.png"]
    assert (path.parent / "timeseries_time_per_epoch.png").exists()
    assert not list(path.parent.glob("checkpoint_*.pt"))
    runs = json.loads((path.parent / "runs.json").read_text())
    assert len(runs) == len(MODELS)
    # A rerun reuses every finished run (resume): identical numbers.
    again = json.loads(
        run_experiment("timeseries-hopfield", "tiny", tmp_path, progress=False).read_text()
    )
    assert again["results"]["metrics"] == record["results"]["metrics"]


def test_missing_data_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="ETTh1"):
        run_experiment(
            "timeseries-hopfield",
            "tiny",
            tmp_path / "out",
            data_dir=tmp_path,
            overrides={"datasets": '["ETTh1"]'},
            progress=False,
        )

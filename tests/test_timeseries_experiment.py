"""``timeseries-hopfield``: model families, tiny run with resume, paper numbers, missing data and
its stand-in."""

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
    assert all(row[8] > 0 and row[9] > 0 for row in tables[0]["rows"])  # s and CPU s per epoch
    assert record["results"]["figures"] == ["timeseries_time_per_epoch.png"]
    assert (path.parent / "timeseries_time_per_epoch.png").exists()
    assert len(list((path.parent / "runs").glob("*/log.jsonl"))) == len(MODELS)
    assert not list(path.parent.rglob("checkpoints"))  # finished runs keep no checkpoints
    runs = json.loads((path.parent / "runs.json").read_text())
    assert len(runs) == len(MODELS)
    assert all(r["finished"] and r["steps"] == 2 and r["processes"] == 1 for r in runs.values())
    # A rerun reuses every finished run (resume): identical numbers, nothing trained.
    again = json.loads(
        run_experiment("timeseries-hopfield", "tiny", tmp_path, progress=False).read_text()
    )
    assert again["results"]["metrics"] == record["results"]["metrics"]
    assert json.loads((path.parent / "runs.json").read_text()) == runs


def test_a_stopped_run_resumes_from_its_checkpoints(tmp_path: Path) -> None:
    """``--max-steps 1`` stops every run after its first step; the same command without the
    limit resumes each from its checkpoint and ends with the uninterrupted run's numbers."""
    full = run_experiment("timeseries-hopfield", "tiny", tmp_path / "full", progress=False)
    cut = run_experiment(
        "timeseries-hopfield", "tiny", tmp_path / "cut", progress=False, stop_after=1
    )
    runs = json.loads((cut.parent / "runs.json").read_text())
    assert all(r["steps"] == 1 and not r["finished"] for r in runs.values())
    assert len(list(cut.parent.rglob("checkpoints/step-1/trainer.pt"))) == len(MODELS)
    resumed = run_experiment("timeseries-hopfield", "tiny", tmp_path / "cut", progress=False)
    runs = json.loads((resumed.parent / "runs.json").read_text())
    assert all(r["resumed_from"] == 1 and r["finished"] for r in runs.values())
    metrics = json.loads(full.read_text())["results"]["metrics"]
    assert json.loads(resumed.read_text())["results"]["metrics"] == metrics


def test_stand_in_data_replaces_an_absent_file(tmp_path: Path) -> None:
    path = run_experiment(
        "timeseries-hopfield",
        "tiny",
        tmp_path / "out",
        data_dir=tmp_path,
        overrides={"datasets": '["ETTh1"]', "models": '["dense"]'},
        progress=False,
        stand_in_data=True,
    )
    results = json.loads(path.read_text())["results"]
    assert any(note.startswith("STAND-IN") and "ETTh1" in note for note in results["notes"])
    assert results["tables"][0]["rows"][0][:3] == ["ETTh1", 24, "dense"]


def test_device_must_be_auto_or_cpu(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="device"):
        run_experiment(
            "timeseries-hopfield", "tiny", tmp_path, overrides={"device": '"gpu"'}, progress=False
        )


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

"""``timeseries-hopfield``: model families, tiny run with resume, paper numbers, missing data and
its stand-in."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from hopfield.data import DataNotFoundError
from hopfield.data.timeseries import DATASETS, synthetic_series
from hopfield.experiments import run_experiment
from hopfield.experiments.timeseries_hopfield import (
    MODELS,
    PRESETS,
    build_model,
    paper_value,
    user_supplied,
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
    assert paper_value("ECL", 96, "dense") == (0.347, 0.474)  # block D
    assert paper_value("ECL", 720, "window") == (0.564, 0.595)
    assert paper_value("Traffic", 96, "linear") == (1.489, 0.644)  # block E
    assert paper_value("Traffic", 720, "dense") == (1.660, 0.681)


def write_user_files(root: Path, n_rows: int = 300) -> None:
    """Small ``timeseries/ECL.csv`` (Informer: date, MT_000, ...) and ``timeseries/traffic.csv``
    (Autoformer: date, 0, 1, ..., OT) shaped like the real files."""
    headers = {"ECL.csv": ["MT_000", "MT_001", "MT_002"], "traffic.csv": ["0", "1", "2", "OT"]}
    for seed, (name, columns) in enumerate(headers.items()):
        values = synthetic_series(n_rows, len(columns), seed=seed) + 5.0
        lines = ["date," + ",".join(columns)]
        for i, row in enumerate(values):
            stamp = f"2016-07-{1 + i // 24:02d} {i % 24:02d}:00:00"
            lines.append(stamp + "," + ",".join(f"{v:.6f}" for v in row))
        (root / "timeseries").mkdir(parents=True, exist_ok=True)
        (root / "timeseries" / name).write_text("\n".join(lines) + "\n")


def _run(tmp_path: Path, datasets: str, data: Path, **options: Any) -> dict[str, Any]:
    path = run_experiment(
        "timeseries-hopfield",
        "tiny",
        tmp_path / "out",
        data_dir=data,
        overrides={"datasets": datasets, "models": '["dense", "linear"]'},
        progress=False,
        **options,
    )
    results: dict[str, Any] = json.loads(path.read_text())["results"]
    return results


def test_paper_preset_lists_ecl_and_traffic() -> None:
    assert PRESETS["paper"].datasets == ("ETTh1", "ETTm1", "WTH", "ECL", "Traffic")
    assert [user_supplied(d) for d in PRESETS["paper"].datasets] == [False] * 3 + [True] * 2


def test_ecl_and_traffic_run_from_their_files(tmp_path: Path) -> None:
    write_user_files(tmp_path / "data")
    results = _run(tmp_path, '["ECL", "Traffic"]', tmp_path / "data")
    rows = results["tables"][0]["rows"]
    assert [row[:3] for row in rows] == [
        ["ECL", 24, "dense"],
        ["ECL", 24, "linear"],
        ["Traffic", 24, "dense"],
        ["Traffic", 24, "linear"],
    ]
    assert all(math.isfinite(row[3]) and row[3] > 0 for row in rows)
    assert results["tables"][1]["name"] == "Figure 5: training seconds per epoch on ECL"
    assert not any("Skipped" in t["name"] for t in results["tables"])
    assert "Paper blocks D/E read as ECL/Traffic (unverified, as A/B/C)." in results["notes"]
    runs = json.loads((tmp_path / "out" / "timeseries-hopfield" / "runs.json").read_text())
    assert {r["identity"]["data"] for r in runs.values()} == {"ECL", "Traffic"}
    assert results["metrics"]["ECL/24/dense/mse"] == runs["ECL|24|dense|0"]["test"]["mse"]


def test_absent_ecl_and_traffic_are_skipped_and_listed(tmp_path: Path) -> None:
    """Without the user files the other datasets run and compute what they compute alone."""
    (tmp_path / "empty").mkdir()
    results = _run(tmp_path / "a", '["synthetic", "ECL", "Traffic"]', tmp_path / "empty")
    alone = _run(tmp_path / "b", '["synthetic"]', tmp_path / "empty")
    table6, figure5, skipped = results["tables"]
    assert [row[:8] for row in table6["rows"]] == [row[:8] for row in alone["tables"][0]["rows"]]
    assert results["metrics"] == alone["metrics"]
    assert figure5["name"].endswith("on synthetic")
    assert skipped["name"].startswith("Skipped datasets")
    assert skipped["rows"] == [
        ["ECL", "timeseries/ECL.csv", DATASETS["ECL"].file.url],
        ["Traffic", "timeseries/traffic.csv", DATASETS["Traffic"].file.url],
    ]
    missing = str((tmp_path / "empty" / "timeseries" / "ECL.csv").absolute())
    assert any(n.startswith("ECL skipped:") and missing in n for n in results["notes"])


def test_only_absent_datasets_give_an_empty_report(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    results = _run(tmp_path, '["Traffic"]', tmp_path / "empty")
    table6, skipped = results["tables"]
    assert table6["rows"] == [] and results["figures"] == [] and results["metrics"] == {}
    assert [row[0] for row in skipped["rows"]] == ["Traffic"]


def test_stand_in_data_replaces_an_absent_user_file(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    results = _run(tmp_path, '["ECL"]', tmp_path / "empty", stand_in_data=True)
    rows = [row[:3] for row in results["tables"][0]["rows"]]
    assert rows == [["ECL", 24, "dense"], ["ECL", 24, "linear"]]
    assert any(note.startswith("STAND-IN") and "ECL" in note for note in results["notes"])
    assert not any("Skipped" in t["name"] for t in results["tables"])


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
    assert len(list(cut.parent.rglob("checkpoints/step-1/manifest.json"))) == len(MODELS)
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

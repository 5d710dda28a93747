"""The time-series experiments under ``torchrun`` (2 CPU processes): tiny presets end to end, a
stopped run resumed, and both paper presets for 2 optimiser steps with their exact architecture
and optimiser (the smoke recipe of docs/scale.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("accelerate")

from hopfield.experiments import run_experiment
from launch import run_distributed

#: ``--set`` overrides of the 2-step paper smoke runs. They cut the outer loops only: one dataset
#: and horizon (timeseries: ETTh1, H = 96 with all nine model families; STanHop-Net: the WTH
#: T 48 → τ 24 setting of the authors' scripts, batch 64, with OutEffHop), one seed, and a
#: smaller evaluation (one batch; STanHop-Net: of 4 windows, one calibration batch). The model
#: (d 64 forecaster; the 35M-parameter STanHop-Net), the optimiser, the schedule and the global
#: batch stay the paper's. (The ETTh1 T 168 setting of STanHop-Net, batch 128, takes about 85 s
#: for 2 steps here.)
SMOKE: dict[str, dict[str, str]] = {
    "timeseries-hopfield": {
        "datasets": '["ETTh1"]',
        "horizons": "[96]",
        "seeds": "1",
        "max_eval_batches": "1",
    },
    "stanhop-outliers": {
        "settings": '[["WTH", 24, 48, 4, 0.0001, 64]]',
        "models": '["outeffhop"]',
        "seeds": "1",
        "max_eval_batches": "1",
        "eval_batch_size": "4",
        "calibration_batches": "1",
    },
}

LIMITS = ("--max-steps", "2", "--micro-batch-size", "1", "--stand-in-data")


def _smoke(name: str, out: Path) -> dict[str, Any]:
    overrides = [arg for k, v in SMOKE[name].items() for arg in ("--set", f"{k}={v}")]
    return run_distributed(name, "paper", out, *LIMITS, *overrides)


def _runs(out: Path, name: str) -> dict[str, Any]:
    runs: dict[str, Any] = json.loads((out / name / "runs.json").read_text())
    return runs


# --- tiny presets -----------------------------------------------------------------------------


def test_tiny_timeseries_follows_one_process(tmp_path: Path) -> None:
    """Two processes train the same global batches as one (the forecasters have no dropout):
    the same numbers to float tolerance; run again, every finished run is reused."""
    name = "timeseries-hopfield"
    record = run_distributed(name, "tiny", tmp_path / "two")
    runs = _runs(tmp_path / "two", name)
    assert all(r["processes"] == 2 and r["finished"] for r in runs.values())
    assert all(r["seconds_per_epoch"] > 0 for r in runs.values())
    assert not list((tmp_path / "two").rglob("checkpoints"))
    single = json.loads(run_experiment(name, "tiny", tmp_path / "one", progress=False).read_text())
    metrics = record["results"]["metrics"]
    assert metrics.keys() == single["results"]["metrics"].keys()
    for key, value in single["results"]["metrics"].items():
        # random features are redrawn in every forward pass from each process's own RNG stream
        # (processes draw different ones), so that model only agrees to the draw's noise
        assert metrics[key] == pytest.approx(value, rel=1e-3 if "random" in key else 1e-5), key
    again = run_distributed(name, "tiny", tmp_path / "two")
    assert again["results"]["metrics"] == metrics
    assert _runs(tmp_path / "two", name) == runs  # nothing trained again


def test_tiny_timeseries_resumes_under_two_processes(tmp_path: Path) -> None:
    name = "timeseries-hopfield"
    one = ("--set", 'models=["dense"]')
    run_distributed(name, "tiny", tmp_path / "out", "--max-steps", "1", *one)
    (cut,) = _runs(tmp_path / "out", name).values()
    assert (cut["steps"], cut["finished"]) == (1, False)
    run_dir = tmp_path / "out" / name / "runs" / "synthetic-24-dense-0"
    assert (run_dir / "checkpoints" / "step-1" / "random_states_1.pkl").is_file()
    resumed = run_distributed(name, "tiny", tmp_path / "out", *one)
    (record,) = _runs(tmp_path / "out", name).values()
    assert (record["resumed_from"], record["finished"], record["steps"]) == (1, True, 2)
    full = run_distributed(name, "tiny", tmp_path / "full", *one)
    assert resumed["results"]["metrics"] == full["results"]["metrics"]


def test_tiny_stanhop(tmp_path: Path) -> None:
    name = "stanhop-outliers"
    record = run_distributed(name, "tiny", tmp_path / "out")
    runs = _runs(tmp_path / "out", name)
    assert len(runs) == 8 and all(r["processes"] == 2 and r["finished"] for r in runs.values())
    assert all(r["mse"] > 0 and r["w8a8_mse"] > 0 for r in runs.values())
    assert record["results"]["tables"][2]["rows"][1][1:] == [25, 30]
    # Figure 2(d): both steps recorded, the maximum over the processes' halves of each batch
    assert all([p["step"] for p in r["curve"]] == [1, 2] for r in runs.values())


# --- paper presets, 2 steps -------------------------------------------------------------------


def test_paper_timeseries_two_steps(tmp_path: Path, shared_data: Path) -> None:
    name = "timeseries-hopfield"
    record = _smoke(name, tmp_path / "out")
    assert record["limits"] == {"stop_after": 2, "micro_batch_size": 1, "stand_in_data": True}
    assert record["config"]["d_model"] == 64 and record["config"]["batch_size"] == 128
    assert not any("STAND-IN" in note for note in record["results"]["notes"])  # ETTh1 is here
    runs = _runs(tmp_path / "out", name)
    assert len(runs) == 9
    for run in runs.values():
        assert (run["steps"], run["finished"], run["processes"]) == (2, False, 2)
        assert run["epoch_steps"] == (12_194 - 2 * 96 + 1) // 128  # full ETTh1 epochs
        assert run["identity"]["optimizer"] == "adamw" and run["identity"]["schedule"] == "cosine"
    log = (tmp_path / "out" / name / "runs" / "ETTh1-96-dense-0" / "checkpoints").iterdir()
    assert [p.name for p in log] == ["step-2"]  # kept: a full run resumes from it


def test_paper_stanhop_two_steps(tmp_path: Path, shared_data: Path) -> None:
    name = "stanhop-outliers"
    record = _smoke(name, tmp_path / "out")
    (run,) = _runs(tmp_path / "out", name).values()
    assert (run["steps"], run["finished"], run["processes"]) == (2, False, 2)
    assert run["params_without_position_tables"] > 35_000_000  # the paper's STanHop-Net
    assert run["identity"]["e_layers"] == 11 and run["identity"]["d_model"] == 256
    assert run["w8a8_mse"] > 0 and run["avg_kurtosis"] > 0
    assert record["results"]["metrics"]["WTH/24/outeffhop/mse"] == run["mse"]

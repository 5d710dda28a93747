"""outlier-benchmark's tiny preset under ``torchrun --nproc_per_node 2`` (2 CPU processes, gloo):
one record written by the main process, every run measured, and the same numbers as one process
(the benchmark has no dropout and its data order does not depend on the process count)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

from hopfield.experiments import outlier_benchmark as ob
from hopfield.experiments.runner import run_experiment
from launch import run_distributed


def test_tiny_benchmark_on_two_processes_follows_one(tmp_path: Path, shared_data: Path) -> None:
    record = run_distributed("outlier-benchmark", "tiny", tmp_path / "two")
    assert record["processes"] == 2
    folder = tmp_path / "two" / "outlier-benchmark"
    runs = json.loads((folder / "runs.json").read_text())["runs"]
    config = ob.PRESETS["tiny"]
    assert len(runs) == len(config.tasks) * len(config.arms) * config.seeds
    for figure in record["results"]["figures"]:
        assert (folder / figure).stat().st_size > 1000
    single = run_experiment(
        "outlier-benchmark", "tiny", tmp_path / "one", data_dir=shared_data, progress=False
    )
    one = json.loads((single.parent / "runs.json").read_text())["runs"]
    assert one.keys() == runs.keys()
    for key, run in one.items():
        for metric in ("sink_mass", "residual_peak", "avg_kurtosis", "fp_ppl", "train_loss"):
            assert runs[key][metric] == pytest.approx(run[metric], rel=1e-3), (key, metric)

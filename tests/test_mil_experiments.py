"""MIL experiments: tiny presets end to end, resuming, folds, trials and worker processes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hopfield.experiments import mil_benchmark, mil_mnist_bags, run_experiment
from hopfield.experiments.mil_common import resolve_workers, run_tasks


def test_mil_mnist_bags_tiny_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = run_experiment("mil-mnist-bags", "tiny", tmp_path, progress=False)
    record = json.loads(path.read_text())
    table = record["results"]["tables"][0]
    assert table["columns"] == ["method", "M=5", "M=10"]
    assert [row[0] for row in table["rows"]] == ["dense", "sparse", "topk-50"]
    metrics = record["results"]["metrics"]
    assert all(0.0 <= v <= 1.0 for v in metrics.values()) and len(metrics) == 6
    saved = json.loads((path.parent / "runs.json").read_text())["runs"]
    assert len(saved["10/dense/0"]["curves"]["valid_accuracy"]) == 2  # curve at bag size 10

    def fail(task: Any) -> Any:
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(mil_mnist_bags, "train_one", fail)
    again = json.loads(
        run_experiment("mil-mnist-bags", "tiny", tmp_path, progress=False).read_text()
    )
    assert again["results"]["metrics"] == metrics


def test_mil_mnist_bags_figures(tmp_path: Path) -> None:
    path = run_experiment(
        "mil-mnist-bags",
        "tiny",
        tmp_path,
        progress=False,
        overrides={
            "figures": "true",
            "bag_sizes": "[5]",
            "methods": '["dense"]',
            "curve_bag_size": "5",
        },
    )
    figures = json.loads(path.read_text())["results"]["figures"]
    assert figures == ["accuracy_vs_bag_size.png", "learning_curves.png"]
    assert all((path.parent / f).stat().st_size > 0 for f in figures)


def test_mil_benchmark_tiny(tmp_path: Path, shared_data: Path) -> None:
    path = run_experiment("mil-benchmark", "tiny", tmp_path, data_dir=shared_data, progress=False)
    record = json.loads(path.read_text())
    table = record["results"]["tables"][0]
    assert table["columns"] == ["method", "elephant (ours)", "elephant (paper)"]
    assert table["rows"][0][2] == 0.877 and table["rows"][1][2] == 0.852
    runs = json.loads((path.parent / "runs.json").read_text())["runs"]
    assert set(runs) == {f"elephant/{m}/0/{f}" for m in ("dense", "topk-50") for f in (0, 1)}


def test_mil_benchmark_missing_data(tmp_path: Path) -> None:
    from hopfield.data import DataNotFoundError

    with pytest.raises(DataNotFoundError, match="elephant"):
        run_experiment("mil-benchmark", "tiny", tmp_path / "out", data_dir=tmp_path, progress=False)


def test_folds_are_stratified_and_disjoint() -> None:
    labels = np.array([1] * 26 + [0] * 32)
    config = replace(mil_benchmark.PRESETS["paper"], folds=10)
    splits = mil_benchmark.split_folds(labels, config, seed=0)
    tests = np.concatenate([s[2] for s in splits])
    assert sorted(tests.tolist()) == list(range(58))
    for train, valid, test in splits:
        assert not set(train) & set(valid) and not set(train) & set(test)
        assert len(train) + len(valid) + len(test) == 58
        assert 2 <= labels[test].sum() <= 3 and labels[valid].sum() >= 1
    assert all(
        np.array_equal(a[0], b[0])
        for a, b in zip(splits, mil_benchmark.split_folds(labels, config, 0), strict=True)
    )


def test_trials_come_from_the_search_space() -> None:
    config = replace(mil_benchmark.PRESETS["paper"], trials=30)
    trials = mil_benchmark.sample_trials(config, seed=0, fold=3)
    assert trials == mil_benchmark.sample_trials(config, seed=0, fold=3)
    assert trials != mil_benchmark.sample_trials(config, seed=0, fold=4)
    for name, field in mil_benchmark.SEARCH_SPACE.items():
        assert {t[name] for t in trials} <= set(getattr(config, field))
    assert len({t["width"] for t in trials}) == 3


def test_worker_processes() -> None:
    assert resolve_workers(1, 10) == 1 and resolve_workers(4, 2) == 2 and resolve_workers(0, 1) == 1
    with pytest.raises(ValueError, match="workers"):
        resolve_workers(-1, 3)
    results = dict(run_tasks(abs, [-1, -2, 3], workers=2))
    assert results == {-1: 1, -2: 2, 3: 3}


def test_mil_bit_pattern_tiny(tmp_path: Path) -> None:
    path = run_experiment("mil-bit-pattern", "tiny", tmp_path, progress=False)
    record = json.loads(path.read_text())
    assert record["results"]["tables"][0]["rows"][1][0] == "sparse"
    assert set(record["results"]["metrics"]) == {"accuracy/dense/8", "accuracy/sparse/8"}


def test_mean_pm_std() -> None:
    from hopfield.experiments.mil_common import mean_pm_std

    assert mean_pm_std([0.5]) == "0.500"
    assert mean_pm_std([0.4, 0.6]) == "0.500 ± 0.141"
    assert mean_pm_std([]) == "–"

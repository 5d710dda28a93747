"""``stanhop-outliers``: tiny run (MSE, outliers, W8A8) and its resume, the top-two count, paper
numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hopfield.experiments import run_experiment
from hopfield.experiments.stanhop_outliers import (
    FIGURE2_PAIRS,
    PAPER_SETTINGS,
    PRESETS,
    TABLE2_MODELS,
    figure_layer,
    mean_curve,
    paper_table2,
    top_two_count,
)
from hopfield.models.stanhop import ASSOCIATION_KINDS


def test_paper_table2_and_the_25_of_30_claim() -> None:
    assert paper_table2("ETTm1", 96, "sparse") == {
        "mse": 0.345,
        "mae": 0.383,
        "avg_kurtosis": 3.568,
        "max_inf_norm": 4.441,
    }
    assert paper_table2("ETTh1", 24, "gated") is None
    entries = {
        (d, h): {m: p for m in TABLE2_MODELS if (p := paper_table2(d, h, m)) is not None}
        for d, h, *_ in PAPER_SETTINGS
    }
    assert top_two_count(entries) == (25, 30)


def test_top_two_count_ranks_lowest_first() -> None:
    def row(k: float) -> dict[str, float]:
        return {"avg_kurtosis": k, "max_inf_norm": k}

    entries = {("x", 1): {"dense": row(1), "sparse": row(2), "gsh": row(4), "outeffhop": row(3)}}
    assert top_two_count(entries) == (0, 2)
    entries[("x", 1)]["outeffhop"] = row(1.5)
    assert top_two_count(entries) == (2, 2)
    assert top_two_count({("y", 2): {"dense": row(1)}}) == (0, 0)  # incomplete settings skipped


def test_tiny_run(tmp_path: Path) -> None:
    path = run_experiment("stanhop-outliers", "tiny", tmp_path, progress=False)
    record = json.loads(path.read_text())
    table2, table1, count, _ = record["results"]["tables"]
    assert [r[2] for r in table2["rows"]] == list(ASSOCIATION_KINDS)
    for row in table2["rows"]:
        mse, kurt, inf, w8a8 = row[3], row[5], row[7], row[8]
        assert mse > 0 and kurt > 1 and inf > 0 and w8a8 > 0
    params = {r[0]: r[5] for r in table1["rows"]}
    assert params["gsh"] == params["dense"] + 3 + 4 * 2  # one alpha per association module
    assert params["gated"] > params["dense"]
    assert count["rows"][1][1:] == [25, 30]
    runs = json.loads((path.parent / "runs.json").read_text())
    assert set(runs["synthetic|8|gsh|0"]["alphas"].values()) != set()
    assert all(r["finished"] and r["steps"] == 2 and r["history"] for r in runs.values())
    assert not list(path.parent.rglob("checkpoints"))


def test_tiny_run_records_figure_2d(tmp_path: Path) -> None:
    """Every run records max |x| of each decoder layer at each logged step (tiny: 2 steps of one
    epoch, every step logged); the table is the mean over runs of those points."""
    path = run_experiment("stanhop-outliers", "tiny", tmp_path, progress=False)
    results = json.loads(path.read_text())["results"]
    curves = results["tables"][3]
    assert curves["name"].startswith("Figure 2(d)")
    assert [(r[0], r[1]) for r in curves["rows"]] == [
        (m, s) for m in ASSOCIATION_KINDS for s in (1, 2)
    ]
    runs = json.loads((path.parent / "runs.json").read_text())
    layers = {f"decoder.{j}" for j in range(PRESETS["tiny"].e_layers + 1)}
    for model, step, n, layer, top in curves["rows"]:
        (point,) = [p for p in runs[f"synthetic|8|{model}|0"]["curve"] if p["step"] == step]
        assert set(point["max_abs"]) == layers
        assert n == 1 and layer == point["max_abs"]["decoder.0"]
        assert math.isfinite(layer) and 0 < layer <= top == max(point["max_abs"].values())
    for old, new in FIGURE2_PAIRS:
        assert 0 <= results["metrics"][f"figure2d/{new}_below_{old}"] <= 1
    assert sum(note.startswith("Figure 2(d)") for note in results["notes"]) == 3
    assert results["figures"] == ["figure2d_stanhop.png"]
    assert (path.parent / "figure2d_stanhop.png").stat().st_size > 0


def test_mean_curve_averages_the_steps_every_run_has() -> None:
    def run(values: dict[int, tuple[float, float]]) -> dict[str, Any]:
        curve = [
            {"step": s, "max_abs": {"decoder.0": a, "decoder.1": b}} for s, (a, b) in values.items()
        ]
        return {"curve": curve}

    found = [run({1: (1.0, 4.0), 2: (2.0, 1.0)}), run({1: (3.0, 0.5)}), {"mse": 1.0}]
    curve = mean_curve(found, 0)
    assert curve is not None
    assert (curve.steps, curve.layer, curve.top, curve.runs) == ([1], [2.0], [3.5], 2)
    assert mean_curve([{"mse": 1.0}], 0) is None  # records from before curves were kept
    assert [figure_layer(e) for e in (11, 2, 1)] == [9, 0, 0]


def test_a_stopped_run_resumes(tmp_path: Path) -> None:
    options: dict[str, Any] = {"overrides": {"models": '["outeffhop"]'}, "progress": False}
    full = run_experiment("stanhop-outliers", "tiny", tmp_path / "full", **options)
    cut = run_experiment("stanhop-outliers", "tiny", tmp_path / "cut", stop_after=1, **options)
    (record,) = json.loads((cut.parent / "runs.json").read_text()).values()
    assert (record["steps"], record["finished"], record["stop_after"]) == (1, False, 1)
    resumed = run_experiment("stanhop-outliers", "tiny", tmp_path / "cut", **options)
    (record,) = json.loads((resumed.parent / "runs.json").read_text()).values()
    assert (record["resumed_from"], record["finished"]) == (1, True)
    metrics = json.loads(full.read_text())["results"]["metrics"]
    assert json.loads(resumed.read_text())["results"]["metrics"] == metrics
    curves = json.loads(full.read_text())["results"]["tables"][3]
    assert json.loads(resumed.read_text())["results"]["tables"][3] == curves

"""``stanhop-outliers``: tiny run (MSE, outliers, W8A8) and its resume, the top-two count, paper
numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hopfield.experiments import run_experiment
from hopfield.experiments.stanhop_outliers import (
    PAPER_SETTINGS,
    TABLE2_MODELS,
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
    table2, table1, count = record["results"]["tables"]
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

"""``noise-robustness``: the tiny preset runs, sweeps σ and the exact claims hold."""

from __future__ import annotations

from pathlib import Path

from hopfield.experiments import run_experiment
from hopfield.experiments.runner import load_record


def test_tiny_noise_sweep(tmp_path: Path) -> None:
    record = load_record(run_experiment("noise-robustness", "tiny", tmp_path, progress=False))
    trends, points, *summaries = record["results"]["tables"]
    # the summaries the docs quote: one per study (and criterion) the preset measures
    assert [t["name"] for t in summaries] == [
        "OutEffHop study at β = 1: cos success after 1 step, noise queries",
        "OutEffHop study at β = 1: rel success after 2 steps, noise queries",
        "Nonparametric study: cos success after 1 step, noise queries",
    ]
    assert summaries[0]["columns"] == ["dataset", "β", "model", "σ=0.1", "σ=1"]
    assert trends["columns"][3] == "verdict"
    assert (
        trends["rows"][0][0].startswith("OutEffHop spec B-ii") and trends["rows"][0][3] == "holds"
    )
    assert trends["rows"][1][0].startswith("OutEffHop spec B-i") and trends["rows"][1][3] == "holds"
    verdicts = {row[3] for row in trends["rows"]}
    assert verdicts <= {"holds", "does not hold", "inconclusive"}
    beats = [row for row in trends["rows"] if "beats its baselines" in row[1]]
    assert beats and all("n=3" in row[2] for row in beats)  # paired over the 3 memory sets
    sources = {row[0] for row in trends["rows"]}
    assert {"OutEffHop Fig. 6", "Nonparametric Remark 4.2 / Fig. 2"} <= sources
    columns = points["columns"]
    sigmas = {row[columns.index("σ")] for row in points["rows"]}
    assert sigmas == {0.1, 1.0}
    assert {row[columns.index("steps")] for row in points["rows"]} == {1, 2}
    # Noise hurts: mean cos success over all models falls from the lowest to the highest σ.
    success = columns.index("success cos")
    low = [row[success] for row in points["rows"] if row[columns.index("σ")] == 0.1]
    high = [row[success] for row in points["rows"] if row[columns.index("σ")] == 1.0]
    assert sum(high) / len(high) < sum(low) / len(low)
    assert (tmp_path / "noise-robustness" / "noise_checkpoint.json").is_file()

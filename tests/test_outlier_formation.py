"""The outlier-formation experiment: success criterion, grid order, tiny search and comparison."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hopfield.experiments import outlier_formation as of
from hopfield.experiments.runner import run_experiment

# --- success criterion ------------------------------------------------------------------------


def test_judge_kurtosis_or_norm_and_degradation() -> None:
    # heavy tails by kurtosis, W8A8 10 % worse: success
    v = of.judge(25.0, 5.0, 1.0, 10.0, 11.0, train_seconds=100.0)
    assert v.outliers and v.quantization_hurts and v.within_budget and v.success
    assert v.degradation == pytest.approx(0.1) and v.norm_ratio == pytest.approx(5.0)
    # Gaussian kurtosis but max |x| = 12 × the median scale: outliers by the norm condition
    v = of.judge(3.0, 24.0, 2.0, 10.0, 10.6)
    assert v.outliers and v.norm_ratio == pytest.approx(12.0) and v.success
    # outliers without a quantization cost are not a success (and vice versa)
    v = of.judge(400.0, 100.0, 1.0, 10.0, 10.2)
    assert v.outliers and not v.quantization_hurts and not v.success
    v = of.judge(3.0, 5.0, 1.0, 10.0, 20.0)
    assert not v.outliers and v.quantization_hurts and not v.success
    assert "kurtosis 3 < 20" in v.reason
    # thresholds are inclusive
    assert of.judge(20.0, 0.0, 1.0, 1.0, 1.05).success


def test_judge_budget_accuracy_and_criterion() -> None:
    criterion = of.Criterion(kurtosis=10.0, norm_ratio=5.0, degradation=0.02, budget_s=60.0)
    v = of.judge(11.0, 1.0, 1.0, 10.0, 11.0, train_seconds=61.0, criterion=criterion)
    assert v.outliers and v.quantization_hurts and not v.within_budget and not v.success
    assert "budget" in v.reason
    # accuracy: higher is better, so a drop is a degradation
    v = of.judge(30.0, 1.0, 1.0, 80.0, 76.0, higher_is_better=True)
    assert v.degradation == pytest.approx(0.05) and v.success
    v = of.judge(30.0, 1.0, 1.0, 80.0, 84.0, higher_is_better=True)
    assert v.degradation < 0 and not v.success
    no_budget = of.Criterion(budget_s=None)
    assert of.judge(30.0, 1.0, 1.0, 1.0, 2.0, train_seconds=1e9, criterion=no_budget).success


def test_judge_errors() -> None:
    with pytest.raises(ValueError, match="median_scale"):
        of.judge(3.0, 1.0, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="fp_metric"):
        of.judge(3.0, 1.0, 1.0, 0.0, 1.0)
    with pytest.raises(TypeError, match="avg_kurtosis"):
        of.judge("3", 1.0, 1.0, 1.0, 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="criterion"):
        of.judge(3.0, 1.0, 1.0, 1.0, 1.0, criterion={"kurtosis": 1})  # type: ignore[arg-type]


def test_confidence_interval() -> None:
    mean, half = of.confidence_interval([1.0, 2.0, 3.0])
    assert mean == pytest.approx(2.0)
    assert half == pytest.approx(4.302652729911275 / math.sqrt(3))  # t(0.975, 2) · s / √n
    assert of.confidence_interval([5.0]) == (5.0, 0.0)
    with pytest.raises(ValueError, match="values"):
        of.confidence_interval([])
    with pytest.raises(ValueError, match="level"):
        of.confidence_interval([1.0, 2.0], level=1.0)


# --- grid ------------------------------------------------------------------------------------


def test_training_gflop_formula() -> None:
    config = of.Config(
        hidden_size=8, ffn_dim=16, seq_len=4, num_layers=2, vocab_size=10, steps=3, batch_size=5
    )
    per_token = 2 * (4 * 64 + 2 * 8 * 16 + 2 * 4 * 8) + 8 * 10
    assert of.training_gflop(config) == pytest.approx(6 * 3 * 5 * 4 * per_token / 1e9)


def test_grid_is_searched_cheapest_first() -> None:
    config = replace(
        of.PRESETS["small"],
        grid={"steps": [400, 100], "lr": [1e-3, 3e-3], "num_layers": [4, 2]},
    )
    points = of.grid_points(config)
    assert len(points) == 8
    costs = [p.gflop for p in points]
    assert costs == sorted(costs)
    # the cheapest (steps=100, 2 layers) first, ties in the listed order of the other axes
    assert [p.name for p in points[:2]] == [
        "steps=100,lr=0.001,num_layers=2",
        "steps=100,lr=0.003,num_layers=2",
    ]
    assert points[0].config.steps == 100 and points[0].config.grid == {}
    assert [p.name for p in of.grid_points(replace(config, max_configs=3))] == [
        p.name for p in points[:3]
    ]
    assert [p.name for p in of.grid_points(replace(config, grid={}))] == ["base"]


def test_ladder_stages() -> None:
    config = replace(
        of.PRESETS["small"],
        grid={"steps": [400, 100], "pre_ln": [True, False], "num_layers": [2, 4], "lr": [1, 2]},
    )
    first = of.ladder_points(config)
    # stage 1: the cost-neutral axes at the cheapest size, in their listed order
    assert [p.name for p in first] == [
        f"steps=100,pre_ln={ln},num_layers=2,lr={lr}" for ln in (True, False) for lr in (1, 2)
    ]
    second = of.ladder_points(config, best=first[2].overrides)
    # stage 2: the size axes in cost order with the best cost-neutral setting
    assert [p.name for p in second] == [
        "steps=100,pre_ln=False,num_layers=2,lr=1",
        "steps=100,pre_ln=False,num_layers=4,lr=1",
        "steps=400,pre_ln=False,num_layers=2,lr=1",
        "steps=400,pre_ln=False,num_layers=4,lr=1",
    ]
    assert second[0].name == first[2].name  # the repeated point keeps its name


def test_ladder_search_runs_both_stages(tmp_path: Path) -> None:
    overrides = {
        "strategy": '"ladder"',
        "grid": '{"steps": [2, 4], "lr": [0.001, 0.01]}',
        "compare": "false",
    }
    path = run_experiment(
        "outlier-formation", "tiny", tmp_path, overrides=overrides, progress=False
    )
    names = [row[0] for row in _record(path)["tables"][0]["rows"]]
    assert names[:2] == ["steps=2,lr=0.001", "steps=2,lr=0.01"]
    assert len(names) == 3 and names[2].startswith("steps=4,")  # the best lr, longer


def test_grid_errors() -> None:
    with pytest.raises(ValueError, match="seed"):
        of.grid_points(replace(of.PRESETS["tiny"], grid={"seed": [1, 2]}))
    with pytest.raises(ValueError, match="non-empty"):
        of.grid_points(replace(of.PRESETS["tiny"], grid={"lr": []}))


def test_presets_cover_the_documented_axes() -> None:
    small, paper = of.PRESETS["small"], of.PRESETS["paper"]
    for axis in ("pre_ln", "lr", "num_layers", "vocab_size"):
        assert len(small.grid[axis]) >= 2
    for axis in (
        "steps",
        "num_layers",
        "ffn_dim",
        "pre_ln",
        "lr",
        "ln_weight_decay",
        "delimiter_rate",
    ):
        assert len(paper.grid[axis]) >= 2
    for preset in (small, paper):
        assert preset.dropout == 0.0 and preset.seeds == (0, 1, 2)
        assert set(preset.variants) == set(of.VARIANT_NAMES)
    assert small.strategy == "ladder" and small.budget_s == 1800.0
    assert paper.grid["steps"][-1] > small.steps


def test_small_ladder_ends_at_the_deepest_widest_vocabulary_point() -> None:
    small = of.PRESETS["small"]
    first = of.ladder_points(small)
    assert len(first) == 4  # LN placement x learning rate at 4 layers, vocabulary 64
    assert {(p.config.num_layers, p.config.vocab_size) for p in first} == {(4, 64)}
    second = of.ladder_points(small, first[0].overrides)
    assert [(p.config.num_layers, p.config.vocab_size) for p in second] == [
        (4, 64),
        (4, 512),
        (6, 64),
        (6, 512),
    ]
    assert [p.gflop for p in second] == sorted(p.gflop for p in second)


# --- running the experiment ------------------------------------------------------------------


def _record(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())["results"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_experiment(
        "outlier-formation", "tiny", tmp_path_factory.mktemp("of"), progress=False
    )


def test_tiny_search_reports_every_point(tiny_run: Path) -> None:
    results = _record(tiny_run)
    search = results["tables"][0]
    assert len(search["rows"]) == 2  # both tiny grid points, cheapest (2 steps) first
    assert search["rows"][0][0].startswith("steps=2") and search["rows"][1][0].startswith("steps=4")
    for row in search["rows"]:
        fp, w8a8, gap, kurt, norm = row[3:8]
        assert math.isfinite(fp) and fp > 1 and w8a8 > 0
        assert gap == pytest.approx(100 * (w8a8 - fp) / fp)
        assert kurt > 1 and norm > 0
    assert results["metrics"]["configs_tried"] == 2
    assert any("GPU" in note or "CPU" in note for note in results["notes"])


def test_tiny_comparison_tables_and_curves(tiny_run: Path) -> None:
    results = _record(tiny_run)
    # no tiny point meets the criterion: the comparison runs at the most outlier-prone point
    assert results["metrics"]["recipe_found"] == 0
    assert any("did NOT meet the criterion" in note for note in results["notes"])
    names = [t["name"] for t in results["tables"]]
    assert any("Variants" in n for n in names) and any("Reductions" in n for n in names)
    variants = next(t for t in results["tables"] if "Variants" in t["name"])
    assert [r[0] for r in variants["rows"]] == list(of.VARIANT_NAMES.values())
    compare = json.loads((tiny_run.parent / "compare.json").read_text())["runs"]
    assert len(compare) == 6 * 2
    # the mechanism: softmax rows sum to 1, Softmax_1 rows to less
    assert compare["softmax/seed0"]["row_sum"] == pytest.approx(1.0, abs=1e-5)
    assert compare["softmax1/seed0"]["row_sum"] < 0.999
    assert compare["gated/seed1"]["params"] > compare["softmax/seed1"]["params"]
    curve = compare["softmax/seed0"]["curve"]
    steps = [step for step, _ in curve]
    assert steps in ([2], [2, 4])  # every 2 steps
    assert "model.decoder.layers.0" in curve[-1][1]
    assert (tiny_run.parent / results["figures"][0]).is_file()


def test_tiny_run_resumes_from_its_json(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("a finished point was trained again")

    before = _record(tiny_run)
    monkeypatch.setattr(of, "train_and_evaluate", fail)
    again = run_experiment("outlier-formation", "tiny", tiny_run.parents[1], progress=False)
    assert _record(again)["tables"] == before["tables"]


def test_search_stops_at_first_success_and_compares(tmp_path: Path) -> None:
    overrides = {
        "kurtosis_threshold": "0",
        "degradation_threshold": "-1",
        "variants": '["softmax", "softmax1"]',
        "seeds": "[0]",
    }
    path = run_experiment(
        "outlier-formation", "tiny", tmp_path, overrides=overrides, progress=False
    )
    results = _record(path)
    assert results["metrics"]["recipe_found"] == 1
    assert len(results["tables"][0]["rows"]) == 1  # stopped after the cheapest point
    assert any(note.startswith("Recipe found: steps=2") for note in results["notes"])
    variants = next(t for t in results["tables"] if "Variants" in t["name"])
    assert [r[0] for r in variants["rows"]] == ["Vanilla", "OutEffHop"]
    pairs = next(t for t in results["tables"] if "Reductions" in t["name"])
    assert [r[1] for r in pairs["rows"]] == ["avg_kurtosis", "max_inf_norm", "w8a8_gap_pct"]
    assert pairs["rows"][2][4] == pytest.approx(
        100 * (1 - (16.429 / 15.916 - 1) / (42.012 / 15.974 - 1))
    )
    assert results["metrics"]["vanilla_seeds_meeting_criterion"] == 1
    assert any(
        note.startswith("Vanilla under the recipe meets the criterion in 1 of 1")
        for note in results["notes"]
    )


def test_parallel_workers_give_the_sequential_runs(tmp_path: Path) -> None:
    common = {"variants": '["softmax", "softmax1"]', "seeds": "[0]", "grid": '{"steps": [4]}'}
    runs = {}
    for workers in (1, 2):
        path = run_experiment(
            "outlier-formation",
            "tiny",
            tmp_path / str(workers),
            overrides={**common, "workers": str(workers)},
            progress=False,
        )
        runs[workers] = json.loads((path.parent / "compare.json").read_text())["runs"]
    assert set(runs[2]) == {"softmax/seed0", "softmax1/seed0"}
    for key, metrics in runs[1].items():
        for name in ("fp_ppl", "w8a8_ppl", "avg_kurtosis", "max_inf_norm"):
            assert runs[2][key][name] == pytest.approx(metrics[name], rel=1e-5)


def test_more_seeds_resume_the_finished_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    common = {"variants": '["softmax"]', "grid": '{"steps": [2]}'}
    run_experiment(
        "outlier-formation", "tiny", tmp_path, overrides={**common, "seeds": "[0]"}, progress=False
    )
    trained: list[int] = []
    real = of.train_and_evaluate

    def counting(config: Any, variant: str, seed: int, *args: Any) -> dict[str, Any]:
        trained.append(seed)
        return real(config, variant, seed, *args)

    monkeypatch.setattr(of, "train_and_evaluate", counting)
    run_experiment(
        "outlier-formation",
        "tiny",
        tmp_path,
        overrides={**common, "seeds": "[0, 1]"},
        progress=False,
    )
    assert trained == [1]  # seed 0 and the search point come from the JSON files


def test_step_limited_runs_are_not_reused_and_folders_keep_their_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs made under ``--max-steps`` are trained again without it (continuing their checkpoint,
    kept with ``keep_checkpoints``); a run folder holding another recipe starts over."""
    common = {
        "variants": '["softmax"]',
        "seeds": "[0]",
        "grid": '{"steps": [4]}',
        "keep_checkpoints": "true",
    }
    run_experiment("outlier-formation", "tiny", tmp_path, overrides=common, stop_after=2)
    search = json.loads((tmp_path / "outlier-formation" / "search.json").read_text())
    compare = json.loads((tmp_path / "outlier-formation" / "compare.json").read_text())
    assert (search[0]["steps"], search[0]["stop_after"], compare["stop_after"]) == (2, 2, 2)
    resumed: list[int | None] = []
    real = of.train_and_evaluate

    def spy(*args: Any) -> dict[str, Any]:
        metrics = real(*args)
        resumed.append(metrics["resumed_from"])
        return metrics

    monkeypatch.setattr(of, "train_and_evaluate", spy)
    run_experiment("outlier-formation", "tiny", tmp_path, overrides=common, progress=False)
    assert resumed == [2, 2]  # the search point and the comparison run continued from step 2
    search = json.loads((tmp_path / "outlier-formation" / "search.json").read_text())
    assert (search[0]["steps"], search[0]["stop_after"]) == (4, None)
    run_experiment(
        "outlier-formation", "tiny", tmp_path, overrides={**common, "lr": "0.002"}, progress=False
    )
    # another recipe: the search point is reused by name (search.json), the comparison run is
    # trained again, and not from the old recipe's checkpoint in its folder
    assert resumed == [2, 2, None]
    run_json = (
        tmp_path / "outlier-formation" / "runs" / "compare" / "softmax" / "seed0" / "run.json"
    )
    assert json.loads(run_json.read_text())["recipe"]["lr"] == 0.002


def test_workers_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="workers"):
        run_experiment("outlier-formation", "tiny", tmp_path, overrides={"workers": "0"})


def test_points_over_budget_are_skipped(tmp_path: Path) -> None:
    overrides = {"budget_s": "1e-9", "compare": "false"}
    path = run_experiment(
        "outlier-formation", "tiny", tmp_path, overrides=overrides, progress=False
    )
    results = _record(path)
    rows = results["tables"][0]["rows"]
    # the first point trains (no timing yet) but misses the budget; the second is predicted over it
    assert rows[0][2] == "no" and rows[1][2] == "skipped" and rows[1][-1] > 1e-9
    assert results["metrics"]["configs_skipped"] == 1
    assert len(results["tables"]) == 1  # compare=false: search only
    assert not any("comparison" in note for note in results["notes"])
    search = json.loads((path.parent / "search.json").read_text())
    assert search[0]["verdict"]["within_budget"] is False


def test_schedule_reaches_the_trainer(tmp_path: Path) -> None:
    overrides = {"schedule": '"constant"', "grid": '{"steps": [4]}', "compare": "false"}
    path = run_experiment(
        "outlier-formation", "tiny", tmp_path, overrides=overrides, progress=False
    )
    log = (path.parent / "runs" / "search" / "000" / "log.jsonl").read_text().splitlines()
    assert [json.loads(line)["lr"] for line in log] == [1e-3, 1e-3]  # no decay


def test_split_sentences() -> None:
    lines = [" = Title = ", " A b . C d , e . F", ""]
    assert of.split_sentences(lines) == ["= Title =", "A b .", "C d , e .", "F"]


def test_wikitext_search(shared_data: Path, tmp_path: Path) -> None:
    overrides = {
        "data": '"wikitext-2"',
        "text_max_lines": "300",
        "vocab_size": "320",
        "train_sequences": "64",
        "grid": '{"steps": [2]}',
        "compare": "false",
    }
    path = run_experiment(
        "outlier-formation",
        "tiny",
        tmp_path,
        data_dir=shared_data,
        overrides=overrides,
        progress=False,
    )
    (row,) = _record(path)["tables"][0]["rows"]
    assert row[0] == "steps=2" and math.isfinite(row[3]) and row[3] > 1
    assert 0 < row[11] < 1  # attention mass on </s> and punctuation keys
    with pytest.raises(ValueError, match="vocab_size"):
        run_experiment(
            "outlier-formation",
            "tiny",
            tmp_path,
            data_dir=shared_data,
            overrides={"data": '"wikitext-2"'},
            progress=False,
        )


def test_bad_data(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="data"):
        run_experiment(
            "outlier-formation", "tiny", tmp_path, overrides={"data": "ptb"}, progress=False
        )


def test_bad_strategy(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="strategy"):
        run_experiment(
            "outlier-formation", "tiny", tmp_path, overrides={"strategy": "random"}, progress=False
        )


def test_bad_variant(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="variants"):
        run_experiment(
            "outlier-formation",
            "tiny",
            tmp_path,
            overrides={"variants": '["softmax2"]'},
            progress=False,
        )


def test_reduction_rows_pair_the_seeds_with_a_t_test() -> None:
    from scipy import stats

    from hopfield.experiments.outlier_formation import _PAIR_METRICS, _reduction_row

    base = [{"avg_kurtosis": k} for k in (20.0, 30.0, 25.0)]
    ours = [{"avg_kurtosis": k} for k in (15.0, 29.0, 20.0)]
    row = _reduction_row(
        "softmax",
        "softmax1",
        "avg_kurtosis",
        _PAIR_METRICS["avg_kurtosis"],
        {"softmax": base, "softmax1": ours},
    )
    assert row[:4] == ["Vanilla → OutEffHop", "avg_kurtosis", pytest.approx(100 * 11 / 75), "3/3"]
    difference = [o["avg_kurtosis"] - b["avg_kurtosis"] for o, b in zip(ours, base, strict=True)]
    low, high = stats.t.interval(0.95, 2, loc=-11 / 3, scale=stats.sem(difference))
    assert row[5] == f"{-11 / 3:+.4g} [{low:+.4g}, {high:+.4g}]"
    assert row[6] == pytest.approx(stats.ttest_rel(difference, [0.0] * 3).pvalue, rel=1e-2)
    single = _reduction_row(
        "softmax",
        "gated",
        "avg_kurtosis",
        _PAIR_METRICS["avg_kurtosis"],
        {"softmax": base[:1], "gated": ours[:1]},
    )
    assert single[5:] == ["–", "–"]


def test_the_recipe_comparison_records_the_quantizer_ablation(tmp_path: Path) -> None:
    overrides = {
        "variants": '["softmax"]',
        "seeds": "[0]",
        "grid": '{"steps": [4]}',
        "ablation": "true",
    }
    path = run_experiment(
        "outlier-formation", "tiny", tmp_path, overrides=overrides, progress=False
    )
    results = _record(path)
    table = next(t for t in results["tables"] if t["name"].startswith("Quantizer ablation"))
    run = json.loads((path.parent / "compare.json").read_text())["runs"]["softmax/seed0"]
    kinds = list(run["ablation"])
    assert table["columns"] == ["arm", "variant", *kinds]
    assert [row[:2] for row in table["rows"]] == [["the recipe", "Vanilla"]]
    expected = [100 * (run["ablation"][k] / run["fp_ppl"] - 1) for k in kinds]
    assert table["rows"][0][2:] == pytest.approx(expected)
    assert run["ablation"]["all"] == pytest.approx(run["w8a8_ppl"])

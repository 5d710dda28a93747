"""``memory-capacity`` and its shared protocol: queries, memory sets, scores, models, resume, data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hopfield.data import DataNotFoundError
from hopfield.experiments import run_experiment
from hopfield.experiments.memory_capacity import (
    Point,
    corrupt,
    efficient_trends,
    energy_trend,
    make_model,
    memory_sets,
    run_model,
    scores,
    standardisation,
    success_table,
    throughput,
)
from hopfield.experiments.runner import load_record
from hopfield.functional import Polynomial, Softmax, SoftmaxN, Sparsemax
from hopfield.functional.efficient import RandomMask, TopK
from hopfield.functional.efficient_kernel import Linear, RandomFeatures


def trend_rows(record: dict) -> list[list]:
    table = record["results"]["tables"][0]
    assert table["name"] == "Stated trends, checked"
    return table["rows"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("capacity")
    path = run_experiment("memory-capacity", "tiny", out, progress=False)
    return path, load_record(path)


def test_tiny_run_measures_every_model_and_the_exact_claims_hold(tiny: tuple[Path, dict]) -> None:
    _, record = tiny
    rows = trend_rows(record)
    # B-ii: energy descent in every run; B-i: one-step Dense/OutEffHop identity.
    assert rows[0][0].startswith("OutEffHop spec B-ii") and rows[0][3] == "holds"
    assert rows[1][0].startswith("OutEffHop spec B-i") and rows[1][3] == "holds"
    assert {row[3] for row in rows} <= {"holds", "does not hold", "inconclusive"}
    points = record["results"]["tables"][1]
    columns = points["columns"]
    models = {(r[columns.index("study")], r[columns.index("model")]) for r in points["rows"]}
    assert len(models) == 15
    sizes = {r[columns.index("M")] for r in points["rows"]}
    assert sizes == {10, 30}
    for row in points["rows"]:
        for name in ("success cos", "success rel", "success nearest"):
            assert 0.0 <= row[columns.index(name)] <= 1.0
    metrics = record["results"]["metrics"]
    assert metrics["trends_checked"] == len(rows)
    assert metrics["trends_holding"] == sum(row[3] == "holds" for row in rows)
    assert metrics["throughput_ratio"] > 0
    throughput_table = record["results"]["tables"][2]
    assert throughput_table["rows"][0][-1] > 0
    # the note names the pixels each study retrieves (standardised for the nonparametric one)
    assert any("retrieves standardised pixels" in n for n in record["results"]["notes"])
    summaries = [t["name"] for t in record["results"]["tables"][3:]]
    assert summaries == [
        "OutEffHop study at β = 1: cos success after 1 step, half queries",
        "OutEffHop study at β = 1: rel success after 2 steps, half queries",
        "Nonparametric study: cos success after 1 step, half queries",
    ]


def test_a_stopped_run_resumes_from_its_checkpoint(tiny: tuple[Path, dict], tmp_path: Path) -> None:
    path, _ = tiny
    checkpoint = path.parent / "capacity_checkpoint.json"
    saved = json.loads(checkpoint.read_text())
    assert len(saved["cases"]) == 2
    # Mark one finished case; a resumed run must reuse it rather than recompute it.
    key = next(iter(saved["cases"]))
    saved["cases"][key]["points"][0]["values"]["cos"] = [0.123, 0.123, 0.123]
    target = tmp_path / "memory-capacity"
    target.mkdir()
    (target / "capacity_checkpoint.json").write_text(json.dumps(saved))
    again = load_record(
        run_experiment(
            "memory-capacity", "tiny", tmp_path, progress=False, overrides={"throughput": "null"}
        )
    )
    cells = [r for r in again["results"]["tables"][1]["rows"] if 0.123 in r]
    assert len(cells) == 1
    # A changed configuration starts afresh.
    fresh = load_record(
        run_experiment(
            "memory-capacity",
            "tiny",
            tmp_path,
            progress=False,
            overrides={"throughput": "null", "memory_sizes": "[10]"},
        )
    )
    assert all(0.123 not in r for r in fresh["results"]["tables"][1]["rows"])


def test_corruptions() -> None:
    g = torch.Generator().manual_seed(0)
    images = torch.rand(4, 3, 8, 6, generator=g)
    half = corrupt(images, "half", 0.0, g).view(4, 3, 8, 6)
    assert bool((half[:, :, 4:] == 0).all())
    torch.testing.assert_close(half[:, :, :4], images[:, :, :4])
    noisy = corrupt(images, "noise", 0.5, g)
    assert noisy.shape == (4, 144) and bool(((noisy >= 0) & (noisy <= 1)).all())
    assert not torch.equal(noisy, images.flatten(1))
    with pytest.raises(ValueError, match="query kind"):
        corrupt(images, "blur", 0.1, g)


def test_memory_sets_are_disjoint() -> None:
    g = torch.Generator().manual_seed(1)
    index = memory_sets(100, 20, 7, g)
    assert index is not None and index.shape == (5, 20)
    assert index.unique().numel() == 100
    assert memory_sets(10, 20, 3, g) is None


def test_scores_of_perfect_and_swapped_retrieval() -> None:
    memories = torch.eye(4).repeat(2, 1, 1) + 0.1
    perfect = scores(memories, memories)
    for name in ("cos", "rel", "nearest"):
        torch.testing.assert_close(perfect[name], torch.ones(2))
    torch.testing.assert_close(perfect["mse"], torch.zeros(2))
    swapped = scores(memories.flip(1), memories)
    torch.testing.assert_close(swapped["nearest"], torch.zeros(2))
    torch.testing.assert_close(swapped["cos"], torch.zeros(2))
    zero = scores(torch.zeros_like(memories), memories)
    torch.testing.assert_close(zero["cos"], torch.zeros(2))


def test_models() -> None:
    expected = {
        "dense": (Softmax, type(None)),
        "outeffhop": (SoftmaxN, type(None)),
        "sparse": (Sparsemax, type(None)),
        "poly10": (Polynomial, type(None)),
        "topk-20": (Softmax, TopK),
        "random-80": (Softmax, RandomMask),
        "linear": (Softmax, Linear),
        "random-features": (Softmax, RandomFeatures),
    }
    for name, (separation, structure) in expected.items():
        model = make_model(name, "study", 0.5, seed=0)
        assert isinstance(model.separation, separation) and isinstance(model.structure, structure)
        assert model.beta == 0.5
    top = make_model("topk-20", "s", 1.0, 0).structure
    assert isinstance(top, TopK) and top.fraction == pytest.approx(0.2)
    random = make_model("random-80", "s", 1.0, 0).structure
    assert isinstance(random, RandomMask) and random.fraction == pytest.approx(0.2)  # 80 % masked
    with pytest.raises(ValueError, match="unknown model"):
        make_model("topk-x", "s", 1.0, 0)


def test_run_model_scores_each_step_count_and_traces_energy() -> None:
    g = torch.Generator().manual_seed(2)
    memories = torch.rand(2, 30, 16, generator=g)
    queries = memories + 0.2 * torch.randn(2, 30, 16, generator=g)
    outs, rise = run_model(make_model("outeffhop", "s", 1.0, 0), queries, memories, (1, 3))
    assert set(outs) == {1, 3} and rise is not None and rise <= 1e-5
    manual = queries
    for _ in range(3):
        manual = SoftmaxN(1.0)(manual @ memories.transpose(1, 2)) @ memories
    torch.testing.assert_close(outs[3], manual, rtol=1e-4, atol=1e-5)
    _, none = run_model(make_model("topk-50", "s", 1.0, 0), queries, memories, (1,))
    assert none is None


def test_standardised_models_retrieve_in_standard_units_and_score_in_pixels() -> None:
    g = torch.Generator().manual_seed(3)
    memories = torch.rand(2, 20, 16, generator=g)
    queries = memories.clone()
    queries[..., 8:] = 0
    model = make_model("dense", "s", 0.5, 0, normalize=(0.2, 0.4))
    outs, _ = run_model(model, queries, memories, (1,))
    standard = (queries - 0.2) / 0.4, (memories - 0.2) / 0.4
    expected = torch.softmax(0.5 * standard[0] @ standard[1].transpose(1, 2), -1) @ standard[1]
    torch.testing.assert_close(outs[1], (expected * 0.4 + 0.2).clamp(0, 1))
    assert standardisation("mnist", memories) == (0.1307, 0.3081)
    mean, std = standardisation("digits", memories)
    assert mean == pytest.approx(float(memories.mean())) and std == pytest.approx(
        float(memories.std())
    )


def test_energy_trend_and_point() -> None:
    assert energy_trend({"a": -1.0, "b": 1e-7}, 1e-5)[3] is True
    assert energy_trend({"a": 1e-3}, 1e-5)[3] is False
    point = Point("d", "half", "m", "s", 1.0, 1, 10, 0.1, 2, {"cos": [0.5, 1.0]})
    assert point.mean("cos") == pytest.approx(0.75)
    assert point.std("cos") == pytest.approx(0.3535533906)


def _points(model: str, by_size: dict[int, list[float]]) -> list[Point]:
    return [
        Point("d", "half", model, "nonparametric", 1.0, 1, size, 0.0, len(v), {"cos": v})
        for size, v in by_size.items()
    ]


def test_efficient_trends_are_paired_over_memory_sets() -> None:
    """Each Fig. 2 trend is judged by paired tests over (M, memory set): a clear order holds,
    a reversed one does not, nor does a strict trend every set ties; too few sets is
    inconclusive (never a bare mean)."""
    sets = [0.0, 0.02, -0.01, 0.01]
    points = [
        *_points("topk-20", {10: [0.9 + d for d in sets], 30: [0.8 + d for d in sets]}),
        *_points("topk-50", {10: [0.7 + 2 * d for d in sets], 30: [0.6 - d for d in sets]}),
        *_points("random-50", {10: [0.5 + d for d in sets], 30: [0.4 + d for d in sets]}),
        *_points("dense", {10: [0.9 + d for d in sets], 30: [0.97 - d for d in sets]}),
        *_points("linear", {10: [0.3] * 4, 30: [0.3] * 4}),
    ]
    models = ["topk-20", "topk-50", "random-50", "dense", "linear"]
    rows = {
        r[1].split(": ")[1].split(" (")[0]: r
        for r in efficient_trends(points, models, "d, half", 10, 30)
    }
    assert rows["Top-K success falls as K grows"][3] == "holds"
    assert "n=8" in rows["Top-K success falls as K grows"][2]
    # random-50 beats linear (0.45 vs 0.3): random masks are not the worst
    assert rows["random masks perform worst"][3] == "does not hold"
    assert rows["dense degrades as M grows from 10 to 30"][3] == "does not hold"
    assert rows["linear degrades as M grows from 10 to 30"][3] == "does not hold"  # a tie
    few = efficient_trends(
        _points("dense", {10: [0.9, 0.8], 30: [0.1, 0.2]}), ["dense"], "w", 10, 30
    )
    assert few[0][3] == "inconclusive"  # 2 memory sets


def test_success_tables_pivot_one_criterion_over_the_sweep() -> None:
    points = [
        Point("d", "half", "dense", "outeffhop", 1.0, 1, 10, 0.1, 2, {"cos": [0.5, 1.0]}),
        Point("d", "half", "dense", "outeffhop", 1.0, 1, 30, 0.1, 2, {"cos": [0.25, 0.25]}),
        Point("d", "half", "sparse", "outeffhop", 1.0, 1, 10, 0.1, 2, {"cos": [1.0, 1.0]}),
        Point("d", "half", "dense", "outeffhop", 1.0, 3, 10, 0.1, 2, {"cos": [0.0, 0.0]}),
    ]
    table = success_table(
        points, "t", "M", "cos", spread=True, study="outeffhop", beta=1.0, steps=1
    )
    assert table is not None and table.columns == ["dataset", "β", "model", "M=10", "M=30"]
    assert table.rows == [
        ["d", 1.0, "dense", "0.750 ± 0.354", "0.250 ± 0.000"],
        ["d", 1.0, "sparse", "1.000 ± 0.000", None],  # not measured at M = 30
    ]
    means = success_table(points, "t", "M", "cos", spread=False, steps=3)
    assert means is not None and means.rows == [["d", 1.0, "dense", "0.000"]]
    assert success_table(points, "t", "M", "cos", spread=False, study="nonparametric") is None


def test_missing_data_fails_clearly_or_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "nothing").mkdir()  # a data folder without the datasets
    with pytest.raises(DataNotFoundError, match="mnist"):
        run_experiment(
            "memory-capacity",
            "tiny",
            tmp_path,
            data_dir=tmp_path / "nothing",
            progress=False,
            overrides={"datasets": '["mnist"]', "throughput": "null"},
        )
    record = load_record(
        run_experiment(
            "memory-capacity",
            "tiny",
            tmp_path,
            data_dir=tmp_path / "nothing",
            progress=False,
            overrides={
                "datasets": '["digits", "cifar10"]',
                "memory_sizes": "[10]",
                "extra_betas": "[0.05]",
                "throughput": "null",
            },
        )
    )
    assert any(note.startswith("cifar10 skipped") for note in record["results"]["notes"])
    # The OutEffHop-study models run at β = 1 and at the extra β; the identity holds at both.
    table = record["results"]["tables"][1]
    columns = table["columns"]
    betas = {
        r[columns.index("β")] for r in table["rows"] if r[columns.index("study")] == "outeffhop"
    }
    assert betas == {1.0, 0.05}
    identity = record["results"]["tables"][0]["rows"][1]
    assert identity[3] == "holds" and identity[2].startswith("2 of 2")


def test_mnist_from_the_shared_data(shared_data: Path, tmp_path: Path) -> None:
    if not (shared_data / "images" / "mnist" / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip("MNIST test images not in the shared data")
    record = load_record(
        run_experiment(
            "memory-capacity",
            "tiny",
            tmp_path,
            data_dir=shared_data,
            progress=False,
            overrides={
                "datasets": '["mnist"]',
                "memory_sizes": "[20]",
                "memory_sets": "2",
                "steps": "[1]",
                "models": '["dense", "outeffhop"]',
                "efficient_models": '["topk-20"]',
                "throughput": "null",
            },
        )
    )
    rows = record["results"]["tables"][1]["rows"]
    assert {r[0] for r in rows} == {"mnist"} and len(rows) == 3


def test_throughput_reports_a_ratio() -> None:
    timing = throughput(200, 100, 16, 1.0, repeats=1)
    assert timing["retrieve_s"] > 0 and timing["matmuls_s"] > 0
    assert timing["ratio"] == pytest.approx(timing["retrieve_s"] / timing["matmuls_s"])

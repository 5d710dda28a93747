"""Hyper-SET experiments: tiny presets end to end, resume from checkpoints, missing data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hopfield.data import DataNotFoundError
from hopfield.experiments import run_experiment
from hopfield.experiments.hyperset_common import cosine_lr, fraction_non_increasing
from hopfield.experiments.hyperset_images import augment
from hopfield.experiments.hyperset_sudoku import _paper_at, blank_loss


def _png(path: Path) -> bool:
    """``path`` is a non-empty PNG file."""
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG


PNG = b"\x89PNG\r\n\x1a\n"


def _tables(path: Path) -> dict[str, dict]:
    record = json.loads(path.read_text())
    return {t["name"]: t for t in record["results"]["tables"]}, record


def test_sudoku_tiny_runs_and_resumes(tmp_path: Path) -> None:
    path = run_experiment("hyperset-sudoku", "tiny", tmp_path, progress=False)
    tables, record = _tables(path)
    main = tables["Sudoku: Hyper-SET vs weight-shared Transformer (Fig. 3, §5.1)"]
    assert [row[0] for row in main["rows"]] == ["hyperset", "transformer", "et", "fixed-0.1"]
    assert main["rows"][0][2] == "5.20 M"  # the paper's printed count beside ours
    assert main["rows"][2][5] == 0.0  # Fig. 3a: the Energy Transformer fails (0 % boards)
    metrics = record["results"]["metrics"]
    assert 0.0 <= metrics["hyperset_cell_acc"] <= 100.0
    assert "Alternative designs (Table 3 layout) on Sudoku" in tables
    trajectory = tables[
        "Energy, effective rank, angle and step sizes along the iterations (Figs. 5-6)"
    ]
    assert len(trajectory["rows"]) == 4  # 2 L: extrapolated rows included
    figures = record["results"]["figures"]
    assert "sudoku_heads_rank_angle.png" in figures  # Figs. 9-10
    assert all(_png(tmp_path / "hyperset-sudoku" / f) for f in figures)
    assert len(runs_of(tmp_path, "hyperset-sudoku")["hyperset"]["analysis"][0]["erank_heads"]) == 2
    runs = json.loads((tmp_path / "hyperset-sudoku" / "runs.json").read_text())
    assert {r["processes"] for r in runs.values()} == {1}
    assert [e["epoch"] for e in runs["hyperset"]["epochs"]] == [1]  # the Fig. 3a curve
    # run again, and with fewer models: the finished runs' records are reused (nothing trains,
    # so even the training times are the recorded ones)
    again = run_experiment("hyperset-sudoku", "tiny", tmp_path, progress=False)
    _, second = _tables(again)
    assert second["results"]["metrics"] == metrics
    run_experiment(
        "hyperset-sudoku", "tiny", tmp_path, progress=False, overrides={"ablations": "[]"}
    )
    assert json.loads((tmp_path / "hyperset-sudoku" / "runs.json").read_text()) == runs
    # each run is seeded by its model's name: a subset in another order trains the same runs
    subset = {"models": '["et"]', "ablations": '["fixed-0.1"]'}
    run_experiment("hyperset-sudoku", "tiny", tmp_path / "subset", progress=False,
                   overrides=subset)  # fmt: skip
    alone = runs_of(tmp_path / "subset", "hyperset-sudoku")
    assert list(alone) == ["et", "fixed-0.1"]
    assert {n: _untimed(r) for n, r in alone.items()} == {n: _untimed(runs[n]) for n in alone}
    # a second seed: the first replicates are reused, the second ones train with seed + 1
    path = run_experiment("hyperset-sudoku", "tiny", tmp_path / "subset", progress=False,
                          overrides={**subset, "seeds": "2"})  # fmt: skip
    two = runs_of(tmp_path / "subset", "hyperset-sudoku")
    assert list(two) == ["et", "fixed-0.1", "et.seed1", "fixed-0.1.seed1"]
    assert {n: _untimed(two[n]) for n in alone} == {n: _untimed(r) for n, r in alone.items()}
    assert _untimed(two["et.seed1"]) != _untimed(two["et"])
    tables, _ = _tables(path)
    replicates = tables["Board accuracy (%) after L = 2 iterations over the replicates"]["rows"]
    assert [row[:2] for row in replicates] == [["et", 2], ["fixed-0.1", 2]]


def runs_of(out: Path, name: str) -> dict:
    """The ``runs.json`` of experiment ``name`` below ``out``."""
    return json.loads((out / name / "runs.json").read_text())


def _untimed(record: dict) -> dict:
    """A model's ``runs.json`` record without its wall-clock times (in the record and in each
    epoch) and the configuration: what two runs of the same model and seed must share."""
    kept = {k: v for k, v in record.items() if k != "seconds"}
    kept["epochs"] = [{k: v for k, v in e.items() if k != "seconds"} for e in record["epochs"]]
    kept["identity"] = {k: v for k, v in record["identity"].items() if k != "config"}
    return kept


#: The tiny image preset with one model (Hyper-SET: 2 steps of 64 images).
ONE_MODEL = {"models": '["hyperset"]', "ablations": "[]", "layer_splits": "[]", "lora_ranks": "[]",
             "contrast": "false"}  # fmt: skip


def _images(out: Path, stop_after: int | None = None, **changes: str) -> tuple[dict, dict]:
    """The metrics and the Hyper-SET run record of a one-model tiny ``hyperset-images`` run."""
    path = run_experiment("hyperset-images", "tiny", out, progress=False, stop_after=stop_after,
                          overrides={**ONE_MODEL, **changes})  # fmt: skip
    runs = json.loads((path.parent / "runs.json").read_text())
    return json.loads(path.read_text())["results"]["metrics"], runs["hyperset"]


def test_images_resume_through_trainer_checkpoints(tmp_path: Path) -> None:
    """A run stopped after a step resumes from its Trainer checkpoint (with the RNG states of the
    augmentation) to the numbers of an uninterrupted run; a run with other settings starts over."""
    full, record = _images(tmp_path / "full")
    assert (record["steps"], record["finished"], record["processes"]) == (2, True, 1)
    _, stopped = _images(tmp_path / "out", stop_after=1)
    assert (stopped["steps"], stopped["finished"]) == (1, False)
    checkpoints = tmp_path / "out" / "hyperset-images" / "runs" / "hyperset" / "checkpoints"
    assert (checkpoints / "step-1" / "random_states_0.pkl").is_file()
    resumed, record = _images(tmp_path / "out")
    assert (record["resumed_from"], record["finished"]) == (1, True) and resumed == full
    assert not checkpoints.exists()  # a finished run keeps its record, not its checkpoints
    _images(tmp_path / "changed", stop_after=1)
    changed, record = _images(tmp_path / "changed", lr="0.003")  # not from the lr 1e-3 step
    assert record["resumed_from"] is None
    fresh, _ = _images(tmp_path / "fresh", lr="0.003")
    assert changed == fresh != full


def test_images_tiny_runs(tmp_path: Path) -> None:
    path = run_experiment("hyperset-images", "tiny", tmp_path, progress=False)
    tables, record = _tables(path)
    assert {"Alternative designs (Table 3)", "Layer-iteration trade-off (Fig. 4)",
            "Depth-wise LoRA (Table 4)"} <= set(tables)  # fmt: skip
    metrics = record["results"]["metrics"]
    assert metrics["param_ratio_small"] < 1.0
    main = tables["Image classification: Hyper-SET vs Transformer (Table 1 layout)"]
    et_row = next(row for row in main["rows"] if row[0] == "et")
    assert et_row[4:] == [0.91, 75.98, 52.50, 40.40] and 0.0 <= et_row[2] <= 100.0
    assert metrics["hyperset-scaleup-lora2_params"] > metrics["hyperset-scaleup_params"]
    # App. F.3 (Figs. 13-14): the four models, appended after the others
    contrast = tables[
        "Subspace separation: Hyper-SET vs shared-QKV Transformers (App. F.3, Figs. 13-14)"
    ]
    models = ["hyperset", "hyperset+fixed-0.1", "shared-qkv", "shared-qkv-reversed"]
    assert [row[0] for row in contrast["rows"]] == models
    assert [row[-1] for row in contrast["rows"]] == ["rise", "rise", "rise", "fall"]
    runs = runs_of(tmp_path, "hyperset-images")
    assert list(runs)[-3:] == models[1:]
    for name, row in zip(models, contrast["rows"], strict=True):
        subspaces = runs[name]["subspaces"]
        assert [r["t"] for r in subspaces] == [0, 1, 2]  # X_0 and L = 2 iterations
        change = subspaces[-1]["erank"] - subspaces[0]["erank"]
        assert row[5] == metrics[f"contrast_{name}_erank_change"] == pytest.approx(change)
    per_head = tables["Effective rank and angle per subspace along the iterations (Figs. 13-14)"]
    assert per_head["columns"][2:] == ["erank h0", "erank h1", "angle h0 °", "angle h1 °"]
    assert len(per_head["rows"]) == 4 * 3
    # each run is seeded by its model's name: a subset of the models, in another order and
    # without the ablations, trains the same runs (the contrast's with them)
    subset = {**ONE_MODEL, "models": '["et", "transformer"]', "contrast": "true"}
    again = run_experiment("hyperset-images", "tiny", tmp_path / "subset", progress=False,
                           overrides=subset)  # fmt: skip
    subset_metrics = json.loads(again.read_text())["results"]["metrics"]
    alone = runs_of(tmp_path / "subset", "hyperset-images")
    assert list(alone) == ["et", "transformer", *models]
    assert {n: _untimed(r) for n, r in alone.items()} == {n: _untimed(runs[n]) for n in alone}
    contrast_keys = [k for k in metrics if k.startswith("contrast_")]
    assert len(contrast_keys) == 8
    assert {k: subset_metrics[k] for k in contrast_keys} == {k: metrics[k] for k in contrast_keys}
    evolution = tables["Token evolution of one test image (Fig. 1)"]
    assert [row[0] for row in evolution["rows"]] == [0, 1, 2]
    figures = record["results"]["figures"]
    assert figures == ["images_heads_rank_angle.png", "images_contrast_rank_angle.png",
                       "images_token_evolution.png"]  # fmt: skip
    assert all(_png(tmp_path / "hyperset-images" / f) for f in figures)
    # the F.3 claims read the contrast metrics; one run is never more than inconclusive
    from hopfield.claims.claim import judge
    from hopfield.claims.hyperset import CLAIMS
    from hopfield.claims.records import ExperimentRecord

    loaded = ExperimentRecord.load(path.parent)
    f13 = [c for c in CLAIMS if c.id.startswith("HS-F13-")]
    assert [c.id for c in f13] == ["HS-F13-separation", "HS-F13-shared-qkv", "HS-F13-sign-reversed"]
    for claim in f13:
        assert claim.extract is not None
        evidence = claim.extract(loaded)
        assert judge(claim, evidence).verdict == "inconclusive"
        if claim.id == "HS-F13-shared-qkv":
            assert isinstance(evidence, list)
            assert [c.ours[0] for c in evidence] == [
                metrics["contrast_shared-qkv_erank_change"],
                metrics["contrast_shared-qkv_angle_change"],
            ]


def test_images_on_an_imagenet100_folder(tmp_path: Path) -> None:
    """dataset="imagenet100" reads a class-folder tree through the cached loader (Hyper-SET and
    the Energy Transformer at grid 16, 14-pixel patches); without the tree it names the path."""
    from PIL import Image

    from hopfield.data.imagenet100 import FOLDER

    tree = tmp_path / "data" / FOLDER
    for split, count in (("train", 8), ("val", 3)):
        for label, wnid in enumerate(("n00000001", "n00000002")):
            (tree / split / wnid).mkdir(parents=True)
            for i in range(count):
                colour = (200 * label, 10 * i, 100)
                Image.new("RGB", (20 + i, 18), colour).save(tree / split / wnid / f"{i}.png")
    (tree / "imagenet100.txt").write_text("n00000001\nn00000002\n")
    changes = {**ONE_MODEL, "models": '["hyperset", "et"]', "dataset": '"imagenet100"',
               "grid": "16", "batch_size": "8", "analysis_size": "4", "eval_batch_size": "4"}  # fmt: skip
    path = run_experiment("hyperset-images", "tiny", tmp_path / "out", data_dir=tmp_path / "data",
                          progress=False, overrides=changes)  # fmt: skip
    metrics = json.loads(path.read_text())["results"]["metrics"]
    assert 0.0 <= metrics["et_accuracy"] <= 100.0 and 0.0 <= metrics["hyperset_accuracy"] <= 100.0
    assert (tree / "cache-224" / "val" / "manifest.json").is_file()  # cached beside the data
    (tmp_path / "none").mkdir()  # a data folder without ImageNet-100
    with pytest.raises(DataNotFoundError, match="imagenet100 not found"):
        run_experiment("hyperset-images", "tiny", tmp_path / "none", data_dir=tmp_path / "none",
                       progress=False, overrides=changes)  # fmt: skip


def _params(name: str, classes: int = 10, **changes: int) -> int:
    """Parameters of model ``name`` of the hyperset-images paper preset (CIFAR-sized images
    unless ``changes`` say otherwise), built on the meta device."""
    from dataclasses import replace

    from hopfield.experiments.hyperset_images import PRESETS, build
    from hopfield.nn.hyperset import count_parameters

    size = changes.pop("image_size", 32)
    with torch.device("meta"):
        return count_parameters(build(replace(PRESETS["paper"], **changes), name, size, 3, classes))


def test_paper_preset_parameter_counts() -> None:
    """Spec §4.5: Table 1's ET row, Table 20's scaled-up rows and Table 4's LoRA ranks."""
    from hopfield.experiments.hyperset_images import PRESETS, _model_names

    names = _model_names(PRESETS["paper"])
    assert {"et", "et-d1152", "transformer-d1152", "crate-d1152", "hyperset-d1536"} <= set(names)
    assert names[-7:-3] == [f"hyperset-scaleup-lora{r}" for r in (4, 8, 16, 32)]
    assert names[-3:] == ["hyperset+fixed-0.1", "shared-qkv", "shared-qkv-reversed"]  # App. F.3
    assert _params("et") == 908_939
    assert (_params("hyperset-d1536"), _params("hyperset-d1536", 100)) == (14_268_394, 14_406_724)
    transformer = (_params("transformer-d1152"), _params("transformer-d1152", 100))
    assert transformer == (16_001_290, 16_105_060)
    # the paper prints only 0.1 M for these: 8.0 / 8.1 M (ET), 4.1 / 4.2 M (CRATE)
    wide = [round(_params(n, c) / 1e5) for n in ("et-d1152", "crate-d1152") for c in (10, 100)]
    assert wide == [80, 81, 41, 42]
    imagenet = {"image_size": 224, "grid": 16}
    assert _params("hyperset-scaleup", 100, **imagenet) == 1_934_268  # Table 4, rank 0
    lora = [_params(f"hyperset-scaleup-lora{r}", 100, **imagenet) for r in (4, 8, 16, 32)]
    assert lora == [2_032_572, 2_130_876, 2_327_484, 2_720_700]


def test_paper_presets_fail_clearly_without_data(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError):
        run_experiment("hyperset-sudoku", "paper", tmp_path, data_dir=tmp_path, progress=False)
    with pytest.raises(DataNotFoundError):
        run_experiment("hyperset-images", "paper", tmp_path, data_dir=tmp_path, progress=False)


def test_helpers() -> None:
    assert cosine_lr(0, 10, 1.0, 0.0, warmup=2) == 0.5
    assert cosine_lr(2, 10, 1.0, 0.0, warmup=2) == 1.0
    assert cosine_lr(10, 10, 1.0, 0.1) == pytest.approx(0.1)
    assert fraction_non_increasing([3.0, 2.0, 2.0, 5.0]) == pytest.approx(2 / 3)
    assert _paper_at(1.0, "hyperset") == 54.70
    assert _paper_at(1.25, "hyperset") == pytest.approx((56.20 + 56.73) / 2)
    puzzles = torch.tensor([[0] * 80 + [5]])
    solutions = torch.full((1, 81), 5)
    logits = torch.zeros(1, 81, 9)
    logits[0, -1, 0] = 100.0  # a wrong, confident given is ignored
    assert blank_loss(logits, puzzles, solutions).item() == pytest.approx(
        torch.log(torch.tensor(9.0)).item()
    )
    images = torch.arange(16.0).reshape(1, 1, 4, 4)
    out = augment(images, 1, False, torch.Generator().manual_seed(0))
    assert out.shape == images.shape
    assert set(out.flatten().tolist()) <= set(images.flatten().tolist()) | {0.0}


def test_mim_toy_pipeline(tmp_path: Path) -> None:
    from hopfield.experiments.hyperset_mim import decode, fixed_mask, kmeans, random_mask, tokenize

    g = torch.Generator().manual_seed(0)
    points = torch.cat([torch.zeros(5, 2), torch.ones(5, 2) * 3])
    centroids = kmeans(points, 2, 5, g)
    assert sorted(centroids[:, 0].tolist()) == [0.0, 3.0]
    images = torch.rand(3, 1, 4, 4)
    grid_centroids = torch.rand(6, 4)
    codes = tokenize(images, grid_centroids, 2)
    assert torch.equal(tokenize(decode(codes, grid_centroids, 2, 1, 4), grid_centroids, 2), codes)
    assert fixed_mask((4, 10), 0.4, g).sum(dim=1).tolist() == [4, 4, 4, 4]
    assert int(random_mask((50, 10), 0.4, g).sum(dim=1).max()) <= 4
    path = run_experiment("hyperset-mim", "tiny", tmp_path, progress=False)
    _, record = _tables(path)
    assert 0.0 <= record["results"]["metrics"]["hyperset_masked_accuracy"] <= 100.0
    assert record["results"]["figures"] == ["mim_reconstructions.png"]
    assert _png(path.parent / "mim_reconstructions.png")
    _check_mim_figure(path.parent, tmp_path / "tokens")
    with pytest.raises(DataNotFoundError, match="VQGAN"):
        run_experiment("hyperset-mim", "paper", tmp_path, progress=False)


def _check_mim_figure(folder: Path, scratch: Path) -> None:
    """The figure's rows of a tiny hyperset-mim run in ``folder``: the recorded one-shot
    reconstructions differ from the true codes only where the evaluation masks, and the masked
    input is greyed exactly there."""
    from hopfield.experiments.hyperset_mim import (
        FIGURE_IMAGES,
        MASK_GREY,
        PRESETS,
        _tokens,
        evaluation_mask,
        figure_images,
        figure_rows,
    )
    from hopfield.experiments.results import RunContext

    config = PRESETS["tiny"]
    tokens = _tokens(config, RunContext(scratch, progress=False))
    runs = json.loads((folder / "runs.json").read_text())
    shown = figure_images(config, len(tokens.test))
    assert len(shown) == FIGURE_IMAGES and len(set(shown.tolist())) == FIGURE_IMAGES
    mask = evaluation_mask(config, tokens.test)[shown]
    assert mask.sum(dim=1).tolist() == [round(0.4 * 16)] * FIGURE_IMAGES
    truth = tokens.test[shown]
    for name in config.models:
        codes = torch.tensor(runs[name]["figure"]["codes"])
        assert torch.equal(codes[~mask], truth[~mask])
    rows = figure_rows(config, tokens, runs)
    assert list(rows) == ["original", "tokenized", "masked input", *config.models]
    greyed = (rows["masked input"] == MASK_GREY).reshape(FIGURE_IMAGES, 4, 2, 4, 2)
    patch_grey = greyed.all(dim=4).all(dim=2).flatten(1)
    assert torch.equal(patch_grey, mask)  # no tokenized patch of this run is all MASK_GREY
    rows.pop("original")
    assert all(images.shape == rows["tokenized"].shape for images in rows.values())
    del runs["hyperset"]["figure"]  # a record from before the figure: no row, no failure
    assert "hyperset" not in figure_rows(config, tokens, runs)


def test_grey_masked_greys_exactly_the_masked_patches() -> None:
    from hopfield.experiments.hyperset_mim import MASK_GREY, grey_masked

    images = torch.rand(2, 3, 4, 4) * 0.4
    mask = torch.tensor([[True, False, False, True], [False, False, False, False]])
    out = grey_masked(images, mask, 2)
    expected = torch.zeros(2, 1, 4, 4, dtype=torch.bool)
    expected[0, 0, :2, :2] = expected[0, 0, 2:, 2:] = True
    assert torch.equal(out == MASK_GREY, expected.expand(-1, 3, -1, -1))
    assert torch.equal(
        out[~expected.expand(-1, 3, -1, -1)], images[~expected.expand(-1, 3, -1, -1)]
    )


def test_trajectory_table_and_energy_trends() -> None:
    from hopfield.experiments.hyperset_common import (
        TRAJECTORY_COLUMNS,
        energy_trend_metrics,
        trajectory_table,
    )

    rows = [
        {key: float(t * 10 + i) for i, (_, key) in enumerate(TRAJECTORY_COLUMNS)} for t in range(3)
    ]
    for row in rows:
        row["e_ff"] = -row["t"]
    table = trajectory_table("traj", rows, "caption")
    assert "full rank h0" not in table.columns and len(table.columns) == len(TRAJECTORY_COLUMNS) - 1
    assert table.rows[2][table.columns.index("erank mean")] == rows[2]["erank"]
    full = trajectory_table("traj", rows, "caption", full_rank=True)
    assert full.columns[6] == "full rank h0" and full.rows[1][6] == rows[1]["full_rank_head0"]
    trends = energy_trend_metrics(rows)
    assert trends["e_attn_slope"] > 0 and trends["e_ff_slope"] < 0
    assert trends["e_ff_fraction_decreasing"] == 1.0


def test_images_replicates_reuse_the_first_seed_and_pair_by_seed(tmp_path: Path) -> None:
    """``seeds=2`` adds a second run of each model (key ``<model>.seed1``, seed + 1) and keeps the
    one-seed run as the first replicate; the ledger pairs two models' runs by seed."""
    from hopfield.claims.claim import NotTested
    from hopfield.claims.extract import hyperset_accuracy, hyperset_subspace_change
    from hopfield.claims.records import ExperimentRecord

    two = {**ONE_MODEL, "models": '["hyperset", "et"]'}
    run_experiment("hyperset-images", "tiny", tmp_path, progress=False, overrides=two)
    first = runs_of(tmp_path, "hyperset-images")
    path = run_experiment("hyperset-images", "tiny", tmp_path, progress=False,
                          overrides={**two, "seeds": "2"})  # fmt: skip
    runs = runs_of(tmp_path, "hyperset-images")
    assert list(runs) == ["hyperset", "et", "hyperset.seed1", "et.seed1"]
    assert {n: _untimed(runs[n]) for n in first} == {n: _untimed(r) for n, r in first.items()}
    assert runs["hyperset.seed1"]["identity"]["replicate"] == 1
    assert _untimed(runs["hyperset.seed1"]) != _untimed(runs["hyperset"])
    tables, _ = _tables(path)
    replicates = tables["Top-1 accuracy (%) over the replicates"]["rows"]
    assert [row[:2] for row in replicates] == [["hyperset", 2], ["et", 2]]
    mean = (runs["hyperset"]["accuracy"] + runs["hyperset.seed1"]["accuracy"]) / 2
    assert replicates[0][2] == pytest.approx(mean)
    record = ExperimentRecord.load(path.parent)
    (comparison,) = hyperset_accuracy([("hyperset", "et")])(record)  # type: ignore[misc]
    assert comparison.units == ("run 0", "run 1")
    assert comparison.ours == (runs["hyperset"]["accuracy"], runs["hyperset.seed1"]["accuracy"])
    assert comparison.rival_values == (runs["et"]["accuracy"], runs["et.seed1"]["accuracy"])
    with pytest.raises(NotTested, match="none of the runs"):  # no contrast runs in this record
        hyperset_subspace_change(["shared-qkv"], ["erank"])(record)

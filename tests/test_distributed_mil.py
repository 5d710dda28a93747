"""The MIL experiments under ``torchrun`` (2 CPU processes): the tiny preset follows one process,
a run cut by ``--max-steps`` resumes to the uninterrupted result, and 2-step paper smoke runs
with the paper models and optimiser (the smoke recipe of docs/scale.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("accelerate")

from hopfield.experiments import run_experiment
from hopfield.experiments.mil_common import WORK_DIR
from hopfield.models.mil import MILNet
from launch import run_distributed

#: ``--set`` overrides of the 2-step paper smoke runs. They cut the outer loops only: one bag
#: size (MNIST bags: 100, the 4-pattern model; bit patterns: 64), one data set (UCSB, the widest
#: instances), one seed, one random-search trial, 2 folds (the paper's 10 would keep 80 models'
#: checkpoints, about 400 MB) and smaller validation and test sets. Every pooling method, the
#: models, the optimiser, the schedule and the global batches stay the paper's.
SMOKE: dict[str, dict[str, str]] = {
    "mil-mnist-bags": {
        "bag_sizes": "[100]",
        "seeds": "1",
        "valid_pairs": "8",
        "test_pairs": "8",
        "figures": "false",
    },
    "mil-benchmark": {"datasets": '["ucsb"]', "seeds": "1", "trials": "1", "folds": "2"},
    "mil-bit-pattern": {"bag_sizes": "[64]", "seeds": "1", "valid_bags": "16", "test_bags": "16"},
}

LIMITS = ("--max-steps", "2", "--micro-batch-size", "1", "--stand-in-data")

#: The tiny MNIST-bags runs of the resume test: one method at one bag size.
ONE_RUN = ("--set", 'methods=["dense"]', "--set", "bag_sizes=[5]")


def _runs(out: Path, name: str) -> dict[str, Any]:
    runs: dict[str, Any] = json.loads((out / name / "runs.json").read_text())["runs"]
    return runs


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The tiny ``mil-mnist-bags`` run with 2 processes: its output folder and record."""
    out = tmp_path_factory.mktemp("two") / "out"
    return out, run_distributed("mil-mnist-bags", "tiny", out)


# --- tiny preset ------------------------------------------------------------------------------


def test_tiny_mnist_bags_follows_one_process(
    two_processes: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """Two processes train the same global batches as one (the tiny model has no dropout) and
    evaluate the same weights: the same numbers to float tolerance; run again, nothing is
    trained again."""
    name = "mil-mnist-bags"
    out, record = two_processes
    assert record["config"]["dropout"] == record["config"]["attention_dropout"] == 0.0
    runs = _runs(out, name)
    assert len(runs) == 6
    for run in runs.values():
        assert (run["processes"], run["finished"], run["steps"]) == (2, True, 10)
    assert not (out / name / WORK_DIR).exists()  # finished runs leave no checkpoints
    single = json.loads(run_experiment(name, "tiny", tmp_path, progress=False).read_text())
    metrics = record["results"]["metrics"]
    assert metrics.keys() == single["results"]["metrics"].keys()
    for key, value in single["results"]["metrics"].items():
        assert metrics[key] == pytest.approx(value, rel=1e-5), key
    one = _runs(tmp_path, name)
    for key, run in runs.items():  # AUCs and per-epoch losses: finer than the accuracies
        assert run["processes"] == 2 and one[key]["processes"] == 1
        assert run["best_epoch"] == one[key]["best_epoch"], key
        assert run["test_auc"] == pytest.approx(one[key]["test_auc"], rel=1e-5), key
        for curve, values in one[key].get("curves", {}).items():
            assert run["curves"][curve] == pytest.approx(values, rel=1e-5), (key, curve)
    again = run_distributed(name, "tiny", out)  # every process reuses every finished run
    assert again["results"]["metrics"] == metrics and _runs(out, name) == runs


def test_tiny_mnist_bags_resumes_under_two_processes(
    two_processes: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """Cut after 3 of 10 steps (a checkpoint there), run again without the limit: the run resumes
    and ends with exactly the uninterrupted run's numbers."""
    name = "mil-mnist-bags"
    run_distributed(name, "tiny", tmp_path, "--max-steps", "3", *ONE_RUN)
    (cut,) = _runs(tmp_path, name).values()
    assert (cut["steps"], cut["finished"], cut["processes"], cut["stop_after"]) == (3, False, 2, 3)
    work = tmp_path / name / WORK_DIR / "5_dense_0" / "checkpoints"
    assert [p.name for p in work.iterdir()] == ["step-3"]
    assert (work / "step-3" / "random_states_1.pkl").is_file()
    resumed = run_distributed(name, "tiny", tmp_path, *ONE_RUN)
    (run,) = _runs(tmp_path, name).values()
    assert (run["resumed_from"], run["finished"], run["steps"]) == (3, True, 10)
    full_out, full = two_processes
    uninterrupted = _runs(full_out, name)["5/dense/0"]
    for field in ("test_accuracy", "test_auc", "best_epoch"):
        assert run[field] == uninterrupted[field], field
    metric = "accuracy/dense/5"
    assert resumed["results"]["metrics"] == {metric: full["results"]["metrics"][metric]}
    assert not (tmp_path / name / WORK_DIR).exists()


# --- paper presets, 2 steps -------------------------------------------------------------------


def _smoke(name: str, out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    overrides = [arg for k, v in SMOKE[name].items() for arg in ("--set", f"{k}={v}")]
    record = run_distributed(name, "paper", out, *LIMITS, *overrides)
    assert record["limits"] == {"stop_after": 2, "micro_batch_size": 1, "stand_in_data": True}
    assert not any("STAND-IN" in note for note in record["results"]["notes"])  # data is here
    return record, _runs(out, name)


def _parameters(model: MILNet) -> int:
    return sum(p.numel() for p in model.parameters())


def test_paper_mnist_bags_two_steps(tmp_path: Path, shared_data: Path) -> None:
    name = "mil-mnist-bags"
    record, runs = _smoke(name, tmp_path)
    config = record["config"]
    assert (config["source"], config["epochs"], config["batch_size"]) == ("mnist", 150, 256)
    assert (config["train_pairs"], config["embedding_size"], config["head_size"]) == (2000, 256, 64)
    assert len(runs) == 9  # every method of the paper's Figure 3
    paper_model = MILNet(
        784, embedding_size=256, num_heads=4, head_size=64, quantity=4, method="dense", scale=0.1
    )
    for run in runs.values():
        assert (run["steps"], run["finished"], run["processes"]) == (2, False, 2)
        assert run["parameters"] == _parameters(paper_model)  # 4 patterns at bag size 100
    checkpoints = tmp_path / name / WORK_DIR / "100_sparse_0" / "checkpoints"
    assert [p.name for p in checkpoints.iterdir()] == ["step-2"]  # a full run resumes from it


def test_paper_mil_benchmark_two_steps(tmp_path: Path, shared_data: Path) -> None:
    name = "mil-benchmark"
    record, runs = _smoke(name, tmp_path)
    config = record["config"]
    assert (config["epochs"], config["batch_sizes"], config["widths"]) == (
        50,
        [4, 8, 16],
        [128, 256, 512],
    )
    assert len(runs) == 8 * 2  # 8 methods × 2 folds
    for run in runs.values():
        assert (run["trial_steps"], run["finished"], run["processes"]) == ([2], False, 2)
        settings = run["settings"]
        model = MILNet(
            708,
            embedding_size=settings["width"],
            num_heads=settings["heads"],
            quantity=1,
            scale=settings["scale"],
        )
        assert run["parameters"] == _parameters(model)


def test_paper_bit_pattern_two_steps(tmp_path: Path) -> None:
    name = "mil-bit-pattern"
    record, runs = _smoke(name, tmp_path)
    assert (record["config"]["train_bags"], record["config"]["batch_size"]) == (2048, 64)
    assert len(runs) == 7
    model = MILNet(8, embedding_size=64, num_heads=4, quantity=2, scale=1.0)
    for run in runs.values():
        assert (run["steps"], run["finished"], run["processes"]) == (2, False, 2)
        assert run["parameters"] == _parameters(model)

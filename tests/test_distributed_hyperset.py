"""The Hyper-SET experiments under ``torchrun`` (2 CPU processes, and 3 for Sudoku): the tiny
runs follow one process, a stopped run resumes to the uninterrupted result, and the paper presets
run 2 optimiser steps with their exact models and optimisers (the smoke recipe of
docs/scale.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("accelerate")

from hopfield.experiments import run_experiment
from launch import run_distributed

NAME = "hyperset-images"

#: No augmentation: crops and flips come from each process's own RNG stream, so only without
#: them do 2 processes train exactly the batches of 1 process.
PLAIN = {"crop_padding": "0", "flip": "false"}

#: Only the Hyper-SET model of the tiny preset; the other models are outer loops, not part of its
#: run, so this run is the Hyper-SET run of the whole preset.
ONE_MODEL = {"models": '["hyperset"]', "ablations": "[]", "layer_splits": "[]", "lora_ranks": "[]"}

#: ``--set`` overrides of the 2-step paper smoke runs: fewer models and smaller evaluations;
#: the models, the optimiser, the schedule and (but for MIM) the global batch stay the paper's.
SMOKE: dict[str, dict[str, str]] = {
    "hyperset-images": {
        "models": '["hyperset"]',
        "contrast": "false",  # the F.3 contrast would append its own three runs
        "lora_ranks": "[]",
        "test_size": "32",
        "analysis_size": "8",
        "eval_batch_size": "32",
    },
    "hyperset-sudoku": {
        "models": '["hyperset"]',
        "ablations": "[]",
        "test_size": "4",
        "eval_size": "4",
        "analysis_size": "4",
        "extrapolation": "[1.0]",
        "seeds": "1",  # the preset trains Fig. 3's five runs; one shows the two steps
    },
    # the one change of the optimiser's recipe: a global batch of 4 instead of 256 (a sequence of
    # 256 tokens through 12 iterations at d 768 costs about 130 GFLOP forward and backward:
    # 256 of them take 4 minutes per 2 steps here)
    "hyperset-mim": {"models": '["hyperset"]', "batch_size": "4"},
}

LIMITS = ("--max-steps", "2", "--micro-batch-size", "1", "--stand-in-data")


def _sets(overrides: dict[str, str]) -> list[str]:
    return [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]


def _runs(out: Path, name: str) -> dict[str, Any]:
    runs: dict[str, Any] = json.loads((out / name / "runs.json").read_text())
    return runs


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The tiny preset without augmentation trained by 2 processes: its folder and record."""
    out = tmp_path_factory.mktemp("hyperset") / "two"
    return out, run_distributed(NAME, "tiny", out, *_sets(PLAIN))


def test_tiny_images_follow_one_process(
    two_processes: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """Every model of the tiny preset (Hyper-SET, Scale-up, Transformer, CRATE, the Energy
    Transformer, an ablation, two layers, LoRA and the F.3 contrast's three extra models) trained
    by 2 processes gives the 1-process numbers."""
    out, record = two_processes
    runs = _runs(out, NAME)
    assert len(runs) == 12
    assert all((r["processes"], r["finished"], r["steps"]) == (2, True, 2) for r in runs.values())
    single = run_experiment(NAME, "tiny", tmp_path / "one", progress=False, overrides=PLAIN)
    expected = json.loads(single.read_text())["results"]["metrics"]
    metrics = record["results"]["metrics"]
    assert metrics.keys() == expected.keys()
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_tiny_images_resume_under_two_processes(
    two_processes: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """Stopped after its first step (and checkpoint), the Hyper-SET run resumes to the numbers
    of the uninterrupted 2-process run."""
    one = _sets({**PLAIN, **ONE_MODEL})
    run_distributed(NAME, "tiny", tmp_path / "out", "--max-steps", "1", *one)
    stopped = _runs(tmp_path / "out", NAME)["hyperset"]
    assert (stopped["steps"], stopped["finished"], stopped["processes"]) == (1, False, 2)
    checkpoint = tmp_path / "out" / NAME / "runs" / "hyperset" / "checkpoints" / "step-1"
    assert (checkpoint / "random_states_1.pkl").is_file()
    resumed = run_distributed(NAME, "tiny", tmp_path / "out", *one)["results"]["metrics"]
    record = _runs(tmp_path / "out", NAME)["hyperset"]
    assert (record["resumed_from"], record["finished"], record["processes"]) == (1, True, 2)
    full = two_processes[1]["results"]["metrics"]
    assert {"hyperset_accuracy", "e_attn_slope"} <= resumed.keys()
    assert resumed == {key: full[key] for key in resumed}


def test_tiny_sudoku_under_three_processes_follows_one(tmp_path: Path) -> None:
    """Three processes split the tiny preset's global batch of 24 into 8 each and give the
    numbers of one process (a layout the preset was not written for). Without dropout (each
    process draws its own masks) and with the loss weighted by each micro-batch's blank cells
    (``count_fn``): the mean over all blank cells of the step, as one process computes it."""
    overrides = {"models": '["hyperset"]', "ablations": "[]", "embedding_dropout": "0.0"}
    record = run_distributed(
        "hyperset-sudoku", "tiny", tmp_path / "three", *_sets(overrides), nproc=3
    )
    (run,) = _runs(tmp_path / "three", "hyperset-sudoku").values()
    assert (run["processes"], run["finished"]) == (3, True)
    single = run_experiment(
        "hyperset-sudoku", "tiny", tmp_path / "one", progress=False, overrides=overrides
    )
    expected = json.loads(single.read_text())["results"]["metrics"]
    metrics = record["results"]["metrics"]
    assert metrics.keys() == expected.keys() and expected
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_paper_presets_two_steps(name: str, tmp_path: Path) -> None:
    record = run_distributed(name, "paper", tmp_path / "out", *LIMITS, *_sets(SMOKE[name]))
    assert record["limits"] == {"stop_after": 2, "micro_batch_size": 1, "stand_in_data": True}
    assert any("STAND-IN" in note for note in record["results"]["notes"])
    (run,) = _runs(tmp_path / "out", name).values()
    assert (run["steps"], run["finished"], run["processes"]) == (2, False, 2)
    config = record["config"]
    paper = {
        "hyperset-images": (384, 12, 128, 962_218),  # Table 1: 0.96 M
        "hyperset-sudoku": (768, 24, 16, 5_195_584),  # the paper's count
        "hyperset-mim": (768, 12, 4, 3_937_856),  # Table 2: 3.94 M
    }[name]
    assert (config["d_model"], config["iterations"], config["batch_size"]) == paper[:3]
    assert run["params"] == paper[3]

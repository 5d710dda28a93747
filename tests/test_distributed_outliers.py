"""The outlier study, outlier formation and convergence experiments under ``torchrun`` (2 CPU
processes): tiny presets end to end, and every paper preset for 2 optimiser steps with its exact
architecture and optimiser on stand-in data (the smoke recipe of docs/scale.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from hopfield.experiments import run_experiment
from hopfield.training import read_log
from launch import run_distributed

#: ``--set`` overrides of the 2-step paper smoke runs: they cut the outer loops (one attention
#: variant or model, one seed, one dataset or grid point, one evaluation and calibration batch)
#: and, for the transformer presets, the global batch to 4 sequences (2 processes × micro-batch
#: 1 × 2 accumulated; OPT: 2, one 512-token sequence per process): the paper batches (256, 192,
#: 5,120) would take minutes per step on 2 CPU cores. Architecture, optimiser, schedule and
#: precision settings stay the paper's.
SMOKE: dict[str, dict[str, str]] = {
    "outliers-bert": {
        "variants": '["softmax1"]',
        "eval_seeds": "1",
        "eval_batches": "1",
        "eval_batch_size": "2",
        "calib_batches": "1",
        "batch_size": "4",
        "log_every": "1",
    },
    "outliers-opt": {
        "variants": '["softmax1"]',
        "eval_seeds": "1",
        "eval_batches": "1",
        "calib_batches": "1",
        "batch_size": "2",
        "log_every": "1",
    },
    "outliers-vit": {
        "variants": '["softmax1"]',
        "eval_seeds": "1",
        "eval_batches": "1",
        "eval_batch_size": "2",
        "calib_batches": "1",
        "batch_size": "4",
        "log_every": "1",
    },
    "convergence": {
        "datasets": '["cifar10"]',
        "models": '["outeffhop"]',
        "seeds": "1",
    },
    "outlier-formation": {
        "max_configs": "1",
        "variants": '["softmax1"]',
        "seeds": "[0]",
    },
}

LIMITS = ("--max-steps", "2", "--micro-batch-size", "1", "--stand-in-data")


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No Hub requests (BookCorpus/wiki40b are absent at once) and a private tokenizer cache;
    the launcher passes the environment on to every process."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HOPFIELD_CACHE", str(tmp_path / "cache"))


def _overrides(name: str) -> list[str]:
    return [arg for key, value in SMOKE[name].items() for arg in ("--set", f"{key}={value}")]


def _smoke(name: str, out: Path) -> dict[str, Any]:
    return run_distributed(name, "paper", out, *LIMITS, *_overrides(name))


def _logs(root: Path) -> dict[str, list[dict[str, Any]]]:
    return {str(p.parent.relative_to(root)): read_log(p.parent) for p in root.rglob("log.jsonl")}


# --- tiny presets -----------------------------------------------------------------------------


def _check_study(name: str, root: Path, record: dict[str, Any]) -> None:
    """Every run of the tiny study left one record, one run identity and its log; figures."""
    runs = root / name / "runs"
    assert len(list(runs.rglob("result.json"))) == len(list(runs.rglob("run.json"))) == 6
    for path in runs.rglob("result.json"):  # the trainer really ran on both processes
        assert json.loads(path.read_text())["processes"] == 2
    assert len(list(runs.rglob("log.jsonl"))) == 6
    for figure in record["results"]["figures"]:
        assert (root / name / figure).stat().st_size > 1000


def test_tiny_opt_study_follows_one_process(tmp_path: Path, shared_data: Path) -> None:
    """Two processes train the same global batches as one (OPT's tiny preset has no dropout, so
    nothing random): the same training curves and, to float tolerance, the same evaluation."""
    name = "outliers-opt"
    record = run_distributed(name, "tiny", tmp_path / "two")
    _check_study(name, tmp_path / "two", record)
    single = run_experiment(name, "tiny", tmp_path / "one", data_dir=shared_data, progress=False)
    one = json.loads(single.read_text())
    assert one["processes"] == 1
    metrics2, metrics1 = record["results"]["metrics"], one["results"]["metrics"]
    assert metrics2.keys() == metrics1.keys()
    for key, value in metrics1.items():
        assert metrics2[key] == pytest.approx(value, rel=1e-3, abs=1e-4, nan_ok=True), key
    logs2, logs1 = _logs(tmp_path / "two" / name), _logs(tmp_path / "one" / name)
    assert logs2.keys() == logs1.keys()
    for run, log in logs1.items():
        assert [r["step"] for r in logs2[run]] == [r["step"] for r in log]
        assert [r["loss"] for r in logs2[run]] == pytest.approx([r["loss"] for r in log], rel=1e-4)


def test_tiny_bert_study(tmp_path: Path) -> None:
    """BERT masks tokens and drops activations at random on each process, so its numbers differ
    from one process's; the run completes, and a second run reuses every record."""
    name = "outliers-bert"
    record = run_distributed(name, "tiny", tmp_path / "out")
    _check_study(name, tmp_path / "out", record)
    metrics = record["results"]["metrics"]
    assert 1.0 < metrics["bert/softmax/fp"] < 1000.0
    assert metrics["bert/softmax1/row_sum"] < 0.999
    results = {p: p.read_text() for p in (tmp_path / "out" / name / "runs").rglob("result.json")}
    again = run_distributed(name, "tiny", tmp_path / "out")
    assert again["results"]["metrics"] == metrics
    assert {p: p.read_text() for p in results} == results  # nothing trained again


def test_tiny_convergence_and_resume(tmp_path: Path) -> None:
    """The tiny convergence run on 2 processes; run again with ``accelerate launch
    --multi_gpu`` (the documented accelerate command for several CPU processes), it resumes every
    finished run from its checkpoint (the same curves, nothing trained)."""
    first = run_distributed("convergence", "tiny", tmp_path / "out")
    curves = json.loads((tmp_path / "out" / "convergence" / "curves.json").read_text())
    assert all(runs[0]["finished"] for runs in curves["digits"].values())
    assert all(runs[0]["processes"] == 2 for runs in curves["digits"].values())
    again = run_distributed("convergence", "tiny", tmp_path / "out", launcher="accelerate")
    assert json.loads((tmp_path / "out" / "convergence" / "curves.json").read_text()) == curves
    assert again["results"]["metrics"] == first["results"]["metrics"]
    assert not any("trained from scratch" in n for n in again["results"]["notes"])


# --- paper presets, 2 steps -------------------------------------------------------------------


@pytest.mark.parametrize("family", ["bert", "opt", "vit"])
def test_paper_outlier_study_two_steps(family: str, tmp_path: Path) -> None:
    name = f"outliers-{family}"
    record = _smoke(name, tmp_path / "out")
    assert record["limits"] == {"stop_after": 2, "micro_batch_size": 1, "stand_in_data": True}
    results = record["results"]
    assert any("STAND-IN" in note for note in results["notes"])
    params = {"bert": 108_891_648, "opt": 124_059_648, "vit": 22_050_664}[family]
    assert results["metrics"][f"{family}/softmax1/parameters"] == params  # the paper's model
    run_dir = tmp_path / "out" / name / "runs" / family / "softmax1" / "seed-1000"
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == 2 and result["stop_after"] == 2 and result["processes"] == 2
    log = read_log(run_dir)
    assert [r["step"] for r in log] == [1, 2] and log[-1]["max_abs"]  # monitored on 2 processes
    assert (run_dir / "checkpoints" / "step-2" / "random_states_1.pkl").is_file()


def test_paper_convergence_two_steps(tmp_path: Path) -> None:
    record = _smoke("convergence", tmp_path / "out")
    results = record["results"]
    assert any("STAND-IN" in note for note in results["notes"])
    settings = json.loads(
        (
            tmp_path / "out" / "convergence" / "runs" / "cifar10-outeffhop-seed0" / "settings.json"
        ).read_text()
    )
    assert (settings["batch_size"], settings["embed_dim"], settings["patch_size"]) == (512, 512, 32)
    assert "STAND-IN" in settings["data"]
    curves = json.loads((tmp_path / "out" / "convergence" / "curves.json").read_text())
    (run,) = curves["cifar10"]["outeffhop"]
    assert (run["steps"], run["processes"], run["finished"]) == (2, 2, False)


def test_paper_outlier_formation_two_steps(tmp_path: Path) -> None:
    record = _smoke("outlier-formation", tmp_path / "out")
    search = json.loads((tmp_path / "out" / "outlier-formation" / "search.json").read_text())
    assert len(search) == 1 and search[0]["steps"] == 2 and search[0]["stop_after"] == 2
    assert search[0]["processes"] == 2
    assert search[0]["overrides"]["steps"] == 10_000  # a point of the paper grid
    assert record["results"]["metrics"]["configs_tried"] == 1.0

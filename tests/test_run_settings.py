"""A run records what it changed from its preset (``--set``, ``--seed``, ``--max-steps``...) and
the report shows it; a finished run of other settings in the output folder is never replaced
without ``--overwrite`` (the command stops with one line saying how to proceed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hopfield.cli import main
from hopfield.experiments.runner import (
    ExistingRunError,
    describe_settings,
    load_record,
    run_experiment,
)
from hopfield.report import render_record

DEMO = ["run", "retrieval-demo", "--preset", "tiny", "--no-progress"]


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_overrides_are_recorded_and_reported(tmp_path: Path) -> None:
    out = ["--out", str(tmp_path)]
    assert main([*DEMO, *out, "--set", "num_memories=30", "--seed", "3", "--max-steps", "2"]) == 0
    path = tmp_path / "retrieval-demo" / "results.json"
    record = load_record(path)
    assert record["overrides"] == {"num_memories": 30, "seed": 3}
    assert record["limits"]["stop_after"] == 2
    heading = render_record(path, tmp_path).splitlines()[0]
    assert heading == (
        "## retrieval-demo (preset `tiny`, overrides `num_memories=30 seed=3`, max steps 2)"
    )
    assert describe_settings(record) == "preset tiny, overrides num_memories=30 seed=3, max steps 2"


def test_a_record_without_overrides_reports_as_before(tmp_path: Path) -> None:
    """Records written before overrides were recorded (the committed ones) keep their heading."""
    record = {
        "experiment": "x",
        "preset": "small",
        "config": {"seed": 0},
        "seed": 0,
        "wall_time_s": 1.0,
        "versions": {"torch": "2", "hopfield": "0.1.0"},
        "mixed_precision": None,
        "limits": {"stop_after": None, "micro_batch_size": None, "stand_in_data": False},
        "results": {},
    }
    path = tmp_path / "x" / "results.json"
    path.parent.mkdir()
    path.write_text(json.dumps(record))
    assert render_record(path, tmp_path).splitlines()[0] == "## x (preset `small`)"


def test_a_finished_run_of_other_settings_is_kept_unless_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--out", str(tmp_path)]
    assert main([*DEMO, *out, "--set", "num_memories=30"]) == 0
    path = tmp_path / "retrieval-demo" / "results.json"
    first = path.read_bytes()

    line = _fails([*DEMO, *out, "--set", "num_memories=40"], capsys)
    assert line == (
        f"hopfield run: {tmp_path / 'retrieval-demo'} holds a finished run of other settings "
        "(preset tiny, overrides num_memories=30; this run differs in num_memories): give "
        "another --out to keep it, or --overwrite to replace it"
    )
    assert "differs in preset, " in _fails([*DEMO, *out, "--preset", "small"], capsys)
    line = _fails(["reproduce", "--preset", "small", "--only", "retrieval-demo", *out], capsys)
    assert line.startswith("hopfield reproduce: ") and "--overwrite" in line
    assert path.read_bytes() == first  # nothing ran, nothing was replaced

    # the same settings resume (a run cut by --max-steps continues without it)
    assert main([*DEMO, *out, "--set", "num_memories=30", "--max-steps", "1"]) == 0
    assert load_record(path)["overrides"] == {"num_memories": 30}

    capsys.readouterr()
    assert main([*DEMO, *out, "--set", "num_memories=40", "--overwrite"]) == 0
    assert "replacing the finished run in" in capsys.readouterr().err
    assert load_record(path)["overrides"] == {"num_memories": 40}


def test_the_python_function_refuses_only_when_asked(tmp_path: Path) -> None:
    run_experiment("retrieval-demo", "tiny", tmp_path, progress=False)
    with pytest.raises(ExistingRunError, match="differs in seed"):
        run_experiment("retrieval-demo", "tiny", tmp_path, seed=5, progress=False, overwrite=False)
    path = run_experiment("retrieval-demo", "tiny", tmp_path, seed=5, progress=False)
    assert load_record(path)["overrides"] == {"seed": 5}


def test_until_epoch_is_a_limit_and_the_next_run_continues(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--set until_epoch=N`` stops a sitting, as ``--max-steps`` does: the same command
    without it continues the run (no refusal, no ``--overwrite``, no restart)."""
    run = ["run", "convergence", "--preset", "tiny", "--out", str(tmp_path), "--no-progress"]
    small = ["--set", 'models=["dense"]', "--set", "train_size=128", "--set", "test_size=64"]
    assert main([*run, *small, "--set", "until_epoch=1"]) == 0
    curves = tmp_path / "convergence" / "curves.json"
    (first,) = json.loads(curves.read_text())["digits"]["dense"]
    assert len(first["test_accuracy"]) == 1 and not first["finished"]
    capsys.readouterr()
    assert main([*run, *small]) == 0
    assert "replacing" not in capsys.readouterr().err
    (second,) = json.loads(curves.read_text())["digits"]["dense"]
    assert second["finished"] and second["test_accuracy"][0] == first["test_accuracy"][0]
    assert len(second["test_accuracy"]) == 2
    notes = load_record(tmp_path / "convergence" / "results.json")["results"]["notes"]
    assert not any("trained from scratch" in n for n in notes)
    sittings = load_record(tmp_path / "convergence" / "results.json")["sittings"]
    assert [s["outcome"] for s in sittings] == ["finished", "finished"]

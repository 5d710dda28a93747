"""An experiment that trains nothing runs once under several processes: the main process
computes and writes, the others wait for its record."""

from __future__ import annotations

import json
from pathlib import Path

from hopfield.experiments.registry import all_experiments
from launch import torchrun

SCRIPT = str(Path(__file__).with_name("single_process_script.py"))


def test_only_the_main_process_runs_a_single_process_experiment(tmp_path: Path) -> None:
    torchrun([SCRIPT, str(tmp_path)], cwd=tmp_path)
    assert sorted(p.name for p in tmp_path.glob("ran-on-*")) == ["ran-on-0"]
    record = json.loads((tmp_path / "count-processes" / "results.json").read_text())
    assert record["processes"] == 2 and record["results"]["metrics"] == {"value": 1.0}


def test_the_experiments_that_train_nothing_are_single_process() -> None:
    from hopfield.plan.jobs import NOT_TRAINED

    single = {e.name for e in all_experiments() if e.single_process}
    assert single == set(NOT_TRAINED)

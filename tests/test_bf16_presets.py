"""Every training experiment's tiny preset trains under bf16 autocast on the CPU: the record
and every checkpoint say bf16, and the numbers it reports are finite."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hopfield.experiments.registry import all_experiments

SCRIPT = str(Path(__file__).with_name("bf16_presets_script.py"))


def _numbers(value: Any) -> list[float]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int | float):
        return [float(value)]
    return []


@pytest.mark.slow
def test_every_training_preset_runs_in_bf16(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    training = {e.name for e in all_experiments() if not e.single_process}
    assert set(summary) == training
    ran = [name for name, outcome in summary.items() if outcome == "ran"]
    assert len(ran) >= len(training) // 2, summary  # the synthetic-data ones at least
    for name in ran:
        record = json.loads((tmp_path / name / "results.json").read_text())
        assert record["mixed_precision"] == "bf16", name
        metrics = record["results"]["metrics"]
        assert all(not math.isnan(v) for m in metrics.values() for v in _numbers(m)), name
        for path in (tmp_path / name).rglob("checkpoints/*/manifest.json"):
            assert json.loads(path.read_text())["facts"]["mixed_precision"] == "bf16", path

"""Run by ``tests/test_bf16_presets.py`` in one fresh process (accelerate keeps one precision per
process): every training experiment's ``tiny`` preset under bf16 autocast. Writes
``OUT/summary.json``: per experiment, ``"ran"`` or why it was skipped (absent data)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hopfield.data import DataNotFoundError
from hopfield.experiments.registry import all_experiments
from hopfield.experiments.runner import run_experiment

if __name__ == "__main__":
    out = Path(sys.argv[1])
    summary = {}
    for experiment in all_experiments():
        if experiment.single_process:  # trains nothing
            continue
        try:
            run_experiment(experiment.name, "tiny", out, progress=False, mixed_precision="bf16")
            summary[experiment.name] = "ran"
        except DataNotFoundError as absent:
            summary[experiment.name] = f"skipped: {absent}"
    (out / "summary.json").write_text(json.dumps(summary))

"""Run by ``tests/test_single_process.py`` under ``torchrun`` (2 processes): an experiment
registered with ``single_process=True`` that leaves one file per process that ran it."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from hopfield.experiments.registry import Experiment, register
from hopfield.experiments.results import Results, RunContext
from hopfield.experiments.runner import run_experiment
from hopfield.training import leave_process_group


@dataclass
class Config:
    seed: int = 0


def run(config: Config, ctx: RunContext) -> Results:
    rank = os.environ.get("RANK", "0")
    (ctx.out_dir.parent / f"ran-on-{rank}").write_text(rank)
    return Results(metrics={"value": 1.0})


if __name__ == "__main__":
    presets = {p: Config() for p in ("tiny", "small", "paper")}
    register(Experiment("count-processes", "test", presets, run, single_process=True))
    run_experiment("count-processes", "tiny", Path(sys.argv[1]), progress=False)
    leave_process_group(exit_status=0)

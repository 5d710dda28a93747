"""Preemption (issue 30, item 7): SIGUSR1 or SIGTERM during training stops the run at the next
optimiser step with a checkpoint there, records the sitting as stopped and exits with
``hopfield.cli.PREEMPTED``; the same command resumes to the weights of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hopfield
from hopfield.cli import PREEMPTED
from hopfield.training import Preempted, preemptible, preemption_requested

SCRIPT = Path(__file__).parent / "preemption_script.py"


def _run(out: Path, step: int, name: str = "SIGUSR1", processes: int = 1, workers: int = 0) -> int:
    paths = [str(Path(hopfield.__file__).parents[1]), str(Path(__file__).parent)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1"}
    args = [str(SCRIPT), str(out), str(step), name, str(workers)]
    if processes > 1:
        launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
        args = [*launch, *args]
    # a session of its own: a signal to the script's process group reaches no test process
    run = subprocess.run([sys.executable, *args], env=env, timeout=300, start_new_session=True)
    return run.returncode


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "test-preempt" / "weights.pt", weights_only=True)


def _check_preempted_then_resumed(tmp_path: Path, name: str, processes: int) -> None:
    stopped = tmp_path / "stopped"
    status = _run(stopped, 3, name, processes)
    # each process exits with PREEMPTED; torchrun reports a failed worker with 1
    assert status == (PREEMPTED if processes == 1 else 1)
    folder = stopped / "test-preempt"
    # the checkpoint of the step the signal arrived in, and none later (checkpoint_every=0)
    steps = sorted(p.name for p in (folder / "train" / "checkpoints").iterdir())
    assert steps == ["step-3"]
    sittings = json.loads((folder / "sittings.json").read_text())["sittings"]
    assert [s["outcome"] for s in sittings] == ["stopped"]
    signal_name = name if processes == 1 else None  # rank 0 learnt of it at the boundary
    assert sittings[0]["preempted"] == {"signal": signal_name, "step": 3}
    if processes > 1:  # exact resume under several processes: tests/test_distributed_training.py
        return
    assert _run(stopped, 3, name, processes) == 0  # the same command resumes
    record = json.loads((folder / "results.json").read_text())
    assert [s["outcome"] for s in record["sittings"]] == ["stopped", "finished"]
    assert record["results"]["metrics"]["step"] == 8.0
    whole = tmp_path / "whole"
    assert _run(whole, 0, name, processes) == 0
    for key, value in _weights(whole).items():
        assert torch.equal(_weights(stopped)[key], value), key


def test_sigusr1_checkpoints_at_the_step_and_resumes_exactly(tmp_path: Path) -> None:
    _check_preempted_then_resumed(tmp_path, "SIGUSR1", processes=1)


def test_every_process_stops_at_the_step_one_of_them_was_signalled_in(tmp_path: Path) -> None:
    """Under 2 processes only the last one receives SIGTERM; both stop after the same step."""
    _check_preempted_then_resumed(tmp_path, "SIGTERM", processes=2)


def test_data_workers_signalled_too_do_not_fail_the_step(tmp_path: Path) -> None:
    """A scheduler signals every process of the job; a data worker that died of the signal
    would fail the step before its boundary. Workers ignore it; the run stops as above."""
    out = tmp_path / "workers"
    assert _run(out, 3, "SIGTERM", workers=1) == PREEMPTED
    steps = sorted(p.name for p in (out / "test-preempt" / "train" / "checkpoints").iterdir())
    assert steps == ["step-3"]


def test_outside_a_training_loop_the_signal_stops_at_once() -> None:
    with pytest.raises(Preempted, match="preempted by SIGUSR1"), preemptible():
        os.kill(os.getpid(), signal.SIGUSR1)
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the handler is restored


def test_a_deferred_signal_not_acted_on_stops_when_the_block_ends() -> None:
    with pytest.raises(Preempted, match="SIGTERM"), preemptible(), preemptible(defer=True):
        os.kill(os.getpid(), signal.SIGTERM)
        assert preemption_requested() == "SIGTERM"  # noted, not raised, inside the block

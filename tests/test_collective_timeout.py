"""A hung process ends a multi-process job after the configured collective timeout, and a
launch that lost its processes says so."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import pytest

from hopfield import training
from hopfield.cli import main
from hopfield.training import COLLECTIVE_TIMEOUT_VARIABLE, collective_timeout

SCRIPT = str(Path(__file__).with_name("collective_timeout_script.py"))


def test_the_timeout_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(COLLECTIVE_TIMEOUT_VARIABLE, raising=False)
    assert collective_timeout() == timedelta(minutes=30)  # torch's default
    monkeypatch.setenv(COLLECTIVE_TIMEOUT_VARIABLE, "2.5")
    assert collective_timeout() == timedelta(seconds=2.5)
    for bad in ("0", "-1", "soon", "nan", "inf"):
        monkeypatch.setenv(COLLECTIVE_TIMEOUT_VARIABLE, bad)
        with pytest.raises(ValueError, match=COLLECTIVE_TIMEOUT_VARIABLE):
            collective_timeout()


def test_the_run_command_sets_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(COLLECTIVE_TIMEOUT_VARIABLE, raising=False)
    out = ["--out", str(tmp_path), "--no-progress"]
    assert (
        main(["run", "retrieval-demo", "--preset", "tiny", *out, "--collective-timeout", "7"]) == 0
    )
    assert os.environ[COLLECTIVE_TIMEOUT_VARIABLE] == "7.0"
    with pytest.raises(SystemExit):
        main(["run", "retrieval-demo", "--preset", "tiny", *out, "--collective-timeout", "0"])


def test_a_hung_process_ends_the_job_after_the_timeout(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", COLLECTIVE_TIMEOUT_VARIABLE: "3"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", SCRIPT]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    elapsed = time.perf_counter() - start
    assert done.returncode != 0
    assert elapsed < 100, elapsed  # process 1 sleeps 120 s; without the timeout: 30 minutes
    assert "timed out" in done.stderr.lower() or "timeout" in done.stderr.lower()


def test_accelerate_launch_without_its_multi_process_flag_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``accelerate launch --num_processes 2`` without ``--multi_gpu``/``--multi_cpu`` runs one
    process with MASTER_ADDR set; the engine warns once."""
    for name in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "ACCELERATE_MIXED_PRECISION"):
        monkeypatch.delenv(name, raising=False)
    training.warn_if_processes_were_lost.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert training.warn_if_processes_were_lost() is False  # a plain single process
    training.warn_if_processes_were_lost.cache_clear()
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.warns(RuntimeWarning, match="--multi_cpu"):
        assert training.warn_if_processes_were_lost() is True
    training.warn_if_processes_were_lost.cache_clear()
    monkeypatch.setenv("WORLD_SIZE", "2")  # a real 2-process launch: nothing to say
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert training.warn_if_processes_were_lost() is False
    training.warn_if_processes_were_lost.cache_clear()

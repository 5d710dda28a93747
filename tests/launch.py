"""Launch the command line under ``torchrun`` or ``accelerate launch`` (several CPU processes,
gloo) for the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


LAUNCHERS = ("torchrun", "accelerate")


def _launcher_command(launcher: str, nproc: int) -> list[str]:
    """The command that starts ``nproc`` local processes: ``torchrun --standalone``, or
    ``accelerate launch --multi_gpu`` (which, without GPUs, starts CPU processes through the
    same torchrun machinery; ``--cpu`` would start one process)."""
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    if launcher == "accelerate":
        flags = ["--multi_gpu", "--num_machines", "1", "--mixed_precision", "no"]
        return [sys.executable, "-m", "accelerate.commands.launch", *flags, "--num_processes"]
    raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")


def torchrun(
    args: list[str],
    *,
    cwd: Path,
    nproc: int = 2,
    timeout: float = 600,
    launcher: str = "torchrun",
) -> subprocess.CompletedProcess[str]:
    """Run ``ARGS`` (a script or ``-m module ...``) in ``nproc`` processes started by
    ``launcher`` in ``cwd``, with one thread per process; raises with the output when it fails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.setdefault("HOPFIELD_DATA", str(DATA))
    command = [*_launcher_command(launcher, nproc), str(nproc), *args]
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited with {done.returncode}\n--- stdout\n"
            f"{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-8000:]}"
        )
    return done


def run_distributed(
    name: str,
    preset: str,
    out: Path,
    *extra: str,
    nproc: int = 2,
    timeout: float = 600,
    launcher: str = "torchrun",
) -> dict[str, Any]:
    """Run ``hopfield run NAME --preset PRESET`` in ``nproc`` processes (started by
    ``launcher``) and check what every multi-process run must do: exit 0, the main process alone
    reports (one ``results:`` line), and the record is complete and says ``nproc`` processes ran
    it. Returns the record."""
    done = torchrun(
        [
            "-m",
            "hopfield.cli",
            "run",
            name,
            "--preset",
            preset,
            "--out",
            str(out),
            "--no-progress",
            *extra,
        ],
        cwd=out.parent,
        nproc=nproc,
        timeout=timeout,
        launcher=launcher,
    )
    reported = [line for line in done.stdout.splitlines() if line.startswith("results:")]
    assert len(reported) == 1, done.stdout
    path = out / name / "results.json"
    assert reported[0].split(maxsplit=1)[1] == str(path)
    record = json.loads(path.read_text())
    assert record["processes"] == nproc and record["experiment"] == name
    assert record["results"]["tables"] or record["results"]["metrics"]
    assert not list((out / name).rglob("*.tmp")), "a half-written file was left behind"
    return record

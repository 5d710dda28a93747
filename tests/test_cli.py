"""The command line, the experiment registry, results JSON and the Markdown report."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hopfield.cli import PREEMPTED, main
from hopfield.data import ChecksumError, DataFile, DataNotFoundError, locate
from hopfield.experiments import (
    Results,
    RunContext,
    Table,
    get,
    run_experiment,
)
from hopfield.experiments.results import mean_std
from hopfield.experiments.runner import apply_overrides
from hopfield.report import build_report
from stubs import StubConfig, interrupted_once


def test_list_shows_the_retrieval_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    assert "retrieval-demo" in capsys.readouterr().out


def test_the_listings_are_what_the_experiment_modules_register() -> None:
    """``hopfield list`` reads the table ``LISTINGS`` (no experiment module imported): it must
    name every built-in experiment with the summary, presets and paper it registers."""
    from hopfield.experiments.registry import LISTINGS, Listing, all_experiments

    registered = [
        Listing.of(e) for e in all_experiments() if e.run.__module__.startswith("hopfield.")
    ]
    assert sorted(LISTINGS, key=lambda listing: listing.name) == registered


def test_run_writes_results_with_provenance_and_a_report(tmp_path: Path) -> None:
    assert (
        main(
            [
                "run",
                "retrieval-demo",
                "--preset",
                "tiny",
                "--out",
                str(tmp_path),
                "--no-progress",
                "--seed",
                "3",
                "--set",
                "noise_std=0.25",
            ]
        )
        == 0
    )
    record = json.loads((tmp_path / "retrieval-demo" / "results.json").read_text())
    assert record["preset"] == "tiny" and record["seed"] == 3
    assert record["config"]["noise_std"] == 0.25
    assert {"torch", "python", "hopfield", "numpy"} <= set(record["versions"])
    assert set(record["code"]) == {"commit", "dirty", "source"}  # the code that ran
    assert record["wall_time_s"] > 0
    masked, noisy = record["results"]["tables"][:2]
    assert masked["columns"] == ["map", "steps", "β=0.1", "β=1"]
    rates = [rate for table in (masked, noisy) for row in table["rows"] for rate in row[2:]]
    assert all(0.0 <= r <= 1.0 for r in rates) and max(rates) > 0.5  # digits are retrieved
    assert (tmp_path / "retrieval-demo" / "retrieval_demo.png").stat().st_size > 1000
    report = (tmp_path / "retrieval-demo" / "REPORT.md").read_text()
    assert "| map | steps | β=0.1 | β=1 |" in report and "retrieval_demo.png" in report


def test_reproduce_and_report_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "reproduce",
                "--preset",
                "tiny",
                "--out",
                str(tmp_path),
                "--no-progress",
                "--only",
                "retrieval-demo",
            ]
        )
        == 0
    )
    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "REPORT.md").read_text().count("## retrieval-demo") == 1


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown experiment 'nope'"):
        get("nope")
    with pytest.raises(ValueError, match="preset must be one of"):
        get("retrieval-demo").config("huge")
    with pytest.raises(ValueError, match="unknown config field 'colour'"):
        apply_overrides(get("retrieval-demo").config("tiny"), {"colour": "red"})
    with pytest.raises(SystemExit):
        main(["run", "retrieval-demo", "--set", "no-equals-sign"])
    with pytest.raises(SystemExit, match="retrieval-demo has presets tiny, small, paper"):
        main(["run", "retrieval-demo", "--preset", "formation"])
    with pytest.raises(SystemExit, match="unknown experiment 'nope'"):
        main(["run", "nope"])
    with pytest.raises(ValueError, match=r"no results\.json"):
        build_report(Path(__file__).parent)


def test_a_stopped_run_resumes_from_its_checkpoint(tmp_path: Path, registered: Any) -> None:
    registered("test-resume", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        run_experiment("test-resume", "tiny", tmp_path, progress=False)
    unfinished = tmp_path / "test-resume" / "sittings.json"
    stopped = json.loads(unfinished.read_text())["sittings"]
    assert [s["outcome"] for s in stopped] == ["stopped"]
    path = run_experiment("test-resume", "tiny", tmp_path, progress=False)
    record = json.loads(path.read_text())
    assert record["results"]["tables"][0]["rows"] == [[0], [1], [2], [3]]
    # The record's times cover both sittings, and the unfinished run's file is gone.
    assert [s["outcome"] for s in record["sittings"]] == ["stopped", "finished"]
    assert record["sittings"][0] == stopped[0]
    assert record["started_at"] == stopped[0]["started_at"]
    assert record["wall_time_s"] == pytest.approx(sum(s["wall_time_s"] for s in record["sittings"]))
    assert record["cpu_time_s"] == pytest.approx(sum(s["cpu_time_s"] for s in record["sittings"]))
    assert not unfinished.exists()
    # Continuing the finished run adds a sitting; a run of other settings starts afresh.
    again = json.loads(run_experiment("test-resume", "tiny", tmp_path, progress=False).read_text())
    assert [s["outcome"] for s in again["sittings"]] == ["stopped", "finished", "finished"]
    other = run_experiment("test-resume", "tiny", tmp_path, seed=7, progress=False)
    assert [s["outcome"] for s in json.loads(other.read_text())["sittings"]] == ["finished"]


def _fails(config: Any, ctx: RunContext) -> Results:
    ctx.save_json("partial.json", {"done": 1})
    raise RuntimeError("the run broke")


def test_a_failed_sitting_is_kept_and_a_refused_run_leaves_none(
    tmp_path: Path, registered: Any
) -> None:
    registered("test-fails", _fails)
    with pytest.raises(RuntimeError, match="the run broke"):
        run_experiment("test-fails", "tiny", tmp_path, progress=False)
    kept = json.loads((tmp_path / "test-fails" / "sittings.json").read_text())
    assert [s["outcome"] for s in kept["sittings"]] == ["failed"]
    assert kept["preset"] == "tiny"
    with pytest.raises(RuntimeError):
        run_experiment("test-fails", "tiny", tmp_path, progress=False)
    kept = json.loads((tmp_path / "test-fails" / "sittings.json").read_text())
    assert [s["outcome"] for s in kept["sittings"]] == ["failed", "failed"]
    with pytest.raises(SystemExit):
        main(["run", "retrieval-demo", "--preset", "tiny", "--out", str(tmp_path / "bad"),
              "--set", "betas=[-1]"])  # fmt: skip
    assert not (tmp_path / "bad" / "retrieval-demo" / "sittings.json").exists()


def test_a_refused_sitting_leaves_the_sittings_as_they_were(
    tmp_path: Path, registered: Any
) -> None:
    """A sitting is recorded when it starts; one refused for missing data is taken back."""
    calls: list[int] = []

    def fails_then_lacks_data(config: Any, ctx: RunContext) -> Results:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the run broke")
        raise DataNotFoundError("no such dataset")

    registered("test-refused", fails_then_lacks_data)
    with pytest.raises(RuntimeError):
        run_experiment("test-refused", "tiny", tmp_path, progress=False)
    sittings = tmp_path / "test-refused" / "sittings.json"
    kept = sittings.read_text()
    with pytest.raises(DataNotFoundError):
        run_experiment("test-refused", "tiny", tmp_path, progress=False)
    assert sittings.read_text() == kept  # the failed sitting only, no refused one
    with pytest.raises(DataNotFoundError):
        run_experiment("test-refused", "tiny", tmp_path / "fresh", progress=False)
    assert not (tmp_path / "fresh" / "test-refused" / "sittings.json").exists()


_SLOW_RUN = """
import sys, time
from pathlib import Path
from hopfield.cli import PREEMPTED, main
from hopfield.experiments.registry import Experiment, register
from stubs import StubConfig

def slow(config, ctx):
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    (ctx.out_dir / "started").touch()
    time.sleep(60)

register(Experiment("test-slow", "test", {p: StubConfig() for p in ("tiny", "small", "paper")}, slow))
main(["run", "test-slow", "--preset", "tiny", "--out", sys.argv[1], "--no-progress"])
"""


def _signalled_run(out: Path, signum: int) -> tuple[int, list[dict[str, Any]]]:
    """Start a run of a slow experiment in a subprocess, send it ``signum`` once it works, and
    return its exit status and the sittings its folder keeps."""
    import hopfield

    paths = [str(Path(hopfield.__file__).parents[1]), str(Path(__file__).parent)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    started = out / "test-slow" / "started"
    started.unlink(missing_ok=True)
    process = subprocess.Popen([sys.executable, "-c", _SLOW_RUN, str(out)], env=env)
    deadline = time.monotonic() + 60
    while not started.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signum)
    status = process.wait(timeout=60)
    kept = json.loads((out / "test-slow" / "sittings.json").read_text())
    return status, kept["sittings"]


def test_a_terminated_or_killed_sitting_is_kept(tmp_path: Path, registered: Any) -> None:
    status, sittings = _signalled_run(tmp_path, signal.SIGTERM)
    assert status == PREEMPTED  # stopped for a requeue: the same command resumes
    assert [s["outcome"] for s in sittings] == ["stopped"] and sittings[0]["wall_time_s"] > 0
    status, sittings = _signalled_run(tmp_path, signal.SIGKILL)
    assert status == -signal.SIGKILL
    assert [s["outcome"] for s in sittings] == ["stopped", "running"]
    # the next sitting finishes the run; the killed one is kept, its times unknown
    registered("test-slow", lambda config, ctx: Results(notes=["done"]))
    record = json.loads(run_experiment("test-slow", "tiny", tmp_path, progress=False).read_text())
    assert [s["outcome"] for s in record["sittings"]] == ["stopped", "killed", "finished"]
    assert record["sittings"][1]["wall_time_s"] is None
    known = [record["sittings"][i]["wall_time_s"] for i in (0, 2)]
    assert record["wall_time_s"] == pytest.approx(sum(known))


def test_tables_and_statistics() -> None:
    with pytest.raises(ValueError, match="row 0 has 1 cells, expected 2"):
        Table("t", ["a", "b"], [[1]])
    assert "| 0.1235 | – |" in Table("t", ["a", "b"], [[0.123456, None]]).to_markdown()
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(2**0.5))
    with pytest.raises(ValueError):
        mean_std([])


def test_data_files_are_located_and_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f.txt").write_bytes(b"hello")
    good = DataFile("sub/f.txt", hashlib.sha256(b"hello").hexdigest(), "https://example.org/f.txt")
    assert locate(good, tmp_path) == tmp_path / "sub" / "f.txt"
    monkeypatch.setenv("HOPFIELD_DATA", str(tmp_path))
    assert locate(good) == tmp_path / "sub" / "f.txt"
    with pytest.raises(ChecksumError, match=r"is [0-9a-f]+, expected"):
        locate(DataFile("sub/f.txt", "0" * 64, "https://example.org/f.txt"), tmp_path)
    with pytest.raises(DataNotFoundError, match=r"https://example\.org/g\.txt"):
        locate(DataFile("sub/g.txt", "", "https://example.org/g.txt"), tmp_path)


def _needs_data(config: StubConfig, ctx: RunContext) -> Results:
    from hopfield.data import DataFile, locate

    locate(DataFile("absent/file.bin", "", "https://example.org/file.bin"), tmp_root := ctx.out_dir)
    raise AssertionError(f"unreachable: {tmp_root}")


def test_reproduce_skips_experiments_whose_data_is_absent(tmp_path: Path, registered: Any) -> None:
    from hopfield.experiments import reproduce

    registered("test-needs-data", _needs_data)
    paths, skipped = reproduce(
        "tiny", tmp_path, progress=False, only=["test-needs-data", "retrieval-demo"]
    )
    assert [p.parent.name for p in paths] == ["retrieval-demo"]
    assert "absent/file.bin" in skipped["test-needs-data"]
    assert "test-needs-data" in json.loads((tmp_path / "skipped.json").read_text())


def test_mixed_precision_applies_to_every_training_run(tmp_path: Path) -> None:
    """``--mixed-precision bf16`` reaches the Trainer of every run (a fresh process: accelerate
    keeps one precision per process) and the record says so."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "hopfield.cli", "run", "convergence", "--preset", "tiny"]
    command += ["--out", str(tmp_path), "--no-progress", "--mixed-precision", "bf16"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "convergence" / "results.json").read_text())
    assert record["mixed_precision"] == "bf16"
    manifests = list((tmp_path / "convergence").rglob("checkpoints/*/manifest.json"))
    assert manifests
    for path in manifests:
        assert json.loads(path.read_text())["facts"]["mixed_precision"] == "bf16", path


def _full_disk_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err.strip()


def test_a_full_disk_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = ["run", "retrieval-demo", "--preset", "tiny", "--out", str(tmp_path), "--no-progress"]
    real = Path.write_text

    def full(path: Path, text: str, *args: Any, **kwargs: Any) -> int:
        if path.suffix != ".tmp":
            return real(path, text, *args, **kwargs)
        real(path, text[:10])  # half written when the disk fills
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(Path, "write_text", full)
        line = _full_disk_line(demo, capsys)
    assert line.startswith("hopfield run: no space left on the device to write ")
    assert "sittings.json; free some space and run again" in line
    assert not list(tmp_path.rglob("*.tmp"))

    import matplotlib.figure

    def no_room(figure: Any, name: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(name))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", no_room)
    line = _full_disk_line(demo, capsys)  # a write of no guarded writer: still one line
    assert line.startswith("hopfield run: no space left: [Errno 28] No space left on device: ")
    assert "retrieval_demo.png" in line


def test_a_run_that_fills_the_disk_reports_its_own_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registered: Any
) -> None:
    """When the disk is full, recording the failed sitting fails too; the error that goes on
    names the file the run could not write, not the sittings file."""
    real = Path.write_text
    full = {"now": False}

    def write_text(path: Path, text: str, *args: Any, **kwargs: Any) -> int:
        if full["now"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, text, *args, **kwargs)

    def fills_the_disk(config: Any, ctx: RunContext) -> Results:
        full["now"] = True
        raise OSError(errno.ENOSPC, "No space left on device", "weights.bin")

    monkeypatch.setattr(Path, "write_text", write_text)
    registered("test-full", fills_the_disk)
    with pytest.raises(OSError, match=r"weights\.bin"):
        run_experiment("test-full", "tiny", tmp_path, progress=False)
    full["now"] = False
    kept = json.loads((tmp_path / "test-full" / "sittings.json").read_text())
    assert [s["outcome"] for s in kept["sittings"]] == ["running"]  # read back as killed
    assert not list(tmp_path.rglob("*.tmp"))

"""benchmarks/gpu_check.py: its ``--smoke`` record on the CPU, its row and report helpers, and
docs/gpu.md as rendered from the newest GPU record."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


gpu_check = _module()


@pytest.fixture(scope="module")
def smoke_record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("gpu") / "smoke.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(out), "--budget-s", "240"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    record: dict[str, Any] = json.loads(out.read_text())
    return record


def _timed(row: dict[str, Any]) -> bool:
    return (
        math.isfinite(row["ratio"])
        and row["ratio"] > 0
        and row["ours_ms"] > 0
        and row["peer_ms"] > 0
        and row["spread"][0] <= row["ratio"] <= row["spread"][1]
    )


@pytest.mark.slow
def test_smoke_record_has_every_section(smoke_record: dict[str, Any]) -> None:
    record = smoke_record
    assert record["schema"] == gpu_check.SCHEMA and record["kind"] == "smoke"
    assert {"created", "budget_s", "wall_s", "environment", "sections"} <= record.keys()
    env = record["environment"]
    assert env["device"] == "cpu" and env["torch"] == torch.__version__
    assert "cuda" in env and "packages" in env
    sections = record["sections"]
    assert list(sections) == list(gpu_check.SECTIONS)
    for name, entry in sections.items():
        assert entry["status"] in ("ok", "skipped"), (name, entry)
        assert entry["wall_s"] >= 0
        if entry["status"] == "skipped":
            assert entry["reason"].strip(), name
    tests = sections["tests"]
    assert tests["status"] == "ok" and tests["total"] > 0
    assert tests["failed"] == tests["errors"] == 0 and not tests["failing"]
    if not torch.cuda.is_available():  # every CUDA test is skipped here
        assert tests["skipped"] == tests["total"] and tests["passed"] == 0
    for name in ("attention", "efficient", "layer"):
        rows = sections[name]["rows"]
        assert rows and all(_timed(row) for row in rows), (name, rows)
    assert {row["model"] for row in sections["efficient"]["rows"]} == {
        "TopK(64)",
        "RandomMask(64)",
        "Window(128)",
        "Linear",
        "RandomFeatures",
    }
    separation = sections["separation"]
    assert all(_timed(row) for row in separation["entmax"])  # entmax is a dev dependency
    assert isinstance(separation["adasplash"], (str, list))
    training = sections["training"]["rows"]
    assert [row["row"] for row in training] == [
        "sdpa",
        "hopfield_softmax1",
        "hopfield_gated_clipped_softmax1",
    ]
    assert all(row["tokens_per_s"] > 0 for row in training)
    assert training[0]["ratio"] == 1.0
    outliers = sections["outliers"]
    assert outliers["status"] == "skipped"  # never run by a smoke check
    expected = "smoke mode" if gpu_check.outlier_benchmark_available() else "not available"
    assert expected in outliers["reason"]


@pytest.mark.slow
def test_render_of_a_smoke_record(smoke_record: dict[str, Any]) -> None:
    page = gpu_check.render(smoke_record)
    assert "This is a smoke record" in page and "say nothing about GPU speed" in page
    for name in gpu_check.SECTIONS:
        assert f"## {name}" in page
    assert "| TopK(64) N=128 fwd |" in page
    assert "| hopfield_softmax1 |" in page
    assert "skipped (of" in page


def _write(folder: Path, name: str, record: dict[str, Any]) -> None:
    (folder / name).write_text(json.dumps(record))


@pytest.mark.slow
def test_newest_record_takes_gpu_records_only(smoke_record: dict[str, Any], tmp_path: Path) -> None:
    assert gpu_check.newest_record(tmp_path / "absent") is None
    _write(tmp_path, "smoke.json", smoke_record)
    (tmp_path / "broken.json").write_text("{not json")
    assert gpu_check.newest_record(tmp_path) is None  # a smoke record is never a GPU result
    page = gpu_check.render(None)
    assert "No GPU record exists yet" in page and "--budget-s 480" in page
    older, newer = copy.deepcopy(smoke_record), copy.deepcopy(smoke_record)
    older.update(kind="gpu", created="2026-01-01T00:00:00+00:00")
    newer.update(kind="gpu", created="2026-02-01T00:00:00+00:00")
    _write(tmp_path, "b-older.json", older)
    _write(tmp_path, "a-newer.json", newer)
    found = gpu_check.newest_record(tmp_path)
    assert found is not None and found["created"] == newer["created"]
    assert "This is a" not in gpu_check.render(found)  # a GPU record carries no smoke banner


def test_docs_page_is_rendered_from_the_newest_record() -> None:
    expected = gpu_check.render(gpu_check.newest_record(gpu_check.RECORDS))
    page = (ROOT / "docs" / "gpu.md").read_text()
    assert page == expected, "regenerate: python3 benchmarks/gpu_check.py --render docs/gpu.md"


def test_no_committed_record_is_a_smoke_record() -> None:
    for path in sorted(gpu_check.RECORDS.glob("*.json")):
        assert json.loads(path.read_text()).get("kind") == "gpu", path


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="2" tests="6">
<testcase classname="tests.test_devices" name="test_a[cuda]"/>
<testcase classname="tests.test_devices" name="test_b[cuda]"/>
<testcase classname="tests.test_devices" name="test_c[cuda]"><failure message="AssertionError: not close&#10;more">x</failure></testcase>
<testcase classname="tests.test_devices" name="test_d[cuda]"><error message="fixture broke">y</error></testcase>
<testcase classname="tests.test_devices" name="test_e[cuda]"><skipped message="no CUDA"/></testcase>
<testcase classname="tests.test_devices" name="test_f[cuda]"><skipped message="no CUDA"/></testcase>
</testsuite></testsuites>"""


def test_junit_counts() -> None:
    counts = gpu_check.junit_counts(JUNIT)
    assert {k: counts[k] for k in ("passed", "failed", "errors", "skipped", "total")} == {
        "passed": 2,
        "failed": 1,
        "errors": 1,
        "skipped": 2,
        "total": 6,
    }
    assert counts["failing"] == [
        {
            "test": "tests.test_devices::test_c[cuda]",
            "outcome": "failure",
            "message": "AssertionError: not close",
        },
        {
            "test": "tests.test_devices::test_d[cuda]",
            "outcome": "error",
            "message": "fixture broke",
        },
    ]


def _run(deadline_s: float) -> Any:
    return gpu_check.Run(
        smoke=True,
        device=torch.device("cpu"),
        sizes=gpu_check.SMOKE_SIZES,
        deadline=time.perf_counter() + deadline_s,
    )


def test_timed_rows_keep_errors_and_skips_as_rows() -> None:
    def good() -> tuple[Any, Any]:
        return (lambda: sum(range(100))), (lambda: sum(range(50)))

    def broken() -> tuple[Any, Any]:
        raise MemoryError("out of memory on purpose")

    run = _run(60.0)
    rows = gpu_check.timed_rows(
        run, [({"row": "good"}, good), ({"row": "broken"}, broken)], time.perf_counter() + 60
    )
    assert rows[0]["row"] == "good" and _timed(rows[0]) and rows[0]["pairs"] >= 2
    assert rows[1] == {"row": "broken", "error": "MemoryError: out of memory on purpose"}
    late = gpu_check.timed_rows(run, [({"row": "late"}, good)], time.perf_counter() - 1)
    assert late == [{"row": "late", "skipped": "the section's share of the time budget was spent"}]


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
def test_a_full_check_without_cuda_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no CUDA device here; on the CPU use --smoke"):
        gpu_check.check(False, 60.0, tmp_path / "record.json")
    assert not (tmp_path / "record.json").exists()


def test_outlier_section_runs_the_cli_and_reports_its_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The command the GPU run gives ``hopfield run`` parses (it fails only because the name is
    made up, so nothing is trained here), and a failure is an error with the CLI's message."""
    monkeypatch.setattr(gpu_check, "outlier_benchmark_available", lambda: True)
    monkeypatch.setattr(gpu_check, "OUTLIER_EXPERIMENT", "no-such-experiment")
    run = _run(120.0)
    run.smoke = False
    with pytest.raises(
        RuntimeError, match=r"exit 2:[\s\S]*unknown experiment 'no-such-experiment'"
    ):
        gpu_check.section_outliers(run, time.perf_counter() + 120)


def test_outlier_section_is_skipped_where_the_experiment_is_absent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpu_check, "outlier_benchmark_available", lambda: False)
    with pytest.raises(gpu_check.Skipped, match="not available: no experiment 'outlier-benchmark'"):
        gpu_check.section_outliers(_run(120.0), time.perf_counter() + 120)


def test_source_hash_follows_the_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "src" / "hopfield"
    package.mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "notes.txt").write_text("not a source")
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)
    first = gpu_check.source_hash()
    (package / "notes.txt").write_text("changed, still not a source")
    assert gpu_check.source_hash() == first
    (package / "a.py").write_text("x = 2\n")
    assert gpu_check.source_hash() != first


def test_commit_is_none_without_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no git program on the path
    assert gpu_check._commit() is None

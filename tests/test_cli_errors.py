"""The command line's user errors (one line on stderr, exit status 2), Ctrl-C (where the run
stopped, exit status 130) and real bugs (tracebacks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from hopfield.cli import main
from hopfield.data import DataFile, locate
from hopfield.experiments import Results, RunContext, get
from hopfield.experiments.runner import ConfigError, RunInterrupted, apply_overrides
from stubs import StubConfig, interrupted_once


@dataclass
class _Checked:
    seed: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"size must be positive, got {self.size}")


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str], status: int = 2) -> str:
    """The one line ``main(argv)`` prints to stderr before it exits with ``status``."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == status
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hopfield") and "Traceback" not in err, err
    return err.strip()


def test_user_errors_are_one_line_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    absent = str(tmp_path / "absent")
    demo = ["run", "retrieval-demo", "--preset", "tiny", "--out", str(tmp_path)]
    cases = {
        "unknown experiment 'nope'; known: ": ["run", "nope"],
        "retrieval-demo has presets tiny, small, paper, not 'huge'": [*demo, "--preset", "huge"],
        "unknown config field 'colour'; fields: betas,": [*demo, "--set", "colour=red"],
        "num_memories=abc does not fit the field's type int": [*demo, "--set", "num_memories=abc"],
        "betas=1,2 does not fit the field's type tuple[float, ...]": [*demo, "--set", "betas=1,2"],
        "--set expects NAME=VALUE, got 'x'": [*demo, "--set", "x"],
        "--max-steps: expected a positive integer, got '0'": [*demo, "--max-steps", "0"],
        f"report: {absent} is not a directory": ["report", absent],
        f"claims: {absent} is not a directory": ["claims", absent],
        f"no results.json below {tmp_path}": ["report", str(tmp_path)],
        "reproduce: unknown experiment 'nope'": ["reproduce", "--only", "retrieval-demo", "nope"],
        "plan: unknown experiment 'nope'": ["plan", "nope"],
        "invalid choice: 'frob'": ["frob"],
    }
    for expected, argv in cases.items():
        assert expected in _fails(argv, capsys), argv
    assert not (tmp_path / "retrieval-demo").exists()  # nothing ran
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "results.json").write_text('{"a": 1}')
    line = _fails(["report", str(tmp_path)], capsys)
    assert "results.json is not a record of `hopfield run`" in line


#: ``--set FIELD=VALUE`` an experiment cannot run with, at least one per family, and what the
#: one-line error says (it names the field).
BAD_SETTINGS: list[tuple[str, str, str]] = [
    ("outliers", 'variants=["softmax2"]', "variants must be a non-empty subset of"),
    ("outliers-bert", "dataset=synthetic", "dataset 'synthetic' is a causal-LM task: model "),
    ("outliers-vit", "patch_size=3", "patch_size (3) must divide the 8-pixel images of digits"),
    ("outliers-opt", "schedule=step", "schedule must be one of"),
    ("timeseries-hopfield", "device=gpu", "device must be one of 'auto', 'cpu', got 'gpu'"),
    ("timeseries-hopfield", 'datasets=["ETTh9"]', "datasets: unknown ['ETTh9']"),
    ("timeseries-hopfield", "optimizer=sgd", "optimizer must be 'adam' or 'adamw', got 'sgd'"),
    ("stanhop-outliers", 'models=["gsh2"]', "models: unknown ['gsh2']"),
    (
        "stanhop-outliers",
        'settings=[["synthetic", 8, 24, 4, 0.001, 0]]',
        "settings[0] (its lr and batch): batch_size must be an int >= 1, got 0",
    ),
    ("mil-mnist-bags", 'methods=["topk-0"]', "methods: 'topk-0' is not a pooling method"),
    ("mil-mnist-bags", "source=svhn", "source must be one of 'mnist', 'digits', got 'svhn'"),
    ("mil-benchmark", 'datasets=["musk9"]', "datasets: unknown ['musk9']"),
    ("mil-bit-pattern", "num_bits=30", "num_bits must be in [1, 20], got 30"),
    ("hyperset-images", "grid=3", "grid (3) must divide the 8-pixel images of digits"),
    ("hyperset-images", 'models=["vit"]', "models: 'vit' is not a model"),
    ("hyperset-mim", "dataset=svhn", "dataset must be one of"),
    ("hyperset-sudoku", 'ablations=["fixed-9"]', "ablations: unknown ['fixed-9']"),
    ("memory-capacity", 'queries=["blur"]', "queries: unknown ['blur']"),
    ("memory-capacity", 'efficient_models=["topk-x"]', "efficient_models: unknown model"),
    ("noise-robustness", "noise_stds=[-1]", "noise_stds[0] must be finite and >= 0, got -1"),
    ("retrieval-demo", 'separations=["relu"]', "separations must be a non-empty subset of"),
    ("convergence", 'datasets=["svhn"]', "datasets: unknown ['svhn']"),
    ("convergence", "num_heads=3", "embed_dim (16) must be divisible by num_heads (3)"),
    ("efficiency", 'models=["fast"]', "models: 'fast' is not a model"),
    ("efficiency", "sizes=[1]", "sizes must hold one or more ints >= 2, got [1]"),
    ("outlier-formation", 'variants=["softmax2"]', "variants: unknown ['softmax2']"),
    ("outlier-formation", "strategy=random", "strategy must be one of"),
    ("outlier-formation", 'grid={"lr2": [1]}', "grid: 'lr2' is not a grid field"),
    ("outlier-formation", 'arms={"a": {"lr2": 1}}', "arms: a: arms: ['lr2'] are not fields"),
    ("outlier-formation", 'arms={"a": {"data": "wikitext-2"}}', "vocab_size must be >= 300"),
]


def test_a_bad_setting_is_one_line_naming_the_field_before_anything_trains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every experiment checks its configuration first: a ``--set`` value it cannot run with is
    a ConfigError (one line, exit status 2) before any data is read or model trained."""
    import hopfield.training

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("a run with a bad setting started training")

    monkeypatch.setattr(hopfield.training.Trainer, "__init__", no_training)
    monkeypatch.setenv("HOPFIELD_DATA", str(tmp_path / "no-data"))  # a data read would fail
    for name, setting, expected in BAD_SETTINGS:
        out = tmp_path / name
        line = _fails(
            ["run", name, "--preset", "tiny", "--out", str(out), "--set", setting], capsys
        )
        assert line.startswith("hopfield run: ") and expected in line, (setting, line)
        assert setting.split("=")[0] in line, line
        assert not [p for p in out.rglob("*") if p.is_file()], f"{name} wrote files"


def test_every_preset_passes_its_experiments_config_check() -> None:
    """Every experiment registers its module's check (the runner calls it before anything else),
    and the checks refuse only what an experiment cannot run: every preset (the paper ones too)
    passes them."""
    import importlib

    from hopfield.experiments import all_experiments

    checked = 0
    for experiment in all_experiments():
        module = importlib.import_module(experiment.run.__module__)
        own = getattr(module, "check_config", None) or getattr(module, "resolve", None)
        assert experiment.check is own, f"{experiment.name} does not register its check"
        for preset in experiment.presets:
            config = experiment.config(preset)  # configs that check in __post_init__: here
            if experiment.check is not None:
                experiment.check(config)
                checked += 1
    assert checked >= 40


def _needs_data(config: StubConfig, ctx: RunContext) -> Results:
    locate(DataFile("absent/file.bin", "", "https://example.org/file.bin"), ctx.data_dir)
    raise AssertionError("unreachable")


def test_a_missing_dataset_names_the_folder_and_how_to_set_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    registered: Any,
) -> None:
    registered("test-needs-data", _needs_data)
    monkeypatch.delenv("HOPFIELD_DATA", raising=False)
    run = ["run", "test-needs-data", "--out", str(tmp_path / "out"), "--no-progress"]
    (tmp_path / "data").mkdir()
    line = _fails([*run, "--data-dir", str(tmp_path / "data")], capsys)
    assert not (tmp_path / "out").exists()  # the refused run leaves no empty OUT/NAME
    assert f"not at {tmp_path / 'data' / 'absent/file.bin'}" in line
    assert f"data folder {tmp_path / 'data'}, from --data-dir" in line
    assert "$HOPFIELD_DATA=DIR" in line and "https://example.org/file.bin" in line
    assert "$DATA" not in line
    line = _fails(run, capsys)
    assert "no data folder is set (neither --data-dir / data_dir=... nor $HOPFIELD_DATA)" in line
    monkeypatch.setenv("HOPFIELD_DATA", str(tmp_path / "env"))
    assert f"data folder {tmp_path / 'env'}, from $HOPFIELD_DATA" in _fails(run, capsys)


def test_a_data_dir_that_does_not_exist_is_an_error_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped ``--data-dir`` is one line naming it (exit status 2), also where the preset
    reads no file (the tiny time-series preset makes its series), and ``reproduce`` stops
    instead of skipping every experiment."""
    absent, out = tmp_path / "absent", tmp_path / "out"
    for command in (
        ["run", "timeseries-hopfield", "--preset", "tiny"],
        ["reproduce", "--preset", "tiny", "--only", "retrieval-demo"],
    ):
        line = _fails([*command, "--out", str(out), "--data-dir", str(absent)], capsys)
        assert f"the data folder {absent} (--data-dir / data_dir) does not exist" in line, line
        assert not out.exists()
    (tmp_path / "file").write_text("")
    line = _fails(["run", "retrieval-demo", "--data-dir", str(tmp_path / "file")], capsys)
    assert f"{tmp_path / 'file'} (--data-dir / data_dir) is not a directory" in line


def test_an_out_folder_that_cannot_be_made_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out`` through a file (or anywhere a folder cannot be made) is one line naming the
    folder and why, for ``run`` and ``reproduce`` (it was a traceback)."""
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "runs"
    for command in (
        ["run", "retrieval-demo", "--preset", "tiny"],
        ["reproduce", "--preset", "tiny", "--only", "retrieval-demo"],
    ):
        line = _fails([*command, "--out", str(out)], capsys)
        assert f"the run folder {out}" in line and "cannot be made (Not a directory)" in line, line


def test_a_bad_setting_is_reported_before_a_folder_conflict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quick start leaves a finished run in ``runs/retrieval-demo``; a run of other settings
    into that folder with a bad ``--set`` value names the value, not the folder, and a wrongly
    typed value is not reported as if it had been changed."""
    monkeypatch.chdir(tmp_path)
    finished = tmp_path / "runs" / "retrieval-demo"
    finished.mkdir(parents=True)
    (finished / "results.json").write_text('{"preset": "small", "config": {}}')
    demo = ["run", "retrieval-demo", "--preset", "tiny"]
    line = _fails([*demo, "--set", "grid_betas=[7]"], capsys)
    assert line == "hopfield run: grid_betas must be taken from betas, got (7.0,)"
    line = _fails([*demo, "--set", "num_memories=abc"], capsys)
    assert line == (
        "hopfield run: num_memories=abc does not fit the field's type int (values are JSON: 5, "
        '0.5, true, "text", [1, 2]; without this setting it is num_memories=20)'
    )
    assert "holds a finished run" in _fails(demo, capsys)  # the conflict itself is still one
    assert sorted(p.name for p in finished.iterdir()) == ["results.json"]


def test_ctrl_c_says_where_the_run_stopped_and_the_same_command_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], registered: Any
) -> None:
    registered("test-ctrl-c", interrupted_once)
    command = ["run", "test-ctrl-c", "--out", str(tmp_path), "--no-progress"]
    line = _fails(command, capsys, status=130)
    assert line == (
        f"hopfield run: interrupted; the run so far is in {tmp_path / 'test-ctrl-c'}, and the "
        "same command resumes it"
    )
    assert main(command) == 0
    record = json.loads((tmp_path / "test-ctrl-c" / "results.json").read_text())
    assert record["results"]["tables"][0]["rows"] == [[0], [1], [2], [3]]
    # reproduce names the folder of the experiment it was running
    (tmp_path / "test-ctrl-c" / "interrupted").unlink()
    (tmp_path / "test-ctrl-c" / "checkpoint.json").unlink()
    command = ["reproduce", "--out", str(tmp_path), "--no-progress", "--only", "test-ctrl-c"]
    assert f"the run so far is in {tmp_path / 'test-ctrl-c'}," in _fails(command, capsys, 130)


def test_the_run_function_interrupted_raises_run_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C inside a real experiment's run (monkeypatched) reaches the caller as a
    KeyboardInterrupt that knows the output folder, and the command line as one line."""
    from hopfield.experiments import registry, run_experiment

    def stopped(config: Any, ctx: RunContext) -> Results:
        raise KeyboardInterrupt

    demo = replace(get("retrieval-demo"), run=stopped)
    monkeypatch.setitem(registry._REGISTRY, "retrieval-demo", demo)
    with pytest.raises(RunInterrupted) as stop:
        run_experiment("retrieval-demo", "tiny", tmp_path, progress=False)
    assert isinstance(stop.value, KeyboardInterrupt)
    assert stop.value.out_dir == tmp_path / "retrieval-demo"
    command = ["run", "retrieval-demo", "--preset", "tiny", "--out", str(tmp_path)]
    assert "interrupted; the run so far is in" in _fails(command, capsys, 130)


def _buggy(config: StubConfig, ctx: RunContext) -> Results:
    raise ValueError("a bug inside the experiment")


def test_real_bugs_keep_their_traceback(tmp_path: Path, registered: Any) -> None:
    registered("test-buggy", _buggy)
    with pytest.raises(ValueError, match="a bug inside the experiment"):
        main(["run", "test-buggy", "--out", str(tmp_path), "--no-progress"])


def test_overrides_are_parsed_as_json_and_must_fit_the_field() -> None:
    config = apply_overrides(
        StubConfig(), {"steps": "7", "rate": "1", "names": '["b", "c"]', "label": "2024"}
    )
    assert config == StubConfig(steps=7, rate=1.0, names=("b", "c"), label="2024")
    assert isinstance(config.rate, float)
    for bad in ({"steps": "1.5"}, {"steps": "true"}, {"names": '"b"'}, {"rate": '"fast"'}):
        with pytest.raises(ConfigError, match="does not fit the field's type"):
            apply_overrides(StubConfig(), bad)
    with pytest.raises(ConfigError, match="size must be positive, got 0"):
        apply_overrides(_Checked(), {"size": "0"})


SLEEPER = """
import sys, time
from dataclasses import dataclass, replace
from hopfield.cli import main
from hopfield.experiments import Experiment, Results, register

@dataclass
class Config:
    seed: int = 0

def run(config, ctx):
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    (ctx.out_dir / "started").touch()
    time.sleep(120)
    return Results()

register(Experiment("test-sleeper", "test", {p: Config() for p in ("tiny", "small", "paper")}, run))
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
def test_sigint_stops_a_real_process_with_one_line_and_status_130(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(textwrap.dedent(SLEEPER))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    child = subprocess.Popen(
        [sys.executable, str(script), "run", "test-sleeper", "--out", str(out), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # as from a terminal: a shell's background job inherits SIGINT ignored, and Python then
        # installs no KeyboardInterrupt handler
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "test-sleeper" / "started").exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the child never started its run"
            time.sleep(0.1)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 130
    assert err == (
        f"hopfield run: interrupted; the run so far is in {out / 'test-sleeper'}, and the same "
        "command resumes it\n"
    )

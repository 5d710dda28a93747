"""Installs that run what they promise: the extras of pyproject.toml and commands on an install
that lacks an extra (one line naming it, exit status 2), ``hopfield --version`` and ``python -m
hopfield``. A missing package is simulated by ``sys.modules[name] = None`` in a child process,
which makes every import of it fail as if it were not installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest

from hopfield.cli import OPTIONAL_MODULES, missing_extra

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
#: The packages a base install (``pip install -e .``: torch and numpy) lacks.
NOT_IN_BASE = sorted(OPTIONAL_MODULES)


def _extras() -> dict[str, set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {
        extra: {req.split(">")[0].split("=")[0].split("[")[0].strip() for req in reqs}
        for extra, reqs in project["optional-dependencies"].items()
    }


def test_experiments_extra_holds_train_and_hf_and_all_holds_every_extra() -> None:
    extras = _extras()
    assert extras["train"] | extras["hf"] <= extras["experiments"]
    runtime = set().union(*(v for k, v in extras.items() if k not in {"all", "dev"}))
    assert extras["all"] == runtime
    for module, (package, extra) in OPTIONAL_MODULES.items():
        assert package in extras[extra], (module, package, extra)


def _hopfield(
    args: list[str], missing: list[str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """``hopfield ARGS`` in a child process in which the modules ``missing`` are absent."""
    code = textwrap.dedent(
        f"""
        import sys
        for name in {missing!r}:
            sys.modules[name] = None
        from hopfield.cli import main
        sys.exit(main({args!r}))
        """
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )


def test_list_works_on_a_base_install(tmp_path: Path) -> None:
    done = _hopfield(["list"], NOT_IN_BASE, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "retrieval-demo" in done.stdout and "convergence" in done.stdout


def test_list_needs_no_torch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``hopfield list`` imports neither torch nor an experiment module (it took 1.5 s to
    import them all), and prints what it prints with them imported."""
    done = _hopfield(["list"], ["torch"], tmp_path)
    assert done.returncode == 0, done.stderr
    from hopfield.cli import main
    from hopfield.experiments import all_experiments

    all_experiments()  # every experiment registered in this process
    assert main(["list"]) == 0
    assert done.stdout == capsys.readouterr().out


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip()


def test_run_without_accelerate_names_the_extra(tmp_path: Path) -> None:
    args = ["run", "convergence", "--preset", "tiny", "--out", str(tmp_path), "--no-progress"]
    line = _one_line(_hopfield(args, ["accelerate"], tmp_path))
    assert line.startswith("hopfield run: convergence needs accelerate, which this install lacks")
    assert line.endswith(
        'which this install lacks: pip install -e ".[experiments]" (in the hopfield clone)'
    )


def test_plan_without_transformers_names_the_extra(tmp_path: Path) -> None:
    line = _one_line(
        _hopfield(["plan", "outlier-formation", "--preset", "tiny"], NOT_IN_BASE, tmp_path)
    )
    assert line.startswith("hopfield plan: outlier-formation needs ")
    assert line.endswith(
        'which this install lacks: pip install -e ".[experiments]" (in the hopfield clone)'
    )


def test_integrations_without_transformers_name_the_extra(tmp_path: Path) -> None:
    code = "import sys\nsys.modules['transformers'] = None\nimport hopfield.integrations"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ImportError: hopfield.integrations needs transformers (extra hf): "
        'pip install -e ".[hf]" (in the hopfield clone)'
    )


def test_missing_extra_follows_the_cause_and_ignores_other_modules() -> None:
    try:
        try:
            import datasets_not_installed_here  # noqa: F401
        except ModuleNotFoundError as error:
            error.name = "datasets"
            raise ImportError("datasets is not installed") from error
    except ImportError as wrapped:
        assert missing_extra(wrapped) == ("datasets", "corpora")
    with pytest.raises(ModuleNotFoundError) as stop:
        import a_module_no_extra_holds  # noqa: F401
    assert missing_extra(stop.value) is None


def python_m_hopfield(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m hopfield ARGS`` in a child process started in ``tmp_path``."""
    return subprocess.run(
        [sys.executable, "-m", "hopfield", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )


def test_version_flag(tmp_path: Path) -> None:
    done = python_m_hopfield(tmp_path, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"hopfield {version('hopfield')}\n"


def test_python_m_hopfield_is_the_command(tmp_path: Path) -> None:
    done = python_m_hopfield(tmp_path, "list")
    assert done.returncode == 0, done.stderr
    assert "retrieval-demo" in done.stdout
    bad = python_m_hopfield(tmp_path, "run", "nope")
    assert bad.returncode == 2 and "unknown experiment 'nope'" in bad.stderr

"""Shared test fixtures: the project's shared data folder (skipped where absent), determinism,
and a checkout that the tests leave as they found it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis.configuration import set_hypothesis_home_dir

# hypothesis fixed its storage folder to the folder pytest started in when the plugin imported
# it, and writes there while test modules are collected: keep it out of the checkout
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "hopfield-tests-hypothesis")

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
#: Folders of the checkout that tools write and git ignores (caches, build metadata).
_CACHES = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def checkout_files(root: Path = ROOT) -> dict[str, int]:
    """``{path relative to root: modification time in ns}`` of every file of the checkout but
    the caches (:data:`_CACHES`, ``*.egg-info``)."""
    files = {}
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in _CACHES and not d.endswith(".egg-info")]
        for name in names:
            path = Path(folder, name)
            files[str(path.relative_to(root))] = path.stat().st_mtime_ns
    return files


@pytest.fixture(autouse=True, scope="session")
def _checkout_unchanged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests run in a folder of their own, not in the checkout, so that a command's default
    output (``hopfield run`` writes ``runs/``) lands there; and the session fails if a test
    created, changed or removed a file of the checkout (the quick start's ``runs/`` included)."""
    before = checkout_files()
    cwd = Path.cwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    try:
        yield
    finally:
        os.chdir(cwd)
    after = checkout_files()
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    if changed:
        pytest.fail(f"the tests changed the checkout {ROOT}: {', '.join(changed[:10])}")


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> None:
    """Tests use small tensors: one thread avoids oversubscribing a shared 2-core machine."""
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)


@pytest.fixture
def shared_data() -> Path:
    """The real datasets of ``../shared/data`` (or ``$HOPFIELD_DATA``); skips the test where absent."""
    root = Path(os.environ.get("HOPFIELD_DATA", SHARED_DATA))
    if not root.is_dir():
        pytest.skip(f"real datasets not available: {root} does not exist (set $HOPFIELD_DATA)")
    return root


@pytest.fixture
def registered() -> Iterator[Callable[[str, Callable[[Any, Any], Any]], None]]:
    """Registers stand-in experiments (a :class:`stubs.StubConfig` at every preset) for one
    test; other tests see only the real ones."""
    from hopfield.experiments.registry import Experiment, register, unregister
    from stubs import StubConfig

    names: list[str] = []

    def add(name: str, run: Callable[[Any, Any], Any]) -> None:
        presets = {p: StubConfig() for p in ("tiny", "small", "paper")}
        register(Experiment(name, "test", presets, run))
        names.append(name)

    yield add
    for name in names:
        unregister(name)


@pytest.fixture(params=["native", "torch"])
def kernel_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test twice: with the native CPU kernels (:mod:`hopfield.functional.native`) and
    with ``HOPFIELD_NATIVE=0``, the PyTorch path that GPUs and half precision take."""
    if request.param == "torch":
        monkeypatch.setenv("HOPFIELD_NATIVE", "0")
    else:
        from hopfield.functional import native

        monkeypatch.delenv("HOPFIELD_NATIVE", raising=False)
        if not native.available(torch.zeros(1)):
            pytest.skip("the native kernels did not build on this machine")
    return str(request.param)


@pytest.fixture(
    params=[
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.cuda,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
            ],
        ),
    ]
)
def device(request: pytest.FixtureRequest) -> torch.device:
    """Runs a test on the CPU and, where one is present, on the GPU (``pytest -m cuda`` selects
    the GPU half alone; without a GPU it is skipped)."""
    return torch.device(request.param)

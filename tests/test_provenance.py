"""Records name the code that ran: the git commit and whether the source tree differed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hopfield.experiments.provenance import code_version

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@needs_git
def test_a_checkout_gives_its_commit_and_whether_the_source_changed(tmp_path: Path) -> None:
    package = tmp_path / "src" / "pkg"
    package.mkdir(parents=True)
    (package / "mod.py").write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    clean = code_version(package)
    assert re.fullmatch(r"[0-9a-f]{40}", clean["commit"]) and clean["dirty"] is False
    (tmp_path / "results.json").write_text("{}")  # outside the source tree: still clean
    assert code_version(package)["dirty"] is False
    (package / "mod.py").write_text("x = 2\n")
    assert code_version(package) == {**clean, "dirty": True}
    (package / "mod.py").write_text("x = 1\n")
    (package / "new.py").write_text("y = 1\n")  # an untracked source file counts
    assert code_version(package)["dirty"] is True


def test_outside_a_checkout_there_is_no_commit(tmp_path: Path) -> None:
    version = code_version(tmp_path)
    assert version["commit"] is None and version["dirty"] is None
    assert "not a git checkout" in version["source"]
    with pytest.raises(ValueError, match="package_dir"):
        code_version(tmp_path / "missing")

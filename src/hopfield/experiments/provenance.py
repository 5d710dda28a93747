"""Which code produced a record: the git commit of the checkout and whether its code was changed.

Every record of ``hopfield run`` carries :func:`code_version` as ``code``, so a number can be
traced to the code that computed it (a record from a changed tree says so).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

__all__ = ["code_version"]

#: The package's source tree; the checkout is the git work tree that holds it.
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _git(*args: str, cwd: Path) -> str | None:
    """The output of ``git args`` in ``cwd``, ``None`` if git is missing or fails."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def code_version(package_dir: Path | str = _PACKAGE_DIR) -> dict[str, Any]:
    """``{"commit": sha, "dirty": bool, "source": "git"}`` for a package inside a git checkout:
    ``dirty`` is true when any file of the source tree (``package_dir``, untracked files
    included) differs from the commit. Outside a checkout (an installed wheel) or without git:
    ``{"commit": None, "dirty": None, "source": <why>}``."""
    package_dir = Path(package_dir)
    if not package_dir.is_dir():
        raise ValueError(f"package_dir {package_dir} is not a folder")
    commit = _git("rev-parse", "HEAD", cwd=package_dir)
    if commit is None:
        return {"commit": None, "dirty": None, "source": "not a git checkout (or no git)"}
    status = _git("status", "--porcelain", "--", ".", cwd=package_dir)
    return {"commit": commit, "dirty": None if status is None else bool(status), "source": "git"}

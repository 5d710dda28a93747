"""How to add an extra to an install, in the one form that works: hopfield is on no package
index, so pip installs it, and its extras, from a clone of the repository."""

from __future__ import annotations


def install_command(extra: str) -> str:
    """The command that installs the packages of ``extra`` (e.g. ``"hf"``), run in the clone."""
    return f'pip install -e ".[{extra}]" (in the hopfield clone)'

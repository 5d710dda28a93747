"""A stand-in experiment configuration for command-line tests (see the ``registered`` fixture
in ``conftest.py``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StubConfig:
    """Fields of every kind ``--set`` parses: int, float, tuple of str, str."""

    seed: int = 0
    steps: int = 4
    rate: float = 0.5
    names: tuple[str, ...] = ("a",)
    label: str = "x"

"""Experiments: one module each, registered by name, with tiny/small/paper presets.

``hopfield.experiments.registry`` holds the registry; every module in this package registers
itself when imported (``registry.discover()`` imports them all). ``reproduce`` and
``run_experiment`` (:mod:`hopfield.experiments.runner`, which imports torch) load on first use,
so that the registry and ``hopfield list`` need no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hopfield.experiments.registry import (
    ConfigError,
    Experiment,
    all_experiments,
    get,
    register,
)
from hopfield.experiments.results import Results, RunContext, Table

if TYPE_CHECKING:
    from hopfield.experiments.runner import reproduce, run_experiment

__all__ = [
    "ConfigError",
    "Experiment",
    "Results",
    "RunContext",
    "Table",
    "all_experiments",
    "get",
    "register",
    "reproduce",
    "run_experiment",
]


def __getattr__(name: str) -> Any:
    """``reproduce`` and ``run_experiment``, imported from the runner when first asked for."""
    if name in ("reproduce", "run_experiment"):
        from hopfield.experiments import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

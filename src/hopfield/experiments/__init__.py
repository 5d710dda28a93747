"""Experiments: one module each, registered by name, with tiny/small/paper presets.

``hopfield.experiments.registry`` holds the registry; every module in this package registers
itself when imported (``registry.discover()`` imports them all).
"""

from hopfield.experiments.registry import (
    ConfigError,
    Experiment,
    all_experiments,
    get,
    register,
)
from hopfield.experiments.results import Results, RunContext, Table
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

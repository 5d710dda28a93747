"""Registry of experiments: a name, presets (configuration data) and a ``run`` function.

Every experiment module in :mod:`hopfield.experiments` registers itself at import time with
:func:`register`; :func:`discover` imports all of them, so the command line never keeps a list.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hopfield.experiments.results import Results, RunContext

PRESETS = ("tiny", "small", "paper")

RunFunction = Callable[[Any, RunContext], Results]


class ConfigError(ValueError):
    """A configuration an experiment cannot run: an unknown field, or a value of the wrong type
    or out of range. ``apply_overrides`` raises it, and so do experiments that check their
    configuration before they start; the command line prints it as one line (exit status 2)."""


@dataclass(frozen=True)
class Experiment:
    """One registered experiment.

    Attributes:
        name: command-line name, e.g. ``"retrieval-demo"``.
        summary: one line for ``hopfield list``.
        presets: ``{"tiny": config, "small": config, "paper": config}``; configs are dataclass
            instances with at least a ``seed`` field.
        run: ``run(config, context) -> Results``.
        paper: which paper, table or figure the experiment reproduces.
        in_reproduce: whether ``hopfield reproduce`` runs it.
        check: ``check(config)`` raises a :class:`ConfigError` naming the first field the
            experiment cannot run with; the runner calls it before it looks at the output
            folder or creates anything (``None``: the configuration checks itself in
            ``__post_init__``, or anything goes).
    """

    name: str
    summary: str
    presets: Mapping[str, Any]
    run: RunFunction
    paper: str = ""
    in_reproduce: bool = True
    tags: tuple[str, ...] = field(default_factory=tuple)
    check: Callable[[Any], object] | None = None

    def __post_init__(self) -> None:
        missing = [p for p in PRESETS if p not in self.presets]
        if missing:
            raise ValueError(f"experiment {self.name!r}: presets {missing} are missing")

    def config(self, preset: str) -> Any:
        """The configuration of ``preset`` (a fresh copy the caller may change); a
        :class:`ConfigError` for an unknown preset."""
        if preset not in self.presets:
            raise ConfigError(f"preset must be one of {sorted(self.presets)}, got {preset!r}")
        return replace(self.presets[preset])


_REGISTRY: dict[str, Experiment] = {}


def register(experiment: Experiment) -> Experiment:
    """Add ``experiment`` to the registry (names are unique)."""
    if experiment.name in _REGISTRY and _REGISTRY[experiment.name] is not experiment:
        raise ValueError(f"an experiment named {experiment.name!r} is already registered")
    _REGISTRY[experiment.name] = experiment
    return experiment


def unregister(name: str) -> Experiment:
    """Remove the experiment called ``name`` from the registry and return it (for experiments
    registered for a while, as tests and notebooks do)."""
    if name not in _REGISTRY:
        raise ValueError(f"no experiment named {name!r} is registered")
    return _REGISTRY.pop(name)


def discover() -> None:
    """Import every module of :mod:`hopfield.experiments` so that each registers itself."""
    import hopfield.experiments as package

    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_") and module.name not in {"registry", "results", "runner"}:
            importlib.import_module(f"{package.__name__}.{module.name}")


def get(name: str) -> Experiment:
    """The experiment called ``name``; a ``ValueError`` lists the known names otherwise."""
    discover()
    if name not in _REGISTRY:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def all_experiments() -> list[Experiment]:
    """All registered experiments, sorted by name."""
    discover()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]

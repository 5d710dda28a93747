"""Checks of an experiment's configuration, raised as :class:`ConfigError`.

A value a user can set (a config field, a preset, a ``--set`` override, a data choice) that an
experiment cannot run with is a :class:`~hopfield.experiments.registry.ConfigError` naming the
field and what it expects. Every experiment checks its configuration with these helpers before
it reads data or trains (most in a ``check_config`` called first thing in ``run``; convergence in
its ``Config.__post_init__``, the outlier study in ``resolve``), and the command line prints the
error as one line (exit status 2). An internal invariant, or a bad record or file, stays a
``ValueError``.

This module registers no experiment.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from hopfield._validation import check_int, check_real
from hopfield.experiments.registry import ConfigError

__all__ = [
    "check_choice",
    "check_int_items",
    "check_ints",
    "check_real_items",
    "check_reals",
    "check_subset",
    "config_errors",
]


@contextmanager
def config_errors(prefix: str = "") -> Iterator[None]:
    """A ``ValueError`` or ``TypeError`` (a :class:`ConfigError` too) raised inside becomes a
    :class:`ConfigError` with the same message after ``prefix`` (e.g. ``"models: "``, where the
    message names an argument of a function the check calls, not the field)."""
    try:
        yield
    except ConfigError as error:
        if prefix:
            raise ConfigError(f"{prefix}{error}") from error
        raise
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{prefix}{error}") from error


def check_ints(config: Any, *names: str, minimum: int = 1, optional: bool = False) -> None:
    """:class:`ConfigError` unless every field ``names`` of ``config`` is an int ``>= minimum``
    (``optional``: or ``None``)."""
    with config_errors():
        for name in names:
            value = getattr(config, name)
            if not (optional and value is None):
                check_int(name, value, minimum)


def check_reals(
    config: Any,
    *names: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """:class:`ConfigError` unless every field ``names`` of ``config`` is a finite number within
    the bounds (``low_open``: ``> low``, else ``>=``; ``high_open`` likewise)."""
    with config_errors():
        for name in names:
            check_real(
                name,
                getattr(config, name),
                low=low,
                high=high,
                low_open=low_open,
                high_open=high_open,
            )


def check_int_items(
    field: str, values: Iterable[Any], minimum: int = 1, *, allow_empty: bool = False
) -> None:
    """:class:`ConfigError` unless the field ``field`` holds ints ``>= minimum`` (and, unless
    ``allow_empty``, at least one)."""
    values = list(values)
    fits = all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in values)
    if not fits or not (values or allow_empty):
        some = "" if allow_empty else "one or more "
        raise ConfigError(f"{field} must hold {some}ints >= {minimum}, got {values}")


def check_real_items(
    field: str,
    values: Iterable[Any],
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    allow_empty: bool = False,
) -> None:
    """:class:`ConfigError` unless the field ``field`` holds finite numbers within the bounds
    (see :func:`check_reals`; and, unless ``allow_empty``, at least one)."""
    values = list(values)
    if not values and not allow_empty:
        raise ConfigError(f"{field} must hold one or more numbers, got {values}")
    with config_errors():
        for i, value in enumerate(values):
            check_real(
                f"{field}[{i}]",
                value,
                low=low,
                high=high,
                low_open=low_open,
                high_open=high_open,
            )


def check_choice(field: str, value: Any, known: Collection[Any]) -> None:
    """:class:`ConfigError` unless ``value`` is one of ``known``."""
    if value not in known:
        raise ConfigError(f"{field} must be one of {_listed(known)}, got {value!r}")


def check_subset(
    field: str, values: Iterable[Any], known: Collection[Any], *, allow_empty: bool = False
) -> None:
    """:class:`ConfigError` unless every one of ``values`` is in ``known`` and (unless
    ``allow_empty``) there is at least one."""
    values = list(values)
    unknown = [v for v in values if v not in known]
    if unknown:
        raise ConfigError(f"{field}: unknown {unknown}; choose from {_listed(known)}")
    if not values and not allow_empty:
        raise ConfigError(f"{field} must name at least one of {_listed(known)}")


def _listed(known: Collection[Any]) -> str:
    return ", ".join(repr(k) for k in known)

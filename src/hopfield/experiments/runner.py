"""Run registered experiments and write their results as JSON with full provenance."""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import sys
import time
from dataclasses import asdict, fields, is_dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import numpy as np
import torch

from hopfield.data.files import DataNotFoundError
from hopfield.experiments.provenance import code_version
from hopfield.experiments.registry import ConfigError, Experiment, all_experiments, get
from hopfield.experiments.results import Results, RunContext, _json_default
from hopfield.training import (
    FULL_DISK_ERRORS,
    DiskFullError,
    Preempted,
    collective_timeout,
    preemptible,
    process_layout,
    warn_if_processes_were_lost,
)

RESULTS_FILE = "results.json"
#: Beside an unfinished run: the sittings it has had so far (each sitting adds one when it starts,
#: as ``"running"``, and marks it ``"stopped"`` (Ctrl-C; SIGUSR1 or SIGTERM, a preemption, with
#: ``"preempted": {"signal", "step"}``) or ``"failed"`` when it ends so;
#: one still ``"running"`` there was killed and reads back as ``"killed"``); the finished record
#: carries the list and the totals instead.
SITTINGS_FILE = "sittings.json"


def versions() -> dict[str, str]:
    """Versions of the software a result was computed with."""
    import hopfield

    return {
        "hopfield": hopfield.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch_threads": str(torch.get_num_threads()),
    }


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and PyTorch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_experiment`; ``out_dir`` holds the run so far (its checkpoints),
    and the same call resumes it."""

    def __init__(self, out_dir: Path) -> None:
        super().__init__(str(out_dir))
        self.out_dir = out_dir


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) and not get_args(hint) else str(hint)


def _conform(value: Any, hint: Any) -> Any:
    """``value`` (parsed JSON) as the type ``hint`` of a dataclass field: JSON lists become
    tuples where the field is a tuple, ints become floats where it is a float. Raises
    ``TypeError`` when the value does not fit; types it does not know pass unchecked."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if hint is None or hint is type(None):
        if value is not None:
            raise TypeError
        return None
    if origin in (Union, UnionType):
        for option in args:
            try:
                return _conform(value, option)
            except TypeError:
                continue
        raise TypeError
    if origin is Literal:
        if value not in args:
            raise TypeError
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise TypeError
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise TypeError
        return value
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise TypeError
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            items = [_conform(v, args[0]) for v in value]
            return items if origin is list else tuple(items)
        if len(args) != len(value):  # a tuple of fixed length
            raise TypeError
        return tuple(_conform(v, a) for v, a in zip(value, args, strict=True))
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError
        if not args:
            return value
        return {_conform(k, args[0]): _conform(v, args[1]) for k, v in value.items()}
    return value


def apply_overrides(config: Any, overrides: dict[str, str]) -> Any:
    """``config`` with fields replaced from ``{"name": "text value"}``.

    A value is parsed as JSON when it is JSON (``5``, ``[0.1, 1]``, ``true``, ``"text"``), else
    taken as a string, and must fit the field's type (a JSON list for a tuple field, which it
    becomes). Raises :class:`ConfigError` for an unknown field, a value of the wrong type, or a
    value the configuration rejects (its ``__post_init__``).
    """
    if not is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"config must be a dataclass instance, got {type(config).__name__}")
    known = {f.name for f in fields(config)}
    hints = get_type_hints(type(config))
    changes: dict[str, Any] = {}
    for key, text in overrides.items():
        if key not in known:
            raise ConfigError(f"unknown config field {key!r}; fields: {', '.join(sorted(known))}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        try:
            changes[key] = _conform(value, hints[key])
        except TypeError:
            try:  # `--set name=2024` for a text field
                changes[key] = _conform(text, hints[key])
                continue
            except TypeError:
                pass
            raise ConfigError(
                f"{key}={text} does not fit the field's type {_type_name(hints[key])} (values "
                f'are JSON: 5, 0.5, true, "text", [1, 2]; without this setting it is '
                f"{key}={json.dumps(getattr(config, key), default=str)})"
            ) from None
    try:
        return replace(config, **changes)
    except (TypeError, ValueError) as error:
        raise ConfigError(str(error)) from error


def check_data_dir(data_dir: Path | str | None) -> None:
    """A :class:`DataNotFoundError` naming ``data_dir`` when it is given but is no folder (a
    mistyped ``--data-dir``), for every experiment, before anything runs or is created."""
    if data_dir is not None and not Path(data_dir).is_dir():
        raise DataNotFoundError(
            f"the data folder {Path(data_dir).absolute()} (--data-dir / data_dir) "
            f"{'is not a directory' if Path(data_dir).exists() else 'does not exist'}"
        )


def _first_missing(folder: Path) -> Path | None:
    """The outermost folder of the path ``folder`` that does not exist (``None``: it does)."""
    missing = None
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


class ExistingRunError(ValueError):
    """The run folder holds a finished run of other settings, which a run with
    ``overwrite=False`` (``hopfield run`` without ``--overwrite``) does not replace."""


def _as_json(value: Any) -> Any:
    """``value`` as it reads back from a results file (tuples become lists, and so on)."""
    return json.loads(json.dumps(value, default=_json_default))


def overrides_of(experiment: Experiment, preset: str, config: Any) -> dict[str, Any]:
    """The fields of ``config`` that differ from ``preset``'s configuration of ``experiment``
    (``--set``, ``--seed``), as JSON values in the order of the fields."""
    base = _as_json(asdict(experiment.config(preset)))
    now = _as_json(asdict(config))
    return {key: value for key, value in now.items() if base.get(key) != value}


#: Configuration fields that only say where a sitting stops, as ``--max-steps`` does: a run
#: that differs in them is the same run, and the next sitting continues it from its checkpoints.
LIMIT_FIELDS = frozenset({"until_epoch"})


def _settings(record: dict[str, Any]) -> dict[str, Any]:
    """What makes a run's numbers: preset, configuration, precision and stand-in data (not
    ``--max-steps`` or a field of :data:`LIMIT_FIELDS`: a run cut by one continues under the
    same settings without it, nor the micro-batch size, which keeps the recipe)."""
    config = record.get("config")
    if isinstance(config, dict):
        config = {k: v for k, v in config.items() if k not in LIMIT_FIELDS}
    return {
        "preset": record.get("preset"),
        "config": config,
        "mixed_precision": record.get("mixed_precision"),
        "stand_in_data": (record.get("limits") or {}).get("stand_in_data", False),
    }


def settings_parts(record: dict[str, Any], *, code: bool = False) -> list[str]:
    """What a run record says it changed from its preset: ``["overrides lr=0.01 seed=3",
    "max steps 5", "stand-in data"]`` (``code``: the overrides as a Markdown code span).
    Records written before overrides were recorded show none."""
    parts = []
    overrides = record.get("overrides") or {}
    if overrides:
        text = " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in overrides.items())
        parts.append(f"overrides `{text}`" if code else f"overrides {text}")
    limits = record.get("limits") or {}
    if limits.get("stop_after") is not None:
        parts.append(f"max steps {limits['stop_after']}")
    if limits.get("micro_batch_size") is not None:
        parts.append(f"micro-batch {limits['micro_batch_size']}")
    if record.get("mixed_precision") is not None:
        parts.append(f"mixed precision {record['mixed_precision']}")
    if limits.get("stand_in_data"):
        parts.append("stand-in data")
    return parts


def describe_settings(record: dict[str, Any]) -> str:
    """``preset small, overrides lr=0.01 seed=3, max steps 5`` of a run record."""
    return ", ".join([f"preset {record.get('preset')}", *settings_parts(record)])


def check_run_folder(
    folder: Path, new: dict[str, Any], *, overwrite: bool
) -> dict[str, Any] | None:
    """The record of the finished run in ``folder`` when its settings differ from those of the
    run record ``new`` (``None`` when there is none or they agree). Raises
    :class:`ExistingRunError` for such a run unless ``overwrite``."""
    path = folder / RESULTS_FILE
    try:
        old = load_record(path)
    except (OSError, ValueError):  # no finished run there (or no readable record of one)
        return None
    if not isinstance(old, dict):
        return None
    was, now = _settings(old), _as_json(_settings(new))
    if was == now:
        return None
    if not overwrite:
        differ = [k.replace("_", " ") for k in ("preset", "mixed_precision", "stand_in_data")
                  if was[k] != now[k]]  # fmt: skip
        old_config, new_config = was["config"] or {}, now["config"] or {}
        differ += [k for k in sorted({*old_config, *new_config})
                   if old_config.get(k) != new_config.get(k)]  # fmt: skip
        raise ExistingRunError(
            f"{folder} holds a finished run of other settings ({describe_settings(old)}; this run "
            f"differs in {', '.join(differ)}): give another --out to keep it, or --overwrite to "
            "replace it"
        )
    return old


def earlier_sittings(folder: Path, planned: dict[str, Any]) -> list[dict[str, Any]]:
    """The sittings (``started_at``, ``wall_time_s``, ``cpu_time_s``, ``outcome``) that the run
    of settings ``planned`` in ``folder`` has had: those of its unfinished sittings
    (:data:`SITTINGS_FILE`), else those of its finished record (a record written before
    sittings were kept counts as one). Sittings of other settings do not count."""
    now = _as_json(_settings(planned))
    unfinished = folder / SITTINGS_FILE
    try:
        kept = json.loads(unfinished.read_text())
        if isinstance(kept, dict) and {k: kept.get(k) for k in now} == now:
            return [_ended(s) for s in kept["sittings"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        old = load_record(folder / RESULTS_FILE)
    except (OSError, ValueError):
        return []
    if not isinstance(old, dict) or _as_json(_settings(old)) != now:
        return []
    keys = ("started_at", "wall_time_s", "cpu_time_s")
    return list(old.get("sittings") or [{**{k: old.get(k) for k in keys}, "outcome": "finished"}])


def _ended(sitting: dict[str, Any]) -> dict[str, Any]:
    """A sitting read back from :data:`SITTINGS_FILE`: one still ``"running"`` there was ended by
    a signal that left it no time to record (SIGKILL, a power cut): ``"killed"``, its times
    unknown (``None``)."""
    if sitting.get("outcome") != "running":
        return sitting
    return {**sitting, "wall_time_s": None, "cpu_time_s": None, "outcome": "killed"}


def _total(sittings: list[dict[str, Any]], key: str) -> float:
    """The sum of ``key`` over the sittings whose time is known."""
    return sum(s[key] for s in sittings if s.get(key) is not None)


def _put_back(unfinished: Path, before: str | None) -> None:
    """Undo a refused sitting's record: the sittings file as it was (``before``; ``None``: there
    was none)."""
    if before is None:
        unfinished.unlink(missing_ok=True)
    else:
        unfinished.write_text(before)


def run_experiment(
    name: str,
    preset: str,
    out: Path | str,
    *,
    data_dir: Path | str | None = None,
    seed: int | None = None,
    overrides: dict[str, str] | None = None,
    progress: bool = True,
    stop_after: int | None = None,
    micro_batch_size: int | None = None,
    mixed_precision: str | None = None,
    stand_in_data: bool = False,
    overwrite: bool = True,
    data_workers: int = 0,
    tf32: bool = False,
    log_with: tuple[str, ...] = (),
) -> Path:
    """Run experiment ``name`` at ``preset`` and write ``out/name/results.json``.

    Returns the path of the results file. The file holds the configuration, seed, software
    versions, the code that ran (``code``: git commit and whether the source tree differed from
    it, :func:`~hopfield.experiments.provenance.code_version`), wall time and CPU time (of this process; on a busy machine the wall time
    grows and the CPU time does not), the number of processes that ran it, the run limits and the
    :class:`Results` (tables, metrics, figures). Both times are sums over the run's sittings
    (:data:`SITTINGS_FILE`): this one is recorded there as ``"running"`` when it starts and as
    ``"stopped"`` (Ctrl-C; or SIGUSR1/SIGTERM, a preemption: a training loop stops at its next
    optimiser step after writing a checkpoint there, elsewhere the run stops at once, and the
    sitting says ``"preempted": {"signal", "step"}``) or ``"failed"`` when it ends so; either
    raises :class:`RunInterrupted` (from the :class:`~hopfield.training.Preempted` of a
    preemption).

    Under ``torchrun``/``accelerate launch`` every process calls this; the process group is
    set up first (gloo on CPUs, nccl on GPUs), every process runs the experiment with the same
    seed, and only the main process writes files. ``stop_after``, ``micro_batch_size``,
    ``mixed_precision``, ``stand_in_data``, ``data_workers`` and ``tf32`` (TF32 matrix products on
    CUDA, recorded as ``"tf32"``) and ``log_with`` (accelerate trackers, e.g. ``("tensorboard",)``,
    each run's in its ``trackers`` folder) apply to every training run (see :class:`RunContext`).

    The record names the configuration fields that differ from the preset's (``overrides``:
    ``--set``, ``--seed``). When ``out/name`` holds a finished run of other settings (preset,
    configuration, precision, stand-in data: :func:`check_run_folder`), ``overwrite=False``
    raises :class:`ExistingRunError` before anything runs (the command line's default), and
    ``overwrite=True`` replaces it, saying so on stderr (its work of unchanged settings is reused).

    The settings are checked first (``overrides``, then the experiment's ``check``: a
    :class:`ConfigError`), then ``data_dir`` (a :class:`DataNotFoundError` when it is given but
    is no folder), then the output folder; a run refused with either error leaves no folder it
    created behind.
    """
    experiment: Experiment = get(name)
    config = experiment.config(preset)
    if seed is not None:
        config = replace(config, seed=seed)
    if overrides:
        config = apply_overrides(config, overrides)
    if experiment.check is not None:  # settings first: a bad one is no folder conflict
        experiment.check(config)
    check_data_dir(data_dir)
    planned = {
        "preset": preset,
        "config": asdict(config),
        "overrides": overrides_of(experiment, preset, config),
        "mixed_precision": mixed_precision,
        "limits": {
            "stop_after": stop_after,
            "micro_batch_size": micro_batch_size,
            "stand_in_data": stand_in_data,
        },
    }
    replaced = check_run_folder(Path(out) / name, planned, overwrite=overwrite)
    if replaced is not None and process_layout()[0] == 0:
        print(
            f"replacing the finished run in {Path(out) / name} ({describe_settings(replaced)}) "
            f"with one of other settings ({describe_settings(planned)})",
            file=sys.stderr,
            flush=True,
        )
    state = distributed_state()
    created = _first_missing(Path(out) / name)  # removed again if the run is refused
    context = RunContext(
        out_dir=Path(out) / name,
        data_dir=Path(data_dir) if data_dir is not None else None,
        preset=preset,
        progress=progress,
        stop_after=stop_after,
        micro_batch_size=micro_batch_size,
        mixed_precision=mixed_precision,
        stand_in_data=stand_in_data,
        data_workers=data_workers,
        tf32=tf32,
        log_with=tuple(log_with),
    )
    if experiment.single_process and state is not None and not context.is_main_process:
        state.wait_for_everyone()  # the main process computes and writes the record
        return context.out_dir / RESULTS_FILE
    seed_everything(int(getattr(config, "seed", 0)))
    earlier = [] if replaced is not None else earlier_sittings(context.out_dir, planned)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0, cpu0 = time.perf_counter(), time.process_time()

    def sitting(outcome: str, **more: Any) -> dict[str, Any]:
        return {
            "started_at": started,
            "wall_time_s": time.perf_counter() - t0,
            "cpu_time_s": time.process_time() - cpu0,
            "outcome": outcome,
            **more,
        }

    def keep(outcome: str, **more: Any) -> None:
        kept = {**_as_json(_settings(planned)), "sittings": [*earlier, sitting(outcome, **more)]}
        context.save_json(SITTINGS_FILE, kept)

    code = code_version()  # what this sitting runs, before anything can change the tree
    unfinished = context.path(SITTINGS_FILE)
    before = unfinished.read_text() if unfinished.is_file() else None
    keep("running")  # what a killed sitting leaves (a stopped or failed one says so below)
    try:
        with preemptible():  # SIGUSR1/SIGTERM: a training loop stops at its next step
            results = experiment.run(config, context)
    except (ConfigError, DataNotFoundError):  # refused before any work: no sitting, no folder
        if context.is_main_process:
            _put_back(unfinished, before)
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
        raise
    except (KeyboardInterrupt, Exception) as stop:
        try:
            if isinstance(stop, Preempted):
                keep("stopped", preempted={"signal": stop.signal_name, "step": stop.step})
                if stop.step is not None and state is not None:
                    state.wait_for_everyone()  # all stopped at this step: none leaves early
            else:
                keep("stopped" if isinstance(stop, KeyboardInterrupt) else "failed")
        except DiskFullError:
            if not (isinstance(stop, OSError) and stop.errno in FULL_DISK_ERRORS):
                raise
            # the disk is still full: the sitting stays "running" (read back as killed), and
            # the error that names the file the run could not write goes on

        if isinstance(stop, KeyboardInterrupt) and not isinstance(stop, RunInterrupted):
            raise RunInterrupted(context.out_dir) from stop
        raise
    if not isinstance(results, Results):
        raise TypeError(f"experiment {name!r} returned {type(results).__name__}, expected Results")
    sittings = [*earlier, sitting("finished")]
    record = {
        "experiment": name,
        "paper": experiment.paper,
        "preset": preset,
        "config": asdict(config),
        "overrides": planned["overrides"],
        "seed": getattr(config, "seed", None),
        "versions": versions(),
        "code": code,
        "started_at": sittings[0]["started_at"],
        # Over every sitting; CPU time of the main process, all its threads.
        "wall_time_s": _total(sittings, "wall_time_s"),
        "cpu_time_s": _total(sittings, "cpu_time_s"),
        "sittings": sittings,
        "processes": context.processes,
        "mixed_precision": mixed_precision,
        "tf32": tf32,
        "limits": {
            "stop_after": stop_after,
            "micro_batch_size": micro_batch_size,
            "stand_in_data": stand_in_data,
        },
        "results": results.to_dict(),
    }
    path = context.save_json(RESULTS_FILE, record)
    if context.is_main_process:
        (context.out_dir / SITTINGS_FILE).unlink(missing_ok=True)
    if state is not None:
        state.wait_for_everyone()  # nobody leaves while the main process still writes
    return path


def distributed_state() -> Any:
    """Set up the process group of a multi-process launch (``WORLD_SIZE > 1``) through
    :class:`accelerate.PartialState` and return it; ``None`` for a single process."""
    if int(os.environ.get("WORLD_SIZE", 1)) <= 1:
        warn_if_processes_were_lost()
        return None
    import torch
    from accelerate import PartialState

    # without ``cpu=True`` accelerate on a machine with no GPU keeps every rank a
    # process of its own (no process group), and they all act as the main process
    return PartialState(cpu=not torch.cuda.is_available(), timeout=collective_timeout())


def reproduce(
    preset: str,
    out: Path | str,
    *,
    data_dir: Path | str | None = None,
    progress: bool = True,
    only: list[str] | None = None,
    overwrite: bool = True,
) -> tuple[list[Path], dict[str, str]]:
    """Run every experiment marked for reproduction (or those in ``only``) at ``preset``.

    Experiments whose datasets are absent are skipped, not fatal. Returns the results files and
    ``{experiment: reason}`` for the skipped ones (also written to ``out/skipped.json``);
    ``hopfield reproduce`` then writes the claims ledger of ``out``
    (:func:`hopfield.claims.report.write_ledger`: experiments never import the ledger). With
    ``overwrite=False`` a finished run of other settings in ``out`` raises
    :class:`ExistingRunError` before any experiment runs.
    """
    check_data_dir(data_dir)
    chosen = [e for e in all_experiments() if (e.name in only if only else e.in_reproduce)]
    if not overwrite:
        for experiment in chosen:
            planned = {
                "preset": preset,
                "config": asdict(experiment.config(preset)),
                "limits": {"stand_in_data": False},
            }
            check_run_folder(Path(out) / experiment.name, planned, overwrite=False)
    paths: list[Path] = []
    skipped: dict[str, str] = {}
    for experiment in chosen:
        try:
            paths.append(
                run_experiment(
                    experiment.name,
                    preset,
                    out,
                    data_dir=data_dir,
                    progress=progress,
                    overwrite=overwrite,
                )
            )
        except DataNotFoundError as missing:
            skipped[experiment.name] = str(missing)
    if process_layout()[0] == 0:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "skipped.json").write_text(json.dumps(skipped, indent=2))
    return paths, skipped


def load_record(path: Path | str) -> dict[str, Any]:
    """Read a results file written by :func:`run_experiment`."""
    return json.loads(Path(path).read_text())

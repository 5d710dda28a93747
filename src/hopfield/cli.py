"""The ``hopfield`` command: list, run, reproduce and report experiments.

A mistake in the input (an unknown experiment, preset or ``--set`` field, a value of the wrong
type or one the experiment cannot run with (a :class:`ConfigError` from its configuration check,
before it reads data or trains), a missing dataset or results folder, an output folder holding a
finished run of other settings without ``--overwrite``) is one line on stderr and
exit status 2, as argparse's own errors; so is a command that needs a package of an extra the
install lacks (the line names the extra and the command that works from a clone:
``pip install -e ".[experiments]"``; hopfield is on no package index), and so is a
``--data-dir`` that is no folder; Ctrl-C during ``run``/``reproduce`` says which folder holds
the stopped run (the same command resumes it) and exits with 130; SIGUSR1 or SIGTERM (a
scheduler's preemption) stops a training run at its next optimiser step with a checkpoint there
and exits with 75 (:data:`PREEMPTED`, for a job script to requeue); a full disk is one line naming
the file that could not be written (exit status 1). Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from hopfield._install import install_command
from hopfield.data.files import ChecksumError, DataNotFoundError
from hopfield.experiments.registry import PRESETS, ConfigError, all_experiments, get, listings

USAGE_ERROR = 2
INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a program stopped by Ctrl-C
DISK_FULL = 1
#: SIGUSR1/SIGTERM stopped ``run``/``reproduce`` (a checkpoint at the step boundary; the same
#: command resumes): sysexits.h's EX_TEMPFAIL, "try again later", for a SLURM script's requeue.
PREEMPTED = 75

#: Optional packages the commands import, as ``{module: (pip name, extra that installs it)}``;
#: a command that imports one the install lacks names the extra in its one-line error.
#: ``experiments`` holds everything ``hopfield run``/``reproduce``/``claims``/``plan`` need.
OPTIONAL_MODULES: dict[str, tuple[str, str]] = {
    "accelerate": ("accelerate", "experiments"),
    "tqdm": ("tqdm", "experiments"),
    "transformers": ("transformers", "experiments"),
    "tokenizers": ("tokenizers", "experiments"),
    "scipy": ("scipy", "experiments"),
    "sklearn": ("scikit-learn", "experiments"),
    "matplotlib": ("matplotlib", "experiments"),
    "pandas": ("pandas", "experiments"),
    "PIL": ("pillow", "experiments"),
    "datasets": ("datasets", "corpora"),
}


class UsageError(Exception):
    """A mistake in the command's input, reported as one line (exit status 2)."""


class CommandExit(SystemExit):
    """How :func:`main` ends on a user error or Ctrl-C, after printing its one line: a
    ``SystemExit`` with the exit status as ``code`` and the line as ``str()``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status)
        self.message = message

    def __str__(self) -> str:
        return self.message


def missing_extra(error: BaseException) -> tuple[str, str] | None:
    """``(pip name, extra)`` of the optional package whose absence caused ``error`` (an
    ``ImportError`` or one raised from it), ``None`` when it is no package of an extra."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ModuleNotFoundError) and current.name:
            found = OPTIONAL_MODULES.get(current.name.partition(".")[0])
            if found is not None:
                return found
        current = current.__cause__ or current.__context__
    return None


def _missing_extra_line(args: argparse.Namespace, package: str, extra: str) -> str:
    name = getattr(args, "name", None)
    who = f"{name} needs" if name else "needs"
    return f"{who} {package}, which this install lacks: {install_command(extra)}"


def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", " ", text.strip())


def _exit(status: int, command: str, message: str, *, together: bool = False) -> NoReturn:
    """Print ``message`` (on the main process) and end with ``status``; ``together``: every
    process of a multi-process run got here, and they leave the process group together."""
    from hopfield.training import leave_process_group, process_layout

    line = f"hopfield {command}: {_one_line(message)}"
    if process_layout()[0] == 0:  # one line per launch, not per process
        print(line, file=sys.stderr, flush=True)
    if together:
        leave_process_group(exit_status=status)
    raise CommandExit(status, line)


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line: ``hopfield run: error: ... (see hopfield run -h)``."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {_one_line(message)} (see {self.prog} -h)\n")


def _parse_overrides(pairs: Sequence[str]) -> dict[str, str]:
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--set expects NAME=VALUE, got {pair!r}")
        overrides[key] = value
    return overrides


def _number_type(kind: Callable[[str], float], lowest: float, wanted: str) -> Callable[[str], Any]:
    """An argparse ``type``: ``kind(text)`` when it is finite and at least ``lowest``, else an
    error saying ``expected {wanted}``."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= lowest):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    return parse


_positive_int = _number_type(int, 1, "a positive integer")
_non_negative_int = _number_type(int, 0, "an integer >= 0")
_positive_float = _number_type(float, math.ulp(0.0), "a positive number")


def _installed_version() -> str:
    """The version of the installed distribution (its metadata), else the package's own."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hopfield")
    except PackageNotFoundError:  # run from a source tree that is not installed
        import hopfield

        return hopfield.__version__


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hopfield", description="Modern Hopfield networks: experiments and reports."
    )
    parser.add_argument("--version", action="version", version=f"hopfield {_installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("list", help="list the registered experiments")

    def add_common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--out",
            type=Path,
            default=Path("runs"),
            help="output folder (default: runs; results/ holds the committed evidence)",
        )
        p.add_argument("--data-dir", type=Path, default=None, help="dataset root ($HOPFIELD_DATA)")
        p.add_argument("--no-progress", action="store_true", help="no progress bars")
        p.add_argument(
            "--overwrite",
            action="store_true",
            help="replace a finished run of other settings in the output folder (without it "
            "such a run is kept and the command stops; work of unchanged settings is reused)",
        )

    run = sub.add_parser("run", help="run one experiment")
    run.add_argument("name")
    run.add_argument(
        "--preset",
        default="small",
        help=f"one of {', '.join(PRESETS)} or an experiment's own preset (see `hopfield list`)",
    )
    add_common(run)
    run.add_argument("--seed", type=int, default=None)
    run.add_argument(
        "--max-steps",
        type=_positive_int,
        default=None,
        metavar="N",
        help="end every training run after N optimiser steps (schedule of the full run; smoke "
        "runs of paper presets)",
    )
    run.add_argument(
        "--micro-batch-size",
        type=_positive_int,
        default=None,
        metavar="M",
        help="examples per forward/backward pass and process (the global batch stays)",
    )
    run.add_argument(
        "--mixed-precision",
        choices=("no", "fp16", "bf16"),
        default=None,
        help="precision of every training run instead of the preset's (fp16 needs a GPU)",
    )
    run.add_argument(
        "--tf32",
        action="store_true",
        help="on CUDA, float32 matrix products of every training run in TF32 on the tensor "
        "cores (8x an A100's float32 peak; the fp32 paper presets keep it off without it)",
    )
    run.add_argument(
        "--log-with",
        action="append",
        default=[],
        metavar="TRACKER",
        help="also log every training run's records (loss, lr, throughput, max |x|) to this "
        "accelerate tracker, e.g. tensorboard (needs its package: pip install tensorboard), "
        "in the run's trackers/ folder; repeatable",
    )
    run.add_argument(
        "--data-workers",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="DataLoader worker processes per training process that read and collate batches "
        "ahead of the step (JPEG decoding, tokenising); the results stay the same",
    )
    run.add_argument(
        "--collective-timeout",
        type=_positive_float,
        default=None,
        metavar="SECONDS",
        help="under several processes, end the job when one process keeps the others waiting "
        "this long in a collective (default: $HOPFIELD_COLLECTIVE_TIMEOUT, else 1800)",
    )
    run.add_argument(
        "--stand-in-data",
        action="store_true",
        help="train on random data of the real shapes where a dataset is absent (smoke runs)",
    )
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a configuration field (JSON values)",
    )

    rep = sub.add_parser("reproduce", help="run every experiment at a preset, then the report")
    rep.add_argument("--preset", choices=PRESETS, default="small")
    add_common(rep)
    rep.add_argument("--only", nargs="*", default=None, help="names of experiments to run")

    report = sub.add_parser("report", help="render a Markdown report of a results folder")
    report.add_argument("dir", type=Path)
    report.add_argument(
        "--docs",
        nargs="+",
        type=Path,
        default=None,
        metavar="FILE",
        help="also rewrite the generated blocks (<!-- generated: EXPERIMENT/TABLE -->) of these "
        "Markdown files from the records in DIR",
    )
    claims = sub.add_parser(
        "claims", help="judge every paper claim from a results folder: claims.json, CLAIMS.md"
    )
    claims.add_argument("dir", type=Path)
    _add_plan_parser(sub)
    _add_prepare_parser(sub)
    return parser


def _add_plan_parser(sub: Any) -> None:
    plan = sub.add_parser(
        "plan",
        help="price a preset without training: parameters, FLOPs, memory, GPU-hours, data",
        description="Build every model a preset trains on the meta device and print its "
        "parameters, FLOPs per step and in total, activation memory per device, GPU-hours on "
        "8 x A100 / H100 and the dataset files it needs.",
    )
    plan.add_argument("name", nargs="?", help="experiment (see `hopfield list`)")
    plan.add_argument(
        "--all",
        action="store_true",
        help="every registered experiment (a few minutes at the paper preset)",
    )
    plan.add_argument("--preset", default="paper", help="preset to price (default: paper)")
    plan.add_argument(
        "--mfu", type=float, default=0.4, help="model-FLOPs utilisation in (0, 1] (default 0.4)"
    )
    plan.add_argument("--data-dir", type=Path, default=None, help="dataset root ($HOPFIELD_DATA)")
    plan.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    plan.add_argument("--jobs", action="store_true", help="one row per job, not per group")
    plan.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write the plan as JSON to DIR/plan/PRESET.json (results/plan/paper.json is "
        "the committed record the claims ledger reads parameter counts from)",
    )


def _add_prepare_parser(sub: Any) -> None:
    prepare = sub.add_parser(
        "prepare",
        help="build a preset's tokenizers and token stores and check its files, without training",
        description="Build what a preset reads from the network (the outlier study's tokenizers "
        "and token stores, into $HOPFIELD_CACHE) on a node that can reach it, and check the "
        "dataset files of every other experiment; the training job then runs offline.",
    )
    prepare.add_argument("name", help="experiment (see `hopfield list`)")
    prepare.add_argument("--preset", default="paper", help="preset to prepare (default: paper)")
    prepare.add_argument(
        "--data-dir", type=Path, default=None, help="dataset root ($HOPFIELD_DATA)"
    )
    prepare.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a configuration field, as for `hopfield run`",
    )


def _prepare_command(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    from hopfield.experiments.runner import check_data_dir
    from hopfield.plan.prepare import prepare

    _check_preset(args.name, args.preset)
    check_data_dir(args.data_dir)
    rows = prepare(
        args.name, args.preset, data_dir=args.data_dir, overrides=_parse_overrides(args.overrides)
    )
    for what, state in rows:
        print(f"{what}: {state}")
    return 0


def _plan_command(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    import json
    import shlex

    from hopfield.plan import PlanCache, plan, plan_to_dict, render_markdown, write_plan_record

    if args.all == (args.name is not None):
        raise UsageError("give an experiment name or --all (not both)")
    if not 0.0 < args.mfu <= 1.0:
        raise UsageError(f"--mfu must lie in (0, 1], got {args.mfu}")
    names = [e.name for e in all_experiments()] if args.all else [args.name]
    for name in names:
        _check_preset(name, args.preset)

    def progress(job: str) -> None:
        if sys.stderr.isatty():
            print(f"\033[2K\rpricing {job}", end="", file=sys.stderr, flush=True)

    cache = PlanCache()  # experiments share models (outliers and outliers-bert) and layers
    results = [
        plan(n, args.preset, mfu=args.mfu, data_dir=args.data_dir, progress=progress, cache=cache)
        for n in names
    ]
    if sys.stderr.isatty():
        print("\033[2K\r", end="", file=sys.stderr, flush=True)
    words = list(sys.argv[1:] if argv is None else argv)
    command = "hopfield " + " ".join(shlex.quote(w) for w in words)
    if args.out is not None:
        path = write_plan_record(results, args.out, command=command)
        print(f"plan record: {path}", file=sys.stderr)
    if args.json:
        dicts = [plan_to_dict(r) for r in results]
        print(json.dumps(dicts if args.all else dicts[0], indent=1))
    else:
        print(render_markdown(results, per_job=args.jobs, command=command), end="")
    return 0


def _experiment_names(names: Sequence[str]) -> None:
    """``UsageError`` naming the registered experiments unless every one of ``names`` is one."""
    for name in names:
        try:
            get(name)
        except ValueError as error:
            raise UsageError(f"{error} (see hopfield list)") from None


def _check_preset(name: str, preset: str) -> None:
    _experiment_names([name])
    presets = get(name).presets
    if preset not in presets:
        raise UsageError(f"--preset: {name} has presets {', '.join(presets)}, not {preset!r}")


def _results_folder(folder: Path) -> None:
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a directory (give the folder a run wrote to, e.g. runs)")


def _check_record(path: Path) -> None:
    """``UsageError`` unless ``path`` holds a record of ``hopfield run`` the report can read."""
    import json

    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{path} is not readable JSON ({error})") from None
    needed = {"experiment", "preset", "wall_time_s", "versions", "results"}
    missing = needed - set(record) if isinstance(record, dict) else needed
    if missing:
        raise UsageError(
            f"{path} is not a record of `hopfield run` (it lacks {', '.join(sorted(missing))})"
        )


def _list_command(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    for e in listings():  # imports no experiment module (nor torch)
        presets = "/".join(e.presets)
        print(f"{e.name:24s} {e.summary} [{presets}]" + (f" — {e.paper}" if e.paper else ""))
    return 0


def _run_command(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    from hopfield.experiments.runner import run_experiment
    from hopfield.report import build_report
    from hopfield.training import (
        COLLECTIVE_TIMEOUT_VARIABLE,
        check_tracker_names,
        leave_process_group,
        process_layout,
    )

    _check_preset(args.name, args.preset)
    try:
        check_tracker_names(args.log_with)
    except ValueError as error:
        raise UsageError(f"--log-with: {error}") from None
    except ImportError as error:
        if error.name not in args.log_with:
            raise  # accelerate itself is missing: the extra that installs it is named
        raise UsageError(f"--log-with: {error}") from None
    if args.collective_timeout is not None:  # read where the process group is set up
        os.environ[COLLECTIVE_TIMEOUT_VARIABLE] = str(args.collective_timeout)
    path = run_experiment(
        args.name,
        args.preset,
        args.out,
        data_dir=args.data_dir,
        seed=args.seed,
        overrides=_parse_overrides(args.overrides),
        progress=not args.no_progress,
        stop_after=args.max_steps,
        micro_batch_size=args.micro_batch_size,
        mixed_precision=args.mixed_precision,
        stand_in_data=args.stand_in_data,
        overwrite=args.overwrite,
        data_workers=args.data_workers,
        tf32=args.tf32,
        log_with=tuple(args.log_with),
    )
    if process_layout()[0] == 0:
        print(f"results: {path}")
        print(f"report:  {build_report(path.parent)}")
    leave_process_group(exit_status=0)
    return 0


def _reproduce_command(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    from hopfield.claims.report import write_ledger
    from hopfield.experiments.runner import reproduce
    from hopfield.report import build_report, find_records
    from hopfield.training import leave_process_group, process_layout

    if args.only is not None:
        _experiment_names(args.only)
    paths, skipped = reproduce(
        args.preset,
        args.out,
        data_dir=args.data_dir,
        progress=not args.no_progress,
        only=args.only,
        overwrite=args.overwrite,
    )
    if process_layout()[0] == 0:
        for path in paths:
            print(f"results: {path}")
        for name, reason in skipped.items():
            print(f"skipped: {name}: {reason}")
        if find_records(Path(args.out)):  # none when every experiment was skipped
            print(f"report:  {build_report(args.out)}")
        write_ledger(args.out)
        print(f"claims:  {Path(args.out) / 'CLAIMS.md'}")
    leave_process_group(exit_status=0)
    return 0


def _report_command(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    from hopfield.report import RESULTS_FILE, build_report, find_records, update_docs

    _results_folder(args.dir)
    records = find_records(args.dir)
    if not records:
        raise UsageError(f"no {RESULTS_FILE} below {args.dir}; run `hopfield run` first")
    for record in records:
        _check_record(record)
    for doc in args.docs or ():
        if not doc.is_file():
            raise UsageError(f"--docs: {doc} is not a file")
    print(build_report(args.dir))
    if args.docs:
        try:
            changed = update_docs(args.docs, args.dir)
        except ValueError as error:  # a generated block names a record or table not there
            raise UsageError(f"--docs: {error}") from None
        for path in changed:
            print(f"updated: {path}")
    return 0


def _claims_command(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    from hopfield.claims.report import write_ledger

    _results_folder(args.dir)
    for path in write_ledger(args.dir):
        print(f"claims:  {path}")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, Sequence[str] | None], int]] = {
    "list": _list_command,
    "run": _run_command,
    "reproduce": _reproduce_command,
    "report": _report_command,
    "claims": _claims_command,
    "plan": _plan_command,
    "prepare": _prepare_command,
}


def _user_errors() -> tuple[type[Exception], ...]:
    """The errors a command reports as one line: mistakes in its input. (The runner, which
    imports torch, is imported here, after the error, not by ``hopfield list``.)"""
    from hopfield.experiments.results import OutputFolderError
    from hopfield.experiments.runner import ExistingRunError

    return (
        UsageError,
        ConfigError,
        ExistingRunError,
        OutputFolderError,
        DataNotFoundError,
        ChecksumError,
    )


def _stopped_in(args: argparse.Namespace, stop: KeyboardInterrupt) -> Path | None:
    """The folder that holds the work of a run stopped by Ctrl-C (``None``: no run)."""
    if args.command == "run":
        return Path(args.out) / args.name
    if args.command == "reproduce":
        return Path(getattr(stop, "out_dir", args.out))
    return None


def _preemption_of(stop: KeyboardInterrupt) -> KeyboardInterrupt | None:
    """The :class:`~hopfield.training.Preempted` behind ``stop`` (itself or its cause), if any."""
    from hopfield.training import Preempted

    for error in (stop, stop.__cause__):
        if isinstance(error, Preempted):
            return error
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default ``sys.argv[1:]``); returns 0 when it succeeds.

    A user error prints one line to stderr and raises ``SystemExit`` with status 2 (Ctrl-C:
    130; SIGUSR1/SIGTERM, a preemption: 75), whose ``str()`` is that line.
    """
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args, argv)
    except ImportError as error:
        missing = missing_extra(error)
        if missing is None:
            raise
        _exit(USAGE_ERROR, args.command, _missing_extra_line(args, *missing))
    except OSError as error:
        from hopfield.training import FULL_DISK_ERRORS, DiskFullError

        if error.errno in FULL_DISK_ERRORS:  # the run so far is kept; the line names the file
            line = str(error) if isinstance(error, DiskFullError) else f"no space left: {error}"
            _exit(DISK_FULL, args.command, line)
        if not isinstance(error, _user_errors()):  # a missing dataset is an OSError too
            raise
        _exit(USAGE_ERROR, args.command, str(error))
    except KeyboardInterrupt as stop:
        preempted = _preemption_of(stop)
        status = INTERRUPTED if preempted is None else PREEMPTED
        what = "interrupted" if preempted is None else str(preempted)
        folder = _stopped_in(args, stop)
        if folder is not None:
            what += f"; the run so far is in {folder}, and the same command resumes it"
        # a training loop's preemption stopped every process after the same step
        _exit(status, args.command, what, together=getattr(preempted, "step", None) is not None)
    except Exception as error:
        if not isinstance(error, _user_errors()):
            raise
        _exit(USAGE_ERROR, args.command, str(error))


if __name__ == "__main__":
    sys.exit(main())

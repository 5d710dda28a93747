"""The ``hopfield`` command: list, run, reproduce and report experiments."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hopfield.experiments.registry import PRESETS, all_experiments, get
from hopfield.experiments.runner import reproduce, run_experiment
from hopfield.report import build_report, update_docs
from hopfield.training import process_layout


def _parse_overrides(pairs: Sequence[str]) -> dict[str, str]:
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects NAME=VALUE, got {pair!r}")
        overrides[key] = value
    return overrides


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hopfield", description="Modern Hopfield networks: experiments and reports."
    )
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
        type=int,
        default=None,
        metavar="N",
        help="end every training run after N optimiser steps (schedule of the full run; smoke "
        "runs of paper presets)",
    )
    run.add_argument(
        "--micro-batch-size",
        type=int,
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
        help="every registered experiment (minutes: stanhop-outliers alone builds 120 models "
        "of 35M parameters)",
    )
    plan.add_argument("--preset", default="paper", help="preset to price (default: paper)")
    plan.add_argument(
        "--mfu", type=float, default=0.4, help="model-FLOPs utilisation in (0, 1] (default 0.4)"
    )
    plan.add_argument("--data-dir", type=Path, default=None, help="dataset root ($HOPFIELD_DATA)")
    plan.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    plan.add_argument("--jobs", action="store_true", help="one row per job, not per group")


def _plan_command(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    import json
    import shlex

    from hopfield.plan import plan, plan_to_dict, render_markdown

    if args.all == (args.name is not None):
        raise SystemExit("plan: give an experiment name or --all (not both)")
    names = [e.name for e in all_experiments()] if args.all else [args.name]

    def progress(job: str) -> None:
        if sys.stderr.isatty():
            print(f"\033[2K\rpricing {job}", end="", file=sys.stderr, flush=True)

    try:
        results = [
            plan(n, args.preset, mfu=args.mfu, data_dir=args.data_dir, progress=progress)
            for n in names
        ]
    except ValueError as error:
        raise SystemExit(f"plan: {error}") from None
    if sys.stderr.isatty():
        print("\033[2K\r", end="", file=sys.stderr, flush=True)
    if args.json:
        dicts = [plan_to_dict(r) for r in results]
        print(json.dumps(dicts if args.all else dicts[0], indent=1))
    else:
        words = list(sys.argv[1:] if argv is None else argv)
        command = "hopfield " + " ".join(shlex.quote(w) for w in words)
        print(render_markdown(results, per_job=args.jobs, command=command), end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "list":
        for e in all_experiments():
            presets = "/".join(e.presets)
            print(f"{e.name:24s} {e.summary} [{presets}]" + (f" — {e.paper}" if e.paper else ""))
        return 0
    if args.command == "run":
        try:
            preset_names = get(args.name).presets
        except ValueError as error:
            raise SystemExit(str(error)) from None
        if args.preset not in preset_names:
            raise SystemExit(
                f"--preset: {args.name} has presets {', '.join(preset_names)}, not {args.preset!r}"
            )
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
        )
        if process_layout()[0] == 0:
            print(f"results: {path}")
            print(f"report:  {build_report(path.parent)}")
        _leave_process_group()
        return 0
    if args.command == "reproduce":
        paths, skipped = reproduce(
            args.preset,
            args.out,
            data_dir=args.data_dir,
            progress=not args.no_progress,
            only=args.only,
        )
        for path in paths:
            print(f"results: {path}")
        for name, reason in skipped.items():
            print(f"skipped: {name}: {reason}")
        print(f"report:  {build_report(args.out)}")
        print(f"claims:  {Path(args.out) / 'CLAIMS.md'}")
        return 0
    if args.command == "report":
        print(build_report(args.dir))
        if args.docs:
            try:
                changed = update_docs(args.docs, args.dir)
            except ValueError as error:
                raise SystemExit(f"report --docs: {error}") from None
            for path in changed:
                print(f"updated: {path}")
        return 0
    if args.command == "claims":
        from hopfield.claims.report import write_ledger

        if not args.dir.is_dir():
            raise SystemExit(f"claims: {args.dir} is not a directory")
        for path in write_ledger(args.dir):
            print(f"claims:  {path}")
        return 0
    if args.command == "plan":
        return _plan_command(args, argv)
    raise AssertionError(f"unhandled command {args.command}")  # argparse guarantees a command


def _leave_process_group() -> None:
    """Destroy the process group of a multi-process run before the interpreter exits (gloo's
    threads torn down at exit can abort the process after its work is done)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

"""An experiment's results as the claims ledger reads them: ``results.json`` and the small JSON
records the experiment keeps beside it (per-seed runs, per-memory-set values); and the plan
record of ``hopfield plan --out`` (``plan/<preset>.json``), which gives the parameter counts of
the models a preset trains without training them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hopfield.claims.claim import Measured, NotTested
from hopfield.plan import PLAN_FOLDER, ExperimentPlan, read_plan_record

__all__ = ["RESULTS_FILE", "ExperimentRecord", "PlanRecord", "load_plans", "load_records"]

RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class ExperimentRecord:
    """The record of one experiment run: ``folder/results.json`` (written by
    :func:`hopfield.experiments.runner.run_experiment`) and its side files.

    Attributes:
        folder: the experiment's results folder (``DIR/<experiment>``).
        data: the parsed ``results.json``.
    """

    folder: Path
    data: dict[str, Any]

    @classmethod
    def load(cls, folder: Path | str) -> ExperimentRecord:
        """Read ``folder/results.json``."""
        folder = Path(folder)
        data = json.loads((folder / RESULTS_FILE).read_text())
        if not isinstance(data, dict) or "results" not in data:
            raise ValueError(f"{folder / RESULTS_FILE} is not an experiment record")
        return cls(folder, data)

    @property
    def name(self) -> str:
        return str(self.data.get("experiment", self.folder.name))

    @property
    def preset(self) -> str:
        return str(self.data.get("preset", "?"))

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.data.get("config", {}))

    @property
    def metrics(self) -> dict[str, float]:
        return dict(self.data["results"].get("metrics", {}))

    @property
    def command(self) -> str:
        """The command that wrote the record (its ``--set`` overrides are in its config)."""
        return f"hopfield run {self.name} --preset {self.preset}"

    @property
    def smoke_run(self) -> str | None:
        """Why the run is a smoke run that tests no empirical claim (``--stand-in-data``,
        ``--max-steps``), or ``None``."""
        limits = self.data.get("limits") or {}
        if limits.get("stand_in_data"):
            return f"{self.name} trained on random stand-in data (a smoke run)"
        if limits.get("stop_after") is not None:
            return f"{self.name} was cut after {limits['stop_after']} steps (a smoke run)"
        return None

    @property
    def scale(self) -> str:
        """Where the evidence comes from: the preset of the run, and its folder where that is not
        the experiment's name (a second preset's record, ``outlier-formation-small``)."""
        if self.folder.name == self.name:
            return self.preset
        return f"{self.preset} ({self.folder.name})"

    def metric(self, key: str) -> float:
        """The scalar metric ``key``; :class:`NotTested` if the run did not record it."""
        if key not in self.metrics:
            raise NotTested(f"{self.name} at {self.preset} recorded no metric {key!r}")
        return float(self.metrics[key])

    def table(self, prefix: str) -> tuple[list[str], list[list[Any]]]:
        """``(columns, rows)`` of the first table whose name starts with ``prefix``."""
        for table in self.data["results"].get("tables", []):
            if str(table["name"]).startswith(prefix):
                return list(table["columns"]), [list(r) for r in table["rows"]]
        raise NotTested(f"{self.name} at {self.preset} has no table {prefix!r}")

    def side(self, relative: str) -> Any:
        """The JSON file ``relative`` of the experiment's folder; :class:`NotTested` if absent."""
        path = self.folder / relative
        if not path.is_file():
            raise NotTested(f"{self.name}: {relative} is missing beside results.json")
        return json.loads(path.read_text())

    def files(self, pattern: str) -> list[Path]:
        """Files of the experiment's folder matching the glob ``pattern``, sorted."""
        return sorted(self.folder.glob(pattern))


#: The order in which records of several presets of one experiment are read (the largest scale
#: first: the first record that tests a claim decides it); other presets come between ``small``
#: and ``tiny``.
PRESET_ORDER = ("paper", "gpu", "decisive", "cpu", "formation", "trained", "small")


def _preset_rank(record: ExperimentRecord) -> tuple[int, str]:
    preset = record.preset
    rank = PRESET_ORDER.index(preset) if preset in PRESET_ORDER else len(PRESET_ORDER)
    return (rank + (1 if preset == "tiny" else 0), record.folder.name)


def load_records(directory: Path | str) -> dict[str, list[ExperimentRecord]]:
    """``{experiment: records}`` for every ``directory/<folder>/results.json``: each record under
    the experiment it names (``outlier-formation-small`` holds a record of
    ``outlier-formation``), several presets ordered by :data:`PRESET_ORDER`."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory} is not a directory")
    out: dict[str, list[ExperimentRecord]] = {}
    for path in sorted(directory.glob(f"*/{RESULTS_FILE}")):
        record = ExperimentRecord.load(path.parent)
        out.setdefault(record.name, []).append(record)
    return {name: sorted(records, key=_preset_rank) for name, records in out.items()}


@dataclass(frozen=True)
class PlanRecord:
    """One experiment's plan in a plan record (``DIR/plan/<preset>.json``, written by
    ``hopfield plan --out DIR``): the models its preset trains, built on the meta device.

    Attributes:
        path: the plan record's file.
        plan: the experiment's plan.
    """

    path: Path
    plan: ExperimentPlan

    @property
    def name(self) -> str:
        return self.plan.experiment

    @property
    def preset(self) -> str:
        return self.plan.preset

    @property
    def command(self) -> str:
        """The command that prints this experiment's plan."""
        return f"hopfield plan {self.name} --preset {self.preset}"

    @property
    def scale(self) -> str:
        """Where the evidence comes from: the plan, not a run."""
        return f"plan ({self.preset} preset, meta device)"

    def parameters(self, job: str, *, base: str = "") -> Measured:
        """The parameter count of ``job``'s model in the paper's convention, less that of
        ``base``'s model if given (an increment); :class:`NotTested` at a preset other than
        ``paper`` (a smaller model) or without such jobs."""
        if self.preset != "paper":
            raise NotTested(
                f"parameter counts are the paper's only at the paper preset, not {self.preset}"
            )
        where = f"{PLAN_FOLDER}/{self.path.name}"  # the same wherever DIR lies
        count = self._count(job)
        if not base:
            return Measured(float(count), f"{count:,} parameters of {job!r} in {where}")
        increment = count - self._count(base)
        return Measured(
            float(increment), f"{increment:+,} parameters from {base!r} to {job!r} in {where}"
        )

    def _count(self, job: str) -> int:
        for entry in self.plan.jobs:
            if entry.name == job:
                return int(entry.parameters_counted)
        raise NotTested(f"the {self.preset} plan of {self.name} has no job {job!r}")


def load_plans(directory: Path | str) -> dict[str, list[PlanRecord]]:
    """``{experiment: [its plans]}`` from every plan record ``directory/plan/*.json`` (sorted by
    file name); ``{}`` without such files."""
    plans: dict[str, list[PlanRecord]] = {}
    for path in sorted(Path(directory).glob(f"{PLAN_FOLDER}/*.json")):
        for plan in read_plan_record(path)[0]:
            plans.setdefault(plan.experiment, []).append(PlanRecord(path, plan))
    return plans

"""A stand-in experiment configuration for command-line tests (see the ``registered`` fixture
in ``conftest.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from hopfield.experiments.results import Results, RunContext, Table


@dataclass
class StubConfig:
    """Fields of every kind ``--set`` parses: int, float, tuple of str, str."""

    seed: int = 0
    steps: int = 4
    rate: float = 0.5
    names: tuple[str, ...] = ("a",)
    label: str = "x"


def interrupted_once(config: StubConfig, ctx: RunContext) -> Results:
    """Counts steps, checkpointing after each; Ctrl-C after the second step of the first run,
    so the same command resumes where it left off."""
    state = ctx.load_json("checkpoint.json") or {"done": 0, "log": []}
    for step in range(state["done"], config.steps):
        state = {"done": step + 1, "log": [*state["log"], step]}
        ctx.save_json("checkpoint.json", state)
        if step == 1 and not (ctx.out_dir / "interrupted").exists():
            (ctx.out_dir / "interrupted").touch()
            raise KeyboardInterrupt
    return Results(tables=[Table("log", ["step"], [[s] for s in state["log"]])])

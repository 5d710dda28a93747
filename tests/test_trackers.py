"""Experiment trackers through accelerate (issue 30, item 7): every log record reaches them with
the loss, learning rate, throughput and ``max |x|``; a tracker whose package is missing is an
error naming it, not a silent no-op."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate.tracking import GeneralTracker
from torch import nn

from hopfield.cli import main
from hopfield.training import Trainer, TrainingConfig


class FakeTracker(GeneralTracker):
    """Keeps what accelerate gives it."""

    name = "fake"
    requires_logging_directory = False

    def __init__(self) -> None:
        super().__init__()
        self.config: dict[str, Any] = {}
        self.logged: list[tuple[int | None, dict[str, Any]]] = []
        self.finished = 0

    @property
    def tracker(self) -> Any:
        return self

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.config = dict(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.logged.append((step, dict(values)))

    def finish(self) -> None:
        self.finished += 1


def _trainer(out: Path, trackers: Any = (), **settings: Any) -> Trainer:
    """A small regression, 4 steps of 8 examples, logged every 2 steps."""
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    dataset = list(zip(x, x.sum(dim=1), strict=True))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def loss_fn(model: nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        return ((model(inputs).squeeze(-1) - targets) ** 2).mean()

    config = TrainingConfig(max_steps=4, batch_size=8, log_every=2, cpu=True, **settings)
    monitor = [r"0"]
    return Trainer(model, dataset, loss_fn, config, out, monitor=monitor, progress=False,
                   trackers=trackers)  # fmt: skip


def test_every_log_record_reaches_the_trackers(tmp_path: Path) -> None:
    fake = FakeTracker()
    trainer = _trainer(tmp_path, trackers=[fake], tokens_per_example=5)
    result = trainer.fit()
    assert [step for step, _ in fake.logged] == [r["step"] for r in result.log] == [2, 4]
    for (_, values), record in zip(fake.logged, result.log, strict=True):
        assert values["loss"] == record["loss"] and values["lr"] == record["lr"]
        assert values["grad_norm"] == record["grad_norm"]
        assert values["max_abs/0"] == record["max_abs"]["0"] > 0
        assert values["examples_per_s"] > 0
        assert values["tokens_per_s"] == pytest.approx(5 * values["examples_per_s"])
    assert fake.config["batch_size"] == 8 and fake.config["betas"] == "(0.9, 0.999)"
    assert fake.finished == 1 and trainer.accelerator.trackers == []


def test_a_tracker_must_be_known_and_installed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tracker 'tensorbored'"):
        _trainer(tmp_path, log_with=("tensorbored",))
    if importlib.util.find_spec("tensorboard") is None:
        with pytest.raises(ImportError, match="needs the tensorboard package"):
            _trainer(tmp_path, log_with="tensorboard")
    with pytest.raises(TypeError, match="GeneralTracker"):
        _trainer(tmp_path, trackers=["fake"])
    with pytest.raises(TypeError, match="log_with"):
        TrainingConfig(max_steps=1, log_with=(1,))  # type: ignore[arg-type]
    run = ["run", "retrieval-demo", "--preset", "tiny", "--out", str(tmp_path / "runs")]
    with pytest.raises(SystemExit, match="--log-with: unknown tracker 'tensorbored'") as stop:
        main([*run, "--log-with", "tensorbored"])
    assert stop.value.code == 2 and not (tmp_path / "runs").exists()

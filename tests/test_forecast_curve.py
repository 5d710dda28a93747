"""Training curves of the forecasters (``forecasting_common.TrainingCurve``, OutEffHop Figure 2):
points at regular steps equal to a float64 reference, training unchanged by the hooks, a cut run
resumed to the uninterrupted curve, and the argument checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from hopfield.data.timeseries import ForecastSplits, make_splits, synthetic_series
from hopfield.experiments.forecasting_common import (
    PENDING_CURVE,
    ForecastFit,
    ForecastRecipe,
    TrainingCurve,
    curve_points,
    train_forecaster,
)
from hopfield.experiments.results import RunContext


class Probe(nn.Module):
    """The identity; in training mode it also keeps max |x| of every input, in float64."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[float] = []

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            self.seen.append(float(x.detach().double().abs().max()))
        return x


class Probed(nn.Module):
    """A linear forecaster ``(B, T, C) -> (B, τ, C)`` between two probes (``first``: its input,
    ``last``: its output) and with dropout, so that training draws random numbers."""

    def __init__(self, in_len: int, out_len: int, channels: int) -> None:
        super().__init__()
        self.out_len, self.channels = out_len, channels
        self.first, self.last = Probe(), Probe()
        self.drop = nn.Dropout(0.2)
        self.linear = nn.Linear(in_len * channels, out_len * channels)

    def forward(self, x: Tensor) -> Tensor:
        h = self.linear(self.drop(self.first(x).flatten(1)))
        return self.last(h.view(x.shape[0], self.out_len, self.channels))


#: 12 steps per epoch (199 training windows, batch 16); 4 points per epoch: every 3rd step.
RECIPE = ForecastRecipe(epochs=2, batch_size=16, lr=1e-2, schedule="constant", patience=5)
MONITOR = [r"first|last"]


def _splits() -> ForecastSplits:
    return make_splits(synthetic_series(300, 2, seed=1), 8, 4, (210, 40, 50))


def _fit(root: Path, monitor: list[str], **limits: Any) -> tuple[Probed, ForecastFit]:
    torch.manual_seed(0)
    model = Probed(8, 4, 2)
    ctx = RunContext(out_dir=root, progress=False, **limits)
    fit = train_forecaster(
        model,
        _splits(),
        RECIPE,
        ctx,
        "run",
        seed=3,
        identity="a",
        monitor=monitor,
        points_per_epoch=4,
    )
    return model, fit


def test_points_at_regular_steps_equal_the_float64_reference(tmp_path: Path) -> None:
    model, fit = _fit(tmp_path, MONITOR)
    assert [p["step"] for p in fit.curve] == [3, 6, 9, 12, 15, 18, 21, 24]
    assert len(model.first.seen) == 24  # one training forward per step, none in evaluation
    for point in fit.curve:
        step = point["step"]
        assert point["max_abs"] == {
            "first": model.first.seen[step - 1],
            "last": model.last.seen[step - 1],
        }
    assert len({p["max_abs"]["last"] for p in fit.curve}) == len(fit.curve)  # not a constant
    assert fit.to_dict()["curve"] == fit.curve


def test_the_hooks_change_no_training_number(tmp_path: Path) -> None:
    watched, fit = _fit(tmp_path / "watched", MONITOR)
    plain, bare = _fit(tmp_path / "plain", [])
    assert bare.curve == [] and "curve" not in bare.to_dict()
    timing = ("seconds", "cpu_seconds")
    history = [{k: v for k, v in h.items() if k not in timing} for h in fit.history]
    assert history == [{k: v for k, v in h.items() if k not in timing} for h in bare.history]
    for name, value in plain.state_dict().items():
        assert torch.equal(watched.state_dict()[name], value), name
    assert watched.first.seen == plain.first.seen and watched.last.seen == plain.last.seen


@pytest.mark.parametrize("cut", [7, 16])
def test_a_cut_run_resumes_to_the_uninterrupted_curve(tmp_path: Path, cut: int) -> None:
    _, full = _fit(tmp_path / "full", MONITOR)
    _, part = _fit(tmp_path / "cut", MONITOR, stop_after=cut)
    assert [p["step"] for p in part.curve] == [s for s in range(3, cut + 1, 3)]
    assert (tmp_path / "cut" / "run" / PENDING_CURVE).is_file()  # points after the last epoch
    _, resumed = _fit(tmp_path / "cut", MONITOR)
    assert resumed.resumed_from == cut
    assert resumed.curve == full.curve
    assert not (tmp_path / "cut" / "run" / PENDING_CURVE).exists()  # in the log now


def test_curve_points_group_by_step_and_skip_other_entries() -> None:
    entries = {"val_mse": 1.0, "max_abs/12/a.b": 2.0, "max_abs/3/a.b": 4.0, "max_abs/3/c": 5.0}
    assert curve_points(entries) == [
        {"step": 3, "max_abs": {"a.b": 4.0, "c": 5.0}},
        {"step": 12, "max_abs": {"a.b": 2.0}},
    ]


def test_curve_arguments_are_checked(tmp_path: Path) -> None:
    model = Probed(8, 4, 2)
    with pytest.raises(ValueError, match="every"):
        TrainingCurve(model, MONITOR, 0)
    with pytest.raises(TypeError, match="every"):
        TrainingCurve(model, MONITOR, 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="patterns"):
        TrainingCurve(model, ["nothing"], 1)
    ctx = RunContext(out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="points_per_epoch"):
        train_forecaster(
            model,
            _splits(),
            RECIPE,
            ctx,
            "run",
            seed=0,
            identity="a",
            monitor=MONITOR,
            points_per_epoch=0,
        )


def test_a_step_is_recorded_over_all_its_micro_batches() -> None:
    """Several forward passes of one step give one point: the maximum over them."""
    model = Probed(2, 1, 1).eval()
    curve = TrainingCurve(model, ["first"], 2)
    batches = [torch.tensor(np.full((1, 2, 1), v, dtype=np.float32)) for v in (1.0, -7.0, 3.0)]
    for step, x in zip((0, 1, 1), batches, strict=True):  # step 1 (the 2nd) has two passes
        curve.before_batch(step)
        model(x)
    curve.before_batch(2)
    model(torch.full((1, 2, 1), 9.0))
    assert curve.flush() == {"max_abs/2/first": 7.0}
    assert curve.flush() == {}

"""Training of the forecasters through the Trainer (``hopfield.experiments.forecasting_common``):
schedules, epochs, early stopping, best-epoch restore, metrics, timing, resume, run records and
stand-in data."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from hopfield.data import DataNotFoundError
from hopfield.data.timeseries import (
    DATASETS,
    ForecastSplits,
    load_forecasting,
    load_series,
    make_splits,
)
from hopfield.experiments.forecasting_common import (
    EpochClock,
    ForecastFit,
    ForecastRecipe,
    epoch_lr_factor,
    epoch_steps,
    evaluate,
    load_splits,
    reusable,
    save_run,
    train_forecaster,
)
from hopfield.experiments.results import RunContext
from hopfield.training import latest_checkpoint


class Flat(nn.Module):
    """A linear forecaster ``(B, T, C) -> (B, τ, C)``."""

    def __init__(self, in_len: int, out_len: int, channels: int) -> None:
        super().__init__()
        self.out_len, self.channels = out_len, channels
        self.linear = nn.Linear(in_len * channels, out_len * channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x.flatten(1)).view(x.shape[0], self.out_len, self.channels)


class Offset(nn.Module):
    """Forecasts the constant ``offset`` for every step; ``frozen`` leaves only a parameter with
    a zero gradient to train, so the forecasts never change."""

    def __init__(self, out_len: int, offset: float, frozen: bool = False) -> None:
        super().__init__()
        self.out_len = out_len
        self.offset = nn.Parameter(torch.tensor(offset), requires_grad=not frozen)
        self.idle = nn.Parameter(torch.zeros(()))

    def forward(self, x: Tensor) -> Tensor:
        level = self.offset + 0.0 * self.idle
        return level.expand(x.shape[0], self.out_len, x.shape[-1])


def _ctx(root: Path, **limits: Any) -> RunContext:
    return RunContext(out_dir=root, progress=False, **limits)


def _train(
    model: nn.Module,
    splits: ForecastSplits,
    recipe: ForecastRecipe,
    ctx: RunContext,
    folder: str = "run",
    identity: Any = "run-a",
) -> ForecastFit:
    return train_forecaster(model, splits, recipe, ctx, folder, seed=5, identity=identity)


def _shifted_splits() -> ForecastSplits:
    """Training rows around 0 and validation rows around 6 (training standardisation): the more a
    model learns the training level, the worse it validates."""
    rng = np.random.default_rng(0)
    values = rng.standard_normal((300, 1))
    values[200:] += 6.0
    return make_splits(values, 4, 2, (200, 50, 50))


def test_epoch_lr_factors() -> None:
    factors = [epoch_lr_factor("type1", e, 20) for e in range(1, 14)]
    assert factors == [
        1,
        1,
        0.5,
        0.5,
        0.25,
        0.25,
        0.125,
        0.125,
        1 / 16,
        1 / 16,
        1 / 32,
        1 / 32,
        1 / 32,
    ]
    assert epoch_lr_factor("cosine", 1, 4) == 1.0
    assert epoch_lr_factor("cosine", 3, 4) == pytest.approx(0.5)
    assert epoch_lr_factor("constant", 7, 4) == 1.0
    with pytest.raises(ValueError, match="schedule"):
        epoch_lr_factor("step", 1, 1)
    with pytest.raises(ValueError, match="epoch"):
        epoch_lr_factor("type1", 0, 1)


def test_recipe_checks_its_fields() -> None:
    assert ForecastRecipe(batch_size=16).eval_batch == 16
    assert ForecastRecipe(batch_size=16, eval_batch_size=4).eval_batch == 4
    bad: list[tuple[dict[str, Any], str]] = [
        ({"optimizer": "sgd"}, "optimizer"),
        ({"schedule": "step"}, "schedule"),
        ({"epochs": 0}, "epochs"),
        ({"patience": 0}, "patience"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"max_train_batches": 0}, "max_train_batches"),
        ({"max_eval_batches": 0}, "max_eval_batches"),
        ({"eval_batch_size": 0}, "eval_batch_size"),
        ({"lr": 0.0}, "lr"),
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"grad_clip": -1.0}, "grad_clip"),
    ]
    for fields, name in bad:
        with pytest.raises(ValueError, match=name):
            ForecastRecipe(**fields)


def test_epoch_steps_drop_the_last_batch_and_cap() -> None:
    assert epoch_steps(100, ForecastRecipe(batch_size=32)) == 3
    assert epoch_steps(100, ForecastRecipe(batch_size=32, max_train_batches=2)) == 2
    assert epoch_steps(100, ForecastRecipe(batch_size=32, max_train_batches=9)) == 3
    with pytest.raises(ValueError, match="fewer than one batch"):
        epoch_steps(10, ForecastRecipe(batch_size=32))


def test_evaluate_is_the_exact_element_mean() -> None:
    splits = load_forecasting("synthetic", 12, 4, max_rows=300)
    model = Flat(12, 4, 7)
    model.train()
    mse = evaluate(model, splits.test, batch_size=7)
    assert model.training  # the mode is restored
    xs, ys = splits.test.batch(torch.arange(len(splits.test)))
    with torch.no_grad():
        diff = model(xs) - ys
    assert mse["mse"] == pytest.approx(float(diff.square().mean()), rel=1e-5)
    assert mse["mae"] == pytest.approx(float(diff.abs().mean()), rel=1e-5)
    first = evaluate(model, splits.test, batch_size=7, max_batches=1)
    assert first["mse"] == pytest.approx(float(diff[:7].square().mean()), rel=1e-5)
    with pytest.raises(ValueError, match="max_batches"):
        evaluate(model, splits.test, max_batches=0)


def test_training_learns_with_the_per_epoch_schedule(tmp_path: Path) -> None:
    splits = load_forecasting("synthetic", 24, 6, max_rows=600)
    model = Flat(24, 6, 7)
    before = evaluate(model, splits.val)["mse"]
    recipe = ForecastRecipe(
        epochs=4, batch_size=32, lr=3e-3, optimizer="adamw", weight_decay=0.01, patience=4
    )
    fit = _train(model, splits, recipe, _ctx(tmp_path))
    per_epoch = len(splits.train) // 32  # the last incomplete batch is dropped
    assert (fit.epoch_steps, fit.steps, fit.epochs_run) == (per_epoch, 4 * per_epoch, 4)
    assert fit.finished and not fit.stopped_early and fit.resumed_from is None
    assert [h["epoch"] for h in fit.history] == [1, 2, 3, 4]
    assert [h["lr"] for h in fit.history] == pytest.approx([3e-3, 3e-3, 1.5e-3, 1.5e-3])  # type1
    best = min(h["val_mse"] for h in fit.history)
    assert best < before
    assert fit.history[fit.best_epoch - 1]["val_mse"] == best
    assert evaluate(model, splits.val, recipe.eval_batch)["mse"] == pytest.approx(best, rel=1e-6)
    assert all(h["seconds"] > 0 and h["cpu_seconds"] >= 0 for h in fit.history)
    assert fit.seconds_per_epoch == pytest.approx(sum(h["seconds"] for h in fit.history) / 4)
    record = fit.to_dict()
    assert record["cpu_seconds_per_epoch"] == fit.cpu_seconds_per_epoch
    assert record["history"] == fit.history and json.dumps(record)


def test_max_train_batches_caps_the_epoch(tmp_path: Path) -> None:
    splits = load_forecasting("synthetic", 24, 6, max_rows=600)
    recipe = ForecastRecipe(epochs=3, batch_size=16, max_train_batches=2, max_eval_batches=1)
    fit = _train(Flat(24, 6, 7), splits, recipe, _ctx(tmp_path))
    assert (fit.epoch_steps, fit.steps, len(fit.history)) == (2, 6, 3)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [2, 4, 6]


def test_early_stopping_restores_the_best_epoch(tmp_path: Path) -> None:
    """Validation worsens every epoch: epoch 1 is best, patience 2 stops after epoch 3, and the
    model holds epoch 1's weights, not the last ones."""
    splits = _shifted_splits()
    model = Offset(2, offset=6.0)
    recipe = ForecastRecipe(epochs=10, batch_size=32, lr=0.05, patience=2, schedule="constant")
    fit = _train(model, splits, recipe, _ctx(tmp_path))
    val = [h["val_mse"] for h in fit.history]
    assert val == sorted(val) and len(set(val)) == 3
    assert (fit.best_epoch, fit.epochs_run, fit.stopped_early, fit.finished) == (1, 3, True, True)
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert kept == ["step-12", "step-18"]  # the newest and the one before (the fallback)
    newest = latest_checkpoint(tmp_path / "run")
    saved = torch.load(newest / "custom_checkpoint_1.pkl", weights_only=False)  # the trainer's
    last = load_file(newest / "model.safetensors")["offset"]
    best = saved["best_state"]["offset"]
    assert float(model.offset.detach()) == float(best) != float(last)
    assert evaluate(model, splits.val, recipe.eval_batch)["mse"] == pytest.approx(val[0])


def test_an_equal_validation_is_no_improvement(tmp_path: Path) -> None:
    splits = _shifted_splits()
    recipe = ForecastRecipe(epochs=10, batch_size=32, patience=2, schedule="constant")
    fit = _train(Offset(2, offset=1.0, frozen=True), splits, recipe, _ctx(tmp_path))
    assert len({h["val_mse"] for h in fit.history}) == 1
    assert (fit.best_epoch, fit.epochs_run, fit.stopped_early) == (1, 3, True)


def test_a_stopped_run_resumes_to_the_uninterrupted_one(tmp_path: Path) -> None:
    splits = load_forecasting("synthetic", 24, 6, max_rows=500)
    recipe = ForecastRecipe(epochs=3, batch_size=32, lr=1e-3, patience=5)

    def trained(ctx: RunContext, folder: str, identity: str = "run-a") -> tuple[Flat, ForecastFit]:
        torch.manual_seed(1)
        model = Flat(24, 6, 7)
        return model, _train(model, splits, recipe, ctx, folder, identity)

    full_model, full = trained(_ctx(tmp_path), "full")
    stop = full.epoch_steps + 2  # inside the second epoch
    _, cut = trained(_ctx(tmp_path, stop_after=stop), "cut")
    assert (cut.steps, cut.finished, len(cut.history)) == (stop, False, 1)
    resumed_model, resumed = trained(_ctx(tmp_path), "cut")
    assert resumed.resumed_from == stop and resumed.finished
    for name in ("val_mse", "train_mse", "lr"):
        assert [h[name] for h in resumed.history] == [h[name] for h in full.history]
    assert resumed.history[0]["seconds"] == cut.history[0]["seconds"]  # from the checkpoint
    for a, b in zip(full_model.parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(a, b)
    _, other = trained(_ctx(tmp_path), "cut", identity="run-b")  # another run: starts over
    assert other.resumed_from is None and other.steps == full.steps


def test_epoch_clock() -> None:
    clock = EpochClock()
    with pytest.raises(RuntimeError, match="start"):
        clock.lap()
    clock.start()
    first = clock._started
    clock.start()  # a running clock keeps its start
    assert clock._started == first
    sum(i * i for i in range(20_000))
    wall, cpu = clock.lap()
    assert wall > 0 and cpu >= 0
    with pytest.raises(RuntimeError):
        clock.lap()


def test_a_fit_without_epochs_has_no_time_per_epoch() -> None:
    fit = ForecastFit(0, 0, 10, 2, False, False, None, 1)
    assert math.isnan(fit.seconds_per_epoch) and math.isnan(fit.cpu_seconds_per_epoch)


def test_run_records_are_reused_only_for_the_same_run_and_limit(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    runs: dict[str, Any] = {}
    identity = {"lr": 1e-3, "setting": ("ETTh1", 24)}
    for folder in ("a", "b"):
        (tmp_path / folder / "checkpoints" / "step-1").mkdir(parents=True)
    save_run(ctx, runs, "a", {"mse": 1.0}, identity=identity, folder="a", finished=True)
    save_run(ctx, runs, "b", {"mse": 2.0}, identity=identity, folder="b", finished=False)
    assert not (tmp_path / "a" / "checkpoints").exists()  # finished: checkpoints deleted
    assert (tmp_path / "b" / "checkpoints" / "step-1").is_dir()  # kept to resume
    saved = json.loads((tmp_path / "runs.json").read_text())
    assert saved == runs and saved["a"]["stop_after"] is None
    assert reusable(saved["a"], identity, ctx)
    assert not reusable(saved["a"], {**identity, "lr": 1e-4}, ctx)
    assert not reusable(saved["a"], identity, _ctx(tmp_path, stop_after=2))
    assert not reusable(None, identity, ctx)


def test_stand_in_series_replace_an_absent_file(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="ETTh1"):
        load_splits(RunContext(out_dir=tmp_path / "out", data_dir=tmp_path), "ETTh1", 24, 8)
    ctx = RunContext(out_dir=tmp_path / "out", data_dir=tmp_path, stand_in_data=True)
    splits, source = load_splits(ctx, "WTH", 48, 24, protocol="stanhop")
    assert source.startswith("STAND-IN") and "WTH" in source
    assert splits.series.shape == DATASETS["WTH"].shape and splits.num_inputs == 12
    assert len(splits.train) == 28 * 720 - 48 - 24 + 1  # the month split of the real file
    again, _ = load_splits(ctx, "WTH", 48, 24, protocol="stanhop")
    assert torch.equal(again.series, splits.series)  # the same on every process
    uni, _ = load_splits(ctx, "ECL", 24, 24, features="S")
    assert uni.num_inputs == 1 and uni.columns[-1] == DATASETS["ECL"].target


def test_the_stand_in_shapes_are_the_files_shapes(shared_data: Path, tmp_path: Path) -> None:
    for name in ("ETTh1", "ETTm1", "WTH"):
        values, _ = load_series(name, shared_data)
        assert values.shape == DATASETS[name].shape, name
    ctx = RunContext(out_dir=tmp_path, data_dir=shared_data, stand_in_data=True)
    splits, source = load_splits(ctx, "ETTh1", 24, 8)  # present: the file, not a stand-in
    assert source == "ETTh1" and splits.series.shape == (17_420, 7)

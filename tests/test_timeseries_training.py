"""Training loop of the forecasters: schedules, early stopping, metrics, checkpoint and resume."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from hopfield.data.timeseries import load_forecasting
from hopfield.models.forecasting import TrainConfig, evaluate, fit, learning_rate


class Flat(nn.Module):
    """A linear forecaster ``(B, T, C) -> (B, τ, C)``."""

    def __init__(self, in_len: int, out_len: int, channels: int) -> None:
        super().__init__()
        self.out_len, self.channels = out_len, channels
        self.linear = nn.Linear(in_len * channels, out_len * channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x.flatten(1)).view(x.shape[0], self.out_len, self.channels)


def test_type1_and_cosine_schedules() -> None:
    lrs = [learning_rate("type1", 1.0, e, 20) for e in range(1, 14)]
    assert lrs == [1, 1, 0.5, 0.5, 0.25, 0.25, 0.125, 0.125, 1 / 16, 1 / 16, 1 / 32, 1 / 32, 1 / 32]
    assert learning_rate("cosine", 2.0, 1, 4) == 2.0
    assert learning_rate("cosine", 2.0, 3, 4) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="schedule"):
        learning_rate("step", 1.0, 1, 1)
    with pytest.raises(ValueError, match="optimizer"):
        TrainConfig(optimizer="sgd")


def test_evaluate_is_the_exact_element_mean() -> None:
    splits = load_forecasting("synthetic", 12, 4, max_rows=300)
    model = Flat(12, 4, 7)
    mse = evaluate(model, splits.test, batch_size=7)
    xs, ys = splits.test.batch(torch.arange(len(splits.test)))
    with torch.no_grad():
        diff = model(xs) - ys
    assert mse["mse"] == pytest.approx(float(diff.square().mean()), rel=1e-5)
    assert mse["mae"] == pytest.approx(float(diff.abs().mean()), rel=1e-5)


def test_fit_learns_and_restores_the_best_epoch() -> None:
    splits = load_forecasting("synthetic", 24, 6, max_rows=600)
    model = Flat(24, 6, 7)
    before = evaluate(model, splits.val)["mse"]
    result = fit(model, splits, TrainConfig(epochs=4, batch_size=32, lr=3e-3, patience=4))
    assert result.val["mse"] < before
    best = min(h["val_mse"] for h in result.history)
    assert result.val["mse"] == pytest.approx(best, rel=1e-5)
    assert result.history[result.best_epoch - 1]["val_mse"] == best
    assert result.seconds_per_epoch > 0 and result.cpu_seconds_per_epoch > 0
    assert result.epochs_run == 4 and result.to_dict()["cpu_seconds_per_epoch"] > 0


def test_early_stopping_counts_patience() -> None:
    splits = load_forecasting("synthetic", 24, 6, max_rows=600)
    model = Flat(24, 6, 7)
    # lr 0 never improves after epoch 1, so training stops after 1 + patience epochs.
    config = TrainConfig(epochs=10, batch_size=64, lr=0.0, patience=2, schedule="constant")
    result = fit(model, splits, config)
    assert result.epochs_run == 3 and result.best_epoch == 1


class Interrupt(Exception):
    pass


def test_checkpoint_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    splits = load_forecasting("synthetic", 24, 6, max_rows=500)
    config = TrainConfig(epochs=3, batch_size=32, lr=1e-3, patience=5)

    def trained(progress=None) -> tuple[nn.Module, object]:  # type: ignore[no-untyped-def]
        torch.manual_seed(1)
        model = Flat(24, 6, 7)
        gen = torch.Generator().manual_seed(5)
        return model, fit(model, splits, config, generator=gen, checkpoint=ckpt, progress=progress)

    def stop_after_one(epochs: Iterable[int], total: int, desc: str) -> Iterator[int]:
        for i, epoch in enumerate(epochs):
            if i == 1:
                raise Interrupt
            yield epoch

    ckpt = tmp_path / "ckpt.pt"
    full_model, full = trained()
    assert not ckpt.exists()
    with pytest.raises(Interrupt):
        trained(stop_after_one)
    assert ckpt.exists()
    resumed_model, resumed = trained()
    assert [h["val_mse"] for h in resumed.history] == [h["val_mse"] for h in full.history]  # type: ignore[attr-defined]
    for a, b in zip(full_model.parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(a, b)

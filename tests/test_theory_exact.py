"""The ``theory`` rows of issue 15: Cor. 4.1.2, App. B.1, §4.1's INT8 premise and Hyper-SET's
identities; each check passes on the library and fails on a broken stand-in."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

import hopfield.experiments.theory_hyperset as hyperset_rows
from hopfield.experiments.theory import (
    PRESETS,
    BoundTally,
    check_corollary_412,
    memory_separation,
    one_step_bound,
    sparse_trials,
    well_separated,
)
from hopfield.experiments.theory_outliers import (
    check_int8_outlier,
    check_softmax1_example,
    others_error,
)
from hopfield.nn.hyperset import HyperSETEncoder

TINY = replace(PRESETS["tiny"], sparse_sizes=(50,), sparse_betas=(0.2,), trials=2)


def test_one_step_bound_and_tally_by_hand() -> None:
    bound = one_step_bound(3, 1.0, torch.tensor([1.0]), torch.tensor([0.1]), 2.0)
    assert float(bound) == pytest.approx(2 * 2 * math.exp(-2 * (1 - 0.2)))
    tally = BoundTally()
    tally.add(torch.tensor([0.5, 1.0]), torch.tensor([1.0, 3.0]), 1.0)  # holds, bound vacuous
    tally.add(torch.tensor([]), torch.tensor([]), 1.0)  # no trial
    assert (tally.count, tally.violations, tally.nonvacuous) == (2, 0, 1)
    assert tally.margin == pytest.approx(0.25)
    tally.add(torch.tensor([0.5]), torch.tensor([0.4]), 1.0)
    assert tally.violations == 1 and tally.margin == pytest.approx(-0.05)


def test_memory_separation_of_well_separated_memories() -> None:
    memories = well_separated(torch.Generator().manual_seed(0), 6, 16, math.radians(20.0))
    delta = memory_separation(memories)
    torch.testing.assert_close(delta[:4], torch.ones(4, dtype=torch.float64))
    expected = torch.full((2,), 1 - math.cos(math.radians(20.0)), dtype=torch.float64)
    torch.testing.assert_close(delta[4:], expected)
    assert memory_separation(memories[None]).shape == (1, 6)


def test_corollary_412_passes_and_catches_a_larger_error() -> None:
    trials = sparse_trials(TINY, torch.Generator().manual_seed(0))
    row = check_corollary_412(TINY, trials)
    assert row.status == "pass" and row.trials > 0 and "non-vacuous" in row.check
    nonvacuous = int(row.check.split("in ")[-1].split()[0])
    assert 0 < nonvacuous <= row.trials
    for group in trials:  # every error pushed to the largest possible, 2m: bounds below it fail
        group.errors = {name: error + 2 * group.radius for name, error in group.errors.items()}
    broken = check_corollary_412(replace(TINY, separation_sizes=(10,), trials=1), trials)
    assert broken.status == "fail" and broken.violations > 0


def test_softmax1_example_and_int8_outlier_rows() -> None:
    example = check_softmax1_example()
    assert example.status == "pass" and example.trials == 3
    assert example.margin == pytest.approx(math.exp(-10) / (1 + 3 * math.exp(-10)) - 4.5e-5)
    row = check_int8_outlier(TINY)
    assert row.status == "pass" and row.trials == 2 * 3 * 2  # trials × outliers × quantizers
    assert row.margin > 0.3  # even a 2x outlier widens the asymmetric range by 1.3x or more


def test_others_error_is_the_rms_int8_error_of_the_other_entries() -> None:
    x = torch.tensor([[127.0, 1.0, -1.0, 0.4]], dtype=torch.float64)
    # symmetric grid of step 1: the entries 1..3 round to 1, -1, 0
    assert float(others_error(x, "weight")[0]) == pytest.approx(math.sqrt(0.4**2 / 3))
    spiked = x.clone()
    spiked[0, 0] = 10 * 127.0  # step 10: every other entry rounds to 0
    assert float(others_error(spiked, "weight")[0]) == pytest.approx(math.sqrt((1 + 1 + 0.16) / 3))
    assert others_error(spiked, "activation")[0] > others_error(x, "activation")[0]


def test_hyperset_rows_pass_and_catch_broken_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    config = PRESETS["tiny"]
    rows = hyperset_rows.hyperset_checks(config)
    assert [r.status for r in rows] == ["pass"] * 3
    assert rows[0].trials == 2 * 7 * config.hyperset_trials  # two comparisons per energy
    generator = torch.Generator().manual_seed(0)

    real_update = hyperset_rows.feedforward_update
    monkeypatch.setattr(hyperset_rows, "feedforward_update", lambda *a, **k: -real_update(*a, **k))
    assert hyperset_rows.check_gradients(config, generator).violations == 4 * config.hyperset_trials
    monkeypatch.undo()

    real_layer = hyperset_rows._layer

    def doubled_gain(*args: object) -> hyperset_rows.HyperSETLayer:
        layer = real_layer(*args)  # type: ignore[arg-type]
        with torch.no_grad():
            layer.ff_norm.weight.fill_(2.0)
        return layer

    monkeypatch.setattr(hyperset_rows, "_layer", doubled_gain)
    assert hyperset_rows.check_spheres(config, generator).status == "fail"
    monkeypatch.undo()

    class Stepping(HyperSETEncoder):
        def reset_parameters(self) -> None:
            super().reset_parameters()
            if self.step_sizes is not None:
                torch.nn.init.constant_(self.step_sizes.step.bias, 0.1)

    monkeypatch.setattr(hyperset_rows, "HyperSETEncoder", Stepping)
    moving = hyperset_rows.check_identity(config, generator)
    assert moving.violations == moving.trials > 0 and moving.margin < 0

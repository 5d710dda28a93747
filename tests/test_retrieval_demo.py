"""The quick-start demo: centred digits, a β sweep from blends to single digits, three maps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from hopfield.cli import main
from hopfield.experiments import ConfigError, run_experiment
from hopfield.experiments.retrieval_demo import (
    PRESETS,
    Config,
    centre_and_scale,
    check_config,
    make_queries,
    mixed_patterns,
    success,
    sweep,
)
from hopfield.functional import Softmax, Sparsemax


def test_patterns_are_centred_and_scaled_to_norm_sqrt_d() -> None:
    pixels = torch.rand(30, 64, dtype=torch.float64) * 2 - 1
    patterns, mean, spread = centre_and_scale(pixels)
    assert torch.allclose(mean, pixels.mean(dim=0))
    assert torch.allclose(patterns.norm(dim=1), torch.full((30,), 8.0, dtype=torch.float64))
    centred = pixels - mean  # the same direction as the pattern
    cosine = torch.nn.functional.cosine_similarity(patterns, centred, dim=1)
    assert torch.allclose(cosine, torch.ones(30, dtype=torch.float64))
    assert spread == pytest.approx((centred.norm(dim=1) / 8).mean().item())
    flat, _, _ = centre_and_scale(torch.ones(3, 64, dtype=torch.float64))
    assert bool((flat == 0).all())  # rows equal to the mean stay 0, not NaN


def test_half_masked_queries_keep_the_upper_half_and_zero_the_lower() -> None:
    memories = torch.randn(5, 64, dtype=torch.float64)
    queries = make_queries(memories, 0.5, torch.Generator().manual_seed(0))
    masked = queries["half-masked"].view(5, 8, 8)
    assert torch.equal(masked[:, :4], memories.view(5, 8, 8)[:, :4])
    assert bool((masked[:, 4:] == 0).all())
    noise = queries["noisy"] - memories
    assert 0.3 < noise.std().item() < 0.7


def test_large_beta_lands_on_one_pattern_and_small_beta_blends_all() -> None:
    memories, _, _ = centre_and_scale(torch.randn(40, 64, dtype=torch.float64))
    queries = memories + 0.3 * torch.randn(40, 64, dtype=torch.float64)
    for separation in (Softmax(), Sparsemax()):
        clean = sweep(memories, queries, separation, 5.0, (1, 3))
        assert set(clean) == {1, 3}
        assert bool(success(clean[3], memories, 0.2).all())
        assert mixed_patterns(clean[3], memories, separation, 5.0).max().item() < 1.01
    blend = sweep(memories, queries, Softmax(), 0.001, (3,))[3]
    assert mixed_patterns(blend, memories, Softmax(), 0.001).min().item() > 39
    assert not bool(success(blend, memories, 0.2).any())
    # three steps from the query are one step, then two more
    one_then_two = sweep(memories, queries, Softmax(), 0.3, (1, 3))[3]
    three = sweep(memories, queries, Softmax(), 0.3, (3,))[3]
    assert torch.allclose(one_then_two, three)


def test_tiny_run_shows_the_transition_and_softmax1_equals_softmax(tmp_path: Path) -> None:
    record = json.loads(
        run_experiment("retrieval-demo", "tiny", tmp_path, progress=False).read_text()
    )
    results = record["results"]
    masked, noisy, mixed = (
        {(row[0], row[1]): row[2:] for row in table["rows"]} for table in results["tables"]
    )
    for name in ("Softmax", "Softmax_1", "Sparsemax"):
        assert masked[name, 3][-1] == 1.0 and noisy[name, 3][-1] == 1.0  # β = 1: every digit
        assert mixed[name, 3][-1] < 1.01  # ... and each one alone
    assert masked["Softmax", 3][0] < 0.5 and mixed["Softmax", 3][0] > 2  # β = 0.1: blends
    assert masked["Softmax_1", 3] == masked["Softmax", 3]
    assert results["metrics"]["softmax1 smallest weight sum"] > 0.95
    assert results["figures"] == ["retrieval_demo.png"]
    assert (tmp_path / "retrieval-demo" / "retrieval_demo.png").stat().st_size > 1000


def test_small_preset_retrieves_most_half_masked_digits_at_large_beta(tmp_path: Path) -> None:
    """The quick start's headline (README): at β = 5 and 3 steps every map retrieves about 90 %
    of the 200 half-masked digits, at β = 0.02 none."""
    path = run_experiment(
        "retrieval-demo", "small", tmp_path, progress=False, overrides={"figure": "false"}
    )
    table = json.loads(path.read_text())["results"]["tables"][0]
    beta5, beta002 = table["columns"].index("β=5"), table["columns"].index("β=0.02")
    for row in table["rows"]:
        if row[1] == 3:
            assert row[beta5] >= 0.85 and row[beta002] == 0.0, row


def test_bad_settings_are_config_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    check_config(PRESETS["paper"])
    for bad in (
        Config(grid_betas=(7.0,)),
        Config(betas=(1.0, 0.5), grid_betas=(1.0,)),
        Config(betas=(0.0, 1.0), grid_betas=(1.0,)),
        Config(betas=(math.inf,), grid_betas=(math.inf,)),
        Config(steps=(0,)),
        Config(separations=("entmax",)),
        Config(num_memories=5000),
        Config(num_memories=5),
    ):
        with pytest.raises(ConfigError):
            check_config(bad)
    command = ["run", "retrieval-demo", "--preset", "tiny", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as stop:
        main([*command, "--set", "grid_betas=[7]"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err == "hopfield run: grid_betas must be taken from betas, got (7.0,)\n"

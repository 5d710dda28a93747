"""The opt-in ``svr`` model of ``memory-capacity`` (nonparametric §3's fitted SVR memory)."""

from __future__ import annotations

import math

import pytest
import torch

from hopfield.experiments import run_experiment
from hopfield.experiments.memory_capacity import (
    EFFICIENT_MODELS,
    PRESETS,
    SVR_MODEL,
    Point,
    efficient_trends,
    make_model,
    run_model,
    svr_memory,
)
from hopfield.experiments.runner import load_record


def test_svr_is_in_the_small_and_paper_presets_only() -> None:
    # It fits an SVR per memory set (float64, M × M duals): too slow for the tiny test preset.
    assert SVR_MODEL not in PRESETS["tiny"].efficient_models
    for name in ("small", "paper"):
        assert PRESETS[name].efficient_models == (*EFFICIENT_MODELS, SVR_MODEL)
    assert all(SVR_MODEL not in config.models for config in PRESETS.values())


def test_adding_svr_leaves_the_other_models_unchanged(tmp_path) -> None:
    """Memory sets and queries are drawn before any model runs: a run with the svr row gives
    every other model the numbers of a run without it."""
    overrides = {"models": "[]", "throughput": "null", "memory_sizes": "[10]", "steps": "[1]"}
    points = {}
    for models in ('["dense", "random-50", "random-features"]',
                   '["svr", "dense", "random-50", "random-features"]'):  # fmt: skip
        path = run_experiment(
            "memory-capacity",
            "tiny",
            tmp_path / str(len(points)),
            progress=False,
            overrides={**overrides, "efficient_models": models},
        )
        rows = load_record(path)["results"]["tables"][1]["rows"]
        points[models] = [r for r in rows if r[3] != SVR_MODEL]
    without, with_svr = points.values()
    assert without == with_svr and len(without) == 3


def test_svr_is_in_no_stated_trend() -> None:
    points = [
        Point("d", "half", model, "nonparametric", 1.0, 1, size, 0.0, 3, {"cos": values})
        for model, values in (("random-50", [0.5, 0.6, 0.4]), ("svr", [0.1, 0.2, 0.1]))
        for size in (10, 30)
    ]
    rows = efficient_trends(points, ["random-50", "svr"], "d, half", 10, 30)
    assert rows == []  # random masks are compared only with the figure's models


def test_svr_memory_interpolates_and_matches_its_formula() -> None:
    g = torch.Generator().manual_seed(0)
    memories = torch.rand(2, 12, 16, generator=g)
    beta = 0.5
    for patterns in memories:
        memory = svr_memory(patterns, beta)
        assert memory.kkt_violation <= 1e-10
        # ε = 0 and C never binding: every memory is a fixed point of T_SVR.
        torch.testing.assert_close(memory(patterns.double()), patterns.double(), rtol=0, atol=1e-8)
        # T_SVR(x) = Σ_µ coef_µ exp(β⟨ξ_µ, x⟩) / (h(ξ_µ) h(x)), h(x) = Σ_ν exp(β⟨ξ_ν, x⟩).
        x = torch.rand(5, 16, generator=g, dtype=torch.float64)
        p = patterns.double()
        h_x, h_key = torch.exp(beta * x @ p.T).sum(-1), torch.exp(beta * p @ p.T).sum(-1)
        expected = (torch.exp(beta * x @ p.T) / (h_x[:, None] * h_key[None])) @ memory.coef
        torch.testing.assert_close(memory(x), expected, rtol=1e-12, atol=1e-12)
    model = make_model(SVR_MODEL, "nonparametric", beta, 0)
    queries = memories.clone()
    queries[..., 8:] = 0
    outs, rise = run_model(model, queries, memories, (1, 3))
    assert rise is None and set(outs) == {1, 3}
    # Steps iterate the same map: three steps from the query are one step from step two.
    two = run_model(model, queries, memories, (2,))[0][2]
    torch.testing.assert_close(
        outs[3], run_model(model, two, memories, (1,))[0][1], rtol=1e-5, atol=1e-5
    )
    assert outs[1].dtype == queries.dtype and not bool(outs[1].isnan().any())


def test_tiny_run_with_the_svr_row(tmp_path) -> None:
    path = run_experiment(
        "memory-capacity",
        "tiny",
        tmp_path,
        progress=False,
        overrides={"models": "[]", "efficient_models": '["dense", "svr"]', "throughput": "null"},
    )
    table = load_record(path)["results"]["tables"][1]
    col = {c: i for i, c in enumerate(table["columns"])}
    rows = [r for r in table["rows"] if r[col["model"]] == SVR_MODEL]
    assert {(r[col["M"]], r[col["steps"]]) for r in rows} == {(10, 1), (10, 2), (30, 1), (30, 2)}
    for row in rows:
        for name in ("success cos", "success rel", "success nearest"):
            assert 0.0 <= row[col[name]] <= 1.0
        assert math.isfinite(row[col["MSE"]])


def test_unknown_model_names_svr_among_the_known() -> None:
    with pytest.raises(ValueError, match="svr"):
        make_model("svm", "nonparametric", 1.0, 0)

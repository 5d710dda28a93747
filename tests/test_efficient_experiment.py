"""The ``efficiency`` experiment: measurement helpers, FLOP counts, skipping, resume, tiny run."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hopfield.experiments import efficiency, run_experiment
from hopfield.experiments.efficiency import (
    PRESETS,
    Config,
    analytic_flops,
    fit_slope,
    forward_function,
    make_model,
    measure,
    model_names,
    window_size,
)
from hopfield.experiments.measure import peak_bytes
from hopfield.experiments.results import RunContext
from hopfield.experiments.runner import load_record
from hopfield.functional import Sparsemax
from hopfield.functional.efficient import RandomMask, TopK, Window
from hopfield.functional.efficient_kernel import RandomFeatures


def test_fit_slope_recovers_power_laws() -> None:
    sizes = [256, 512, 1024, 4096]
    assert fit_slope(sizes, [3e-9 * n**2 for n in sizes]) == pytest.approx(2.0)
    assert fit_slope(sizes, [5e-6 * n for n in sizes]) == pytest.approx(1.0)
    assert fit_slope([10], [1.0]) is None


def test_models_and_window_sizes() -> None:
    config = Config(
        models=["dense", "random", "window-fixed", "window-paper"],
        mask_probabilities=[0.1, 0.9],
        fixed_window=12,
    )
    assert model_names(config) == ["dense", "random-0.1", "random-0.9", "window-12", "window-paper"]
    assert window_size("window-paper", 720) == 18 and window_size("window-paper", 1000) == 31
    assert window_size("window-sqrt", 4096) == 64 and window_size("window-12", 99) == 12
    _, structure = make_model("random-0.9", 100, config)
    assert isinstance(structure, RandomMask) and structure.fraction == pytest.approx(0.1)
    assert not structure.training  # deterministic "fixed" evaluation sampling
    assert isinstance(make_model("sparsemax", 10, config)[0], Sparsemax)
    assert isinstance(make_model("topk", 10, config)[1], TopK)
    assert isinstance(make_model("window-sqrt", 100, config)[1], Window)
    assert make_model("rf-relu", 10, config)[1].kernel_name == "relu"  # type: ignore[union-attr]
    assert isinstance(make_model("rf", 10, config)[1], RandomFeatures)
    with pytest.raises(ValueError, match="unknown model"):
        make_model("fast", 10, config)
    with pytest.raises(ValueError, match="mask probability"):
        make_model("random-1.5", 10, config)


def test_analytic_flops_scale_as_the_algorithms() -> None:
    config = Config()

    def slope(name: str) -> float:
        sizes = [1024, 2048, 4096]
        value = fit_slope(sizes, [analytic_flops(name, 4, 1, n, 16, config) for n in sizes])
        assert value is not None
        return value

    assert slope("dense") == pytest.approx(2.0)
    assert slope("linear") == pytest.approx(1.0)
    assert slope("rf") == pytest.approx(1.0)
    assert slope("window-16") == pytest.approx(1.0)
    assert slope("window-sqrt") == pytest.approx(1.5, abs=0.02)
    assert slope("random-0.5") == pytest.approx(2.0)
    # Dense and sparsemax share the products; linear is far cheaper than dense at large L.
    dense = analytic_flops("dense", 4, 1, 4096, 16, config)
    assert dense == 4 * (4 * 4096**2 * 16 + 3 * 4096**2)
    assert analytic_flops("linear", 4, 1, 4096, 16, config) < dense / 100
    assert analytic_flops("random-0.9", 4, 1, 4096, 16, config) < analytic_flops(
        "random-0.1", 4, 1, 4096, 16, config
    )


def test_peak_bytes_sees_temporary_allocations() -> None:
    def work() -> torch.Tensor:
        big = torch.ones(1 << 20)  # 4 MiB, freed before the small result is returned
        return big.sum()

    assert peak_bytes(work) >= 4 * (1 << 20)


@pytest.mark.parametrize("mode", ["association", "layer"])
def test_forward_function_runs_without_grad(mode: str) -> None:
    fn = forward_function(mode, "window-4", 20, 8, Config(layer_heads=2), torch.Generator())
    out = fn()
    assert out.shape == (4, 1, 20, 8) if mode == "association" else (4, 20, 8)
    assert not out.requires_grad
    with pytest.raises(ValueError, match="mode"):
        forward_function("both", "dense", 20, 8, Config(), torch.Generator())


def test_growth_guard_skips_and_says_why(tmp_path: Path) -> None:
    config = Config(
        sizes=[16, 32, 2048],
        dims=[8],
        models=["dense", "linear"],
        repeats=1,
        warmup=0,
        measure_memory=False,
        max_seconds=1e-4,
    )
    points = measure(config, RunContext(tmp_path, progress=False))
    skipped = points["association|8|dense|2048"]
    assert skipped["seconds"] is None and "max_seconds" in skipped["skipped"]
    assert points["association|8|dense|16"]["seconds"] > 0
    assert points["association|8|dense|2048"]["flops"] > 0


def test_tiny_run_tables_figures_and_resume(tmp_path: Path, monkeypatch) -> None:
    path = run_experiment("efficiency", "tiny", tmp_path, progress=False)
    record = load_record(path)
    tables = {t["name"]: t for t in record["results"]["tables"]}
    assert set(tables) == {
        "Slopes and speed-ups",
        "Forward wall time (ms, median)",
        "Forward CPU time (ms, median)",
        "Peak memory (MiB)",
        "Analytic FLOPs",
        "Matrix-product FLOPs",
    }
    tiny = PRESETS["tiny"]
    rows = tables["Forward CPU time (ms, median)"]["rows"]
    assert len(rows) == len(tiny.modes) * len(tiny.dims) * len(model_names(tiny))
    assert all(cell is None or cell > 0 for row in rows for cell in row[3:])
    slopes = tables["Slopes and speed-ups"]["rows"]
    assert all(cell is None or math.isfinite(cell) for row in slopes for cell in row[3:7])
    assert any(k.startswith("slope_cpu_association") for k in record["results"]["metrics"])
    assert any(
        k.startswith("speedup_vs_dense_cpu_association") for k in record["results"]["metrics"]
    )
    for figure in record["results"]["figures"]:
        assert (path.parent / figure).stat().st_size > 0

    # A second run with the same configuration measures nothing again.
    def no_measuring(*args, **kwargs):
        raise AssertionError("resumed run re-measured a point")

    monkeypatch.setattr(efficiency, "_measure_point", no_measuring)
    context = RunContext(path.parent, progress=False)
    again = efficiency.summarise(tiny, efficiency.measure(tiny, context))
    assert again.tables[2].rows == rows
    # A changed configuration starts afresh.
    with pytest.raises(AssertionError, match="re-measured"):
        efficiency.measure(replace(tiny, seed=1), context)


def test_docs_examples_run() -> None:
    import re

    doc = Path(__file__).resolve().parents[1] / "docs" / "efficient.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.DOTALL)
    assert blocks
    for index, block in enumerate(blocks):
        exec(compile(block, f"docs/efficient.md[python block {index}]", "exec"), {})


def test_matrix_products_by_hand() -> None:
    """L = S = 8 memories, d = 4, one head, batch 1: dense 4·8·8·4 = 1024; Top-K(20 %) keeps 1
    of 8: 2·8·8·4 + 2·8·1·4 = 576; linear 4·8·4·4 = 512. No separation or sort is counted, so
    sparsemax equals dense."""
    from hopfield.experiments.efficiency import matrix_product_flops

    config = PRESETS["tiny"]
    count = {
        n: matrix_product_flops(n, 1, 1, 8, 4, config)
        for n in ("dense", "sparsemax", "topk", "linear")
    }
    assert count == {"dense": 1024.0, "sparsemax": 1024.0, "topk": 576.0, "linear": 512.0}
    with pytest.raises(ValueError, match="unknown model"):
        matrix_product_flops("lstm", 1, 1, 8, 4, config)

"""``outlier-cost`` (OutEffHop Table 4): tiny run and its resume, configuration errors, the
paper's ratios, and the ledger's time and memory claims on hand-made records."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hopfield.claims.ledger import evaluate
from hopfield.claims.outeffhop import CLAIMS
from hopfield.experiments import outlier_cost, run_experiment
from hopfield.experiments.outlier_cost import (
    FAMILIES,
    PRESETS,
    VARIANTS,
    Config,
    check_config,
    paper_ratio,
    time_ratio,
)
from hopfield.experiments.registry import ConfigError
from hopfield.experiments.results import RunContext
from hopfield.experiments.runner import load_record


def test_tiny_run_writes_both_variants_every_round_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = run_experiment("outlier-cost", "tiny", tmp_path, progress=False)
    record = load_record(path)
    (table,) = record["results"]["tables"]
    assert [row[0] for row in table["rows"]] == ["BERT", "OPT", "ViT", "STanHop-Net"]
    tiny = PRESETS["tiny"]
    measured = json.loads((path.parent / "measurements.json").read_text())
    assert measured["config"]["rounds"] == tiny.rounds == 3
    for family in FAMILIES:
        found = measured["families"][family]
        assert found["threads"] == 1 and found["device"] == "cpu"
        assert found["parameters"]["softmax"] == found["parameters"]["softmax1"]  # no new weights
        rounds = found["rounds"]
        assert [r["first"] for r in rounds] == ["softmax", "softmax1", "softmax"]  # alternating
        for entry in rounds:
            for variant in VARIANTS:
                assert entry[variant]["wall"] > 0 and entry[variant]["cpu"] > 0
                assert entry[variant]["peak_bytes"] > 0
        ratio = record["results"]["metrics"][f"{family}/time_ratio"]
        assert 0 < ratio < 10 and math.isfinite(ratio)
    assert table["rows"][0][7] == pytest.approx(17.05 / 14.82)  # the paper's BERT time ratio

    def no_measuring(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("a resumed run measured a family again")

    monkeypatch.setattr(outlier_cost, "measure_family", no_measuring)
    context = RunContext(path.parent, progress=False)
    assert outlier_cost.measure(tiny, context) == measured["families"]
    with pytest.raises(AssertionError, match="measured a family again"):
        outlier_cost.measure(replace(tiny, seed=1), context)  # another configuration


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"families": ("bert", "gpt")}, "families"),
        ({"families": ()}, "families"),
        ({"scale": "formation"}, "scale"),
        ({"rounds": 0}, "rounds"),
        ({"steps": 1.5}, "steps"),
        ({"warmup": -1}, "warmup"),
        ({"clock": "gpu"}, "clock"),
        ({"threads": 0}, "threads"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_bad_configurations_name_their_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field) as error:
        check_config(replace(Config(), **change))
    assert isinstance(error.value, ValueError)


@pytest.mark.parametrize(
    ("option", "named"),
    [
        ({"mixed_precision": "bf16"}, "--mixed-precision"),
        ({"micro_batch_size": 2}, "--micro-batch"),
    ],
)
def test_run_options_it_cannot_honour_are_refused(
    tmp_path: Path, option: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        run_experiment("outlier-cost", "tiny", tmp_path, progress=False, **option)
    assert not (tmp_path / "outlier-cost" / "measurements.json").exists()  # refused before timing


def test_every_preset_is_valid_and_the_paper_ratios_are_table_4s() -> None:
    for config in PRESETS.values():
        check_config(config)
    assert PRESETS["small"].rounds == 7  # fixed before the committed run
    assert paper_ratio("opt", 0) == pytest.approx(43.47 / 28.13)
    assert paper_ratio("opt", 1) == 1.0
    assert paper_ratio("vit", 1) == pytest.approx(49.69 / 47.47)


def test_time_ratio_is_the_geometric_mean_of_the_rounds() -> None:
    rounds = [
        {"softmax": {"cpu": 1.0}, "softmax1": {"cpu": 1.2}},
        {"softmax": {"cpu": 2.0}, "softmax1": {"cpu": 2.0 * 1.2}},
    ]
    ratio, low, high = time_ratio(rounds, "cpu")
    assert ratio == pytest.approx(1.2) and low == pytest.approx(1.2) and high == pytest.approx(1.2)


# ------------------------------------------------------------------------------ claims


def write_cost_record(root: Path, slowdowns: list[float], memory: float) -> Path:
    """``root/outlier-cost`` with BERT rounds whose OutEffHop step takes ``slowdowns[i]`` times
    vanilla's 0.1 s (CPU clock) and ``memory`` times its 1 MB peak."""
    rounds = [
        {
            "first": VARIANTS[i % 2],
            "softmax": {"wall": 0.2, "cpu": 0.1, "peak_bytes": 1_000_000},
            "softmax1": {"wall": 0.2, "cpu": 0.1 * s, "peak_bytes": round(1_000_000 * memory)},
        }
        for i, s in enumerate(slowdowns)
    ]
    folder = root / "outlier-cost"
    folder.mkdir(parents=True)
    record = {
        "experiment": "outlier-cost",
        "preset": "small",
        "config": {"clock": "cpu", "rounds": len(rounds)},
        "limits": {"stop_after": None, "micro_batch_size": None, "stand_in_data": False},
        "results": {"tables": [], "metrics": {}, "figures": [], "notes": []},
    }
    (folder / "results.json").write_text(json.dumps(record))
    families = {"bert": {"shape": "toy", "parameters": {}, "rounds": rounds}}
    (folder / "measurements.json").write_text(json.dumps({"families": families}))
    return root


def _verdicts(root: Path) -> dict[str, dict[str, Any]]:
    table4 = tuple(c for c in CLAIMS if c.id.startswith("OEH-T4-"))
    return {r["id"]: r for r in evaluate(root, table4)}


def test_table_4_claims_hold_within_the_papers_overhead_and_fail_beyond_it(
    tmp_path: Path,
) -> None:
    # BERT's paper overhead is 17.05 / 14.82 - 1 = 15.0 %
    cheap = _verdicts(write_cost_record(tmp_path / "cheap", [1.02, 1.04, 1.03] * 2 + [1.01], 1.01))
    time, memory = cheap["OEH-T4-time-bert"], cheap["OEH-T4-memory-bert"]
    assert time["verdict"] == "holds" and time["seeds"] == 7
    assert time["direction"] == "at least" and time["rival"].startswith("vanilla")
    assert memory["verdict"] == "holds" and memory["ours"] == pytest.approx(1.0)
    assert memory["kind"] == "exact" and "over 7 rounds" in memory["note"]
    assert cheap["OEH-T4-time-opt"]["verdict"] == "not run"  # no OPT rounds in the record

    costly = _verdicts(write_cost_record(tmp_path / "costly", [1.25, 1.3, 1.28] * 2 + [1.27], 1.08))
    assert costly["OEH-T4-time-bert"]["verdict"] == "does not hold"
    assert costly["OEH-T4-memory-bert"]["verdict"] == "does not hold"
    assert costly["OEH-T4-memory-bert"]["ours"] == pytest.approx(8.0)

    noisy = _verdicts(write_cost_record(tmp_path / "noisy", [0.9, 1.4, 1.1], 1.0))
    assert noisy["OEH-T4-time-bert"]["verdict"] == "inconclusive"

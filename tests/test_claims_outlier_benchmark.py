"""The OutEffHop claims read from outlier-benchmark: judged only under a passed validity gate
(else not tested, premise absent), per task, paired over seeds; the OPT claims read its LM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hopfield.claims.ledger import CLAIMS, evaluate
from test_claims_ledger import write_record


def _runs(task: str, vanilla: list[float], softmax1: list[float]) -> dict[str, dict[str, Any]]:
    """Runs whose every claim metric takes the given per-seed values."""
    out = {}
    for arm, values in (("vanilla", vanilla), ("softmax1", softmax1)):
        for seed, value in enumerate(values):
            metrics = dict.fromkeys(
                ("sink_mass", "avg_kurtosis", "max_inf_norm", "w8a8_cost_pct"), value
            )
            out[f"{task}/{arm}/seed{seed}"] = {"task": task, "arm": arm, "seed": seed, **metrics}
    return out


def _judge(
    root: Path, gates: dict[str, tuple[float, float]], runs: dict, seeds: int = 6
) -> dict[str, dict]:
    """Ledger records from an outlier-benchmark record with ``gates``: ``task/part`` ->
    (stage 1, stage 2) outcomes."""
    metrics = {}
    for key, (first, second) in gates.items():
        metrics.update({f"{key}/stage1": first, f"{key}/stage2": second,
                        f"{key}/gate_passed": float(first and second)})  # fmt: skip
    side = {"runs.json": {"protocol": {"seeds_per_arm": 6}, "runs": runs}}
    write_record(root, "outlier-benchmark", metrics=metrics, side=side)
    path = root / "outlier-benchmark" / "results.json"
    record = json.loads(path.read_text())
    record["config"] = {"seeds": seeds}
    path.write_text(json.dumps(record))
    return {r["id"]: r for r in evaluate(root)}


VANILLA = [0.80, 0.82, 0.78, 0.85, 0.81, 0.79]


def test_a_failed_gate_means_the_premise_is_absent(tmp_path: Path) -> None:
    runs = _runs("bigram_backcopy", VANILLA, [v - 0.3 for v in VANILLA])
    gates = {"bigram_backcopy/sink": (0.0, 1.0), "bigram_backcopy/outliers": (1.0, 0.0)}
    ledger = _judge(tmp_path, gates, runs)
    sink = ledger["OEH-S2.1-sink-bench-bb"]
    assert sink["verdict"] == "premise absent at this scale"
    assert "premise absent" in sink["note"] and "stage 1" in sink["note"]
    kurt = ledger["OEH-T1-kurtosis-bench-bb"]
    assert kurt["verdict"] == "premise absent at this scale" and "stage 2" in kurt["note"]
    # the LM task has no gate metrics in this record
    assert ledger["OEH-S2.1-sink-bench-lm"]["verdict"] == "not run"


def test_a_passed_gate_judges_softmax1_both_ways(tmp_path: Path) -> None:
    lower = _runs("bigram_backcopy", VANILLA, [v - 0.3 + 0.01 * i for i, v in enumerate(VANILLA)])
    higher = _runs("wikitext", VANILLA, [v + 0.2 + 0.01 * i for i, v in enumerate(VANILLA)])
    gates = {f"{t}/{p}": (1.0, 1.0) for t in ("bigram_backcopy", "wikitext")
             for p in ("sink", "outliers")}  # fmt: skip
    ledger = _judge(tmp_path, gates, {**lower, **higher})
    for what in ("S2.1-sink", "T1-kurtosis", "T1-infnorm", "T1-w8a8"):
        bb, lm = ledger[f"OEH-{what}-bench-bb"], ledger[f"OEH-{what}-bench-lm"]
        assert bb["verdict"] == "holds" and bb["seeds"] == 6, what
        assert lm["verdict"] == "does not hold", what
    # OPT's sink and Table 1 claims read the benchmark's LM when outlier-formation is absent
    assert ledger["OEH-S2.1-sink-opt"]["verdict"] == "does not hold"
    assert ledger["OEH-T1-w8a8-opt"]["experiment"] == "outlier-benchmark"
    assert ledger["OEH-T1-gated-opt"]["verdict"] == "not run"


def test_every_benchmark_claim_names_the_experiment() -> None:
    bench = [c for c in CLAIMS if "-bench-" in c.id]
    assert len(bench) == 8
    assert all(c.experiment == "outlier-benchmark" and c.direction == "lower" for c in bench)


def test_fewer_seeds_than_the_protocol_test_nothing(tmp_path: Path) -> None:
    runs = _runs("bigram_backcopy", VANILLA[:3], [v - 0.3 for v in VANILLA[:3]])
    ledger = _judge(tmp_path, {"bigram_backcopy/sink": (1.0, 1.0)}, runs, seeds=3)
    sink = ledger["OEH-S2.1-sink-bench-bb"]
    assert sink["verdict"] == "not run" and "fewer than the 6" in sink["note"]

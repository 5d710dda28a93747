"""The decisive Softmax_1 outlier test: gate, endpoints, arms and the tiny end-to-end run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from hopfield.experiments import outlier_decisive as od
from hopfield.experiments import outlier_formation as of
from hopfield.experiments.runner import run_experiment

LAYERS = 4


def _run(
    block_max: float,
    *,
    last_block: float = 1.0,
    attention: float = 2.0,
    fp: float = 10.0,
    w8a8: float = 10.3,
    scale: float = 1.0,
) -> dict[str, Any]:
    """A run record with per-tensor statistics: blocks 0…L−2 reach ``block_max``."""
    tensors = {
        f"model.decoder.layers.{i}": {"kurtosis": 3.0 + i, "inf_norm": block_max - i, "rms": 1.0}
        for i in range(LAYERS - 1)
    }
    tensors[f"model.decoder.layers.{LAYERS - 1}"] = {
        "kurtosis": 50.0,
        "inf_norm": last_block,
        "rms": 1.0,
    }
    tensors["model.decoder.layers.0.self_attn.out_proj"] = {
        "kurtosis": 4.0,
        "inf_norm": attention,
        "rms": 1.0,
    }
    return {"tensors": tensors, "median_scale": scale, "fp_ppl": fp, "w8a8_ppl": w8a8}


# --- per-run quantities -------------------------------------------------------------------------


def test_residual_max_leaves_out_the_last_block() -> None:
    run = _run(30.0, last_block=500.0)
    assert od.residual_max(run, LAYERS) == 30.0
    assert od.residual_max(run, LAYERS + 1) == 500.0  # with one more layer it is not the last


def test_tensor_stats_per_kind() -> None:
    run = _run(30.0, last_block=500.0, attention=7.0)
    kurtosis, norm = od.tensor_stats(run, "residual")
    assert kurtosis == pytest.approx((3 + 4 + 5 + 50) / 4) and norm == 500.0
    assert od.tensor_stats(run, "attention") == (4.0, 7.0)
    assert od.tensor_stats(run, "all")[1] == 500.0
    with pytest.raises(ValueError, match="kind"):
        od.tensor_stats(run, "ffn")
    with pytest.raises(ValueError, match="tensors"):
        od.residual_max({"median_scale": 1.0}, LAYERS)


# --- the validity gate ----------------------------------------------------------------------------


def test_gate_passes_with_outliers_a_w8a8_cost_and_a_working_control() -> None:
    vanilla = [_run(30.0 + s, w8a8=10.3) for s in range(6)]
    gated = [_run(10.0, w8a8=10.1) for _ in range(5)] + [_run(25.0)]  # 5 of 6 cut >= 50 %
    verdict = od.gate(vanilla, gated, LAYERS)
    assert verdict.passed and verdict.seeds_cut == 5 and verdict.seeds_needed == 5
    assert verdict.norm_ratios[0] == 30.0 and verdict.gaps_pct[0] == pytest.approx(3.0)
    assert verdict.cuts[0] == pytest.approx(1 - 10 / 30)
    assert "FAILS" not in verdict.reason


@pytest.mark.parametrize(
    ("vanilla", "gated", "failing"),
    [
        # the control cuts max|x| in only 4 of 6 seeds
        ([_run(30.0)] * 6, [_run(10.0)] * 4 + [_run(25.0)] * 2, "gated attention"),
        # no outliers: 15× the median RMS
        ([_run(15.0)] * 6, [_run(5.0)] * 6, "median RMS"),
        # outliers that cost no precision: W8A8 1.5 % worse
        ([_run(30.0, w8a8=10.15)] * 6, [_run(5.0)] * 6, "W8A8"),
    ],
)
def test_gate_fails(
    vanilla: list[dict[str, Any]], gated: list[dict[str, Any]], failing: str
) -> None:
    verdict = od.gate(vanilla, gated, LAYERS)
    assert not verdict.passed
    (failed,) = [part for part in verdict.reason.split("; ") if part.startswith("FAILS")]
    assert failing in failed


def test_gate_needs_pairs() -> None:
    with pytest.raises(ValueError, match="pair"):
        od.gate([_run(30.0)] * 3, [_run(10.0)] * 2, LAYERS)


# --- endpoints -----------------------------------------------------------------------------------


def _primary(base: list[float], new: list[float]) -> od.Comparison:
    endpoint = od.ENDPOINTS[0]
    assert endpoint.primary and endpoint.log
    comparison = od.compare_endpoint(
        endpoint, [_run(x) for x in base], [_run(y) for y in new], LAYERS, ("softmax", "softmax1")
    )
    assert comparison is not None
    return comparison


def test_primary_endpoint_is_the_paired_log_ratio() -> None:
    base = [100.0, 80.0, 120.0, 90.0, 110.0, 95.0]
    new = [30.0, 35.0, 28.0, 40.0, 33.0, 31.0]
    c = _primary(base, new)
    logs = [math.log(y / x) for x, y in zip(base, new, strict=True)]
    assert c.effect == pytest.approx(sum(logs) / 6)
    assert c.p_t == pytest.approx(
        stats.ttest_rel([math.log(y) for y in new], [math.log(x) for x in base]).pvalue
    )
    assert c.p_wilcoxon == pytest.approx(stats.wilcoxon(logs).pvalue)
    half = stats.t.ppf(0.975, 5) * stats.tstd(logs) / math.sqrt(6)
    assert c.interval == pytest.approx((c.effect - half, c.effect + half))
    assert c.seeds_lower == 6 and c.reading == "reduction"  # paper-sized: a ratio ≈ 0.33
    assert c.effect_text().startswith("×0.3")


def test_readings() -> None:
    base = [100.0, 80.0, 120.0, 90.0, 110.0, 95.0]
    small_cut = [0.9 * x * (1 + 0.01 * (-1) ** i) for i, x in enumerate(base)]
    assert _primary(base, small_cut).reading == "reduction; no paper-sized effect"
    noise = [x * (1 + 0.05 * (-1) ** i) for i, x in enumerate(base)]
    assert _primary(base, noise).reading == "no significant change; no paper-sized effect"
    wide = [x * f for x, f in zip(base, [0.2, 1.5, 0.3, 1.2, 0.6, 1.1], strict=True)]
    assert _primary(base, wide).reading == "no significant change"
    grow = [2 * x * (1 + 0.01 * (-1) ** i) for i, x in enumerate(base)]
    assert _primary(base, grow).reading.startswith("increase")
    assert _primary(base[:2], small_cut[:2]).reading.startswith("inconclusive")


def test_w8a8_endpoint_is_a_difference_in_points() -> None:
    endpoint = next(e for e in od.ENDPOINTS if e.name.startswith("W8A8 cost % (min"))
    base = [_run(30.0, w8a8=w) for w in (10.5, 10.4, 10.6)]
    new = [_run(30.0, w8a8=w) for w in (10.1, 10.15, 10.1)]
    c = od.compare_endpoint(endpoint, base, new, LAYERS, ("softmax", "softmax1"))
    assert c is not None and not endpoint.log
    assert c.effect == pytest.approx(-(4 + 2.5 + 5) / 3)
    assert c.reading == "reduction" and c.effect_text().startswith("-3.83")
    extra = next(e for e in od.ENDPOINTS if "percentile" in e.name)
    assert od.compare_endpoint(extra, base, new, LAYERS, ("softmax", "softmax1")) is None


# --- arms ----------------------------------------------------------------------------------------


def test_arm_config() -> None:
    base = of.PRESETS["decisive"]
    for name, overrides in base.arms.items():
        arm = od.arm_config(base, overrides)
        assert arm.arms == {} and arm.grid == {} and arm.steps == of.DECISIVE_STEPS
        assert arm.num_layers == 6 and arm.vocab_size == 512 and arm.hidden_size == 64
        if name.startswith("synthetic"):
            assert arm.data == "synthetic" and arm.recall_rate == 1.0
        else:
            assert arm.data == "wikitext-2" and arm.sentence_separators
        if name.endswith("paper-like"):
            assert (arm.schedule, arm.min_lr_ratio, arm.ln_weight_decay) == ("cosine", 0.1, True)
            assert 1e-3 <= arm.lr <= 3e-3
        else:
            assert (arm.schedule, arm.lr, arm.ln_weight_decay) == ("constant", 1e-2, False)
    assert len(base.arms) == 4 and len(base.seeds) == 6 and base.workers == 2
    assert set(base.variants) == {"softmax", "softmax1", "gated", "gated_softmax1"}
    with pytest.raises(ValueError, match="seeds"):
        od.arm_config(base, {"seeds": [0]})
    with pytest.raises(TypeError, match="mapping"):
        od.arm_config(base, [("lr", 1.0)])  # type: ignore[arg-type]


TINY_ARMS = {
    "arms": '{"a": {}, "b": {"recall_rate": 1.0, "schedule": "cosine", "min_lr_ratio": 0.1}}',
    "grid": "{}",
    "variants": '["softmax", "gated", "softmax1"]',
    "seeds": "[0, 1, 2]",
    "ablation": "true",
    "extra_percentile": "99.999",
}


def _results(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())["results"]


def test_tiny_arms_failing_the_gate_train_no_softmax1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = run_experiment(
        "outlier-formation", "tiny", tmp_path, overrides=TINY_ARMS, progress=False
    )
    results = _results(path)
    names = [t["name"] for t in results["tables"]]
    assert names[:3] == [
        "Decisive test: arms",
        "Validity gate",
        "Endpoints (paired over training seeds)",
    ]
    assert results["metrics"]["a/gate_passed"] == 0  # a tiny model forms no outliers
    assert [note.split(":")[0] for note in results["notes"]] == ["Arm a", "Arm b"]
    assert all(": uninformative (the validity gate fails" in note for note in results["notes"])
    for arm in "ab":
        runs = json.loads((path.parent / "arms" / arm / "compare.json").read_text())["runs"]
        assert sorted(runs) == [f"{v}/seed{s}" for v in ("gated", "softmax") for s in range(3)]
        assert {"tensors", "ablation", "w8a8_ppl_extra"} <= set(runs["softmax/seed0"])
    endpoints = next(t for t in results["tables"] if t["name"].startswith("Endpoints"))
    assert {row[1] for row in endpoints["rows"]} == {"Vanilla → Gated Attention"}
    assert all("(uninformative)" in row[0] for row in endpoints["rows"])

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(of, "train_and_evaluate", fail)
    again = run_experiment(
        "outlier-formation", "tiny", tmp_path, overrides=TINY_ARMS, progress=False
    )
    assert _results(again)["tables"] == results["tables"]


def test_tiny_arms_passing_the_gate_compare_softmax1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(od, "GATE", od.GateRule(norm_ratio=0, w8a8_gap_pct=-100, gated_cut=-10))
    overrides = {**TINY_ARMS, "arms": '{"a": {}}'}
    path = run_experiment(
        "outlier-formation", "tiny", tmp_path, overrides=overrides, progress=False
    )
    results = _results(path)
    assert results["metrics"]["a/gate_passed"] == 1
    runs = json.loads((path.parent / "arms" / "a" / "compare.json").read_text())["runs"]
    assert len(runs) == 9 and runs["softmax1/seed2"]["row_sum"] < 0.999
    endpoints = next(t for t in results["tables"] if t["name"].startswith("Endpoints"))
    primary = [r for r in endpoints["rows"] if r[2].endswith("(primary)")]
    assert [r[1] for r in primary] == ["Vanilla → OutEffHop", "Vanilla → Gated Attention"]
    assert primary[0][3] == 3 and primary[0][4].startswith("×")
    assert results["notes"][0].startswith("Arm a: passes the gate; Softmax_1 changes")
    ratio = math.log(
        od.residual_max(runs["softmax1/seed0"], 2) / od.residual_max(runs["softmax/seed0"], 2)
    )
    assert math.isfinite(ratio)
    ablation = results["tables"][-1]
    assert ablation["columns"][:3] == ["arm", "variant", "weights only"]


def test_decisive_needs_its_variants(tmp_path: Path) -> None:
    overrides = {**TINY_ARMS, "variants": '["softmax", "softmax1"]'}
    with pytest.raises(ValueError, match="gated"):
        run_experiment("outlier-formation", "tiny", tmp_path, overrides=overrides, progress=False)
    with pytest.raises(ValueError, match="arms"):
        run_experiment(
            "outlier-formation",
            "tiny",
            tmp_path,
            overrides={**TINY_ARMS, "arms": '{"a": {"workers": 3}}'},
            progress=False,
        )


def test_a_seed_gives_every_variant_the_same_shared_initial_weights() -> None:
    """The pairing of the design: only the gates' own parameters differ between variants."""
    import torch

    from hopfield.experiments.runner import seed_everything

    def weights(variant: str) -> dict[str, torch.Tensor]:
        seed_everything(3)
        return dict(of.build(of.PRESETS["tiny"], variant).named_parameters())

    vanilla = weights("softmax")
    for variant in ("softmax1", "gated", "gated_softmax1"):
        other = weights(variant)
        assert all(torch.equal(p, other[name]) for name, p in vanilla.items())
        assert all(".gate." in name for name in set(other) - set(vanilla))

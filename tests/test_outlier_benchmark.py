"""outlier-benchmark: sink metrics on hand-made maps, the quantizer's bit widths, the
Bigram-Backcopy generator, the attention arms, the staged gate and the tiny preset end to end."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from hopfield.experiments import outlier_benchmark as ob
from hopfield.experiments import outlier_benchmark_analysis as oba
from hopfield.experiments.outlier_benchmark_tasks import BOS, bigram_backcopy
from hopfield.models.sink_lm import ATTENTIONS, SinkLM, SinkLMConfig
from hopfield.outliers import (
    fake_quantize_asymmetric,
    fake_quantize_weight,
    quantize_w8a8,
    residual_peak,
    sink_mass,
    sink_rate,
    value_norm_ratio,
)
from hopfield.outliers.quantize import ActivationQuantizer

# --- sink metrics on constructed maps ---------------------------------------------------------


def test_sink_mass_is_gus_mean_over_the_queries_that_see_the_sink() -> None:
    # one sample, two heads, 3 queries x 3 keys (causal rows)
    w = torch.tensor(
        [
            [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]],
            [[0.6, 0.0, 0.0], [0.0, 1.0, 0.0], [0.9, 0.1, 0.0]],  # a Softmax_1-like row sum 0.6
        ]
    )[None]
    assert sink_mass(w)[0].tolist() == pytest.approx([(1 + 0.5 + 0.2) / 3, (0.6 + 0 + 0.9) / 3])
    # sink at position 1: queries 1 and 2 see it
    assert sink_mass(w, sink=1)[0, 0].item() == pytest.approx((0.5 + 0.3) / 2)


def test_sink_rate_counts_heads_above_epsilon() -> None:
    masses = torch.tensor([[[0.9, 0.1], [0.31, 0.3]], [[0.2, 0.2], [0.5, 0.0]]])  # (B=2, L=2, H=2)
    # above 0.3 strictly: sample 0: 0.9, 0.31 (2 of 4); sample 1: 0.5 (1 of 4)
    assert sink_rate(masses) == pytest.approx(3 / 8)
    assert sink_rate(masses[0], epsilon=0.05) == 1.0
    with pytest.raises(ValueError, match="epsilon"):
        sink_rate(masses, epsilon=1.0)


def test_value_norm_ratio_and_residual_peak_against_the_median() -> None:
    # values (B=1, H=1, S=4, E=2): norms 1, 2, 4, 10 -> median of the others (2, 4, 10) = 4
    v = torch.tensor([[[[0.6, 0.8], [2.0, 0.0], [0.0, 4.0], [6.0, 8.0]]]])
    assert value_norm_ratio(v).item() == pytest.approx(1 / 4)
    # hidden (B=1, T=3, D=2): RMS = |h| / sqrt 2: token 0 has 10·sqrt2 -> RMS 10; others 1 and 3
    h = torch.tensor([[[10.0, 10.0], [1.0, 1.0], [3.0, -3.0]]])
    assert residual_peak(h).item() == pytest.approx(10 / 2)  # median of (1, 3) = 2
    with pytest.raises(ValueError, match="sink"):
        residual_peak(h, sink=2)
    with pytest.raises(ValueError, match="hidden"):
        residual_peak(h[0])


# --- quantizer bit widths and per-token ranges -----------------------------------------------


def test_weight_and_activation_grids_follow_the_bit_width() -> None:
    w = torch.tensor([-1.0, 0.2, 0.6])
    # 4 bits symmetric: scale 1/7, grid -8..7: 0.2·7 = 1.4 -> 1, 0.6·7 = 4.2 -> 4
    assert fake_quantize_weight(w, bits=4).tolist() == pytest.approx([-1.0, 1 / 7, 4 / 7])
    # 8 bits: scale 1/127: 25.4 -> 25, 76.2 -> 76
    assert fake_quantize_weight(w, bits=8).tolist() == pytest.approx([-1.0, 25 / 127, 76 / 127])
    # 2 bits asymmetric on [0, 3]: scale 1, values 0..3
    x = torch.tensor([0.4, 1.6, 2.9, 5.0])
    assert fake_quantize_asymmetric(x, 0.0, 3.0, bits=2).tolist() == [0.0, 2.0, 3.0, 3.0]
    with pytest.raises(ValueError, match="bits"):
        fake_quantize_weight(w, bits=1)


def test_per_token_ranges_isolate_an_outlier_token() -> None:
    x = torch.tensor([[0.0, 0.1, 0.2, 0.3], [0.0, 100.0, 50.0, 25.0]])
    per_tensor = ActivationQuantizer(bits=4)
    per_token = ActivationQuantizer(bits=4, per_token=True)
    for q in (per_tensor, per_token):
        q(x)
        q.state = "quantize"
    # one range [0, 100] crushes the first token to zeros; its own range [0, 0.3] keeps it
    assert per_tensor(x)[0].abs().max().item() == 0.0
    assert per_token(x)[0].tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3])


# --- tasks --------------------------------------------------------------------------------------


def test_bigram_backcopy_copies_after_triggers_and_is_seeded() -> None:
    x, chain = bigram_backcopy(500, 40, vocab_size=16, triggers=3, seed=5)
    again, _ = bigram_backcopy(500, 40, vocab_size=16, triggers=3, seed=5)
    assert torch.equal(x, again) and x.shape == (500, 40)
    assert (x[:, 0] == BOS).all() and (x[:, 1:] != BOS).all()
    trig = torch.isin(x[:, 1:-1], chain.triggers)
    assert trig.any() and torch.equal(x[:, 2:][trig], x[:, :-2][trig])
    assert not torch.isin(x[:, 1], chain.triggers).any()
    # non-trigger successors follow the transition matrix: an impossible bigram never occurs
    prev, nxt = x[:, 1:-1][~trig], x[:, 2:][~trig]
    assert (chain.transition[prev, nxt] > 0).all()
    assert not torch.equal(bigram_backcopy(500, 40, vocab_size=16, seed=6)[0], x)
    with pytest.raises(ValueError, match="triggers"):
        bigram_backcopy(4, 8, vocab_size=8, triggers=6)


# --- the model's attention maps -------------------------------------------------------------------


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_every_arm_trains_and_captures_weights_on_its_own_keys(attention: str) -> None:
    torch.manual_seed(0)
    config = SinkLMConfig(20, 10, d_model=8, num_layers=2, num_heads=2, ffn_size=16,
                          attention=attention)  # fmt: skip
    model = SinkLM(config)
    tokens = torch.randint(0, 20, (3, 10))
    captures: list[dict[str, torch.Tensor]] = []
    logits = model(tokens, captures)
    assert logits.shape == (3, 10, 20) and len(captures) == 2
    w = captures[0]["weights"]
    assert w.shape == (3, 2, 10, 10) and (w.triu(1) == 0).all()  # causal
    rows = w.sum(-1)
    if attention in ("softmax", "gated"):
        assert torch.allclose(rows, torch.ones_like(rows))
    elif attention in ("softmax1", "sink_logit", "kv_bias"):
        assert (rows < 1).all()  # the extra slot takes mass
    ob.next_token_loss(model, tokens).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_the_same_seed_gives_every_arm_the_same_shared_weights() -> None:
    def build(attention: str) -> dict[str, torch.Tensor]:
        torch.manual_seed(3)
        return SinkLM(SinkLMConfig(20, 10, 8, 2, 2, 16, attention)).state_dict()

    vanilla = build("softmax")
    for attention in ("gated", "kv_bias", "sink_logit"):
        other = build(attention)
        assert all(torch.equal(vanilla[k], other[k]) for k in vanilla), attention


def test_softmax1_equals_a_zero_sink_logit_at_initialisation() -> None:
    torch.manual_seed(1)
    one = SinkLM(SinkLMConfig(20, 10, 8, 1, 2, 16, "softmax1"))
    sink = SinkLM(SinkLMConfig(20, 10, 8, 1, 2, 16, "sink_logit"))
    sink.load_state_dict(one.state_dict(), strict=False)
    tokens = torch.randint(0, 20, (2, 10))
    assert torch.allclose(one(tokens), sink(tokens), atol=1e-6)


def test_quantize_w8a8_takes_the_models_blocks_and_keeps_the_head() -> None:
    torch.manual_seed(0)
    model = SinkLM(SinkLMConfig(20, 10, 8, 1, 1, 16))
    tokens = torch.randint(0, 20, (4, 9))
    q = quantize_w8a8(model, [tokens], num_batches=1, weight_bits=4, per_token=True)
    names = {n for n, _ in q.named_modules()}
    assert "decoder.layers.0.output_quantizer" in names
    assert not any(n.startswith("lm_head.") and "quantizer" in n for n in names)
    assert q.decoder.layers[0].output_quantizer.per_token
    assert not torch.allclose(q(tokens), model(tokens))


# --- the staged gate on synthetic runs --------------------------------------------------------


def _runs(values: dict[str, list[dict[str, float]]], task: str = "bigram_backcopy") -> dict:
    return {
        f"{task}/{arm}/seed{s}": {"task": task, "arm": arm, "seed": s, **v}
        for arm, seeds in values.items()
        for s, v in enumerate(seeds)
    }


def _metrics(sink: float, peak: float, kurt: float = 10.0, cost: float = 3.0) -> dict[str, float]:
    return {"sink_mass": sink, "residual_peak": peak, "avg_kurtosis": kurt,
            "max_inf_norm": 10 * peak, "w8a8_cost_pct": cost}  # fmt: skip


def test_gate_stages_fail_pass_and_need_a_removing_control() -> None:
    protocol = oba.load_protocol()
    part = protocol["parts"]["sink"]
    vanilla = [_metrics(0.8 + 0.01 * s, 8.0) for s in range(6)]
    # stage 1 fails: vanilla's median sink mass 0.3 < 0.5
    weak = _runs({"vanilla": [_metrics(0.3, 8.0)] * 6})
    assert not oba.stage1(weak, "bigram_backcopy", part).passed
    # a control that lowers the sink but not below the threshold does not remove it
    partial = _runs(
        {"vanilla": vanilla, "relu": [_metrics(0.6 + 0.001 * s, 8.0) for s in range(6)]}
    )
    assert oba.stage1(partial, "bigram_backcopy", part).passed
    second = oba.stage2(partial, "bigram_backcopy", part, 0.05)
    assert not second.passed and "does not remove" in second.lines[0]
    assert "not trained" in second.lines[1]
    removed = _runs(
        {"vanilla": vanilla, "relu": [_metrics(0.05 + 0.01 * s, 1.0) for s in range(6)]}
    )
    assert oba.stage2(removed, "bigram_backcopy", part, 0.05).passed
    ((arm, metric, result),) = oba.stage3(removed, "bigram_backcopy", part)
    assert (arm, metric, result) == ("softmax1", "sink_mass", None)


def test_the_protocol_is_fixed_data_and_checked(tmp_path: Path) -> None:
    protocol = oba.load_protocol()
    assert protocol["seeds_per_arm"] >= 6 and protocol["sink_epsilon"] == 0.3
    assert {c["metric"] for c in protocol["parts"]["outliers"]["claims"]} == {
        "avg_kurtosis",
        "max_inf_norm",
        "w8a8_cost_pct",
    }
    assert all(c in ob.ARMS for p in protocol["parts"].values() for c in p["stage2"]["controls"])
    assert ob.PRESETS["small"].seeds == ob.PRESETS["gpu"].seeds == protocol["seeds_per_arm"]
    bad = dict(protocol, seeds_per_arm=3)
    (tmp_path / "p.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="seeds_per_arm"):
        oba.load_protocol(tmp_path / "p.json")


# --- the tiny preset end to end ------------------------------------------------------------------


DATA = Path(
    os.environ.get("HOPFIELD_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)


@pytest.fixture(scope="module")
def tiny_record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hopfield.experiments.runner import run_experiment

    if not DATA.is_dir():
        pytest.skip(f"real datasets not available: {DATA} does not exist (set $HOPFIELD_DATA)")
    out = tmp_path_factory.mktemp("ob")
    path = run_experiment("outlier-benchmark", "tiny", out, data_dir=DATA, progress=False)
    return Path(path).parent


def test_tiny_preset_records_every_run_with_its_commit(tiny_record: Path) -> None:
    stored = json.loads((tiny_record / "runs.json").read_text())
    config = ob.PRESETS["tiny"]
    assert len(stored["runs"]) == len(config.tasks) * len(config.arms) * config.seeds
    assert stored["protocol"] == oba.load_protocol() and stored["code_commit"]
    run = stored["runs"]["wikitext/softmax1/seed1"]
    assert set(run["quant_cost_pct"]) == set(ob.QUANT_SCHEMES)
    assert 0 < run["sink_mass"] < 1 and math.isfinite(run["avg_kurtosis"])
    assert [p["step"] for p in run["curve"]] == [2, 4] and run["code_commit"]
    record = json.loads((tiny_record / "results.json").read_text())
    names = [t["name"] for t in record["results"]["tables"]]
    assert "Validity gate (stages 1 and 2)" in names and "Optimizer axis (Kaul et al.)" in names
    assert "Per layer and head on wikitext" in names
    assert record["results"]["figures"] == ["curves_bigram_backcopy.png", "curves_wikitext.png"]
    assert not (tiny_record / "train").exists()
    assert any("not a protocol run" in note for note in record["results"]["notes"])


def test_tiny_rerun_reuses_the_finished_runs(
    tiny_record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hopfield.experiments.runner import run_experiment

    def refuse(*args: Any) -> None:
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(ob, "train_one", refuse)
    run_experiment("outlier-benchmark", "tiny", tiny_record.parent, data_dir=DATA,
                   progress=False)  # fmt: skip


def test_the_doc_renders_the_protocol_then_the_record(tiny_record: Path, tmp_path: Path) -> None:
    empty = oba.render_doc(tmp_path)
    assert "No recorded run yet" in empty and "stage 1: vanilla `sink_mass` ≥ 0.5" in empty
    page = oba.render_doc(tiny_record.parent)
    assert "## Results" in page and "curves_wikitext.png" in page and "the validity gate" in page
    assert "What the data suggest next" in page and "(stage 1 fails)" in page
    assert oba.main([str(tiny_record.parent), str(tmp_path / "page.md")]) == 0
    assert (tmp_path / "page.md").read_text() == page


def test_bad_config_is_refused(tmp_path: Path) -> None:
    from hopfield.experiments.registry import ConfigError
    from hopfield.experiments.runner import run_experiment

    with pytest.raises(ConfigError, match="arms"):
        run_experiment("outlier-benchmark", "tiny", tmp_path, overrides={"arms": '["nope"]'})
    with pytest.raises(ConfigError, match="eval_sequences"):
        run_experiment("outlier-benchmark", "tiny", tmp_path, overrides={"eval_sequences": "2"})
    with pytest.raises(ConfigError, match="schedule"):
        run_experiment("outlier-benchmark", "tiny", tmp_path, overrides={"schedule": "step"})
    short = {"text_max_lines": "4", "tasks": '["wikitext"]', "eval_sequences": "64",
             "eval_batch_size": "64"}  # fmt: skip
    with pytest.raises(ValueError, match="held-out sequences"):
        run_experiment("outlier-benchmark", "tiny", tmp_path, data_dir=DATA, overrides=short)


def test_the_trainer_offers_sgd_with_momentum(tmp_path: Path) -> None:
    from hopfield.training import Trainer, TrainingConfig

    torch.manual_seed(0)
    model = SinkLM(SinkLMConfig(20, 8, 8, 1, 1, 16))
    data = torch.randint(0, 20, (16, 8))
    config = TrainingConfig(max_steps=2, batch_size=8, optimizer="sgd", lr=0.5, momentum=0.9,
                            log_every=1, cpu=True)  # fmt: skip
    trainer = Trainer(model, data, ob.next_token_loss, config, tmp_path, progress=False)
    assert isinstance(trainer.optimizer.optimizer, torch.optim.SGD)
    assert trainer.optimizer.param_groups[0]["momentum"] == 0.9
    before = ob.next_token_loss(model, data).item()
    trainer.fit(resume=False)
    assert ob.next_token_loss(trainer.unwrapped, data).item() != before
    with pytest.raises(ValueError, match="momentum"):
        TrainingConfig(max_steps=1, optimizer="sgd", momentum=1.0)


def test_the_committed_page_is_generated_from_the_committed_results() -> None:
    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "outlier-benchmark.md").read_text()
    assert page == oba.render_doc(root / "results"), (
        "docs/outlier-benchmark.md is stale: regenerate with `python -m "
        "hopfield.experiments.outlier_benchmark_analysis results docs/outlier-benchmark.md`"
    )

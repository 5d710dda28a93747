"""W8A8 fake quantization (hopfield.outliers.quantize)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hopfield.outliers import (
    QUANTIZER_KINDS,
    ActivationQuantizer,
    activation_quantizers,
    fake_quantize_asymmetric,
    fake_quantize_fp8,
    fake_quantize_weight,
    quantize_w8a8,
    quantizer_ablation,
    quantizer_kinds,
    symmetric_scale,
)


def test_asymmetric_round_trip_error_and_integer_grid() -> None:
    x = torch.linspace(-1.3, 2.9, 10_001, dtype=torch.float64)
    lo, hi = -1.3, 2.9
    xq = fake_quantize_asymmetric(x, lo, hi)
    scale = (hi - lo) / 255
    assert (xq - x).abs().max() <= scale / 2 + 1e-12
    zero_point = round(-lo / scale)
    grid = xq / scale + zero_point
    torch.testing.assert_close(grid, grid.round(), rtol=0, atol=1e-9)
    assert grid.min() >= 0 and grid.max() <= 255
    assert len(torch.unique(grid.round())) == 256
    # outside the range: saturation; zero is exactly representable
    assert float(fake_quantize_asymmetric(torch.tensor([100.0]), lo, hi)) <= hi + scale
    assert float(fake_quantize_asymmetric(torch.tensor([0.0]), lo, hi)) == 0.0


def test_symmetric_weight_scale_and_grid() -> None:
    w = torch.randn(64, 32, dtype=torch.float64)
    w[3, 4] = -5.0
    scale, unsigned = symmetric_scale(w)
    assert not unsigned and float(scale) == pytest.approx(w.abs().max().item() / 127)
    wq = fake_quantize_weight(w)
    q = wq / scale
    torch.testing.assert_close(q, q.round(), rtol=0, atol=1e-9)
    assert q.min() >= -128 and q.max() <= 127 and float(q.min()) == -127
    assert (wq - w).abs().max() <= scale / 2 + 1e-12
    positive = w.abs()
    scale_u, unsigned_u = symmetric_scale(positive)
    assert unsigned_u and float(scale_u) == pytest.approx(5.0 / 255)
    assert (fake_quantize_weight(positive) / scale_u).max().round() == 255


def test_fp8_e4m3() -> None:
    x = torch.randn(10_000) * 3
    xq = fake_quantize_fp8(x, x.abs().max())
    scale = x.abs().max() / 448
    assert torch.equal(xq / scale, (x / scale).to(torch.float8_e4m3fn).float())
    normal = x.abs() / scale > 2**-6  # e4m3 normal range: 3 mantissa bits
    rel = ((xq - x).abs() / x.abs())[normal]
    assert rel.max() <= 2**-4 + 1e-6
    assert fake_quantize_weight(x, "fp8_e4m3").abs().max() == pytest.approx(x.abs().max().item())


def test_running_min_max_and_percentile_calibration() -> None:
    q = ActivationQuantizer(momentum=0.9)
    a, b = torch.tensor([-1.0, 2.0]), torch.tensor([-3.0, 4.0])
    assert torch.equal(q(a), a) and torch.equal(q(b), b)  # calibration passes through
    assert float(q.x_min) == pytest.approx(0.9 * -1 + 0.1 * -3)
    assert float(q.x_max) == pytest.approx(0.9 * 2 + 0.1 * 4)
    q.state = "quantize"
    assert not torch.equal(q(torch.tensor([0.1234])), torch.tensor([0.1234]))
    p = ActivationQuantizer(percentile=99.0)
    data = torch.arange(1, 1001, dtype=torch.float32)
    p(data)
    assert float(p.x_min) == 10.0 and float(p.x_max) == 990.0
    with pytest.raises(RuntimeError, match="calibration"):
        fresh = ActivationQuantizer()
        fresh.state = "quantize"
        fresh(a)
    with pytest.raises(ValueError, match="fmt"):
        ActivationQuantizer("int4")
    with pytest.raises(ValueError, match="momentum"):
        ActivationQuantizer(momentum=1.0)


def test_one_outlier_multiplies_the_error_of_the_others_by_the_squared_range_ratio() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100_000, generator=g, dtype=torch.float64)
    base_range = float(x.max() - x.min())
    clean_error = ((fake_quantize_asymmetric(x, x.min(), x.max()) - x) ** 2).mean()
    with_outlier = torch.cat([x, torch.tensor([100.0], dtype=torch.float64)])
    q = fake_quantize_asymmetric(with_outlier, with_outlier.min(), with_outlier.max())
    outlier_error = ((q[:-1] - x) ** 2).mean()
    ratio = float(outlier_error / clean_error)
    expected = ((100.0 - float(x.min())) / base_range) ** 2
    assert expected > 100
    assert ratio == pytest.approx(expected, rel=0.03)


transformers = pytest.importorskip("transformers")


def _bert(variant: str = "softmax1") -> nn.Module:
    from hopfield.integrations import build_model

    return build_model(
        "bert",
        variant,
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=60,
    ).eval()


def _batches(n: int = 4) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[2, 8:] = 0
    return [
        {"input_ids": torch.randint(0, 60, (4, 12), generator=g), "attention_mask": mask}
        for _ in range(n)
    ]


def test_quantized_tiny_model_stays_close_and_places_quantizers() -> None:
    model = _bert("gated_softmax1")
    batches = _batches()
    quantized = quantize_w8a8(model, batches, num_batches=3)
    quantizers = activation_quantizers(quantized)
    assert all(q.state == "quantize" and int(q.batches) == 3 for q in quantizers.values())
    names = set(quantizers)
    layer = "bert.encoder.layer.0"
    for expected in (
        f"{layer}.attention.self.query.input_quantizer",
        f"{layer}.attention.self.value.output_quantizer",
        f"{layer}.attention.self.attention_quantizer.score_quantizer",
        f"{layer}.attention.self.attention_quantizer.weight_quantizer",
        f"{layer}.intermediate.intermediate_act_fn.output_quantizer",  # FFN intermediate
        f"{layer}.output.LayerNorm.input_quantizer",  # residual sum
        f"{layer}.output.LayerNorm.output_quantizer",
        "bert.embeddings.LayerNorm.input_quantizer",  # embedding sum
    ):
        assert expected in names, expected
    assert not any(n.startswith("cls.") for n in names)  # the MLM head stays in floating point
    # weights of the body are on the int8 grid; the tied MLM decoder keeps the float embedding
    query = quantized.bert.encoder.layer[0].attention.self.query.weight
    scale, _ = symmetric_scale(query)
    torch.testing.assert_close(query / scale, (query / scale).round(), rtol=0, atol=1e-4)
    embedding = model.bert.embeddings.word_embeddings.weight
    assert torch.equal(quantized.cls.predictions.decoder.weight, embedding)
    assert not torch.equal(quantized.bert.embeddings.word_embeddings.weight, embedding)
    # the original model is untouched, and the quantized outputs stay close
    assert not activation_quantizers(model)
    with torch.no_grad():
        ref = model(**batches[0]).logits
        out = quantized(**batches[0]).logits
        again = quantized(**batches[0]).logits
    assert torch.equal(out, again)  # ranges are frozen
    rel = float((out - ref).norm() / ref.norm())
    assert 0 < rel < 0.05


def test_sdpa_model_is_switched_and_fp8_variant_runs() -> None:
    model = _bert("sdpa")
    quantized = quantize_w8a8(model, _batches(2), fmt="fp8_e4m3", percentile=99.999)
    assert quantized.config._attn_implementation == "hopfield_softmax"
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        ref = model(**_batches(1)[0]).logits
        out = quantized(**_batches(1)[0]).logits
    assert 0 < float((out - ref).norm() / ref.norm()) < 0.1
    with pytest.raises(ValueError, match="calibration_batches"):
        quantize_w8a8(model, [])
    with pytest.raises(ValueError, match="fmt"):
        quantize_w8a8(model, _batches(1), fmt="int4")


def test_quantizer_ablation_switches_one_kind_at_a_time() -> None:
    model = _bert("softmax")
    batches = _batches()
    quantized = quantize_w8a8(model, batches, num_batches=3)
    kinds = quantizer_kinds(quantized)
    assert set(kinds) == set(activation_quantizers(quantized))
    assert set(kinds.values()) == set(QUANTIZER_KINDS)  # BERT has every kind
    assert kinds["bert.encoder.layer.0.output_quantizer"] == "block output"
    assert kinds["bert.encoder.layer.0.output.LayerNorm.input_quantizer"] == "LayerNorm input"
    with torch.no_grad():
        reference = model(**batches[0]).logits

    def error(m: nn.Module) -> float:
        with torch.no_grad():
            return float((m(**batches[0]).logits - reference).norm() / reference.norm())

    full = error(quantized)
    ablation = quantizer_ablation(quantized, error)
    assert list(ablation) == ["weights only", *QUANTIZER_KINDS, "all"]
    assert ablation["all"] == full  # every quantizer back in its state
    assert all(q.state == "quantize" for q in activation_quantizers(quantized).values())
    assert 0 < ablation["weights only"] < full
    assert all(ablation["weights only"] <= v + 1e-3 for v in ablation.values())

"""Outlier metrics: kurtosis, infinity norms, their aggregation, and attention diagnostics."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from hopfield.outliers import ActivationRecorder, ModuleSelection, inf_norm, kurtosis


def test_kurtosis_of_normal_samples_is_three_and_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    x = torch.randn(1, 1_000_000, dtype=torch.float64)
    assert float(kurtosis(x)) == pytest.approx(3.0, abs=0.03)
    n = x.shape[1]
    reference = torch.tensor(stats.kurtosis(x.numpy(), axis=1, fisher=False, bias=True))
    torch.testing.assert_close(
        kurtosis(x, eps=0.0), reference * ((n - 1) / n) ** 2, rtol=1e-9, atol=0
    )
    # with the default eps = 1e-6 the difference is of order eps / s**4
    torch.testing.assert_close(kurtosis(x), reference * ((n - 1) / n) ** 2, rtol=3e-6, atol=0)
    # heavy tails: one huge entry in a small row
    y = torch.zeros(1, 100, dtype=torch.float64)
    y[0, 0] = 1.0
    expected = stats.kurtosis(y.numpy(), axis=1, fisher=False, bias=True)[0] * (99 / 100) ** 2
    assert float(kurtosis(y, eps=0.0)) == pytest.approx(expected, rel=1e-9)


def test_kurtosis_and_inf_norm_validate_input() -> None:
    assert inf_norm(torch.tensor([[1.0, -3.0], [0.5, 0.25]])).tolist() == [3.0, 0.5]
    with pytest.raises(ValueError, match="x must"):
        kurtosis(torch.randn(5))
    with pytest.raises(TypeError, match="x must"):
        inf_norm([1.0, 2.0])  # type: ignore[arg-type]


class _Replay(nn.Module):
    """Modules ``a`` and ``b`` that output given tensors (hand-made activations)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Identity(), nn.Identity()

    def forward(self, xa: Tensor, xb: Tensor) -> None:
        self.a(xa)
        self.b(xb)


def test_aggregation_on_hand_made_activations() -> None:
    model = _Replay()
    batches = [(torch.randn(3, 4, 5) ** 3, torch.randn(3, 20)) for _ in range(2)]
    batches[1][1][2, 7] = 50.0  # an outlier in one sample of b
    with ActivationRecorder(model, ["a", "b"]) as recorder:
        for xa, xb in batches:
            model(xa, xb)
    xa = torch.cat([b[0] for b in batches]).reshape(6, -1)
    xb = torch.cat([b[1] for b in batches])
    mean_kurt = [float(kurtosis(t).mean()) for t in (xa, xb)]
    mean_inf = [float(t.abs().amax(1).mean()) for t in (xa, xb)]
    summary = recorder.summary()
    assert summary["avg_kurtosis"] == pytest.approx(sum(mean_kurt) / 2, rel=1e-9)
    assert summary["max_inf_norm"] == pytest.approx(max(mean_inf), rel=1e-6)
    assert summary["max_inf_norm"] < 50  # a mean over samples, not the max of all
    table = recorder.table()
    assert [row[0] for row in table.rows] == ["a", "b"]
    assert table.rows[1][3] == 50.0 and table.rows[1][4] == 6
    # removing the hooks stops recording; reset forgets
    model(*batches[0])
    assert recorder.stats["a"].samples == 6
    recorder.reset()
    assert math.isnan(recorder.summary()["avg_kurtosis"])


def test_inputs_and_named_summaries() -> None:
    model = _Replay()
    selection = ModuleSelection(
        outputs=("a",), inputs=("b",), kurtosis=("a",), inf_norms={"in_b": ("b:input",)}
    )
    recorder = ActivationRecorder(model, selection)
    xb = torch.tensor([[1.0, -4.0], [2.0, 0.0]])
    model(torch.randn(2, 8), xb)
    recorder.remove()
    assert recorder.names == ["a", "b:input"]
    assert recorder.summary()["in_b"] == pytest.approx(3.0)
    with pytest.raises(ValueError, match="modules"):
        ActivationRecorder(model, "gpt")
    with pytest.raises(ValueError, match="no module"):
        ActivationRecorder(model, ["zzz"])


transformers = pytest.importorskip("transformers")


def _tiny(family: str, variant: str = "softmax") -> nn.Module:
    from hopfield.integrations import build_model

    sizes = {
        "bert": dict(intermediate_size=128, vocab_size=50),
        "opt": dict(ffn_dim=128, vocab_size=50, word_embed_proj_dim=64),
        "vit": dict(intermediate_size=128, image_size=16, patch_size=8, num_labels=3),
    }[family]
    common = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4)
    return build_model(family, variant, **common, **sizes).eval()


def test_spec_module_selections_on_models() -> None:
    ids = torch.randint(0, 50, (2, 9))
    bert = ActivationRecorder(_tiny("bert"), "bert")
    bert.model(input_ids=ids)
    assert len(bert.names) == 2 * 3  # per layer: FFN output dense, LN output, LN input
    assert set(bert.summary()) == {
        "avg_kurtosis",
        "max_ffn_out_inf_norm",
        "max_LN_out_inf_norm",
        "max_LN_inp_inf_norm",
        "samples",
    }
    opt = ActivationRecorder(_tiny("opt"), "opt")
    opt.model(input_ids=ids)
    assert len(opt.names) == 1 + 5 * 2  # 61 for 12 layers
    layers = opt.layer_table("max_inf_norm")
    assert layers.columns[2:] == [
        "block",
        "self_attn.out_proj",
        "self_attn_layer_norm",
        "fc2",
        "final_layer_norm",
    ] and [row[0] for row in layers.rows] == ["-", "0", "1"]
    column = layers.columns.index("self_attn_layer_norm")
    stats = opt.stats["model.decoder.layers.1.self_attn_layer_norm"]
    assert layers.rows[2][column] == stats.inf_norm_max
    with pytest.raises(ValueError, match="statistic"):
        opt.layer_table("median")
    vit = ActivationRecorder(_tiny("vit", "gated"), "vit")
    vit.model(pixel_values=torch.randn(2, 3, 16, 16))
    assert not any("gate" in n or "dropout" in n for n in vit.names)
    assert "vit.layers.1" in vit.names and "vit.layers.1.mlp.fc2" in vit.names
    assert vit.summary()["max_layer_inf_norm"] > 0


def test_attention_diagnostics_with_uniform_logits() -> None:
    from hopfield.outliers import AttentionRecorder

    for variant, extra in (("softmax", 0), ("softmax1", 1)):
        model = _tiny("bert", variant)
        with torch.no_grad():  # zero queries: every logit is 0
            for layer in model.bert.encoder.layer:
                layer.attention.self.query.weight.zero_()
                layer.attention.self.query.bias.zero_()
        mask = torch.ones(2, 8, dtype=torch.long)
        mask[1, 5:] = 0
        with AttentionRecorder(model) as recorder:
            recorder.special_mask = torch.zeros(2, 8, dtype=torch.bool)
            recorder.special_mask[:, -1] = True  # last position: padding for sample 1
            model(input_ids=torch.randint(0, 50, (2, 8)), attention_mask=mask)
        layer = recorder.per_layer()["bert.encoder.layer.0.attention.self"]
        # row sums S/(S+n) with S = 8 and 5 keys; special mass 1/(S+n) for sample 0 only
        assert layer["row_sum"] == pytest.approx((8 / (8 + extra) + 5 / (5 + extra)) / 2)
        assert layer["special_mass"] == pytest.approx(1 / (8 + extra) / 2)
        assert layer["logit_range"] == 0 and layer["max_logit"] == 0
        assert len(recorder.table().rows) == 2 * 4
    with pytest.raises(ValueError, match="attention"):
        model.set_attn_implementation("sdpa")
        AttentionRecorder(model)

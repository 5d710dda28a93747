"""Hyper-SET figures and the App. F.3 contrast: per-head statistics against float64 sums, the
shared-QKV Transformer (and its sign-reversed update) against an explicit computation, the Fig. 1
token evolution, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hopfield.experiments.hyperset_common import (
    head_statistics,
    subspace_trajectory,
    trajectory_statistics,
)
from hopfield.experiments.hyperset_figures import token_evolution
from hopfield.models.shared_qkv import (
    SharedQKVTransformerEncoder,
    SharedQKVTransformerLayer,
    shared_qkv_image_classifier,
)
from hopfield.nn.hyperset import HyperSETEncoder


def _reference(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Effective rank (eq. 17) and average angle (Def. D.2, degrees) of each ``(N, p)`` matrix of
    ``z`` ``(B, H, N, p)``, by explicit loops: ``(B, H)`` each."""
    b, h, n, _ = z.shape
    erank, angle = np.zeros((b, h)), np.zeros((b, h))
    for i in range(b):
        for j in range(h):
            s = np.linalg.svd(z[i, j], compute_uv=False)
            prob = s / s.sum()
            erank[i, j] = math.exp(-sum(q * math.log(q) for q in prob if q > 0))
            unit = z[i, j] / np.linalg.norm(z[i, j], axis=1, keepdims=True)
            cosines = [unit[a] @ unit[c] for a in range(n) for c in range(a + 1, n)]
            angle[i, j] = math.degrees(math.acos(sum(cosines) / len(cosines)))
    return erank, angle


def _rms(z: np.ndarray) -> np.ndarray:
    """Gain-free RMS normalisation over the last axis."""
    return z / np.sqrt((z**2).mean(axis=-1, keepdims=True))


def _hyperset(num_heads: int = 2) -> HyperSETEncoder:
    """A float64 Hyper-SET encoder with fixed steps, so the tokens move."""
    torch.manual_seed(0)
    return HyperSETEncoder(8, num_heads, 8, iterations=3, step_size=0.3, dtype=torch.float64)


def test_per_head_statistics_equal_a_float64_computation() -> None:
    encoder = _hyperset()
    x0 = torch.randn(3, 5, 8, dtype=torch.float64)
    rows = trajectory_statistics(encoder, x0, 3)
    states, _ = encoder.trajectory(x0, 3)
    weight = encoder.hyperset_layers()[0].qkv.weight.detach().numpy()
    for row, x in zip(rows, states, strict=True):
        z = _rms((x.numpy() @ weight.T).reshape(3, 5, 2, 4).transpose(0, 2, 1, 3))
        erank, angle = _reference(z)
        np.testing.assert_allclose(row["erank_heads"], erank.mean(axis=0), rtol=1e-10)
        np.testing.assert_allclose(row["angle_heads"], angle.mean(axis=0), rtol=1e-10)
        # the full-model numbers are the same quantities
        assert row["erank_head0"] == row["erank_heads"][0]
        assert row["angle_head0"] == row["angle_heads"][0]
        assert row["erank"] == pytest.approx(erank.mean(), rel=1e-10)
        assert row["angle"] == pytest.approx(angle.mean(), rel=1e-10)
    # the tokens do move: a test of constant statistics would pass trivially
    assert rows[0]["erank_heads"] != rows[-1]["erank_heads"]


def test_subspace_trajectory_starts_at_the_embedding() -> None:
    encoder = _hyperset()
    x0 = torch.randn(2, 6, 8, dtype=torch.float64)
    rows = subspace_trajectory(encoder, x0, 3)
    assert [r["t"] for r in rows] == [0, 1, 2, 3]
    layer = encoder.hyperset_layers()[0]
    assert rows[0] == {"t": 0, **head_statistics(layer.subspace_tokens(x0))}
    assert rows[1:] == [{k: r[k] for k in rows[1]} for r in trajectory_statistics(encoder, x0, 3)]


def _explicit_layer(layer: SharedQKVTransformerLayer, x: torch.Tensor, sign: float) -> np.ndarray:
    """One shared-QKV iteration ``x + sign·attn(LN(x))`` then the MLP, by explicit float64
    matrix products and softmax (numpy)."""
    x = x.numpy()

    def layer_norm(v: np.ndarray, norm: torch.nn.LayerNorm) -> np.ndarray:
        centred = v - v.mean(axis=-1, keepdims=True)
        scaled = centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + norm.eps)
        return scaled * norm.weight.detach().numpy() + norm.bias.detach().numpy()

    w, o = layer.qkv.weight.detach().numpy(), layer.out.weight.detach().numpy()
    b, n, d = x.shape
    h, p = layer.num_heads, d // layer.num_heads
    z = (layer_norm(x, layer.norm1) @ w.T).reshape(b, n, h, p).transpose(0, 2, 1, 3)
    scores = z @ z.transpose(0, 1, 3, 2) / math.sqrt(p)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    attention = (weights @ z).transpose(0, 2, 1, 3).reshape(b, n, d) @ o.T
    x = x + sign * attention
    hidden = np.maximum(layer_norm(x, layer.norm2) @ layer.fc1.weight.detach().numpy().T, 0.0)
    return x + hidden @ layer.fc2.weight.detach().numpy().T


@pytest.mark.parametrize(("reverse", "sign"), [(False, 1.0), (True, -1.0)])
def test_shared_qkv_layer_applies_the_signed_attention_update(reverse: bool, sign: float) -> None:
    torch.manual_seed(1)
    layer = SharedQKVTransformerLayer(8, 2, 2.0, reverse_attention=reverse, dtype=torch.float64)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    np.testing.assert_allclose(layer(x).detach().numpy(), _explicit_layer(layer, x, sign),
                               rtol=1e-10, atol=1e-12)  # fmt: skip
    # the two signs give different updates (the attention term is not zero)
    assert not np.allclose(_explicit_layer(layer, x, 1.0), _explicit_layer(layer, x, -1.0))


def test_shared_qkv_encoder_iterates_one_layer_and_gives_subspace_tokens() -> None:
    torch.manual_seed(2)
    encoder = SharedQKVTransformerEncoder(8, 2, iterations=3, reverse_attention=True,
                                          dtype=torch.float64)  # fmt: skip
    layer = encoder.layer_at(2)
    x0 = torch.randn(2, 4, 8, dtype=torch.float64)
    with torch.no_grad():
        x, states = encoder(x0, return_states=True)
        assert torch.equal(x, layer(layer(layer(x0)))) and len(states) == 3
    z = layer.subspace_tokens(x0)
    assert z.shape == (2, 2, 4, 4)
    torch.testing.assert_close(z.square().sum(-1), torch.full((2, 2, 4), 4.0, dtype=z.dtype))
    model = shared_qkv_image_classifier(image_size=8, in_channels=1, grid=4, d_model=8,
                                        num_heads=2, iterations=2)  # fmt: skip
    assert model(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    assert model.patch_norm_in is None  # the baselines' plain patch Linear


def test_shared_qkv_bad_input() -> None:
    with pytest.raises(ValueError, match="num_heads"):
        SharedQKVTransformerLayer(10, 3)
    with pytest.raises(TypeError, match="reverse_attention"):
        SharedQKVTransformerLayer(8, 2, reverse_attention="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mlp_ratio"):
        SharedQKVTransformerLayer(8, 2, 0.0)
    with pytest.raises(ValueError, match="num_layers"):
        SharedQKVTransformerEncoder(8, 2, iterations=3, num_layers=2)
    with pytest.raises(ValueError, match=r"x must have shape \(B, N, 8\)"):
        SharedQKVTransformerLayer(8, 2)(torch.randn(4, 8))


def test_token_evolution_of_one_sample() -> None:
    encoder = _hyperset()
    x0 = torch.randn(1, 6, 8, dtype=torch.float64)
    evolution = token_evolution(encoder, x0, 3, head=1)
    assert len(evolution["angle"]) == len(evolution["subspace"]) == len(evolution["tokens"]) == 4
    # alignment: mean over tokens of the largest cosine with a feed-forward direction
    states, _ = encoder.trajectory(x0, 3)
    anchors = encoder.hyperset_layers()[0].mlp.weight.detach()
    for t, x in enumerate([x0, *states]):
        cos = (
            torch.nn.functional.normalize(x[0], dim=-1)
            @ torch.nn.functional.normalize(anchors, dim=-1).T
        )
        assert evolution["alignment"][t] == pytest.approx(float(cos.max(-1).values.mean()))
    z = encoder.hyperset_layers()[0].subspace_tokens(x0)[:, 1]
    _, angle = _reference(z[:, None].numpy())
    assert evolution["angle"][0] == pytest.approx(angle[0, 0])
    for key in ("subspace", "tokens"):  # 3-D points on the unit sphere
        points = torch.tensor(evolution[key])
        assert points.shape == (4, 6, 3)
        torch.testing.assert_close(points.norm(dim=-1), torch.ones(4, 6, dtype=points.dtype))
    assert len(evolution["anchors"]) == len(evolution["anchor_ids"]) >= 1
    assert all(0.0 < share <= 1.0 + 1e-12 for share in evolution["pca_share"])
    with pytest.raises(ValueError, match="x0 must have shape"):
        token_evolution(encoder, torch.randn(2, 6, 8, dtype=torch.float64), 3)


def test_contrast_models_are_appended_once_and_the_field_is_checked() -> None:
    from dataclasses import replace

    from hopfield.experiments.hyperset_common import name_seed
    from hopfield.experiments.hyperset_images import CONTRAST, PRESETS, _model_names, check_config
    from hopfield.experiments.registry import ConfigError

    small = PRESETS["small"]
    without = _model_names(replace(small, contrast=False))
    # the contrast models come after the others, Hyper-SET (already trained in models) only once
    assert _model_names(small) == [*without, "hyperset+fixed-0.1", "shared-qkv",
                                   "shared-qkv-reversed"]  # fmt: skip
    alone = replace(small, models=("transformer",), ablations=(), layer_splits=(), lora_ranks=())
    assert _model_names(alone) == ["transformer", *CONTRAST]
    # a run's seed index is its model name's CRC-32: the same in every list, distinct per name
    names = _model_names(small)
    assert name_seed("hyperset") == 0x9D4F90BA  # CRC-32 of b"hyperset": stable across runs
    assert len({name_seed(name) for name in names}) == len(names)
    with pytest.raises(ConfigError, match="contrast"):
        check_config(replace(small, contrast="yes"))  # type: ignore[arg-type]

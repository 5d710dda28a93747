"""STanHop-Net: segment embedding, merging, association kinds, shapes and parameter counts."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hopfield.functional import ClippedSoftmax, Entmax, Softmax, SoftmaxN, Sparsemax
from hopfield.models.stanhop import Association, SegmentEmbedding, SegmentMerging, STanHopNet
from hopfield.nn import GatedAttention


def test_segment_embedding_front_pads_with_the_first_step() -> None:
    emb = SegmentEmbedding(seg_len=4, d_model=3)
    x = torch.randn(2, 10, 5)
    out = emb(x)
    assert out.shape == (2, 5, 3, 3)
    # Segment 0 of series 1 is [x0, x0, x0, x1]; segment 2 is x[6:10].
    first = torch.stack([x[:, 0, 1], x[:, 0, 1], x[:, 0, 1], x[:, 1, 1]], dim=-1)
    assert torch.allclose(out[:, 1, 0], emb.linear(first), atol=1e-6)
    assert torch.allclose(out[:, 1, 2], emb.linear(x[:, 6:10, 1]), atol=1e-6)
    with pytest.raises(ValueError, match="seg_len"):
        SegmentEmbedding(0, 3)


def test_segment_merging_groups_neighbours_and_repeats_the_tail() -> None:
    merge = SegmentMerging(d_model=2, win_size=2)
    x = torch.randn(1, 3, 5, 2)
    out = merge(x)
    assert out.shape == (1, 3, 3, 2)
    group = torch.cat([x[:, :, 2], x[:, :, 3]], dim=-1)
    assert torch.allclose(out[:, :, 1], merge.linear(merge.norm(group)), atol=1e-6)
    tail = torch.cat([x[:, :, 4], x[:, :, 4]], dim=-1)  # N=5, w=2: the last segment repeats
    assert torch.allclose(out[:, :, 2], merge.linear(merge.norm(tail)), atol=1e-6)
    with pytest.raises(ValueError, match="win_size"):
        SegmentMerging(2, 1)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("dense", Softmax),
        ("sparse", Sparsemax),
        ("gsh", Entmax),
        ("outeffhop", SoftmaxN),
        ("clipped", ClippedSoftmax),
        ("gated_outeffhop", SoftmaxN),
    ],
)
def test_association_kinds(kind: str, expected: type) -> None:
    association = Association(kind)
    sep = association.separation()
    assert isinstance(sep, expected)
    assert association.gated == kind.startswith("gated")
    if kind == "outeffhop":
        assert sep.n == 1.0
    if kind == "gsh":
        assert sep is not association.separation()  # one learnable alpha per module
        assert float(torch.as_tensor(sep.alpha).detach()) == pytest.approx(1.5)


def test_clipped_outeffhop_and_bad_kind() -> None:
    sep = Association("clipped_outeffhop").separation()
    assert isinstance(sep, ClippedSoftmax) and isinstance(sep.base, SoftmaxN) and sep.base.n == 1
    assert (sep.gamma, sep.zeta) == (-0.1, 1.1)
    with pytest.raises(ValueError, match="kind"):
        Association("softmax2")


def tiny_net(kind: str = "gsh", **kwargs: Any) -> STanHopNet:
    args: dict[str, Any] = dict(
        win_size=2, factor=3, d_model=16, d_ff=32, num_heads=4, e_layers=2, dropout=0.0
    )
    args.update(kwargs)
    return STanHopNet(3, 24, 8, 4, association=Association(kind), **args)


@pytest.mark.parametrize("kind", ["dense", "gsh", "clipped_outeffhop", "gated_outeffhop"])
def test_forward_shapes_and_gradients(kind: str) -> None:
    net = tiny_net(kind)
    x = torch.randn(2, 24, 3)
    out = net(x)
    assert out.shape == (2, 8, 3) and torch.isfinite(out).all()
    out.square().mean().backward()
    assert all(p.grad is not None for p in net.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="in_len"):
        net(torch.randn(2, 20, 3))


def test_padding_path_segment_counts() -> None:
    net = STanHopNet(
        2, 170, 30, 6, win_size=2, factor=2, d_model=8, d_ff=16, num_heads=2, e_layers=3
    )
    x = torch.randn(1, 170, 2)
    assert [e.shape[2] for e in net.encode(x)] == [29, 29, 15, 8]
    assert net(x).shape == (1, 30, 2)


def test_parameter_counts_match_the_spec() -> None:
    table1 = dict(win_size=1, factor=10, d_model=256, d_ff=512, num_heads=4, e_layers=11)
    dense = STanHopNet(7, 168, 24, 6, association=Association("dense"), device="meta", **table1)
    assert dense.parameter_counts() == {"total": 35_185_992, "without_position_tables": 35_128_648}
    gated = STanHopNet(7, 168, 24, 6, association=Association("gated"), device="meta", **table1)
    assert gated.parameter_counts()["without_position_tables"] == 35_149_708  # "35.15m"
    template = STanHopNet(
        7,
        168,
        24,
        12,
        win_size=4,
        factor=10,
        d_model=256,
        d_ff=512,
        num_heads=4,
        e_layers=2,
        device="meta",
    )
    # The spec's 8,093,256 includes 18 unused `alpha_chooser` scalars (defect D6).
    assert template.parameter_counts()["total"] == 8_093_256 - 18
    alphas = [m for m in template.modules() if isinstance(m, Entmax)]
    assert len(alphas) == 3 * 2 + 4 * 3  # one learnable alpha per association module


def test_heads_are_merged_per_position() -> None:
    layer = tiny_net("dense").decoder[0].cross.eval()
    stored, state = torch.randn(1, 6, 16), torch.randn(1, 5, 16)
    base = layer((stored, state, stored))
    state2 = state.clone()
    state2[0, 3] += 1.0
    changed = (layer((stored, state2, stored)) - base).abs().sum(-1)[0] > 1e-6
    assert changed.tolist() == [False, False, False, True, False]


def test_series_stage_is_permutation_equivariant() -> None:
    block = tiny_net("gsh").encoder[0].eval()
    x = torch.randn(2, 3, 5, 16)
    perm = torch.tensor([2, 0, 1])
    assert torch.allclose(block(x)[:, perm], block(x[:, perm]), atol=1e-5)


def test_initialisation_and_learnable_alpha() -> None:
    net = tiny_net("gsh")
    assert all(torch.isfinite(p).all() for p in net.parameters())
    routers = net.encoder[0].routers
    assert torch.cdist(routers, routers).add(torch.eye(3) * 9).min() > 1e-3  # pairwise distinct
    assert set(net.alphas().values()) == {1.5}
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    net(torch.randn(4, 24, 3)).square().mean().backward()
    optimizer.step()
    alphas = list(net.alphas().values())
    assert any(a != 1.5 for a in alphas) and all(1 < a < 2 for a in alphas)
    net.reset_parameters()
    assert set(net.alphas().values()) == {1.5}


def test_gated_kind_installs_gates() -> None:
    net = tiny_net("gated")
    gates = [m for m in net.modules() if isinstance(m, GatedAttention)]
    assert len(gates) == 3 * 2 + 4 * 3 and all(g.pi_init == 0.25 for g in gates)
    assert not any(isinstance(m, GatedAttention) for m in tiny_net("dense").modules())

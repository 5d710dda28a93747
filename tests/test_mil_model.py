"""MIL model: pooling methods, masks (batched = per bag), ROC-AUC, evaluation (training: see
test_mil_experiments.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from hopfield.data.mil import MILDataset, make_bit_pattern_bags
from hopfield.experiments.mil_common import torch_threads
from hopfield.functional import Dense, Softmax, SoftmaxN, Sparsemax
from hopfield.functional.efficient import RandomMask, TopK
from hopfield.functional.efficient_kernel import Linear, RandomFeatures
from hopfield.models.mil import (
    POOLING_METHODS,
    GeneratorState,
    MILNet,
    evaluate,
    pooling_method,
    predict,
    roc_auc,
    standardize,
)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models run far faster on one thread, above all on a busy machine."""
    with torch_threads(1):
        yield


def test_pooling_method_table() -> None:
    assert isinstance(pooling_method("dense")[1], Dense)
    assert isinstance(pooling_method("sparse")[0], Sparsemax)
    separation, _ = pooling_method("outeffhop")
    assert isinstance(separation, SoftmaxN) and not isinstance(separation, Softmax)
    _, topk = pooling_method("topk-20")
    assert isinstance(topk, TopK) and topk.fraction == pytest.approx(0.2)
    _, mask = pooling_method("random-mask-80", seed=3)
    assert isinstance(mask, RandomMask) and mask.fraction == pytest.approx(0.2)
    assert isinstance(pooling_method("linear")[1], Linear)
    assert isinstance(pooling_method("random-features")[1], RandomFeatures)
    for name in POOLING_METHODS:
        pooling_method(name)
    for bad in ("topk-0", "topk-101", "random-mask-100", "window", "dense2"):
        with pytest.raises(ValueError):
            pooling_method(bad)
    with pytest.raises(TypeError):
        pooling_method(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "method", ["dense", "sparse", "entmax", "outeffhop", "topk-50", "linear", "random-features"]
)
def test_batched_padded_bags_equal_single_bags(method: str) -> None:
    torch.manual_seed(0)
    net = MILNet(6, embedding_size=16, num_heads=2, quantity=2, method=method, seed=0).eval()
    bags = [torch.randn(n, 6) for n in (3, 7, 1, 5)]
    data = MILDataset(
        torch.cat(bags),
        torch.repeat_interleave(torch.arange(4), torch.tensor([3, 7, 1, 5])),
        torch.zeros(4),
        torch.arange(4),
    )
    x, mask, _ = data.batch(torch.arange(4))
    x = x.masked_fill(mask[..., None], 1e3)  # padding content must not matter
    batched = net(x, mask)
    single = torch.cat([net(bag[None]) for bag in bags])
    torch.testing.assert_close(batched, single, rtol=1e-4, atol=1e-5)


def test_random_mask_pooling_is_fixed_in_eval() -> None:
    net = MILNet(4, embedding_size=8, num_heads=2, method="random-mask-50", seed=1).eval()
    x = torch.randn(5, 12, 4)
    torch.testing.assert_close(net(x), net(x))


def test_milnet_validation_and_reset() -> None:
    net = MILNet(4, embedding_size=8, num_heads=2, dropout=0.5)
    with pytest.raises(ValueError, match="x must be"):
        net(torch.randn(3, 4))
    with pytest.raises(ValueError, match="padding_mask"):
        net(torch.randn(2, 3, 4), torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="dropout"):
        MILNet(4, dropout=1.0)
    with pytest.raises(ValueError, match="input_size"):
        MILNet(0)
    before = net.pooling.state_patterns.detach().clone()
    with torch.no_grad():
        net.pooling.state_patterns.add_(1.0)
    net.reset_parameters()
    assert net.pooling.state_patterns.abs().max() < before.abs().max() + 0.5
    double = MILNet(4, embedding_size=8, num_heads=2, dtype=torch.float64)
    assert double(torch.randn(2, 3, 4, dtype=torch.float64)).dtype == torch.float64


def test_roc_auc_matches_sklearn_with_ties() -> None:
    rng = np.random.default_rng(0)
    for _ in range(5):
        labels = rng.integers(0, 2, 40)
        scores = rng.integers(0, 6, 40).astype(float)  # many ties
        assert roc_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores))
    assert roc_auc(torch.tensor([0.3, 0.1]), torch.tensor([1.0, 1.0])) != roc_auc([0, 1], [1, 0])
    assert math.isnan(roc_auc([0.3, 0.1], [1, 1]))
    with pytest.raises(ValueError, match="same length"):
        roc_auc([0.1, 0.2], [1])


def test_standardize_uses_train_statistics() -> None:
    train, test = torch.randn(50, 3) * 4 + 2, torch.randn(10, 3)
    a, b = standardize(train, test)
    torch.testing.assert_close(a.mean(0), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(b, (test - train.mean(0)) / train.std(0))


def test_predict_and_evaluate_in_order_and_mode() -> None:
    bags, _ = make_bit_pattern_bags(10, 4, num_bits=4, num_signals=1, seed=0)
    net = MILNet(4, embedding_size=8, num_heads=2, dropout=0.5).train()
    logits = predict(net, bags, batch_size=3)  # several batches, in order, without dropout
    assert net.training and logits.shape == (10,)
    x, mask, labels = bags.batch(torch.arange(10))
    torch.testing.assert_close(logits, net.eval()(x, mask))
    metrics = evaluate(net, bags, batch_size=4)
    assert metrics["accuracy"] == pytest.approx(
        float(((logits > 0).float() == labels).float().mean())
    )
    assert metrics["auc"] == pytest.approx(roc_auc_score(labels.numpy(), logits.numpy()))
    assert metrics["loss"] == pytest.approx(
        float(torch.nn.functional.binary_cross_entropy_with_logits(logits, labels))
    )


def test_random_mask_draws_are_in_the_state_dict() -> None:
    """A checkpoint of a random-mask model resumes its training draws where they were."""
    x = torch.randn(3, 10, 4)
    net = MILNet(4, embedding_size=8, num_heads=2, method="random-mask-50", seed=7).train()
    assert isinstance(net.mask_draws, GeneratorState)
    net(x)  # some draws before the checkpoint
    state = {k: v.clone() for k, v in net.state_dict().items()}
    assert "mask_draws._extra_state" in state
    first, second = net(x), net(x)
    assert not torch.equal(first, second)  # fresh subsets every call
    net.load_state_dict(state)
    torch.testing.assert_close(net(x), first)
    twin = MILNet(4, embedding_size=8, num_heads=2, method="random-mask-50", seed=7)
    twin.load_state_dict(state)
    torch.testing.assert_close(twin.train()(x), first)
    for other in (
        MILNet(4, embedding_size=8, num_heads=2, method="random-mask-50"),  # global generator
        MILNet(4, embedding_size=8, num_heads=2, method="dense", seed=7),
    ):
        assert not hasattr(other, "mask_draws")
        assert not any("extra_state" in k for k in other.state_dict())
    with pytest.raises(TypeError, match="generator"):
        GeneratorState(7)  # type: ignore[arg-type]

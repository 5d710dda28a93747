"""Helpers of the ``theory`` rows for the SVR framework and OutEffHop Theorem 3.4 (float64)."""

from __future__ import annotations

import math

import pytest
import torch

from hopfield.experiments.theory import PRESETS
from hopfield.experiments.theory_generalization import (
    LayerSetting,
    bound,
    f_hop,
    generalization_checks,
    norms,
    project,
)
from hopfield.experiments.theory_svr import certify, contaminated, feature_kernel, theorem_31_cases
from hopfield.functional.svr import fit_svr, linear_kernel

DTYPE = torch.float64


def test_certify_passes_an_exact_fit_and_catches_a_wrong_one() -> None:
    g = torch.Generator().manual_seed(0)
    keys, values, radius = contaminated(g, 15, 6, 0.5)
    assert float((keys - values).norm(dim=-1).max()) == pytest.approx(0.5 * radius)
    queries = torch.randn(10, 6, generator=g, dtype=DTYPE)
    for name, features, _ in theorem_31_cases():
        kernel = linear_kernel if name == "linear" else feature_kernel(features)
        memory = fit_svr(keys, values, kernel, epsilon=0.05, C=0.05)
        deviation, gap = certify(memory, features, queries)
        assert deviation <= 1e-12 and gap <= 1e-12
        memory.coef[0] *= 0.5  # no longer the optimum: the duality gap opens
        assert certify(memory, features, queries)[1] > 1e-6


def test_f_hop_is_the_printed_layer() -> None:
    # f_hop(Y, Q) = W̃_Vᵀ Yᵀ Softmax_1(β Y W_K Qᵀ), Softmax_1 over the M memories (columns).
    g = torch.Generator().manual_seed(1)
    y, q = (
        torch.randn(3, 7, 5, generator=g, dtype=DTYPE),
        torch.randn(3, 4, 6, generator=g, dtype=DTYPE),
    )
    w_k, w_v = (
        torch.randn(5, 6, generator=g, dtype=DTYPE),
        torch.randn(5, 6, generator=g, dtype=DTYPE),
    )
    out = f_hop(y, q, w_k, w_v, 0.7)
    for n in range(3):
        scores = torch.exp(0.7 * y[n] @ w_k @ q[n].T)  # (M, T)
        weights = scores / (1 + scores.sum(0, keepdim=True))
        torch.testing.assert_close(out[n], (w_v.T @ y[n].T @ weights).T, rtol=1e-12, atol=1e-12)


def test_project_keeps_the_weights_in_the_class() -> None:
    g = torch.Generator().manual_seed(2)
    w = 10 * torch.randn(8, 8, generator=g, dtype=DTYPE)
    spectral, columns = norms(project(w, 2.0, 4.0))
    assert spectral <= 2.0 + 1e-12 and columns <= 4.0 + 1e-12
    assert max(spectral / 2.0, columns / 4.0) == pytest.approx(1.0)  # scaled onto the boundary
    small = 1e-3 * w
    torch.testing.assert_close(project(small, 2.0, 4.0), small, rtol=0, atol=0)
    assert norms(torch.eye(3, dtype=DTYPE)) == pytest.approx((1.0, 3.0))


def test_the_bound_by_hand() -> None:
    s = LayerSetting()
    n = 100
    log = math.log(s.d * n * s.memories)
    e1 = (4 * 4 * 1 * 16 * log) ** (1 / 3)  # 4 B_V² B_Y² (β B_K^{2,1})² log(dNM)
    e2 = (16 * log) ** (1 / 3)
    expected = (math.sqrt((e1 + e2) ** 3) + math.sqrt(math.log(20))) / 10
    assert bound(s, n) == pytest.approx(expected, rel=1e-12)
    assert bound(s, 10_000) < bound(s, 1000) < bound(s, 100)


def test_generalization_rows_at_the_tiny_preset() -> None:
    checks, table = generalization_checks(PRESETS["tiny"])
    assert [c.paper for c in checks] == ["OutEffHop Thm 3.4"] * 2
    assert all(c.status == "pass" for c in checks)
    assert checks[0].trials == 4 and checks[0].margin > 0
    assert len(table.rows) == 2

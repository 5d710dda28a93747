"""Verdicts from paired runs: hand-computed t intervals, scipy's tests, ties and small n."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from hopfield.claims import VERDICTS, compare_paired, exact_verdict


def test_vocabulary_is_the_ledgers() -> None:
    assert VERDICTS == (
        "holds", "does not hold", "inconclusive", "not tested at this scale", "not implemented"
    )  # fmt: skip


def test_hand_computed_interval_three_seeds() -> None:
    """Differences 1, 2, 3: mean 2, sd 1, t = 2·√3 on 2 df, interval 2 ± 4.303/√3."""
    result = compare_paired([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert result.n == 3 and result.mean_difference == 2.0
    assert result.t == pytest.approx(2 * math.sqrt(3))
    assert result.p_t == pytest.approx(0.07418, abs=1e-4)
    half = 4.302653 / math.sqrt(3)
    assert result.interval == pytest.approx((2 - half, 2 + half), abs=1e-5)
    assert result.verdict == "inconclusive"  # the interval contains 0
    assert result.p_wilcoxon is None  # fewer than 6 pairs


def test_matches_scipy_paired_tests() -> None:
    ours = [0.61, 0.58, 0.66, 0.70, 0.59, 0.64, 0.68, 0.62]
    rival = [0.55, 0.57, 0.60, 0.61, 0.60, 0.58, 0.63, 0.59]
    result = compare_paired(ours, rival)
    reference = stats.ttest_rel(ours, rival)
    assert result.t == pytest.approx(reference.statistic)
    assert result.p_t == pytest.approx(reference.pvalue)
    assert result.p_wilcoxon == pytest.approx(stats.wilcoxon(ours, rival).pvalue)
    assert result.verdict == "holds" and result.interval[0] > 0
    assert compare_paired(ours, rival, min_effect=0.2).verdict == "does not hold"
    assert compare_paired(ours, rival, direction="lower").verdict == "does not hold"
    assert "paired t p=" in result.describe() and "Wilcoxon" in result.describe()


def test_a_tie_or_a_single_run_never_decides() -> None:
    tie = compare_paired([0.016] * 4, [0.016] * 4)  # the four-way tie of noise-robustness
    assert tie.verdict == "inconclusive" and math.isnan(tie.p_t) and tie.mean_difference == 0
    assert compare_paired([0.9], [0.1]).verdict == "inconclusive"
    assert compare_paired([0.9, 0.95], [0.1, 0.12]).verdict == "inconclusive"
    constant = compare_paired([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])  # no spread, three runs
    assert constant.verdict == "holds" and constant.p_t == 0.0


def test_lower_is_better_and_the_outlier_formation_gap() -> None:
    """A W8A8 gap that must fall; differences that straddle 0 over 3 seeds stay inconclusive."""
    ours, rival = [5.1, 7.9, 6.2], [5.9, 4.4, 2.8]
    result = compare_paired(ours, rival, direction="lower")
    reference = stats.ttest_rel(ours, rival)
    assert result.t == pytest.approx(-reference.statistic)
    assert result.p_t == pytest.approx(reference.pvalue)
    assert result.verdict == "inconclusive"
    assert compare_paired([1.0, 1.1, 0.9], [2.0, 2.2, 2.1], direction="lower").verdict == "holds"


def test_outlier_formation_w8a8_gap_is_inconclusive() -> None:
    """docs/outlier-formation.md: W8A8 gap % per seed, vanilla (5.9, 4.4, 2.8) and OutEffHop
    (9.2, 2.8, 7.4). Differences 3.3, -1.6, 4.6: mean 2.1, sd √10.69, t = 2.1/(sd/√3) ≈ 1.11
    on 2 df, p ≈ 0.38; interval 2.1 ± 4.303·sd/√3 contains 0."""
    result = compare_paired([9.2, 2.8, 7.4], [5.9, 4.4, 2.8], direction="lower")
    half = 4.302653 * math.sqrt(10.69) / math.sqrt(3)
    assert result.mean_difference == pytest.approx(-2.1)
    assert result.t == pytest.approx(-1.1125, abs=1e-4)
    assert result.p_t == pytest.approx(0.3817, abs=1e-4)
    assert result.interval == pytest.approx((-2.1 - half, -2.1 + half), abs=1e-5)
    assert result.verdict == "inconclusive" and result.p_wilcoxon is None


def test_equal_claims_need_the_interval_inside_the_margin() -> None:
    """Differences 0.1, -0.1, 0.0, 0.05, -0.05, 0.0: mean 0, sd √0.005, half-width
    2.5706·√0.005/√6 ≈ 0.0742."""
    ours = [1.1, 0.9, 1.0, 1.05, 0.95, 1.0]
    result = compare_paired(ours, [1.0] * 6, direction="equal", min_effect=0.1)
    assert result.interval == pytest.approx((-0.07421, 0.07421), abs=1e-4)
    assert result.verdict == "holds"
    assert result.p_wilcoxon == pytest.approx(stats.wilcoxon([0.1, -0.1, 0.05, -0.05]).pvalue)
    assert compare_paired(ours, [1.0] * 6, direction="equal", min_effect=0.05).verdict == (
        "inconclusive"
    )
    far = compare_paired([2.0, 2.1, 1.9], [1.0, 1.0, 1.0], direction="equal", min_effect=0.1)
    assert far.verdict == "does not hold"
    tie = compare_paired([1.0] * 4, [1.0] * 4, direction="equal", min_effect=0.1)
    assert tie.verdict == "inconclusive"  # a tie decides nothing, not even equality
    with pytest.raises(ValueError, match="margin"):
        compare_paired(ours, [1.0] * 6, direction="equal")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"ours": [1.0], "rival": [1.0, 2.0]}, ValueError, "pair up"),
        ({"ours": [], "rival": []}, ValueError, "no values"),
        ({"ours": [math.nan], "rival": [1.0]}, ValueError, "NaN"),
        ({"ours": "abc", "rival": [1.0]}, TypeError, "ours"),
        ({"ours": [1.0], "rival": [1.0], "direction": "up"}, ValueError, "direction"),
        ({"ours": [1.0], "rival": [1.0], "min_effect": -1.0}, ValueError, "min_effect"),
    ],
)
def test_bad_arguments(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        compare_paired(**kwargs)


def test_exact_verdicts() -> None:
    assert exact_verdict(22_050_000, 22_030_000, tolerance=10_000) == "does not hold"
    assert exact_verdict(962_218, 960_000, tolerance=5_000) == "holds"
    with pytest.raises(ValueError, match="tolerance"):
        exact_verdict(1.0, 1.0, tolerance=-1.0)

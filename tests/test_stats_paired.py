"""Verdicts from paired runs: hand-computed t intervals, scipy's tests, the decision's p-value,
exact sign-flip tests, ties and small n."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from hopfield.claims import VERDICTS
from hopfield.stats import compare_paired, exact_verdict, sign_flip_p


def test_vocabulary_is_the_ledgers() -> None:
    assert VERDICTS == (
        "holds", "does not hold", "inconclusive", "premise absent at this scale", "toy stand-in",
        "not run", "not implemented",
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


def test_a_single_run_or_two_never_decide() -> None:
    assert compare_paired([0.9], [0.1]).verdict == "inconclusive"
    assert compare_paired([0.9, 0.95], [0.1, 0.12]).verdict == "inconclusive"
    assert compare_paired([0.5, 0.5], [0.5, 0.5]).verdict == "inconclusive"
    single = compare_paired([0.9], [0.1], direction="equal", min_effect=0.1)
    assert math.isnan(single.p_decision) and math.isnan(compare_paired([0.9], [0.1]).p_decision)


def test_a_strict_claim_whose_pairs_all_tie_does_not_hold() -> None:
    """The four-way tie of noise-robustness: no pair favours "beats", evidence against it."""
    tie = compare_paired([0.016] * 4, [0.016] * 4)
    assert tie.verdict == "does not hold" and math.isnan(tie.p_t) and tie.mean_difference == 0
    assert compare_paired([0.016] * 3, [0.016] * 3, direction="lower").verdict == "does not hold"


def test_differences_without_spread_use_the_exact_sign_flip_test() -> None:
    """[1, 1, 1] against [0, 0, 0]: the t-test is undefined (sd 0); the exact two-sided
    sign-flip p-value is 2/2³ = 0.25, so three identical wins decide nothing; six give 2/2⁶."""
    constant = compare_paired([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    assert constant.p_decision == 0.25 and constant.verdict == "inconclusive"
    six = compare_paired([1.0] * 6, [0.0] * 6)
    assert six.p_decision == pytest.approx(2 / 64) and six.verdict == "holds"
    against = compare_paired([0.0] * 6, [1.0] * 6)
    assert against.p_decision == pytest.approx(2 / 64) and against.verdict == "does not hold"


def test_sign_flip_p_by_hand() -> None:
    """Values 3, 1, −1: sums over the 8 sign patterns of |x| = (3, 1, 1) are 5, 3, 3, 1, −1,
    −3, −3, −5; the observed 3 is reached by 3 of them."""
    assert sign_flip_p([3.0, 1.0, -1.0]) == pytest.approx(3 / 8)
    assert sign_flip_p([2.0, 2.0, 2.0]) == pytest.approx(1 / 8)
    assert sign_flip_p([0.0, 0.0]) == 1.0
    with pytest.raises(ValueError, match="no values"):
        sign_flip_p([])
    with pytest.raises(ValueError, match="at most"):
        sign_flip_p([1.0] * 21)


def test_the_decision_p_is_against_the_margin() -> None:
    """With a margin the decision tests mean − min_effect, not mean − 0 (scipy's one-sample t)."""
    ours = [0.61, 0.58, 0.66, 0.70, 0.59, 0.64, 0.68, 0.62]
    rival = [0.55, 0.57, 0.60, 0.61, 0.60, 0.58, 0.63, 0.59]
    diffs = [o - r for o, r in zip(ours, rival, strict=True)]
    plain = compare_paired(ours, rival)
    assert plain.p_decision == pytest.approx(plain.p_t)
    margin = compare_paired(ours, rival, min_effect=0.02)
    assert margin.p_decision == pytest.approx(stats.ttest_1samp(diffs, 0.02).pvalue)
    assert margin.p_t == pytest.approx(plain.p_t)  # information: the test against 0
    assert margin.verdict == ("holds" if margin.interval[0] > 0.02 else "inconclusive")
    assert "decision p=" in margin.describe()


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
    assert tie.verdict == "inconclusive"  # exact TOST: 2·2⁻⁴ = 0.125
    assert tie.p_decision == pytest.approx(0.125)
    six_ties = compare_paired([1.0] * 6, [1.0] * 6, direction="equal", min_effect=0.1)
    assert six_ties.verdict == "holds" and six_ties.p_decision == pytest.approx(2 / 64)
    diffs = [0.1, -0.1, 0.0, 0.05, -0.05, 0.0]
    tost = 2 * max(
        stats.ttest_1samp(diffs, -0.1, alternative="greater").pvalue,
        stats.ttest_1samp(diffs, 0.1, alternative="less").pvalue,
    )
    assert result.p_decision == pytest.approx(tost)
    assert far.p_decision == pytest.approx(stats.ttest_1samp([1.0, 1.1, 0.9], 0.1).pvalue)
    with pytest.raises(ValueError, match="margin"):
        compare_paired(ours, [1.0] * 6, direction="equal")


def test_at_least_claims_are_non_inferiority_tests() -> None:
    """``at least``: ours may fall short by less than the margin; decided by the t-test of the
    mean difference against ``-min_effect``."""
    slightly_below = compare_paired([0.98, 0.99, 0.97, 0.985], [1.0] * 4, direction="at least",
                                    min_effect=0.05)  # fmt: skip
    diffs = [-0.02, -0.01, -0.03, -0.015]
    assert slightly_below.verdict == "holds"
    assert slightly_below.p_decision == pytest.approx(stats.ttest_1samp(diffs, -0.05).pvalue)
    assert compare_paired([1.2, 1.3, 1.25], [1.0] * 3, direction="at least",
                          min_effect=0.05).verdict == "holds"  # fmt: skip
    far_below = compare_paired([0.5, 0.6, 0.55], [1.0] * 3, direction="at least", min_effect=0.05)
    assert far_below.verdict == "does not hold"
    # exact ties meet an at-least claim (no "all tie" failure), but 3 pairs without spread
    # cannot reach 5 % with the exact sign-flip test
    tie = compare_paired([1.0] * 3, [1.0] * 3, direction="at least", min_effect=0.05)
    assert tie.verdict == "inconclusive" and tie.p_decision == pytest.approx(0.25)
    with pytest.raises(ValueError, match="margin"):
        compare_paired([1.0] * 3, [1.0] * 3, direction="at least")


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


def test_stats_is_a_leaf_package() -> None:
    """hopfield.stats imports nothing of ours, so experiments and the ledger can both use it."""
    import ast
    from pathlib import Path

    import hopfield.stats

    for path in Path(hopfield.stats.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            ours = [n for n in names if n.split(".")[0] == "hopfield" and n != "hopfield.stats"]
            assert not [n for n in ours if not n.startswith("hopfield.stats.")], (path, ours)

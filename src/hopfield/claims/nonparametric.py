"""The checkable claims of the nonparametric modern Hopfield models (Hu et al., ICML 2025), with
the experiment testing each.

Sources: the paper (Lemma 3.1, Thm 3.1, Thm 4.1, Cor. 4.1.1-4.1.3, Lemma 4.1, Prop. 4.1,
Remark 4.2; App. G: Figs. 2-7, Tables 5-6) and the specification's claim list (spec §12.2).
"""

from __future__ import annotations

from hopfield.claims.claim import Claim
from hopfield.claims.extract import (
    efficiency_flops,
    efficiency_slopes,
    efficiency_time,
    mil_auc,
    mil_bags,
    mil_curves,
    retrieval,
    theory_claim,
    timeseries,
)

__all__ = ["CLAIMS"]

PAPER = "nonparametric"


def _theory(id: str, location: str, statement: str, source: str, check: str) -> Claim:
    return theory_claim(PAPER, id, location, statement, f"Nonparametric {source}", check)


THEORY = [
    _theory("NP-T4.1-bound", "Thm 4.1", "‖T_Sparse(x) − ξ_µ‖ ≤ m(M+k−2)exp(−βΔ̃_µ) when the "
            "target is in the support (Top-K, forced masks, dense).", "Thm 4.1",
            "‖T_sparse(x) - ξ_µ‖ <="),
    _theory("NP-C4.1.1-closer", "Cor. 4.1.1", "Top-K retrieval is at least as close to the "
            "memory as dense retrieval when the target is in the support.", "Cor. 4.1.1",
            "‖T_TopK(x) - ξ_µ‖ <="),
    _theory("NP-T4.1-k-order", "Thm 4.1, Fig. 2", "Top-K retrieval error grows with K (lower K, "
            "higher sparsity, lower error).", "Thm 4.1 / Fig. 2", "Top-K retrieval error grows"),
    _theory("NP-B-random-fail", "App. B, Fig. 2", "Random masks that can drop the target memory "
            "fail: error above dense, growing with the masked share.", "App. B / Fig. 2",
            "random masks that can drop"),
    _theory("NP-L4.1-separation", "Lemma 4.1", "Above the separation threshold, T_TopK maps the "
            "sphere S_µ into itself.", "Lemma 4.1", "Δ_µ >="),
    _theory("NP-L4.1-threshold", "Lemma 4.1", "The separation threshold decreases as k "
            "decreases.", "Lemma 4.1", "the separation threshold decreases"),
    _theory("NP-C4.1.3-fixed-point", "Cor. 4.1.3", "Iterating T_TopK from x_0 ∈ S_µ converges to "
            "a fixed point in S_µ.", "Cor. 4.1.3", "iterating T_TopK"),
    _theory("NP-P4.1-grows-d", "Prop. 4.1", "The capacity lower bound grows with the dimension d.",
            "Prop. 4.1", "the capacity lower bound grows with d"),
    _theory("NP-P4.1-falls-k", "Prop. 4.1", "The capacity lower bound falls as k grows.",
            "Prop. 4.1", "the capacity lower bound falls with k"),
    _theory("NP-P4.1-exponential", "Prop. 4.1", "The capacity is exponential in d (C > 1) iff "
            "b > a.", "Prop. 4.1", "C > 1"),
    _theory("NP-L3.1-kernel", "Lemma 3.1", "Dense retrieval is the kernel regression (SVR) "
            "solution with the normalised exponential kernel (with the proof's coefficients).",
            "Lemma 3.1", "the normalised exp-kernel SVR map with the proof's coefficients"),
    _theory("NP-T3.1-svr", "Thm 3.1", "The SVR memory's solution is w*_i = Σ_µ (α_µ − α̃_µ)"
            "Φ(ξ_µ + δξ_µ): the dual map is the primal minimiser's map.", "Thm 3.1",
            "the SVR dual map"),
    _theory("NP-D3.2-retrieval", "Def. 3.2, Remark 3.4", "The fitted SVR memory ϵ-retrieves "
            "every stored memory from its contaminated query.", "Def. 3.2",
            "a fitted SVR memory ϵ-retrieves every stored memory"),
    _theory("NP-T3.2-masked", "Thm 3.2", "The masked SVR (3.6) gives the sparse-structured "
            "model Ξ_𝓜 Softmax(βΞ_δ,𝓜ᵀx) (Top-K, random masks).", "Thm 3.2",
            "the masked SVR construction"),
    _theory("NP-C4.1.2-one-step", "Cor. 4.1.2", "One Top-K step's error is exponentially "
            "suppressed by the separation Δ_µ: ‖T_Sparse(x) − ξ_µ‖ ≤ 2m(M−1)exp(−β(Δ_µ − "
            "2m‖x − ξ_µ‖)) for x ∈ S_µ, µ ∈ 𝓜.", "Cor. 4.1.2", "‖T_sparse(x) - ξ_µ‖ <= 2m(M-1)"),
]  # fmt: skip

_TOPK = ["topk-20", "topk-50", "topk-80"]
_RANDOM = ["random-20", "random-50", "random-80"]
_SUCCESS = "retrieval success (cosine distance ≤ 0.2, one step) at the largest memory size"

RETRIEVAL = [
    Claim("NP-F2-topk-k", PAPER, "Fig. 2 (upper), App. G.1",
          "Top-K retrieval success rises as K falls (higher sparsity, lower error).",
          "figure only", _SUCCESS, "higher", "empirical", "memory-capacity",
          retrieval(["topk-20"], ["topk-50", "topk-80"], study="nonparametric", criterion="cos",
                    steps="one")),
    Claim("NP-F2-topk-sparse", PAPER, "Fig. 2 (upper), App. G.1",
          "On sparse data (MNIST), Top-K with small K performs like Sparse Hopfield (within 0.05 "
          "success).", "figure only", _SUCCESS, "equal", "empirical", "memory-capacity",
          retrieval(["topk-20"], ["sparse"], study="nonparametric", criterion="cos",
                    steps="one", datasets=("mnist", "digits")), min_effect=0.05),
    Claim("NP-F2-topk-dense", PAPER, "Fig. 2 (upper), App. G.1",
          "In sparse settings (MNIST) careful sparsity (Top-K with small K) matches or exceeds "
          "dense retrieval (falls short by less than 0.05 success).", "figure only", _SUCCESS,
          "at least", "empirical", "memory-capacity",
          retrieval(["topk-20"], ["dense"], study="nonparametric", criterion="cos",
                    steps="one", datasets=("mnist", "digits")), min_effect=0.05),
    Claim("NP-F2-random-poor", PAPER, "Fig. 2 (upper), App. G.1",
          "Random-masked Hopfield models perform poorly (below dense), especially on MNIST.",
          "figure only", _SUCCESS, "lower", "empirical", "memory-capacity",
          retrieval(_RANDOM, ["dense"], study="nonparametric", criterion="cos", steps="one")),
    Claim("NP-R4.2-noise", PAPER, "Remark 4.2, Fig. 2 (lower)",
          "Top-K retrieval is more robust to query noise than dense retrieval.", "figure only",
          "retrieval success (cosine, one step) at the highest noise", "higher", "empirical",
          "noise-robustness",
          retrieval(["topk-20", "topk-50"], ["dense"], study="nonparametric", criterion="cos",
                    steps="one")),
]  # fmt: skip

MIL = [
    Claim("NP-F3-bags", PAPER, "Fig. 3, App. G.2",
          "Sparse and Top-K Hopfield keep their MIL accuracy on large bags, above dense.",
          "figure only", "test accuracy at the largest bag size", "higher", "empirical",
          "mil-mnist-bags", mil_bags(["sparse", "topk"], "dense", prefix=True)),
    Claim("NP-F3-dense-drops", PAPER, "Fig. 3, App. G.2",
          "Dense, Linear and Random-masked Hopfield lose accuracy as bags grow.", "figure only",
          "test accuracy, largest against smallest bag size", "lower", "empirical",
          "mil-mnist-bags",
          mil_bags(["dense", "linear", "random"], "dense", against_smallest=True, prefix=True)),
    Claim("NP-F4-converge", PAPER, "Fig. 4, App. G.2",
          "Sparse and Top-K Hopfield converge faster than dense in MIL training.", "curves only",
          "mean test accuracy over the epochs", "higher", "empirical", "mil-mnist-bags",
          mil_curves(["sparse", "topk"], "dense")),
    Claim("NP-T5-sparse", PAPER, "Table 5, App. G.3",
          "Sparse Hopfield dominates the MIL benchmarks except UCSB (ROC-AUC above dense).",
          "0.830 / 0.573 / 0.893 vs 0.813 / 0.563 / 0.877 (Tiger / Fox / Elephant)",
          "fold-mean test ROC-AUC", "higher", "empirical", "mil-benchmark",
          mil_auc("sparse", "dense", exclude=("ucsb",))),
    Claim("NP-T5-top20", PAPER, "Table 5, App. G.3",
          "Top-20 % Hopfield is comparable with Sparse Hopfield on the MIL benchmarks (within "
          "0.03 ROC-AUC).", "0.824 / 0.562 / 0.848 / 0.586 vs 0.830 / 0.573 / 0.893 / 0.585",
          "fold-mean test ROC-AUC", "equal", "empirical", "mil-benchmark",
          mil_auc("topk-20", "sparse"), min_effect=0.03),
]  # fmt: skip

TIMESERIES = [
    Claim("NP-T6-parity", PAPER, "Table 6, App. G.4",
          "Random-feature and Linear Hopfield forecasters match dense MSE (within 10 %).",
          "comparable, better in several settings", "test MSE, change in %", "equal",
          "empirical", "timeseries-hopfield",
          timeseries(["random_features", "linear"], ["dense"], "mse"), min_effect=10.0,
          relative=True),
    Claim("NP-T6-window", PAPER, "Table 6, App. G.4",
          "Window Hopfield degrades significantly (higher MSE than dense) in most settings.",
          "significant degradation", "test MSE", "higher", "empirical", "timeseries-hopfield",
          timeseries(["window"], ["dense"], "mse")),
    Claim("NP-F5-epoch-time", PAPER, "Fig. 5, App. G.4",
          "Window, Linear and Random-feature Hopfield need less time per training epoch than "
          "dense.", "figure only", "CPU seconds per epoch", "lower", "empirical",
          "timeseries-hopfield",
          timeseries(["window", "linear", "random_features"], ["dense"], "cpu_seconds_per_epoch")),
]  # fmt: skip

EFFICIENCY = [
    Claim("NP-F6-fast", PAPER, "Fig. 6, App. G.5",
          "Random-feature, Linear and Window Hopfield layers are faster than dense in practice.",
          "figure only", "forward CPU time at the larger half of the memory sizes", "lower",
          "empirical", "efficiency", efficiency_time(["linear", "rf", "window"], "dense"),
          note="One comparison per (d, L) point over its repeated timings (the replicates)."),
    Claim("NP-F6-random", PAPER, "Fig. 6, App. G.5",
          "Random-masked Hopfield gains no speed over dense (torch.sparse): it is slower.",
          "figure only", "forward CPU time at the larger half of the memory sizes", "higher",
          "empirical", "efficiency", efficiency_time(["random"], "dense"),
          note="Tested as 'slower than dense'; one comparison per (d, L) point over its repeated "
          "timings."),
    Claim("NP-abstract-subquadratic", PAPER, "Abstract, Sec. 3",
          "The efficient sparse-structured Hopfield models (the sqrt(L) window, linear, random "
          "features) have sub-quadratic complexity.", "sub-quadratic",
          "growth exponent of forward CPU time in the number of memories", "lower",
          "empirical", "efficiency",
          efficiency_slopes(["linear", "rf", "window-sqrt"], "dense"),
          note="Slopes over the larger half of the memory sizes, one per repeated timing, "
          "against dense's (quadratic) in the same run, per d: O(L) for linear and random "
          "features, O(L sqrt(L)) for the window of sqrt(L) keys (Sec. 3); the fixed window "
          "(ours) is left out."),
    Claim("NP-F6-random-probability", PAPER, "Fig. 6 (right), App. G.5",
          "Random-masked Hopfield's time grows with the masked probability.", "figure only",
          "forward CPU time at the larger half of the memory sizes", "higher", "empirical",
          "efficiency", efficiency_time(["random"], "lowest probability"),
          note="Needs at least two mask probabilities in the run."),
    Claim("NP-F7-flops", PAPER, "Fig. 7, App. G.5",
          "The efficient models need far fewer FLOPs; dense and sparse share FLOPs, as do "
          "linear and random-feature models.", 0, "relations the FLOP counts break", "equal",
          "exact", "efficiency",
          efficiency_flops(["window", "linear", "rf"],
                           [("sparsemax", "dense"), ("rf", "linear"), ("rf-relu", "linear")]),
          note="Matrix-product counts of the layer the paper measured (efficiency's "
          "'Matrix-product FLOPs', mode layer), what the paper's fvcore counted; the 'Analytic "
          "FLOPs' table, every operation, is extra information. Far fewer = at most a tenth of "
          "dense's at the largest L; shared = within 10 % at every L."),
]  # fmt: skip

CLAIMS: list[Claim] = [*THEORY, *RETRIEVAL, *MIL, *TIMESERIES, *EFFICIENCY]

"""The checkable claims of Hyper-SET (Hu, Zou & Xu), with the experiment testing each.

Sources: the paper (§4.5 parameter counts, §5.1 Sudoku with Figs. 3, 5, 6 (and the Energy
Transformer and CRATE baselines that fail there), §5.2 image
classification with Tables 1, 3, 4 and Fig. 4, App. F.3 with Figs. 13-14, §5.3 MIM with Table 2)
and the specification's claim list (spec §9.3). The image and Sudoku experiments train each
model ``seeds`` times; their empirical claims pair the replicates of the same seed
(:func:`hopfield.stats.replicate_key` names them in ``runs.json``).
"""

from __future__ import annotations

from hopfield.claims.claim import Claim
from hopfield.claims.extract import (
    hyperset_accuracy,
    hyperset_extrapolation_gain,
    hyperset_params,
    hyperset_subspace_change,
    hyperset_toy,
    hyperset_trajectory,
    theory_claim,
)

__all__ = ["CLAIMS"]

PAPER = "hyperset"


_SCALEUP = "hyperset-scaleup"


def _params(
    id: str,
    location: str,
    what: str,
    paper: float,
    experiment: str,
    model: str,
    decimals: int = 2,
) -> Claim:
    """A parameter count printed in millions with ``decimals`` decimals (tolerance half a unit
    of the last one)."""
    return Claim(
        id, PAPER, location, f"{what} has {paper / 1e6:.{decimals}f} M parameters.", paper,
        "parameters", "equal", "exact", experiment, hyperset_params(model),
        tolerance=0.5 * 10.0 ** (6 - decimals), planned=model,
    )  # fmt: skip


def _lora_params(rank: int, paper_total: float) -> Claim:
    """Table 4 (ImageNet-100): what depth-wise LoRA of ``rank`` adds to the Scale-up model,
    printed as two totals in millions with two decimals (so the increment is known to 0.01 M)."""
    increment = round(paper_total - 1.93e6)
    return Claim(
        f"HS-T4-params-lora{rank}", PAPER, "Table 4",
        f"Depth-wise LoRA of rank {rank} adds {increment / 1e6:.2f} M parameters to the "
        f"Scale-up Hyper-SET ({paper_total / 1e6:.2f} M against 1.93 M).", increment,
        "parameters added", "equal", "exact", "hyperset-images",
        hyperset_params(f"{_SCALEUP}-lora{rank}", base=_SCALEUP), tolerance=1e4,
        planned=f"{_SCALEUP}-lora{rank}", planned_base=_SCALEUP,
        note="The increment does not depend on the dataset: the paper preset (CIFAR-10) counts "
        "it for the ImageNet-100 model of Table 4.",
    )  # fmt: skip


def _theory(id: str, location: str, statement: str, source: str, check: str) -> Claim:
    return theory_claim(PAPER, id, location, statement, source, check)


PARAMETERS = [
    _params("HS-S4.5-params-sudoku", "§4.5, Fig. 3", "The Sudoku Hyper-SET (d 768)", 5.20e6,
            "hyperset-sudoku", "hyperset"),
    _params("HS-S4.5-params-sudoku-transformer", "§4.5, Fig. 3", "The Sudoku Transformer",
            7.16e6, "hyperset-sudoku", "transformer"),
    _params("HS-T1-params-small", "Table 1", "The CIFAR-10 Small Hyper-SET", 0.96e6,
            "hyperset-images", "hyperset"),
    _params("HS-T1-params-transformer", "Table 1", "The CIFAR-10 Transformer", 1.79e6,
            "hyperset-images", "transformer"),
    _params("HS-T1-params-scaleup", "Table 1", "The CIFAR-10 Small Scale-up Hyper-SET", 1.61e6,
            "hyperset-images", "hyperset-scaleup"),
    _params("HS-T1-params-et", "Table 1", "The CIFAR-10 Small Energy Transformer", 0.91e6,
            "hyperset-images", "et"),
    _params("HS-T2-params-mim", "Table 2", "The MIM Hyper-SET", 3.94e6, "hyperset-mim",
            "hyperset"),
    _params("HS-T20-params-transformer", "Table 20, App. G.2",
            "The CIFAR-10 Transformer of width 1152", 16.0e6, "hyperset-images",
            "transformer-d1152", decimals=1),
    _params("HS-T20-params-crate", "Table 20, App. G.2", "The CIFAR-10 CRATE of width 1152",
            4.1e6, "hyperset-images", "crate-d1152", decimals=1),
    _params("HS-T20-params-et", "Table 20, App. G.2",
            "The CIFAR-10 Energy Transformer of width 1152", 8.0e6, "hyperset-images",
            "et-d1152", decimals=1),
    _params("HS-T20-params-hyperset", "Table 20, App. G.2",
            "The CIFAR-10 Hyper-SET of width 1536", 14.3e6, "hyperset-images", "hyperset-d1536",
            decimals=1),
    _params("HS-T2-params-mim-transformer", "Table 2", "The MIM Transformer", 8.85e6,
            "hyperset-mim", "transformer"),
    *(_lora_params(rank, total)
      for rank, total in ((4, 2.03e6), (8, 2.13e6), (16, 2.33e6), (32, 2.72e6))),
]  # fmt: skip

IDENTITIES = [
    _theory("HS-E7-gradients", "Eqs. 7, 10, Tables 18-19", "The layer's updates are the "
            "gradients of its energies (bi-softmax attention, ReLU FF and the alternatives).",
            "Hyper-SET Eqs. 7, 10, Tables 18-19", "the updates are the energy gradients"),
    _theory("HS-S3-sphere", "§3", "RMS-normalised projections lie on spheres of radius √p and "
            "√M.", "Hyper-SET §3", "RMS-normalised projections"),
    _theory("HS-S3-identity", "§3.3", "With zero-initialised step sizes the model is the "
            "identity at initialisation.", "Hyper-SET §3.3", "with zero-initialised step sizes"),
]  # fmt: skip

SUDOKU = [
    Claim("HS-F3-sudoku", PAPER, "Fig. 3a, §5.1",
          "On Sudoku, Hyper-SET beats the weight-shared Transformer with fewer parameters.",
          "54.70 vs 49.30 % boards", "board accuracy after L iterations", "higher", "empirical",
          "hyperset-sudoku", hyperset_accuracy([("hyperset", "transformer")])),
    Claim("HS-F3-baselines-fail", PAPER, "Fig. 3a, §5.1",
          "On Sudoku the Energy Transformer and CRATE both fail where Hyper-SET learns.",
          "0 % boards for 200 epochs (ET, CRATE) vs 54.70 %", "board accuracy after L iterations",
          "higher", "empirical", "hyperset-sudoku",
          hyperset_accuracy([("hyperset", "et"), ("hyperset", "crate")])),
    Claim("HS-F3-extrapolation", PAPER, "Fig. 3b, §5.1",
          "Hyper-SET improves when run for more iterations at test time (2L against L).",
          "54.70 → 57.23 % boards", "board accuracy after 2L iterations", "higher", "empirical",
          "hyperset-sudoku", hyperset_accuracy([("hyperset", "hyperset@L")], at="2L")),
    Claim("HS-F3-beyond-training", PAPER, "Fig. 3b, §5.1",
          "Run beyond its training regime (2L iterations at test time) Hyper-SET still beats the "
          "weight-shared Transformer, averaged over five runs.", "57.23 vs 51.20 % boards",
          "board accuracy after 2L iterations", "higher", "empirical", "hyperset-sudoku",
          hyperset_accuracy([("hyperset", "transformer")], at="2L")),
    Claim("HS-F3-larger-gain", PAPER, "Fig. 3b, §5.1",
          "Hyper-SET scales with test-time iterations more effectively than the Transformer: "
          "its gain from L to 2L iterations is larger.", "+2.53 vs +1.90 points",
          "gain in board accuracy from L to 2L iterations", "higher", "empirical",
          "hyperset-sudoku", hyperset_extrapolation_gain("hyperset", "transformer")),
    Claim("HS-F5-energy", PAPER, "Fig. 5, §5.1",
          "Both energies (attention and feed-forward) decrease along the iterations.",
          "curves only", "slope of E_ATTN and E_FF over the iterations", "lower", "empirical",
          "hyperset-sudoku", hyperset_trajectory("hyperset", [("e_attn", "slope"), ("e_ff", "slope")]),
          note="Per replicate (seed), the least-squares slope of each energy over Hyper-SET's L "
          "training iterations on the test puzzles (`analysis` in runs.json; the rows past L, "
          "test-time extrapolation, left out), against 0."),
    Claim("HS-F6-uniformity", PAPER, "Fig. 6, §5.1",
          "Token representations grow more uniform along the iterations: effective rank and "
          "average angle rise.", "curves only", "change of effective rank and angle over L",
          "higher", "empirical", "hyperset-sudoku",
          hyperset_trajectory("hyperset", [("erank", "change"), ("angle", "change")]),
          note="Per replicate (seed), the effective rank and the average angle (means over "
          "heads) after iteration L less after iteration 1 (`analysis` in runs.json), against "
          "0."),
]  # fmt: skip


IMAGES = [
    Claim("HS-T1-equal-width", PAPER, "Table 1, §5.2",
          "At equal width Hyper-SET is within about 2 points of the Transformer with about half "
          "the parameters.", "88.89 vs 89.90 % (CIFAR-10)", "top-1 accuracy (points)", "equal",
          "empirical", "hyperset-images", hyperset_accuracy([("hyperset", "transformer")]),
          min_effect=2.0),
    Claim("HS-T1-et", PAPER, "Table 1, §5.2",
          "Hyper-SET beats the Energy Transformer at a similar parameter count.",
          "88.89 vs 75.98 % (CIFAR-10)", "top-1 accuracy", "higher", "empirical",
          "hyperset-images", hyperset_accuracy([("hyperset", "et")])),
    Claim("HS-T1-scaleup", PAPER, "Table 1, §5.2",
          "Width-scaled Hyper-SET at matched parameters beats the Transformer.",
          "90.11 vs 89.90 % (CIFAR-10)", "top-1 accuracy", "higher", "empirical",
          "hyperset-images", hyperset_accuracy([(_SCALEUP, "transformer")])),
    Claim("HS-T3-attention", PAPER, "Table 3",
          "Bi-softmax attention beats sigmoid attention, which beats linear attention.",
          "90.11 > 85.93 > 84.88 % (CIFAR-10)", "top-1 accuracy", "higher", "empirical",
          "hyperset-images",
          hyperset_accuracy([(_SCALEUP, f"{_SCALEUP}+attention-sigmoid"),
                             (f"{_SCALEUP}+attention-sigmoid", f"{_SCALEUP}+attention-linear")])),
    Claim("HS-T3-feedforward", PAPER, "Table 3",
          "The ReLU feed-forward energy beats the softmax one, which beats the gated one.",
          "90.11 > 88.20 > 84.99 % (CIFAR-10)", "top-1 accuracy", "higher", "empirical",
          "hyperset-images",
          hyperset_accuracy([(_SCALEUP, f"{_SCALEUP}+ff-softmax"),
                             (f"{_SCALEUP}+ff-softmax", f"{_SCALEUP}+ff-gated")])),
    Claim("HS-T3-steps", PAPER, "Table 3",
          "Learned step sizes beat fixed steps 0.1, which beat fixed steps 0.5.",
          "90.11 > 81.45 > 25.81 % (CIFAR-10)", "top-1 accuracy", "higher", "empirical",
          "hyperset-images",
          hyperset_accuracy([(_SCALEUP, f"{_SCALEUP}+fixed-0.1"),
                             (f"{_SCALEUP}+fixed-0.1", f"{_SCALEUP}+fixed-0.5")])),
    Claim("HS-F4-layers", PAPER, "Fig. 4",
          "Splitting the iterations over more distinct layers raises accuracy mildly.",
          "63.49 → 63.54 / 64.22 / 64.98 % (K = 2 / 6 / 12, CIFAR-100)", "top-1 accuracy",
          "higher", "empirical", "hyperset-images",
          hyperset_accuracy([(f"{_SCALEUP}-layers{k}", _SCALEUP) for k in (2, 3, 4, 6, 12)])),
    Claim("HS-T4-lora", PAPER, "Table 4",
          "Depth-wise LoRA adapters raise accuracy.", "70.16 → 70.36 … 72.20 % (r = 4 … 32)",
          "top-1 accuracy", "higher", "empirical", "hyperset-images",
          hyperset_accuracy([(f"{_SCALEUP}-lora{r}", _SCALEUP) for r in (2, 4, 8, 16, 32)])),
    Claim("HS-F13-separation", PAPER, "Figs. 13-14, App. F.3",
          "Hyper-SET and its fixed-step (0.1) variant both separate the tokens in every "
          "subspace: effective rank and average angle rise along the iterations.",
          "curves only", "change of effective rank and angle from X_0 to X_L (mean over heads)",
          "higher", "empirical", "hyperset-images",
          hyperset_subspace_change(["hyperset", "hyperset+fixed-0.1"], ["erank", "angle"])),
    Claim("HS-F13-shared-qkv", PAPER, "Figs. 13-14, App. F.3",
          "A weight-shared Transformer with one shared QKV projection mirrors Hyper-SET: its "
          "per-subspace effective rank and average angle rise along the iterations.",
          "curves only", "change of effective rank and angle from X_0 to X_L (mean over heads)",
          "higher", "empirical", "hyperset-images",
          hyperset_subspace_change(["shared-qkv"], ["erank", "angle"])),
    Claim("HS-F13-sign-reversed", PAPER, "Figs. 13-14, App. F.3",
          "Reversing the sign of that Transformer's attention update (x ← x − attn(LN(x))) "
          "makes its per-subspace effective rank and average angle fall.", "curves only",
          "change of effective rank and angle from X_0 to X_L (mean over heads)", "lower",
          "empirical", "hyperset-images",
          hyperset_subspace_change(["shared-qkv-reversed"], ["erank", "angle"])),
    Claim("HS-T2-mim", PAPER, "Table 2, §5.3",
          "In masked image modelling Hyper-SET reaches the Transformer's quality with fewer "
          "parameters.", "FID/PSNR comparable at 3.94 M vs 8.85 M", "PSNR", "equal",
          "empirical", "hyperset-mim", hyperset_toy, min_effect=0.5,
          note="Needs ImageNet-100 and the MaskGIT VQGAN tokenizer; the experiment runs a toy "
          "stand-in."),
]  # fmt: skip

CLAIMS: list[Claim] = [*PARAMETERS, *IDENTITIES, *SUDOKU, *IMAGES]

"""The ``theory`` rows of OutEffHop's outlier argument: App. B.1's example and §4.1's premise.

* App. B.1: a head whose scores are all low, ``(-10, -10, -10)``, gets ``≈ 5·10⁻⁵`` attention per
  key from Softmax_1 (it can abstain) but ``1/3`` from softmax (it must attend somewhere), the
  reason vanilla heads learn outliers to put their mass on a no-op token;
* §4.1 (the premise of the W8A8 study, after Bondarenko et al.): per-tensor INT8 quantization
  spreads its 256 levels over the tensor's whole range, so one outlier coarsens the grid of every
  other entry and inflates their error. Checked with the library's own quantizers
  (:func:`~hopfield.outliers.quantize.fake_quantize_asymmetric` for activations, with the range of
  the tensor, as one calibration batch gives it, and
  :func:`~hopfield.outliers.quantize.fake_quantize_weight` for weights) on Gaussian tensors.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from hopfield.experiments.theory_common import DTYPE, Check, Config
from hopfield.functional import Softmax, SoftmaxN
from hopfield.outliers.quantize import fake_quantize_asymmetric, fake_quantize_weight

OUTLIERS_SEED = 68  # offset of the INT8 check's generator (the other rows keep their draws)

#: App. B.1's scores and the value the paper prints for each Softmax_1 entry (one digit).
EXAMPLE_SCORES = (-10.0, -10.0, -10.0)
EXAMPLE_VALUE = 5e-5


def check_softmax1_example() -> Check:
    """App. B.1: ``Softmax_1(-10, -10, -10)`` is ``e⁻¹⁰/(1 + 3e⁻¹⁰)`` per entry (to 1e-12
    relative), which rounds to the printed ``5·10⁻⁵``, while softmax gives ``1/3`` (to 1e-15).

    Margin: how far the worst Softmax_1 entry lies inside the rounding interval
    ``[4.5·10⁻⁵, 5.5·10⁻⁵)``.
    """
    z = torch.tensor(EXAMPLE_SCORES, dtype=DTYPE)
    outeff, dense = SoftmaxN(1.0)(z), Softmax()(z)
    exact = math.exp(-10.0) / (1 + 3 * math.exp(-10.0))
    low, high = 0.9 * EXAMPLE_VALUE, 1.1 * EXAMPLE_VALUE
    slack = torch.minimum(outeff - low, high - outeff)
    wrong = (
        ((outeff - exact).abs() > 1e-12 * exact) | (slack <= 0) | ((dense - 1 / 3).abs() > 1e-15)
    )
    return Check(
        "OutEffHop App. B.1",
        "Softmax_1(-10, -10, -10) ≈ 5·10⁻⁵ each, where softmax gives 1/3",
        "theorem",
        "each entry = e⁻¹⁰/(1+3e⁻¹⁰) to 1e-12 and rounds to 5e-5; softmax = 1/3 to 1e-15",
        z.numel(),
        int(wrong.sum()),
        float(slack.min()),
    )


def others_error(x: Tensor, quantize: str) -> Tensor:
    """RMS INT8 error of the entries ``1:`` of each row of ``x`` ``(T, n)``, quantized per row
    (``"activation"``: asymmetric over the row's range; ``"weight"``: symmetric): ``(T,)``."""
    if quantize == "activation":
        quantized = [fake_quantize_asymmetric(row, row.min(), row.max()) for row in x]
    else:
        quantized = [fake_quantize_weight(row) for row in x]
    error = torch.stack(quantized) - x
    return error[:, 1:].square().mean(-1).sqrt()


def check_int8_outlier(config: Config) -> Check:
    """§4.1: entry 0 of a Gaussian tensor set to ``a·max|x|`` inflates the RMS error of the other
    entries under per-tensor INT8 (every size in ``int8_sizes``, outlier ``a`` in
    ``int8_outliers``, both quantizers, ``trials`` tensors each). Margin: the smallest ratio of
    the error with the outlier to the error without, minus 1."""
    generator = torch.Generator().manual_seed(config.seed + OUTLIERS_SEED)
    count = violations = 0
    margin = math.inf
    for size, factor, quantize in itertools.product(
        config.int8_sizes, config.int8_outliers, ("activation", "weight")
    ):
        clean = torch.randn(config.trials, size, generator=generator, dtype=DTYPE)
        spiked = clean.clone()
        spiked[:, 0] = factor * clean.abs().amax(-1)
        ratio = others_error(spiked, quantize) / others_error(clean, quantize)
        count += ratio.numel()
        violations += int((ratio <= 1).sum())
        margin = min(margin, float(ratio.min()) - 1)
    factors = ", ".join(f"{a:g}" for a in config.int8_outliers)
    return Check(
        "OutEffHop §4.1",
        "one outlier inflates the per-tensor INT8 quantization error of the other entries",
        "heuristic",
        f"RMS error of the other entries rises when one is set to a·max|x| (a ∈ {{{factors}}}; "
        "Gaussian tensors; asymmetric activation and symmetric weight quantizers)",
        count,
        violations,
        margin,
    )


def outlier_checks(config: Config) -> list[Check]:
    """Both rows (own generator: the other rows keep their draws)."""
    return [check_softmax1_example(), check_int8_outlier(config)]

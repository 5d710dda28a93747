"""The functional core: separation maps, structures and :func:`associate`."""

from hopfield.functional import svr as svr  # the SVR view (nonparametric §3): fit_svr, ...
from hopfield.functional.associate import associate
from hopfield.functional.efficient import RandomMask, TopK, Window
from hopfield.functional.efficient_kernel import Linear, RandomFeatures
from hopfield.functional.separation import (
    ClippedSoftmax,
    Entmax,
    EntmaxSink,
    Polynomial,
    Separation,
    Sink,
    Softmax,
    SoftmaxN,
    Sparsemax,
    entmax,
)
from hopfield.functional.structures import Dense, Structure, causal_mask

__all__ = [
    "ClippedSoftmax",
    "Dense",
    "Entmax",
    "EntmaxSink",
    "Linear",
    "Polynomial",
    "RandomFeatures",
    "RandomMask",
    "Separation",
    "Sink",
    "Softmax",
    "SoftmaxN",
    "Sparsemax",
    "Structure",
    "TopK",
    "Window",
    "associate",
    "causal_mask",
    "entmax",
]

"""Half precision with large but representable scores (issue 26, item 5).

Scaled scores of ~3e4 are representable in float16 (max 65504), but ``q kᵀ`` formed before the
scale (2.4e5 for ``E = 16`` here) or sums over many keys are not: sparsemax / entmax on the
explicit path, the window, random-mask, top-K and kernel structures gave NaN, while the fused
dense softmax was finite. Every separation × structure × dtype × score scale must give finite
outputs and gradients, close to the float64 association of the same (rounded) inputs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from hopfield.functional import (
    ClippedSoftmax,
    Dense,
    Entmax,
    Linear,
    Polynomial,
    RandomFeatures,
    RandomMask,
    Separation,
    Softmax,
    SoftmaxN,
    Sparsemax,
    Structure,
    TopK,
    Window,
    associate,
)
from hopfield.functional.structures import computed_in_float32

SEPARATIONS: dict[str, Callable[[], Separation]] = {
    "softmax": Softmax,
    "softmax_1": lambda: SoftmaxN(1.0),
    "sparsemax": Sparsemax,
    "entmax15": lambda: Entmax(1.5),
    "entmax13": lambda: Entmax(1.3),
    "learnable_entmax": lambda: Entmax(1.2, learnable=True),
    "clipped": lambda: ClippedSoftmax(-0.1, 1.1),
    "polynomial": lambda: Polynomial(3),
}
STRUCTURES: dict[str, Callable[[], Structure]] = {
    "dense": Dense,
    "dense_blockwise": lambda: Dense(blockwise_from=0),
    "window": lambda: Window(3),
    "random_mask": lambda: RandomMask(6, seed=0),
    "topk": lambda: TopK(5),
    "linear": Linear,
    "random_features": lambda: RandomFeatures(seed=0),
}
KERNELS = {"linear", "random_features"}  # they stand in for Softmax() only
CASES = [
    (sep, struct)
    for sep, struct in itertools.product(SEPARATIONS, STRUCTURES)
    if struct not in KERNELS or sep == "softmax"
]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
SCALES = [1.0, 1e2, 3e4]
# Outputs are convex combinations of values of size ~3: a few output roundings of the dtype.
TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 1e-4}
LENGTH, DIM = 24, 16


def patterns(score_scale: float, dtype: torch.dtype) -> list[Tensor]:
    """``q, k, v (1, 2, 24, ·)`` whose scaled scores ``q·k / √E`` reach ``±score_scale``."""
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 2, LENGTH, DIM, generator=gen, dtype=torch.float64) for _ in "qk")
    v = torch.randn(1, 2, LENGTH, 8, generator=gen, dtype=torch.float64)
    norm = math.sqrt(score_scale * math.sqrt(DIM))
    q = q / q.norm(dim=-1, keepdim=True) * norm
    k = k / k.norm(dim=-1, keepdim=True) * norm
    return [t.to(dtype) for t in (q, k, v)]


def run(sep: str, struct: str, tensors: list[Tensor], **options: Any) -> Tensor:
    out = associate(
        *tensors, separation=SEPARATIONS[sep](), structure=STRUCTURES[struct](), **options
    )
    assert isinstance(out, Tensor)
    return out


@pytest.mark.parametrize("score_scale", SCALES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("sep", "struct"), CASES)
def test_large_scores_are_finite_and_match_float64(
    sep: str, struct: str, dtype: torch.dtype, score_scale: float
) -> None:
    tensors = [t.requires_grad_(True) for t in patterns(score_scale, dtype)]
    out = run(sep, struct, tensors)
    assert out.dtype == dtype
    assert bool(torch.isfinite(out).all())
    out.float().square().sum().backward()
    for t in tensors:
        assert t.grad is not None and t.grad.dtype == dtype
        assert bool(torch.isfinite(t.grad).all())
    if struct == "random_features" and score_scale > 1e3:
        return  # exp(±3e4) kernels: the estimate's float32 and float64 underflows differ
    reference = run(sep, struct, [t.detach().double() for t in tensors])
    assert torch.allclose(out.double(), reference, atol=TOLERANCE[dtype], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("sep", "struct"), CASES)
def test_large_half_scores_with_a_key_mask_causal_and_weights(
    sep: str, struct: str, dtype: torch.dtype
) -> None:
    keys = torch.ones(1, 1, 1, LENGTH, dtype=torch.bool)
    keys[..., 3] = False
    options: dict[str, Any] = {"mask": keys, "causal": True}
    if struct not in {"dense_blockwise", "topk", "random_mask"}:
        options["return_weights"] = True  # the explicit weights path
    tensors = [t.requires_grad_(True) for t in patterns(3e4, dtype)]
    result = associate(
        *tensors, separation=SEPARATIONS[sep](), structure=STRUCTURES[struct](), **options
    )
    out, weights = result if isinstance(result, tuple) else (result, None)
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    if weights is not None:
        assert weights.dtype == dtype and bool(torch.isfinite(weights).all())
    out.float().sum().backward()
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in tensors)
    reference = associate(
        *[t.detach().double() for t in tensors],
        separation=SEPARATIONS[sep](),
        structure=STRUCTURES[struct](),
        **options,
    )
    expected = reference[0] if isinstance(reference, tuple) else reference
    if struct != "random_features":
        assert torch.allclose(out.double(), expected, atol=TOLERANCE[dtype], rtol=0)


class _Recorder(Structure):
    """Records the dtypes and tensors its forward receives; returns ``q`` and no weights."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    @computed_in_float32
    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, *, scale: Any, mask: Any, **options: Any
    ) -> tuple[Tensor, Tensor | None]:
        self.seen = [q, k, v, scale, mask]
        return q * 2, None


def test_only_half_inputs_are_upcast() -> None:
    """float32 / float64 inputs reach the structure as they are (the fast paths stay as they
    were); half inputs, a tensor scale and a float mask arrive in float32, outputs go back."""
    recorder = _Recorder()
    for dtype in (torch.float32, torch.float64):
        q = torch.randn(1, 1, 3, 4, dtype=dtype)
        scale = torch.ones(1, dtype=dtype)
        out, _ = recorder(q, q, q, scale=scale, mask=None)
        assert recorder.seen[0] is q and recorder.seen[3] is scale and out.dtype == dtype
    for dtype in (torch.float16, torch.bfloat16):
        q = torch.randn(1, 1, 3, 4, dtype=dtype)
        mask = torch.zeros(1, 1, 3, 3, dtype=dtype)
        boolean = torch.ones(1, 1, 3, 3, dtype=torch.bool)
        out, _ = recorder(q, q, q, scale=torch.ones(1, dtype=dtype), mask=mask)
        assert [t.dtype for t in recorder.seen] == [torch.float32] * 5
        assert out.dtype == dtype and torch.equal(out, q * 2)
        recorder(q, q, q, scale=0.5, mask=boolean)
        assert recorder.seen[3] == 0.5 and recorder.seen[4] is boolean

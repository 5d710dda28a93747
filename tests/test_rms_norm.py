"""hopfield.nn.rms_norm.RMSNorm against torch.nn.RMSNorm: values, gradients, second derivatives,
state dicts, and the PyTorch fallback."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hopfield.nn.rms_norm import RMSNorm, rms_norm

D = torch.float64
pytestmark = pytest.mark.usefixtures("kernel_path")


def _pair(width: int, eps: float | None, affine: bool = True) -> tuple[RMSNorm, nn.RMSNorm]:
    ours = RMSNorm(width, eps=eps, elementwise_affine=affine, dtype=D)
    reference = nn.RMSNorm(width, eps=eps, elementwise_affine=affine, dtype=D)
    if affine:
        with torch.no_grad():
            ours.weight.normal_()
        reference.load_state_dict(ours.state_dict())
    return ours, reference


@pytest.mark.parametrize("eps", [None, 1e-3])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [3, 1100])
def test_values_and_gradients_match_torch(eps, affine, threads, batch) -> None:
    """15 rows: one block of the weight gradient's partial sums, one thread; 5,500 rows: 86
    blocks, the last one partial, on two threads when asked."""
    torch.set_num_threads(threads)
    try:
        ours, reference = _pair(13, eps, affine)
        base = torch.randn(batch, 13, 5, dtype=D, requires_grad=True)
        x = base.transpose(1, 2)  # non-contiguous rows
        probe = torch.randn(batch, 5, 13, dtype=D)
        out, expected = ours(x), reference(x)
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
        params = [base, *ours.parameters()]
        grads = torch.autograd.grad((out * probe).sum(), params)
        ref_grads = torch.autograd.grad((expected * probe).sum(), [base, *reference.parameters()])
        for a, b in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    finally:
        torch.set_num_threads(1)


def test_gradcheck_and_second_derivatives() -> None:
    ours, reference = _pair(6, None)
    x = torch.randn(4, 6, dtype=D, requires_grad=True)
    weight = ours.weight.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t, w: rms_norm(t, [6], w, 1e-3), (x, weight))
    (g,) = torch.autograd.grad(ours(x).pow(3).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    (g_ref,) = torch.autograd.grad(reference(x).pow(3).sum(), x, create_graph=True)
    (h_ref,) = torch.autograd.grad(g_ref.sum(), x)
    torch.testing.assert_close(h, h_ref, rtol=1e-9, atol=1e-11)


def test_state_dict_and_type_are_those_of_torch_rmsnorm() -> None:
    ours, reference = _pair(8, 1e-5)
    assert isinstance(ours, nn.RMSNorm)
    assert ours.state_dict().keys() == reference.state_dict().keys()
    reference.load_state_dict(ours.state_dict())
    x = torch.randn(2, 8, dtype=D)
    torch.testing.assert_close(ours(x), reference(x))


def test_zero_rows_and_float32() -> None:
    ours = RMSNorm(4)
    assert ours(torch.zeros(0, 4)).shape == (0, 4)
    x = torch.randn(5, 4)
    torch.testing.assert_close(ours(x), nn.RMSNorm(4)(x))

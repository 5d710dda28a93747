"""Hyper-SET energies, their analytic updates, and the analysis read-outs (functional API).

Hyper-SET (Hu, Zou & Xu, "Designing Transformers via Hyperspherical Energy Minimization") moves
tokens ``X`` (row-major: ``(B, N, d)``, tokens are rows) down two energies:

* the repulsive attention energy in ``H`` subspaces (eq. 3-4, and the Table 18 variants)::

      E_ATTN = Σ_h Σ_i f( Σ_j K(z_i^h, z_j^h) ),   z_i^h = W_hᵀ x_i ∈ R^p,  β = 1/√p

  ``"bisoftmax"``: ``β⁻¹ Σ_i logsumexp_j(β z_iᵀz_j)``; ``"sigmoid"``: ``(2β)⁻¹ Σ_ij σ(β z_iᵀz_j)``;
  ``"linear"``: ``(4β)⁻¹ Σ_ij (β Φ(z_i)ᵀΦ(z_j))²`` with ``Φ = sigmoid``;
* the attractive feedforward energy (eq. 5 and the Table 19 variants), ``u = Dᵀx ∈ R^M``:
  ``"relu"``: ``-½ Σ_i ‖ReLU(u_i)‖²``; ``"gelu"``: ``-Σ_i Σ_m G(u_im)`` with ``G' = GELU``;
  ``"softmax"``: ``-Σ_i logsumexp_m(u_im)``; ``"gated"``: ``-½ Σ_i (Σ_m σ(u_im))²``.

Weights follow :class:`torch.nn.Linear`: ``weight`` has shape ``(out, d)``, so the paper's
``W = weight.T`` and the projections are ``x @ weight.T``. The *operators* return the gradient of
an energy with respect to the projections; back-projecting with the same weight gives the
gradient with respect to ``X`` (attention: ``∇_X E_ATTN = op(Z) @ weight``; feedforward:
``-∇_X E_FF = op(U) @ weight``). With ``normalize=True`` the projections are first put on the
sphere of radius ``√p`` (``√M``) by a gain-free RMSNorm and the RMSNorm Jacobian is dropped,
which is exactly the update of eq. (9) and (11).
"""

from __future__ import annotations

import math
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from hopfield.functional.structures import (
    CPU_FLASH_AVAILABLE,
    flash_attention,
    flash_attention_backward,
)

AttentionKind = Literal["bisoftmax", "sigmoid", "linear"]
FeedforwardKind = Literal["relu", "gelu", "softmax", "gated"]
ATTENTION_KINDS: tuple[str, ...] = ("bisoftmax", "sigmoid", "linear")
FEEDFORWARD_KINDS: tuple[str, ...] = ("relu", "gelu", "softmax", "gated")

__all__ = [
    "ATTENTION_KINDS",
    "FEEDFORWARD_KINDS",
    "FUSED_MIN_TOKENS",
    "AttentionKind",
    "FeedforwardKind",
    "attention_energy",
    "attention_energy_of_projections",
    "attention_operator",
    "attention_update",
    "average_angle",
    "bisoftmax_fusable",
    "bisoftmax_fused",
    "effective_rank",
    "feedforward_energy",
    "feedforward_energy_of_projections",
    "feedforward_operator",
    "feedforward_update",
    "gelu_integral",
    "merge_heads",
    "sinusoidal_positions",
    "sinusoidal_positions_2d",
    "split_heads",
    "time_embedding",
]


def _check_kind(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def _check_tensor(name: str, value: object, dim: int | None = None) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {value.dtype}")
    if dim is not None and value.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(value.shape)}")
    return value


def split_heads(z: Tensor, num_heads: int) -> Tensor:
    """``(B, N, H·p) -> (B, H, N, p)``."""
    if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    b, n, width = z.shape
    if width % num_heads:
        raise ValueError(f"num_heads={num_heads} must divide the projection width {width}")
    return z.view(b, n, num_heads, width // num_heads).transpose(1, 2)


def merge_heads(z: Tensor) -> Tensor:
    """``(B, H, N, p) -> (B, N, H·p)``."""
    b, h, n, p = z.shape
    return z.transpose(1, 2).reshape(b, n, h * p)


def _sigmoid_prime(z: Tensor) -> Tensor:
    s = torch.sigmoid(z)
    return s * (1.0 - s)


# --------------------------------------------------------------------------- attention


def attention_operator(
    zq: Tensor,
    zk: Tensor,
    zv: Tensor,
    kind: str = "bisoftmax",
    *,
    beta: float | None = None,
    symmetric: bool = False,
    fused: bool | None = None,
) -> Tensor:
    """The attention update in the subspaces, ``(B, H, N, p)``.

    For ``zq = zk = zv = Z`` this is ``∂E_ATTN/∂Z`` of the chosen energy. With separate
    (differently normalised) roles it is the code's generalisation: ``"bisoftmax"``
    ``(softmax(A, -1) + softmax(A, -2)) @ zv``, ``"sigmoid"`` ``σ'(A) @ zv`` and ``"linear"``
    ``Φ'(zq) ⊙ (Φ(zv) @ β Φ(zq)ᵀΦ(zk))`` (linear in N), with ``A = β zq zkᵀ``.

    The bi-softmax has two paths with the same values and gradients: the explicit reference
    builds the ``N × N`` scores; the fused path (:func:`bisoftmax_fused`) makes two or three
    fused attention kernel calls and never holds them.

    Args:
        zq, zk, zv: per-head projections ``(B, H, N, p)`` (``zv`` may have another width).
        kind: ``"bisoftmax"``, ``"sigmoid"`` or ``"linear"``.
        beta: inverse temperature; ``1/√p`` when ``None``.
        symmetric: the caller guarantees ``zq is zk`` so ``A`` is symmetric; the bi-softmax then
            uses ``softmax(A, -2) = softmax(A, -1)ᵀ`` (one N×N softmax, or one fused call fewer).
        fused: ``None`` (default) takes the fused path for the bi-softmax whenever
            :func:`bisoftmax_fusable` allows it, and otherwise, for one tensor as queries and
            keys in half precision on the CPU, the explicit form with one ``N × N`` tensor each
            way (:class:`_SharedScoresBisoftmax`, first derivatives only); ``True`` forces the
            fused path (bi-softmax only), ``False`` the explicit reference. The sigmoid map is not a softmax and the linear
            energy is already linear in N: both always run explicitly. The fused path has
            first derivatives only (PyTorch's fused kernels' backward passes have no
            derivative of their own); take ``fused=False`` for double backward.
    """
    _check_kind("kind", kind, ATTENTION_KINDS)
    beta = 1.0 / math.sqrt(zq.shape[-1]) if beta is None else float(beta)
    if fused and kind != "bisoftmax":
        raise ValueError(f"fused=True needs kind='bisoftmax' (a softmax), got {kind!r}")
    if kind == "linear":
        phi_q = torch.sigmoid(zq)
        gram = beta * phi_q.transpose(-1, -2) @ torch.sigmoid(zk)  # (B, H, p, p)
        return _sigmoid_prime(zq) * (torch.sigmoid(zv) @ gram)
    if kind == "bisoftmax" and (fused or (fused is None and bisoftmax_fusable(zq, zk, beta=beta))):
        return bisoftmax_fused(zq, zk, zv, beta=beta, symmetric=symmetric)
    if kind == "bisoftmax" and fused is None and symmetric and _shared_scores_applies(zq, zk):
        out: Tensor = _SharedScoresBisoftmax.apply(zq, zv, beta)
        return out
    scores = beta * zq @ zk.transpose(-1, -2)  # (B, H, N, N)
    if kind == "sigmoid":
        return _sigmoid_prime(scores) @ zv
    rows = torch.softmax(scores, dim=-1)
    cols = rows.transpose(-1, -2) if symmetric else torch.softmax(scores, dim=-2)
    return (rows + cols) @ zv


#: Fewest tokens for which ``attention_operator(fused=None)`` takes the fused bi-softmax. Forward +
#: backward, fp32, 2 CPU threads, 4096 tokens a batch, 4 heads of 64, fused ÷ explicit: 2.1 at
#: N = 128, 1.8 at 256, 0.9 at 512, 0.77 at 1024, 0.67 at 2048 with the padded SDPA calls; 1.4
#: at 128 and 256, 1.0 at 512, 0.79 at 1024, 0.74 at 2048 with the flash path (one run on the
#: loaded machine). The fused path makes more, slower kernel calls; it wins once the N × N
#: tensors outgrow the caches.
FUSED_MIN_TOKENS = 512
#: The same for bfloat16/float16 projections on the CPU, where the explicit form's matrix
#: products get cheaper and the flash kernel does not (forward + backward, B 4, H 4, p 64, 2
#: threads, idle machine, fused ÷ explicit: 2.8 at N = 512, 1.37 at 1024, 1.00 at 2048, 0.90 at
#: 4096; float32 at 1024: 0.70).
FUSED_MIN_TOKENS_HALF_CPU = 2048


def _half_on_cpu(z: Tensor) -> bool:
    """Whether ``z`` is a float16/bfloat16 tensor on the CPU, where the flash kernel does not
    speed up and the explicit bi-softmax's matrix products do."""
    return z.dtype in (torch.float16, torch.bfloat16) and z.device.type == "cpu"


def bisoftmax_fusable(zq: Tensor, zk: Tensor, *, beta: float) -> bool:
    """Whether the fused bi-softmax is chosen automatically for these projections.

    It is when there are at least :data:`FUSED_MIN_TOKENS` tokens (:data:`FUSED_MIN_TOKENS_HALF_CPU`
    for half-precision tensors on the CPU), the tensors hold values (not
    on the meta device, where the plan counts the explicit form) and every normaliser the fused
    path reads back stays far from underflow: with ``a = β·max‖zq_i‖·max‖zk_j‖ ≥ |A_ij|``, the
    log-normalisers lie within ``2a + log(N + 1)`` of zero, which must stay below ¾ of
    ``-log(finfo.tiny)`` (65 in float32, so ``a ≤ 29``; RMS-normalised projections with unit gains
    have ``a = √p``). The same bound keeps the flash path's value scaling ``e^(m - μ_j) ≤
    e^(2a + log N)`` (:class:`_FlashBisoftmax`) far from overflow.
    """
    n = zq.shape[-2]
    minimum = FUSED_MIN_TOKENS_HALF_CPU if _half_on_cpu(zq) else FUSED_MIN_TOKENS
    if zq.is_meta or zk.is_meta or n < minimum or zq.numel() == 0 or zk.numel() == 0:
        return False
    if beta == 0.0:
        return False
    if not zq.is_floating_point() or zq.dtype != zk.dtype:
        return False
    with torch.no_grad():
        norm_q = float(zq.norm(dim=-1).amax())
        norm_k = norm_q if zk is zq else float(zk.norm(dim=-1).amax())
    bound = abs(beta) * norm_q * norm_k
    limit = -0.75 * math.log(torch.finfo(zq.dtype).tiny)
    return 2.0 * bound + math.log(max(n, zk.shape[-2]) + 1) <= limit


class _Padded(torch.autograd.Function):
    """``x`` ``(..., N, c)`` in the first columns of a ``(..., N', width)`` tensor, zeros after.

    ``extra`` (a tensor ``(..., N, 1)`` or a number) fills column ``c``; ``sink`` (a column, or
    ``-1`` for none) appends one more row, the unit vector of that column (zeros for ``-1``).
    One write per element; the backward pass hands back views of the incoming gradient (a
    concatenation or slice assignment would copy whole tensors in one pass or the other).
    """

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, extra: Tensor | float | None, width: int, sink: int | None
    ) -> Tensor:
        n, c = x.shape[-2], x.shape[-1]
        out = x.new_empty(*x.shape[:-2], n + (sink is not None), width)
        out[..., :n, :c] = x
        start = c
        if extra is not None:
            out[..., :n, c : c + 1] = extra
            start += 1
        out[..., :n, start:] = 0.0
        if sink is not None:
            out[..., n, :] = 0.0
            if sink >= 0:
                out[..., n, sink] = 1.0
        ctx.shape = (n, c, isinstance(extra, Tensor))
        ctx.save_for_backward(x)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        n, c, extra = ctx.shape
        # the gradient in x's own layout: the uses of x sum fast and the ops before x (RMSNorm
        # backward) see the strides they produced, not those of the padded tensor
        grad_x = torch.empty_like(ctx.saved_tensors[0])
        grad_x.copy_(grad[..., :n, :c])
        return grad_x, grad[..., :n, c : c + 1] if extra else None, None, None


class _RowTerm(torch.autograd.Function):
    """Read-out of the symmetric first call: ``out`` ``(..., N, w)`` and the detached sink scores
    ``c`` give the row term ``out[:e] / (1 - s)`` and ``λ = c + log(1 - s) - log s`` with
    ``s = out[e]``; the backward pass writes one gradient tensor for ``out`` (slicing ``out``
    under autograd would build a zero-filled one per slice and add them)."""

    @staticmethod
    def forward(ctx: Any, out: Tensor, c: Tensor, e: int) -> tuple[Tensor, Tensor]:
        s = out[..., e : e + 1]
        inv = (1.0 - s).reciprocal()
        ctx.e = e
        ctx.save_for_backward(out, inv)
        return out[..., :e] * inv, c + torch.log1p(-s) - torch.log(s)

    @staticmethod
    def backward(ctx: Any, grad_rows: Tensor, grad_lam: Tensor) -> tuple[Tensor | None, ...]:
        out, inv = ctx.saved_tensors
        e = ctx.e
        s = out[..., e : e + 1]
        grad = torch.empty_like(out)
        torch.mul(grad_rows, inv, out=grad[..., :e])
        # ∂rows/∂s = out[:e] / (1 - s)², ∂λ/∂s = -1/(1 - s) - 1/s
        grad_s = (grad_rows * out[..., :e]).sum(dim=-1, keepdim=True) * inv.square()
        grad[..., e : e + 1] = grad_s - grad_lam * (inv + s.reciprocal())
        grad[..., e + 1 :] = 0.0
        return grad, None, None


class _ColumnTerm(torch.autograd.Function):
    """``rows + out[:e] / out[e]``: adds the column term read from the last call's ``out``
    ``(..., N, w)``, with one gradient tensor for ``out`` (see :class:`_RowTerm`)."""

    @staticmethod
    def forward(ctx: Any, rows: Tensor, out: Tensor, e: int) -> Tensor:
        inv = out[..., e : e + 1].reciprocal()
        ctx.e = e
        ctx.save_for_backward(out, inv)
        return torch.addcmul(rows, out[..., :e], inv)

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor | None, ...]:
        out, inv = ctx.saved_tensors
        e = ctx.e
        grad = torch.empty_like(out)
        torch.mul(grad_y, inv, out=grad[..., :e])
        grad_s = (grad_y * out[..., :e]).sum(dim=-1, keepdim=True) * inv.square()
        grad[..., e : e + 1] = -grad_s
        grad[..., e + 1 :] = 0.0
        return grad_y, grad, None


def _padded(
    x: Tensor, width: int, extra: Tensor | float | None = None, sink: int | None = None
) -> Tensor:
    """See :class:`_Padded`."""
    return cast(Tensor, _Padded.apply(x, extra, width, sink))


_FLASH_DTYPES = (torch.float32, torch.float64)


def _flash_applies(zq: Tensor, zk: Tensor, zv: Tensor) -> bool:
    """Whether :class:`_FlashBisoftmax` serves these projections: the CPU flash kernel (it returns
    the row log-sum-exp and takes it back in its backward pass) on ``(B, H, N, p)`` tensors with
    equal head widths and at least one query and key, in float32 or float64 (the others keep the
    padded SDPA path)."""
    return (
        CPU_FLASH_AVAILABLE
        and zq.device.type == "cpu"
        and zq.dim() == zk.dim() == zv.dim() == 4
        and zq.shape[-2] > 0
        and zk.shape[-2] > 0
        and zq.shape[-1] == zk.shape[-1] == zv.shape[-1]
        and zq.dtype in _FLASH_DTYPES
        and zq.dtype == zk.dtype == zv.dtype
    )


def _flash(q: Tensor, k: Tensor, v: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """``(softmax(β q kᵀ) v, logsumexp_j β q kᵀ)``: ``(B, H, N, p)`` and ``(B, H, N)``, from
    :func:`~hopfield.functional.structures.flash_attention` (which splits the keys of fewer
    batch-heads than threads)."""
    return flash_attention(q, k, v, None, False, beta)


def _flash_backward(
    grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, beta: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The flash kernel's backward pass: ``(dq, dk, dv)`` of ``out = softmax(β q kᵀ) v`` for the
    output gradient ``grad``. The kernel reads ``out`` only through ``D_i = grad_i · out_i``
    (``dS_ij = P_ij (grad_i · v_j - D_i)``), which :func:`_fold_lse_gradient` uses."""
    return flash_attention_backward(grad, q, k, v, out, lse, False, beta)


def _fold_lse_gradient(grad: Tensor, out: Tensor, lse_grad: Tensor) -> tuple[Tensor, Tensor]:
    """Fold a gradient ``g = ∂L/∂lse`` ``(..., N)`` of the row log-sum-exp into the ``out``
    ``(..., N, p)`` handed to :func:`_flash_backward` with output gradient ``grad``.

    ``∂lse_i/∂S_ij = P_ij``, so ``g`` adds ``P_ij g_i`` to ``dS_ij``: ``D_i`` becomes
    ``D_i - g_i``, which ``out_i - (g_i / ‖grad_i‖²) grad_i`` gives (its rounding error is that of
    ``D_i - g_i`` itself). Rows whose ``‖grad_i‖²`` is zero, subnormal, or too small for
    ``g_i / ‖grad_i‖`` to stay finite cannot carry ``g_i``: they come back as the residual
    ``(..., N)`` (zeros elsewhere) for :func:`_lse_backward`. Returns ``(out', residual)``.
    """
    info = torch.finfo(grad.dtype)
    square = torch.linalg.vecdot(grad, grad)
    foldable = (square >= info.tiny / info.eps) & (
        lse_grad.abs() <= info.eps * info.max * square.sqrt()
    )
    scale = torch.where(foldable, lse_grad / torch.where(foldable, square, 1.0), 0.0)
    residual = torch.where(foldable, 0.0, lse_grad)
    return torch.addcmul(out, grad, scale.unsqueeze(-1), value=-1.0), residual


def _lse_backward(
    q: Tensor, k: Tensor, lse: Tensor, lse_grad: Tensor, beta: float
) -> tuple[Tensor, Tensor]:
    """``(dq, dk)`` of a gradient ``g = ∂L/∂lse`` ``(..., N)`` alone, in one flash backward call:
    values 0 (so ``grad_i · v_j = 0``), output gradient ``e_0`` for every row and ``out_i =
    -g_i e_0`` (so ``D_i = -g_i``) give ``dS_ij = P_ij g_i``."""
    grad = torch.zeros_like(q)
    grad[..., 0] = 1.0
    out = torch.zeros_like(q)
    out[..., 0] = -lse_grad
    dq, dk, _ = _flash_backward(grad, q, k, torch.zeros_like(k), out, lse, beta)
    return dq, dk


class _FlashBisoftmax(torch.autograd.Function):
    """``(softmax(A, -1) + softmax(A, -2)) @ v``, ``A = β q kᵀ``, from the CPU flash kernel at
    the head width ``p`` (no padded column, no sink key); ``q``, ``k``, ``v`` ``(..., N, p)``.

    Forward: the row term ``R = softmax(A, -1) v`` and its log-normalisers ``λ`` come from one
    call. The column log-normalisers ``μ_j = logsumexp_i A_ij`` are ``λ`` when ``symmetric``
    (``A = Aᵀ``), else the log-sum-exp of a call with ``q`` and ``k`` swapped. With a shift
    ``m = max(max λ, max μ)`` per batch and head, the column term is
    ``C_i = Σ_j e^(A_ij - μ_j) v_j = e^(λ_i - m) Σ_j P_ij (e^(m - μ_j) v_j)``: one more call on
    the same scores with the values scaled by ``e^(m - μ)``. Every factor keeps relative
    precision: ``e^(λ_i - m) ≤ 1``, ``P_ij e^(m - μ_j) ≥ e^(A_ij - μ_j)`` (no new underflow), and
    ``e^(m - μ_j) ≤ e^(2a + log N)`` with ``a = max |A_ij|`` (bounded by :func:`bisoftmax_fusable`).

    Backward: the flash kernel's backward of each call. ``C_i = Σ_j e^(A_ij - m) (scaled)_j``
    has no normaliser, so its call takes ``out = 0`` (``D_i = 0``: the gradient through
    ``e^(λ_i - m)`` cancels the one through the call's own ``λ_i``). The gradient reaching ``μ``
    through the scaled values, ``-v_j · ∂L/∂v_j`` (column term), goes to the call that made
    ``μ``: folded into the row call when ``symmetric`` (:func:`_fold_lse_gradient`, rows it
    cannot carry through :func:`_lse_backward`), else the swapped call's backward
    (:func:`_lse_backward`). Two calls forward and two backward when ``symmetric``, three and
    three otherwise. First derivatives only.
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, beta: float, symmetric: bool) -> Tensor:
        rows, lam = _flash(q, k, v, beta)
        mu = lam if symmetric else _flash(k, q, q, beta)[1]
        shift = torch.maximum(lam.amax(dim=-1, keepdim=True), mu.amax(dim=-1, keepdim=True))
        down = torch.exp(shift - mu).unsqueeze(-1)  # (..., N, 1), ≥ 1
        up = torch.exp(lam - shift).unsqueeze(-1)  # (..., N, 1), ≤ 1
        scaled = v * down
        out, lam_out = _flash(q, k, scaled, beta)
        ctx.beta, ctx.symmetric = beta, symmetric
        ctx.save_for_backward(q, k, v, rows, lam, mu, scaled, lam_out, down, up)
        return torch.addcmul(rows, out, up)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, rows, lam, mu, scaled, lam_out, down, up = ctx.saved_tensors
        beta = ctx.beta
        no_normaliser = v.new_zeros(v.shape[-1]).expand(*q.shape[:-1], v.shape[-1])
        dq, dk, dv = _flash_backward(grad * up, q, k, scaled, no_normaliser, lam_out, beta)
        dv.mul_(down)
        mu_grad = -torch.linalg.vecdot(dv, v)  # scaled_j = v_j e^(m - μ_j)
        folded = rows
        if ctx.symmetric:
            folded, residual = _fold_lse_gradient(grad, rows, mu_grad)
        else:
            dk_mu, dq_mu = _lse_backward(k, q, mu, mu_grad, beta)
            dq.add_(dq_mu)
            dk.add_(dk_mu)
        dq_rows, dk_rows, dv_rows = _flash_backward(grad, q, k, v, folded, lam, beta)
        dq.add_(dq_rows)
        dk.add_(dk_rows)
        dv.add_(dv_rows)
        if ctx.symmetric and bool(residual.any()):
            dq_res, dk_res = _lse_backward(q, k, lam, residual, beta)
            dq.add_(dq_res)
            dk.add_(dk_res)
        return dq, dk, dv, None, None


class _SharedScoresBisoftmax(torch.autograd.Function):
    """``(P + Pᵀ) v`` with ``P = softmax(β z zᵀ, -1)`` (the symmetric bi-softmax, ``q = k = z``),
    ``z`` ``(..., N, p)``, ``v`` ``(..., N, pv)``, holding one ``N × N`` tensor forward and one
    more backward.

    Forward: ``P`` is computed in place in the score product's buffer (shift, exponential,
    division) and ``(P + Pᵀ) v`` as two products, ``P v + Pᵀ v``, without forming ``P + Pᵀ``.
    Backward, with ``G`` the output gradient: ``dP = G vᵀ + v Gᵀ``, then in place the softmax
    backward ``dA = P ⊙ (dP - rowsum(P ⊙ dP))``, and ``dz = β (dA + dAᵀ) z`` (``z`` is both the
    queries and the keys), ``dv = (P + Pᵀ) G``, each as two products. The explicit form with
    autograd holds some six ``N × N`` tensors over forward and backward, each of which the
    allocator may map afresh (page faults) once they are large. First derivatives only.
    """

    @staticmethod
    def forward(ctx: Any, z: Tensor, v: Tensor, beta: float) -> Tensor:
        weights = torch.matmul(z * beta, z.transpose(-1, -2))
        weights.sub_(weights.amax(dim=-1, keepdim=True)).exp_()
        weights.div_(weights.sum(dim=-1, keepdim=True))
        out = torch.matmul(weights, v).add_(torch.matmul(weights.transpose(-1, -2), v))
        ctx.beta = beta
        ctx.save_for_backward(z, v, weights)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        z, v, weights = ctx.saved_tensors
        grad_v = torch.matmul(weights, grad).add_(torch.matmul(weights.transpose(-1, -2), grad))
        grad_scores = torch.matmul(grad, v.transpose(-1, -2))
        grad_scores.add_(torch.matmul(v, grad.transpose(-1, -2)))
        grad_scores.mul_(weights)  # P ⊙ dP
        row_sums = grad_scores.sum(dim=-1, keepdim=True)
        grad_scores.addcmul_(weights, row_sums.expand_as(weights), value=-1.0)
        grad_z = torch.matmul(grad_scores, z).add_(torch.matmul(grad_scores.transpose(-1, -2), z))
        return grad_z.mul_(ctx.beta), grad_v, None


def _shared_scores_applies(zq: Tensor, zk: Tensor) -> bool:
    """Whether ``attention_operator(fused=None)`` takes :class:`_SharedScoresBisoftmax` for an
    explicit symmetric bi-softmax: the same tensor as queries and keys, in half precision on the
    CPU (where the explicit form runs up to :data:`FUSED_MIN_TOKENS_HALF_CPU` tokens)."""
    return zq is zk and _half_on_cpu(zq)


def bisoftmax_fused(
    zq: Tensor, zk: Tensor, zv: Tensor, *, beta: float, symmetric: bool = False
) -> Tensor:
    """``(softmax(A, -1) + softmax(A, -2)) @ zv`` with ``A = β zq zkᵀ``, never forming ``A``.

    On the CPU, in float32 or float64, with equal widths ``p = e``, this is
    :class:`_FlashBisoftmax`: calls of PyTorch's CPU flash kernel at the head width, which return
    the row log-normalisers beside the output (two calls forward and two backward when
    ``symmetric``, three and three otherwise). Elsewhere (other devices, other widths, lower
    precisions) it is the padded form below, made of SDPA
    (:func:`torch.nn.functional.scaled_dot_product_attention`) calls, which return no
    log-normaliser.

    Row term: ordinary attention, ``SDPA(zq, zk, zv)``. Column term: with the column
    log-normalisers ``λ_j = logsumexp_i A_ij``, ``(softmax(A, -2) @ zv)_i = Σ_j e^(A_ij-λ_j) zv_j``,
    a sum whose weights are *not* normalised over ``j``. The ``λ`` and this sum are read from
    SDPA calls with one extra "sink" key whose score is known and whose value is a unit vector
    the real keys do not use, so the call's normaliser comes out beside the weighted average:

    * ``symmetric`` (the caller guarantees ``zq is zk``, so ``λ`` are the row log-normalisers
      too): one call gives the row term and ``λ``. Queries ``[zq, c/β]``, keys ``[zk, 0]``, the
      sink key ``[0, 1]`` (score ``c_i = A_ii``, detached), values ``[zv, 0]``, sink value
      ``[0, 1]``: ``s_i = e^c_i / (e^λ_i + e^c_i) ≤ ½`` (``λ_i ≥ A_ii``), row term
      ``out[:e] / (1 - s)``, ``λ = c + log(1 - s) - log s``, all to relative precision;
    * otherwise the row term is plain SDPA and ``λ`` comes from queries ``zk``, keys ``zq`` and
      a sink of score 0, values ``e_0`` for the keys and ``e_1`` for the sink:
      ``u_j = e^λ_j / (e^λ_j + 1)``, ``s_j = 1 / (e^λ_j + 1)``, ``λ = log u - log s``;
    * column term: queries ``[zq, 1]``, keys ``[zk, -λ/β]`` (score ``A_ij - λ_j``), a zero sink
      key (score 0), values ``[zv, 0]``, sink value ``[0, 1]``: ``out = [Σ_j e^(A_ij-λ_j) zv_j,
      1] / (R_i + 1)``, so the term is ``out[:e] / out[e]``.

    Every call has one head width (``max(p, e) + 1``, zero-padded) so that PyTorch's fused
    kernels take it (the CPU flash kernel needs equal q, k, v widths): no ``N × N`` tensor in
    the forward or in SDPA's own backward, which autograd uses. The result is exact up to
    rounding (float64 tests compare it with the explicit form); :func:`bisoftmax_fusable` says
    when no normaliser can underflow. ``zq``, ``zk`` ``(..., N, p)``, ``zv`` ``(..., N, e)``.
    """
    if beta == 0.0:
        raise ValueError("the fused bi-softmax needs beta != 0")
    if _flash_applies(zq, zk, zv):
        return cast(Tensor, _FlashBisoftmax.apply(zq, zk, zv, beta, symmetric))
    p, e = zq.shape[-1], zv.shape[-1]
    width = max(p, e) + 1

    def sdpa(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(query, key, value, scale=beta)

    values = _padded(zv, width, sink=e)
    if symmetric:
        c = beta * zq.detach().square().sum(dim=-1, keepdim=True)  # A_ii ≤ λ_i
        keys = values if zk is zv and p == e else _padded(zk, width, sink=p)
        out = sdpa(_padded(zq, width, c / beta), keys, values)
        rows, lam = cast(tuple[Tensor, Tensor], _RowTerm.apply(out, c, e))
    else:
        pad = max(p, e)
        rows = sdpa(_padded(zq, pad), _padded(zk, pad), _padded(zv, pad))[..., :e]
        ones = zq.new_ones(*zq.shape[:-1], 1)  # the values of the keys zq
        out = sdpa(_padded(zk, width), _padded(zq, width, sink=p), _padded(ones, width, sink=1))
        lam = torch.log(out[..., :1]) - torch.log(out[..., 1:2])
    out = sdpa(_padded(zq, width, 1.0), _padded(zk, width, lam / -beta, sink=-1), values)
    return cast(Tensor, _ColumnTerm.apply(rows, out, e))


def attention_energy_of_projections(
    z: Tensor, kind: str = "bisoftmax", *, beta: float | None = None
) -> Tensor:
    """``E_ATTN`` per sample, ``(B,)``, of projections ``z`` ``(B, H, N, p)`` (summed over h, i)."""
    _check_kind("kind", kind, ATTENTION_KINDS)
    beta = 1.0 / math.sqrt(z.shape[-1]) if beta is None else float(beta)
    if kind == "linear":
        phi = torch.sigmoid(z)
        gram = beta * phi @ phi.transpose(-1, -2)
        return gram.square().sum(dim=(1, 2, 3)) / (4.0 * beta)
    scores = beta * z @ z.transpose(-1, -2)
    if kind == "sigmoid":
        return torch.sigmoid(scores).sum(dim=(1, 2, 3)) / (2.0 * beta)
    return torch.logsumexp(scores, dim=-1).sum(dim=(1, 2)) / beta


def _projections(x: Tensor, weight: Tensor, num_heads: int, normalize: bool) -> Tensor:
    _check_tensor("x", x, 3)
    _check_tensor("weight", weight, 2)
    if weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight must have shape (H·p, {x.shape[-1]}), got {tuple(weight.shape)}")
    z = split_heads(F.linear(x, weight), num_heads)
    return F.rms_norm(z, (z.shape[-1],)) if normalize else z


def attention_energy(
    x: Tensor,
    weight: Tensor,
    num_heads: int,
    kind: str = "bisoftmax",
    *,
    normalize: bool = True,
    beta: float | None = None,
) -> Tensor:
    """``E_ATTN(X)`` per sample, ``(B,)``.

    Args:
        x: tokens ``(B, N, d)``.
        weight: ``(H·p, d)``, the ``nn.Linear`` weight of the shared projection (``W = weight.T``).
        num_heads: H.
        kind: energy, see the module docstring.
        normalize: project the per-head projections onto the sphere of radius ``√p`` first
            (gain-free RMSNorm), as the paper does before evaluating energies (Fig. 5).
        beta: inverse temperature, default ``1/√p``.
    """
    return attention_energy_of_projections(
        _projections(x, weight, num_heads, normalize), kind, beta=beta
    )


def attention_update(
    x: Tensor,
    weight: Tensor,
    num_heads: int,
    kind: str = "bisoftmax",
    *,
    normalize: bool = True,
    beta: float | None = None,
    fused: bool | None = None,
) -> Tensor:
    """The attention update direction ``(B, N, d)``; Hyper-SET does ``X ← X - α ⊙ update``.

    With ``normalize=False`` this is exactly ``∇_X E_ATTN`` (eq. 7 for the bi-softmax). With
    ``normalize=True`` it is eq. (9): the operator on RMS-normalised projections, back-projected
    with the same (tied) weight. ``fused`` as in :func:`attention_operator`.
    """
    z = _projections(x, weight, num_heads, normalize)
    y = attention_operator(z, z, z, kind, beta=beta, symmetric=True, fused=fused)
    return merge_heads(y) @ weight


# --------------------------------------------------------------------------- feedforward


def gelu_integral(u: Tensor) -> Tensor:
    """``G(u) = ∫_0^u GELU(s) ds = ½(u²Φ(u) - Φ(u) + uφ(u) + ½)`` (exact GELU, elementwise)."""
    cdf = 0.5 * (1.0 + torch.erf(u / math.sqrt(2.0)))
    pdf = torch.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)
    return 0.5 * (u * u * cdf - cdf + u * pdf + 0.5)


def feedforward_operator(u: Tensor, kind: str = "relu") -> Tensor:
    """``-∂E_FF/∂u`` for projections ``u`` ``(..., M)``: the feedforward hidden activation."""
    _check_kind("kind", kind, FEEDFORWARD_KINDS)
    if kind == "relu":
        return F.relu(u)
    if kind == "gelu":
        return F.gelu(u)
    if kind == "softmax":
        return torch.softmax(u, dim=-1)
    total = torch.sigmoid(u).sum(dim=-1, keepdim=True)
    return total * _sigmoid_prime(u)


def feedforward_energy_of_projections(u: Tensor, kind: str = "relu") -> Tensor:
    """``E_FF`` per sample, ``(B,)``, of projections ``u`` ``(B, N, M)``."""
    _check_kind("kind", kind, FEEDFORWARD_KINDS)
    if kind == "relu":
        per_token = 0.5 * F.relu(u).square().sum(dim=-1)
    elif kind == "gelu":
        per_token = gelu_integral(u).sum(dim=-1)
    elif kind == "softmax":
        per_token = torch.logsumexp(u, dim=-1)
    else:
        per_token = 0.5 * torch.sigmoid(u).sum(dim=-1).square()
    return -per_token.sum(dim=-1)


def _ff_projections(x: Tensor, weight: Tensor, normalize: bool) -> Tensor:
    _check_tensor("x", x, 3)
    _check_tensor("weight", weight, 2)
    if weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight must have shape (M, {x.shape[-1]}), got {tuple(weight.shape)}")
    u = F.linear(x, weight)
    return F.rms_norm(u, (u.shape[-1],)) if normalize else u


def feedforward_energy(
    x: Tensor, weight: Tensor, kind: str = "relu", *, normalize: bool = True
) -> Tensor:
    """``E_FF(X)`` per sample, ``(B,)``; ``weight`` is ``(M, d)`` (``D = weight.T``)."""
    return feedforward_energy_of_projections(_ff_projections(x, weight, normalize), kind)


def feedforward_update(
    x: Tensor, weight: Tensor, kind: str = "relu", *, normalize: bool = True
) -> Tensor:
    """The feedforward update ``(B, N, d)``; Hyper-SET does ``X ← X + γ ⊙ update``.

    With ``normalize=False`` it is exactly ``-∇_X E_FF`` (eq. 10 for ReLU); with ``normalize=True``
    it is eq. (11), ``D act(RMSNorm(Dᵀx))``.
    """
    return feedforward_operator(_ff_projections(x, weight, normalize), kind) @ weight


# --------------------------------------------------------------------------- embeddings


def time_embedding(t: Tensor, frequency: int) -> Tensor:
    """Sinusoidal embedding ``(..., F)`` of iteration indices ``t`` (1-based), as in the code.

    ``half = F/2``, ``ω_k = exp(-k ln(10000)/(half-1))``, embedding ``[sin(tω), cos(tω)]``.
    """
    if not isinstance(frequency, int) or frequency < 4 or frequency % 2:
        raise ValueError(f"frequency must be an even int >= 4, got {frequency!r}")
    half = frequency // 2
    k = torch.arange(half, device=t.device, dtype=torch.float64)
    omega = torch.exp(-k * math.log(10000.0) / (half - 1))
    angle = t.to(torch.float64).unsqueeze(-1) * omega
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)


def sinusoidal_positions(length: int, dim: int) -> Tensor:
    """Fixed 1-D positional encoding ``(length, dim)``: ``sin`` at even, ``cos`` at odd channels."""
    if dim % 2:
        raise ValueError(f"dim must be even, got {dim}")
    pos = torch.arange(length, dtype=torch.float64).unsqueeze(1)
    omega = torch.pow(10000.0, -torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    pe = torch.zeros(length, dim, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * omega)
    pe[:, 1::2] = torch.cos(pos * omega)
    return pe


def sinusoidal_positions_2d(height: int, width: int, dim: int) -> Tensor:
    """Fixed 2-D sin-cos encoding ``(height·width, dim)`` (MAE style: half the channels per axis)."""
    if dim % 4:
        raise ValueError(f"dim must be a multiple of 4, got {dim}")
    rows = sinusoidal_positions(height, dim // 2)
    cols = sinusoidal_positions(width, dim // 2)
    return torch.cat([rows.repeat_interleave(width, dim=0), cols.repeat(height, 1)], dim=-1)


# --------------------------------------------------------------------------- analysis


def effective_rank(z: Tensor) -> Tensor:
    """Effective rank (Roy & Vetterli 2007) of each ``(N, p)`` matrix in ``z`` ``(..., N, p)``.

    ``exp(-Σ p_i log p_i)`` with ``p_i = σ_i / Σ_j σ_j`` over the singular values.
    """
    _check_tensor("z", z)
    s = torch.linalg.svdvals(z.to(torch.float64))
    prob = s / s.sum(dim=-1, keepdim=True).clamp_min(1e-300)
    entropy = -(prob * torch.log(prob.clamp_min(1e-300))).sum(dim=-1)
    return torch.exp(entropy).to(z.dtype)


def average_angle(x: Tensor, definition: str = "arccos_of_mean") -> Tensor:
    """Average pairwise angle in degrees of the rows of ``x`` ``(..., N, p)``, shape ``(...)``.

    ``"arccos_of_mean"`` is the paper's Def. D.2 (arccos of the mean cosine over ``i < j``);
    ``"mean_of_arccos"`` is what the official code computes (mean of the pairwise angles).
    """
    _check_kind("definition", definition, ("arccos_of_mean", "mean_of_arccos"))
    _check_tensor("x", x)
    n = x.shape[-2]
    if n < 2:
        raise ValueError(f"x needs at least 2 rows, got {n}")
    unit = F.normalize(x.to(torch.float64), dim=-1)
    cos = unit @ unit.transpose(-1, -2)
    off = ~torch.eye(n, dtype=torch.bool, device=x.device)
    pairs = cos[..., off].clamp(-1.0, 1.0)
    if definition == "arccos_of_mean":
        angle = torch.arccos(pairs.mean(dim=-1))
    else:
        angle = torch.arccos(pairs).mean(dim=-1)
    return torch.rad2deg(angle).to(x.dtype)

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
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

AttentionKind = Literal["bisoftmax", "sigmoid", "linear"]
FeedforwardKind = Literal["relu", "gelu", "softmax", "gated"]
ATTENTION_KINDS: tuple[str, ...] = ("bisoftmax", "sigmoid", "linear")
FEEDFORWARD_KINDS: tuple[str, ...] = ("relu", "gelu", "softmax", "gated")

__all__ = [
    "ATTENTION_KINDS",
    "FEEDFORWARD_KINDS",
    "AttentionKind",
    "FeedforwardKind",
    "attention_energy",
    "attention_energy_of_projections",
    "attention_operator",
    "attention_update",
    "average_angle",
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
) -> Tensor:
    """The attention update in the subspaces, ``(B, H, N, p)``.

    For ``zq = zk = zv = Z`` this is ``∂E_ATTN/∂Z`` of the chosen energy. With separate
    (differently normalised) roles it is the code's generalisation: ``"bisoftmax"``
    ``(softmax(A, -1) + softmax(A, -2)) @ zv``, ``"sigmoid"`` ``σ'(A) @ zv`` and ``"linear"``
    ``Φ'(zq) ⊙ (Φ(zv) @ β Φ(zq)ᵀΦ(zk))`` (linear in N), with ``A = β zq zkᵀ``.

    Args:
        zq, zk, zv: per-head projections ``(B, H, N, p)``.
        kind: ``"bisoftmax"``, ``"sigmoid"`` or ``"linear"``.
        beta: inverse temperature; ``1/√p`` when ``None``.
        symmetric: the caller guarantees ``zq is zk`` so ``A`` is symmetric; the bi-softmax then
            uses ``softmax(A, -2) = softmax(A, -1)ᵀ`` (one N×N softmax instead of two).
    """
    _check_kind("kind", kind, ATTENTION_KINDS)
    beta = 1.0 / math.sqrt(zq.shape[-1]) if beta is None else float(beta)
    if kind == "linear":
        phi_q = torch.sigmoid(zq)
        gram = beta * phi_q.transpose(-1, -2) @ torch.sigmoid(zk)  # (B, H, p, p)
        return _sigmoid_prime(zq) * (torch.sigmoid(zv) @ gram)
    scores = beta * zq @ zk.transpose(-1, -2)  # (B, H, N, N)
    if kind == "sigmoid":
        return _sigmoid_prime(scores) @ zv
    rows = torch.softmax(scores, dim=-1)
    cols = rows.transpose(-1, -2) if symmetric else torch.softmax(scores, dim=-2)
    return (rows + cols) @ zv


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
) -> Tensor:
    """The attention update direction ``(B, N, d)``; Hyper-SET does ``X ← X - α ⊙ update``.

    With ``normalize=False`` this is exactly ``∇_X E_ATTN`` (eq. 7 for the bi-softmax). With
    ``normalize=True`` it is eq. (9): the operator on RMS-normalised projections, back-projected
    with the same (tied) weight.
    """
    z = _projections(x, weight, num_heads, normalize)
    y = attention_operator(z, z, z, kind, beta=beta, symmetric=True)
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

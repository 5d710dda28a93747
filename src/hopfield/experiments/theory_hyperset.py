"""The ``theory`` rows of Hyper-SET (Hu, Zou & Xu): the layer is energy descent, on spheres,
and the identity at initialisation.

* Eqs. 7, 10 and Tables 18-19: the attention update is ``∇_X E_ATTN`` (bi-softmax, sigmoid and
  linear attention energies) and the feedforward update ``-∇_X E_FF`` (ReLU, GELU, softmax and
  gated energies), against :func:`torch.autograd.grad` in float64; and the layer's own steps
  (eqs. 9, 11) are the gradients with respect to the RMS-normalised projections, back-projected by
  the tied weight (the RMSNorm Jacobian dropped, as the paper does);
* §3: the RMS-normalised projections lie on the spheres of radius ``√p`` (per head) and ``√M``;
* §3.3: with the step-size network zero-initialised the encoder is the identity at
  initialisation, ``X_L = X_0`` exactly, for every step-size style and conditioning, with K
  distinct layers, depth-wise LoRA and test-time extrapolation.

Weights come from the check's own generator (inside :func:`torch.random.fork_rng` where a module
draws its own), so the rows are reproducible and the other rows keep their draws.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
from torch import Tensor

from hopfield.experiments.theory_common import DTYPE, Check, Config
from hopfield.nn.hyperset import HyperSETEncoder, HyperSETLayer
from hopfield.nn.hyperset_energy import (
    ATTENTION_KINDS,
    FEEDFORWARD_KINDS,
    attention_energy,
    attention_energy_of_projections,
    attention_update,
    feedforward_energy,
    feedforward_energy_of_projections,
    feedforward_update,
    merge_heads,
)

HYPERSET_SEED = 51  # offset of these checks' generator (the other rows keep their draws)
D_MODEL, HEADS, FF_SIZE = 16, 4, 24  # d, H (p = 4) and M of every layer checked
GRADIENT_TOLERANCE = 1e-10  # largest relative deviation of an update from autograd's gradient
SPHERE_TOLERANCE = 1e-10  # largest relative deviation of a norm from √p or √M


def relative_deviation(update: Tensor, reference: Tensor) -> float:
    """``max|update - reference| / max|reference|``."""
    return float((update - reference).abs().max() / reference.abs().max().clamp_min(1e-300))


def _gradient(energy: Callable[[Tensor], Tensor], at: Tensor) -> Tensor:
    """``∇ Σ_b energy(at)_b`` at ``at`` (float64 autograd)."""
    leaf = at.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(energy(leaf).sum(), leaf)
    return grad


def _layer(generator: torch.Generator, attention: str, feedforward: str) -> HyperSETLayer:
    """A float64 layer with ``N(0, 1/d)`` weights from ``generator`` (unit RMSNorm gains)."""
    layer = HyperSETLayer(
        D_MODEL, HEADS, FF_SIZE, attention=attention, feedforward=feedforward, dtype=DTYPE
    )
    with torch.no_grad():
        for weight in (layer.qkv.weight, layer.mlp.weight):
            weight.copy_(torch.randn(weight.shape, generator=generator, dtype=DTYPE))
            weight.div_(math.sqrt(D_MODEL))
    return layer


def _tokens(generator: torch.Generator, n: int) -> Tensor:
    """``(2, n, d)`` Gaussian tokens times a scale ``e^U(-2, 2)``."""
    scale = math.exp(float(torch.empty(1, dtype=DTYPE).uniform_(-2, 2, generator=generator)))
    return scale * torch.randn(2, n, D_MODEL, generator=generator, dtype=DTYPE)


def _attention_deviations(x: Tensor, layer: HyperSETLayer) -> list[float]:
    """Eq. 7 / Table 18 (unnormalised update vs ``∇_X E_ATTN``) and eq. 9 (the layer's step vs
    ``∂E/∂Z`` at the normalised projections, back-projected)."""
    w, kind = layer.qkv.weight.detach(), layer.attention
    exact = _gradient(lambda v: attention_energy(v, w, HEADS, kind, normalize=False), x)
    unnormalised = attention_update(x, w, HEADS, kind, normalize=False)
    z = layer.projections(x)[0]
    on_sphere = merge_heads(_gradient(lambda v: attention_energy_of_projections(v, kind), z)) @ w
    with torch.no_grad():
        step = layer.attention_step(x)
    return [relative_deviation(unnormalised, exact), relative_deviation(step, on_sphere)]


def _feedforward_deviations(x: Tensor, layer: HyperSETLayer) -> list[float]:
    """Eq. 10 / Table 19 (unnormalised update vs ``-∇_X E_FF``) and eq. 11 (the layer's step vs
    ``-∂E/∂u`` at the normalised projections, back-projected)."""
    d, kind = layer.mlp.weight.detach(), layer.feedforward
    exact = _gradient(lambda v: feedforward_energy(v, d, kind, normalize=False), x)
    unnormalised = feedforward_update(x, d, kind, normalize=False)
    u = layer.ff_norm(layer.mlp(x))
    on_sphere = _gradient(lambda v: feedforward_energy_of_projections(v, kind), u) @ d
    with torch.no_grad():
        step = layer.feedforward_step(x)
    return [relative_deviation(unnormalised, -exact), relative_deviation(step, -on_sphere)]


def check_gradients(config: Config, generator: torch.Generator) -> Check:
    """Every attention and feedforward energy of Tables 18-19, ``hyperset_trials`` draws at each
    token count: two comparisons per draw and energy (unnormalised and the layer's step)."""
    deviations: list[float] = []
    for n, _ in itertools.product(config.hyperset_tokens, range(config.hyperset_trials)):
        x = _tokens(generator, n)
        for kind in ATTENTION_KINDS:
            deviations += _attention_deviations(x, _layer(generator, kind, "relu"))
        for kind in FEEDFORWARD_KINDS:
            deviations += _feedforward_deviations(x, _layer(generator, "bisoftmax", kind))
    worst = max(deviations)
    return Check(
        "Hyper-SET Eqs. 7, 10, Tables 18-19",
        "the updates are the energy gradients: ∇E_ATTN (bi-softmax, sigmoid, linear), "
        "-∇E_FF (ReLU, GELU, softmax, gated)",
        "theorem",
        f"relative deviation from autograd <= {GRADIENT_TOLERANCE:g} (float64; unnormalised "
        "eqs. 7, 10 and the layer's steps eqs. 9, 11 on the spheres, RMSNorm Jacobian dropped)",
        len(deviations),
        sum(dev > GRADIENT_TOLERANCE for dev in deviations),
        GRADIENT_TOLERANCE - worst,
    )


def check_spheres(config: Config, generator: torch.Generator) -> Check:
    """§3: ``‖RMSNorm(W_hᵀx)‖ = √p`` per head and ``‖RMSNorm(Dᵀx)‖ = √M`` per token (unit
    gains), relative deviations over every token of every draw."""
    worst, count = 0.0, 0
    for n, _ in itertools.product(config.hyperset_tokens, range(config.hyperset_trials)):
        x = _tokens(generator, n)
        layer = _layer(generator, "bisoftmax", "relu")
        with torch.no_grad():
            heads = layer.projections(x)[0].norm(dim=-1) / math.sqrt(layer.head_size)
            hidden = layer.ff_norm(layer.mlp(x)).norm(dim=-1) / math.sqrt(layer.ff_size)
        for ratio in (heads, hidden):
            worst = max(worst, float((ratio - 1).abs().max()))
            count += ratio.numel()
    violations = int(worst > SPHERE_TOLERANCE)
    return Check(
        "Hyper-SET §3",
        "RMS-normalised projections lie on spheres of radius √p and √M",
        "theorem",
        f"|‖z‖/√p - 1| and |‖u‖/√M - 1| <= {SPHERE_TOLERANCE:g} for every head and token",
        count,
        violations,
        SPHERE_TOLERANCE - worst,
    )


IDENTITY_ITERATIONS = 4  # L of the encoders checked (extrapolated to 2L without LoRA)


def check_identity(config: Config, generator: torch.Generator) -> Check:
    """§3.3: zero-initialised step sizes make :class:`HyperSETEncoder` the identity,
    ``X_L == X_0`` bit for bit, for every step style × conditioning × (K = 1, 2 layers) ×
    (no LoRA, rank-2 LoRA), and at ``2L`` iterations without LoRA, ``hyperset_trials`` draws of
    the fewest tokens each (a zero step leaves any number of tokens alike). Margin:
    ``-max|X_L - X_0|``."""
    count = violations = 0
    largest = 0.0
    cases = itertools.product(("plain", "normed", "direct"), ("input", "state"), (1, 2), (0, 2))
    for style, condition, layers, lora in cases:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
            encoder = HyperSETEncoder(
                D_MODEL, HEADS, FF_SIZE, iterations=IDENTITY_ITERATIONS, num_layers=layers,
                step_style=style, condition=condition, time_frequency=D_MODEL, lora_rank=lora,
                dtype=DTYPE,
            )  # fmt: skip
        runs = (None,) if lora else (None, 2 * IDENTITY_ITERATIONS)
        for _, iterations in itertools.product(range(config.hyperset_trials), runs):
            x0 = _tokens(generator, min(config.hyperset_tokens))
            with torch.no_grad():
                out = encoder(x0, iterations)
            count += 1
            violations += int(not torch.equal(out, x0))
            largest = max(largest, float((out - x0).abs().max()))
    return Check(
        "Hyper-SET §3.3",
        "with zero-initialised step sizes the model is the identity at initialisation",
        "theorem",
        "X_L == X_0 exactly (3 step styles × 2 conditionings × K ∈ {1, 2} × LoRA rank 0 / 2; "
        f"L = {IDENTITY_ITERATIONS} and, without LoRA, 2L)",
        count,
        violations,
        -largest if largest else 0.0,
    )


def hyperset_checks(config: Config) -> list[Check]:
    """The three rows (own generator: the other rows keep their draws)."""
    generator = torch.Generator().manual_seed(config.seed + HYPERSET_SEED)
    return [
        check_gradients(config, generator),
        check_spheres(config, generator),
        check_identity(config, generator),
    ]

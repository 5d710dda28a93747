"""The library on every device (the ``device`` fixture: the CPU, and CUDA where present) in
float32, bfloat16 and float16: operators, layers, the Hugging Face attention functions, a few
Trainer steps and the native kernels' PyTorch fallback, each against a float64 CPU reference.

``pytest -m cuda tests/test_devices.py`` runs the CUDA half alone (``benchmarks/gpu_check.py``
counts its passes and failures); without a GPU that half is skipped.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

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
    native,
)
from hopfield.nn import Hopfield, OutEffHop
from hopfield.nn.rms_norm import RMSNorm

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: (atol, rtol) of a result against its float64 reference, per dtype (inputs rounded first).
TOLERANCE = {
    torch.float32: (2e-4, 2e-4),
    torch.bfloat16: (5e-2, 5e-2),
    torch.float16: (8e-3, 8e-3),
}
SEPARATIONS: dict[str, Callable[[], Separation]] = {
    "softmax": Softmax,
    "softmax1": lambda: SoftmaxN(1.0),
    "sink": lambda: SoftmaxN(2.5),  # a fixed sink logit log 2.5: no zero-key identity
    "clipped": lambda: ClippedSoftmax(gamma=-0.02, zeta=1.05),
    "polynomial": lambda: Polynomial(3),
    "sparsemax": Sparsemax,
    "entmax15": lambda: Entmax(1.5),
}
#: The separations whose weights over a subset equal the weights over their own support there
#: (so a selection structure's weights can be checked from their nonzero entries alone).
SUPPORT_CLOSED = ("softmax", "softmax1", "sparsemax", "entmax15")
B, H, L, E = 2, 2, 20, 8
K = 6


def _inputs(dtype: torch.dtype, device: torch.device, values: int = E) -> tuple[Tensor, ...]:
    """``q, k, v`` rounded to ``dtype`` on ``device``, and their float64 CPU copies."""
    g = torch.Generator().manual_seed(1)
    exact = [torch.randn(B, H, L, width, generator=g, dtype=torch.float64) for width in (E, E)]
    exact.append(torch.randn(B, H, L, values, generator=g, dtype=torch.float64))
    rounded = [t.to(dtype) for t in exact]
    return (*(t.to(device) for t in rounded), *(t.double() for t in rounded))


def _close(actual: Tensor, expected: Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    atol, rtol = TOLERANCE[dtype]
    assert actual.dtype == dtype
    assert torch.isfinite(actual).all()
    torch.testing.assert_close(actual.cpu().double(), expected, atol=atol * scale, rtol=rtol)


def _out(result: Tensor | tuple[Tensor, Tensor | None]) -> Tensor:
    assert isinstance(result, Tensor)
    return result


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("structure_name", "separation_name"),
    [("dense", s) for s in SEPARATIONS]
    + [("window", s) for s in SEPARATIONS]
    + [("linear", "softmax"), ("random-features", "softmax")],
)
def test_associate_matches_float64(
    device: torch.device,
    dtype: torch.dtype,
    causal: bool,
    structure_name: str,
    separation_name: str,
) -> None:
    structures: dict[str, Callable[[], Structure]] = {
        "dense": lambda: Dense(blockwise_from=0),  # the streamed sparse path from any size
        "window": lambda: Window(4),
        "linear": Linear,
        "random-features": lambda: RandomFeatures(seed=0),
    }
    q, k, v, q64, k64, v64 = _inputs(dtype, device)
    separation, structure = SEPARATIONS[separation_name](), structures[structure_name]()
    expected = _out(
        associate(q64, k64, v64, separation=separation, structure=structure, causal=causal)
    )
    out = _out(associate(q, k, v, separation=separation, structure=structure, causal=causal))
    assert out.device.type == device.type
    _close(out, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("separation_name", SUPPORT_CLOSED)
@pytest.mark.parametrize("structure_name", ["topk", "random-mask"])
def test_selection_structures_weigh_their_subsets_exactly(
    device: torch.device,
    dtype: torch.dtype,
    causal: bool,
    separation_name: str,
    structure_name: str,
) -> None:
    """With the values the identity (``v = I``) the output is the weight matrix: every row keeps
    at most ``K`` keys (Top-K: scores no lower than any dropped one), and its weights are the
    separation over the kept scores computed in float64."""
    q, k, _, q64, k64, _ = _inputs(dtype, device)
    eye = torch.eye(L, dtype=dtype, device=device).expand(B, H, L, L)
    structure = TopK(K) if structure_name == "topk" else RandomMask(K, seed=0)
    separation = SEPARATIONS[separation_name]()
    weights = _out(associate(q, k, eye, separation=separation, structure=structure, causal=causal))
    weights = weights.cpu().double()
    scores = q64 @ k64.transpose(-1, -2) * E**-0.5
    allowed = torch.ones(L, L, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    kept = weights != 0
    assert not (kept & ~allowed).any()
    assert (kept.sum(-1) <= K).all() and (kept.sum(-1) >= 1).all()
    if separation_name in ("softmax", "softmax1"):  # every kept key has a positive weight
        assert (kept.sum(-1) == allowed.sum(-1).clamp(max=K)).all()
    if structure_name == "topk":
        atol, _ = TOLERANCE[dtype]
        lowest_kept = scores.masked_fill(~kept, torch.inf).amin(-1)
        highest_dropped = scores.masked_fill(kept | ~allowed, -torch.inf).amax(-1)
        assert (lowest_kept >= highest_dropped - 8 * atol * scores.abs().amax()).all()
    expected = separation(scores.masked_fill(~kept, -torch.inf))
    _close(weights.to(dtype), expected, dtype)


def _backward(layer: nn.Module, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    out = layer(x)
    out.float().square().sum().backward()
    assert x.grad is not None
    grads = {name: p.grad for name, p in layer.named_parameters() if p.grad is not None}
    return out.detach(), {"input": x.grad, **grads}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", [Hopfield, OutEffHop], ids=lambda c: c.__name__)
def test_layers_forward_and_backward(
    device: torch.device, dtype: torch.dtype, kind: type[Hopfield]
) -> None:
    torch.manual_seed(0)
    reference = kind(16, 2, dtype=torch.float64)
    layer = copy.deepcopy(reference).to(device, dtype)
    reference.load_state_dict({n: t.double() for n, t in layer.state_dict().items()})
    x64 = torch.randn(B, 12, 16, dtype=torch.float64).to(dtype).double().requires_grad_(True)
    x = x64.detach().to(device, dtype).requires_grad_(True)
    out64, grads64 = _backward(reference, x64)
    out, grads = _backward(layer, x)
    _close(out, out64, dtype)
    assert grads.keys() == grads64.keys()
    largest = max(float(g.abs().max()) for g in grads64.values())
    for name, grad in grads.items():  # sums over the batch: tolerances relative to the largest
        _close(grad, grads64[name], dtype, scale=largest)


OPT_TINY: dict[str, Any] = dict(
    num_hidden_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    ffn_dim=64,
    vocab_size=61,
    word_embed_proj_dim=32,
    max_position_embeddings=32,
    init_std=0.2,  # logits of order one, so that the comparison means something
)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", ["softmax1", "clipped_softmax1", "gated_softmax1"])
def test_hf_attention_functions(device: torch.device, dtype: torch.dtype, variant: str) -> None:
    pytest.importorskip("transformers")
    from hopfield.integrations import build_model

    torch.manual_seed(0)
    reference = build_model("opt", variant, **OPT_TINY).eval()
    model = build_model("opt", variant, **OPT_TINY).eval()
    model.load_state_dict(reference.state_dict())
    model.to(device, dtype)
    reference.load_state_dict({n: t.double() for n, t in model.state_dict().items()})
    reference.double()
    ids = torch.randint(
        0, OPT_TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0)
    )
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # a padded sequence: the mask path
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
    assert logits.device.type == device.type
    _close(logits, expected, dtype, scale=float(expected.abs().max()))


@pytest.fixture
def fresh_accelerate_state() -> Iterator[None]:
    """accelerate keeps one device and precision per process (its state is shared); a test that
    picks them starts and ends with a reset state so that it neither sees nor leaves others'."""
    pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


PRECISION = {torch.float32: "no", torch.bfloat16: "bf16", torch.float16: "fp16"}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.usefixtures("fresh_accelerate_state")
def test_trainer_steps(device: torch.device, dtype: torch.dtype, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from hopfield.integrations import build_model
    from hopfield.training import Trainer, TrainingConfig

    if dtype == torch.float16 and device.type == "cpu":
        pytest.skip("fp16 mixed precision needs a GPU (accelerate refuses it on the CPU)")
    torch.manual_seed(0)
    model = build_model("opt", "softmax1", **OPT_TINY)
    data = [torch.randint(0, OPT_TINY["vocab_size"], (12,)) for _ in range(16)]

    def loss_fn(model: nn.Module, batch: Tensor) -> Tensor:
        assert batch.device.type == device.type
        loss: Tensor = model(input_ids=batch, labels=batch).loss
        return loss

    config = TrainingConfig(
        max_steps=5,  # fp16's loss scaler may skip the first steps (overflow at its initial scale)
        batch_size=4,
        lr=1e-3,
        log_every=1,
        mixed_precision=PRECISION[dtype],
        cpu=device.type == "cpu",
    )
    trainer = Trainer(model, data, loss_fn, config, tmp_path, progress=False)
    before = {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters()}
    result = trainer.fit()
    assert result.finished and len(result.log) == 5
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in result.log)
    params = dict(trainer.unwrapped.named_parameters())
    assert {p.device.type for p in params.values()} == {device.type}
    assert all(p.dtype == torch.float32 for p in params.values())  # float32 master weights
    assert any(not torch.equal(params[n].detach(), before[n]) for n in before)


def _fp16_trainer(out: Path, overflow_calls: set[int]) -> Any:
    """A small MLP under fp16 mixed precision with its loss scaler; ``loss_fn`` multiplies the
    loss of the ``overflow_calls``-th calls (0-based) by 1e30, so that their fp16 gradients
    overflow and the scaler skips those optimiser steps."""
    from hopfield.training import Trainer, TrainingConfig

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
    g = torch.Generator().manual_seed(1)
    x = 0.01 * torch.randn(64, 8, generator=g)  # small losses: no overflow at the initial scale
    data = list(zip(x, x.sum(1, keepdim=True), strict=True))
    calls = {"n": 0}

    def loss_fn(model: nn.Module, batch: Any) -> Tensor:
        inputs, targets = batch
        loss = (model(inputs).float() - targets).square().mean()
        factor = 1e30 if calls["n"] in overflow_calls else 1.0
        calls["n"] += 1
        return loss * factor

    config = TrainingConfig(
        max_steps=8, batch_size=16, micro_batch_size=8, lr=1e-3, warmup_steps=4,
        schedule="constant", log_every=1, checkpoint_every=2, mixed_precision="fp16",
    )  # fmt: skip
    return Trainer(model, data, loss_fn, config, out, progress=False)


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_fp16_loss_scaler_skips_overflowing_steps_and_resumes(
    device: torch.device, tmp_path: Path
) -> None:
    """fp16 with accelerate's GradScaler (issue 30, item 5): a step whose gradients overflow is
    skipped (weights and schedule stay; the scale halves), the scaler's state is checkpointed
    (``scaler.pt``), and a run stopped after step 4 and resumed ends where an uninterrupted one
    does."""
    if device.type != "cuda":
        pytest.skip("fp16 mixed precision with its loss scaler needs a GPU")
    from accelerate.state import AcceleratorState

    whole = _fp16_trainer(tmp_path / "whole", {2})  # micro-batch 2 = step 1's first
    result = whole.fit()
    lrs = [record["lr"] for record in result.log]
    # warm-up factors 0, 1/4, 1/4 (step 2 repeats: step 1 was skipped), 2/4, ...
    assert lrs[:4] == pytest.approx([0.0, 2.5e-4, 2.5e-4, 5e-4])
    scaler = whole.accelerator.scaler
    assert scaler is not None and scaler.get_scale() < 65536.0
    assert (tmp_path / "whole" / "checkpoints" / "step-8" / "scaler.pt").is_file()
    AcceleratorState._reset_state(reset_partial_state=True)
    _fp16_trainer(tmp_path / "parts", {2}).fit(until_step=4)
    AcceleratorState._reset_state(reset_partial_state=True)
    resumed_trainer = _fp16_trainer(tmp_path / "parts", set())  # the overflow lies before
    resumed = resumed_trainer.fit()
    assert resumed.resumed_from == 4
    assert resumed_trainer.accelerator.scaler.get_scale() == scaler.get_scale()
    assert [r["lr"] for r in resumed.log] == lrs
    for name, value in resumed_trainer.unwrapped.state_dict().items():
        torch.testing.assert_close(value, whole.unwrapped.state_dict()[name], rtol=1e-5, atol=1e-6)


@pytest.fixture
def native_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the native kernels looked up while the test runs."""
    calls: list[str] = []
    lookup = native._function

    def spy(name: str, dtype: torch.dtype | None = None) -> Callable[..., None]:
        calls.append(name)
        return lookup(name, dtype)

    monkeypatch.setattr(native, "_function", spy)
    return calls


@pytest.mark.parametrize("structure_name", ["topk", "random-mask"])
def test_gathered_structures_take_the_native_kernels_only_where_available(
    device: torch.device, structure_name: str, native_calls: list[str]
) -> None:
    """Top-K and random-mask association, forward and backward in float32: the C kernels on the
    CPU where they built, the PyTorch path elsewhere (GPUs); the same weights either way."""
    q, k, _, q64, k64, _ = _inputs(torch.float32, device)
    q.requires_grad_(True)
    eye = torch.eye(L, device=device).expand(B, H, L, L)
    structure = TopK(K) if structure_name == "topk" else RandomMask(K, seed=0)
    weights = _out(associate(q, k, eye, structure=structure))
    weights.square().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    assert bool(native_calls) == native.available(q, k)
    kept = weights.detach().cpu().double() != 0
    assert (kept.sum(-1) == K).all()
    scores = (q64 @ k64.transpose(-1, -2) * E**-0.5).masked_fill(~kept, -torch.inf)
    if structure_name == "topk":
        top = (q64 @ k64.transpose(-1, -2)).topk(K).indices
        assert torch.equal(kept, torch.zeros_like(kept).scatter(-1, top, True))
    _close(weights.detach(), torch.softmax(scores, -1), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_takes_the_native_kernels_only_where_available(
    device: torch.device, dtype: torch.dtype, native_calls: list[str]
) -> None:
    g = torch.Generator().manual_seed(2)
    x64 = torch.randn(3, 5, 24, generator=g, dtype=torch.float64).to(dtype).double()
    weight64 = (1 + 0.1 * torch.randn(24, generator=g, dtype=torch.float64)).to(dtype).double()
    norm = RMSNorm(24, eps=1e-6, device=device, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(weight64)
    x = x64.to(device, dtype).requires_grad_(True)
    x64.requires_grad_(True)
    out = norm(x)
    expected = F.rms_norm(x64, [24], weight64, 1e-6)
    out.float().sum().backward()
    expected.sum().backward()
    assert bool(native_calls) == native.available(x, norm.weight)
    assert x.grad is not None and x64.grad is not None
    _close(out.detach(), expected.detach(), dtype)
    _close(x.grad, x64.grad, dtype)


def _moved_models() -> dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]]:
    """name -> (builder of a float32 CPU model, input shape): the papers' models, and a layer
    whose random-feature projection is not drawn until its first call."""
    import hopfield.models as models
    from hopfield.nn import HopfieldPooling
    from hopfield.nn.hyperset import HyperSETEncoder

    return {
        "random-features-moved-before-first-call": (
            lambda: Hopfield(16, 2, structure=RandomFeatures(8, seed=0), batch_first=True),
            (2, 12, 16),
        ),
        "pooling": (lambda: HopfieldPooling(16, num_heads=2, batch_first=True), (2, 12, 16)),
        "hyper-set": (lambda: HyperSETEncoder(32, 4, iterations=3), (2, 10, 32)),
        "energy-transformer": (
            lambda: models.EnergyTransformerEncoder(32, 4, iterations=2),
            (2, 10, 32),
        ),
        "stanhop": (
            lambda: models.STanHopNet(3, 24, 8, 6, d_model=32, d_ff=32, num_heads=4, e_layers=2),
            (2, 24, 3),
        ),
        "mil": (lambda: models.MILNet(10, embedding_size=32), (2, 7, 10)),
        "vision": (
            lambda: models.VisionHopfield(
                16,
                3,
                5,
                patch_size=4,
                embed_dim=32,
                num_heads=4,
                mlp_dim=32,
                depth=2,
                separation=SoftmaxN(1),
            ),
            (2, 3, 16, 16),
        ),
        "forecaster": (lambda: models.HopfieldForecaster(8, 2, d_model=32), (2, 24, 2)),
    }


@pytest.mark.parametrize("name", list(_moved_models()))
def test_models_moved_to_the_device_match_the_cpu(device: torch.device, name: str) -> None:
    """A model built on the CPU and moved with ``.to(device)`` gives the CPU model's output and
    gradients (float32): nothing it makes on its own (a projection drawn on first use, masks,
    positions, step sizes) stays behind on the CPU."""
    build, shape = _moved_models()[name]
    torch.manual_seed(0)
    cpu = build().eval()
    moved = copy.deepcopy(cpu).to(device)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    x_device = x.detach().to(device).requires_grad_(True)
    out, grads = _backward(cpu, x)
    out_device, grads_device = _backward(moved, x_device)
    assert out_device.device.type == device.type
    _close(out_device, out.double(), torch.float32)
    assert grads.keys() == grads_device.keys()
    largest = max(float(g.abs().max()) for g in grads.values())
    for key, grad in grads_device.items():
        _close(grad, grads[key].double(), torch.float32, scale=max(largest, 1.0))


@pytest.mark.parametrize("separation_name", ["softmax", "softmax1", "sparsemax"])
def test_retrieve_on_the_device_matches_float64(device: torch.device, separation_name: str) -> None:
    from hopfield.memory import retrieve

    g = torch.Generator().manual_seed(3)
    memories = torch.randn(50, 16, generator=g, dtype=torch.float64)
    queries = memories[:6] + 0.3 * torch.randn(6, 16, generator=g, dtype=torch.float64)
    separation = SEPARATIONS[separation_name]()
    kwargs: dict[str, Any] = {"beta": 0.5, "steps": 3, "track_energy": True}
    expected = retrieve(queries, memories, separation, **kwargs)
    result = retrieve(queries.float().to(device), memories.float().to(device), separation, **kwargs)
    _close(result.patterns, expected.patterns, torch.float32)
    assert result.energy is not None and expected.energy is not None
    _close(result.energy, expected.energy, torch.float32)
    assert torch.equal(result.steps.cpu(), expected.steps)


def test_svr_memories_fit_and_retrieve_on_the_device(device: torch.device) -> None:
    """The SVR memory's dual is solved on the CPU (numpy) whatever the device of the memories;
    its coefficients, support and retrievals live on that device and equal the CPU's."""
    from hopfield.functional.svr import ExponentialKernel, fit_svr, nonparametric_dense

    g = torch.Generator().manual_seed(4)
    keys = torch.randn(12, 6, generator=g, dtype=torch.float64)
    targets = keys + 0.1 * torch.randn(12, 6, generator=g, dtype=torch.float64)
    mask = torch.arange(12) % 3 != 0
    x = torch.randn(5, 6, generator=g, dtype=torch.float64)
    kernel = ExponentialKernel(0.5)
    for fit in (
        lambda k, t, m: fit_svr(k, t, kernel, epsilon=0.01, C=2.0, mask=m),
        lambda k, t, m: nonparametric_dense(k, t, 0.5, m),
    ):
        expected = fit(keys, targets, mask)
        memory = fit(keys.to(device), targets.to(device), mask)
        assert memory.coef.device.type == memory.support.device.type == device.type
        torch.testing.assert_close(memory.coef.cpu(), expected.coef, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(memory(x.to(device)).cpu(), expected(x), rtol=1e-9, atol=1e-9)

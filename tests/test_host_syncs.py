"""On an accelerator, a training step of the softmax-family layers (and window and Top-K), the
Hugging Face attention variants and the outlier benchmark's language model reads no value back
to the host and copies no Python number to the device: each would wait for the device's queued
work (a synchronisation per layer and step; of the outlier study's maps the vanilla baseline
alone had one, with padding masks); so do sparsemax and entmax(1.5) below the blockwise size.
Sparsemax and entmax copy no number to the device at any size.

A CPU machine stands in for the accelerator: the CPU's own fast paths (its flash kernel, the
native kernels) are switched off and :func:`hopfield.functional.native.reading_waits` answers as
for a device tensor; every call that would synchronise is recorded by a torch function mode.
Known synchronisations, by design: the blockwise sparse path (its Newton steps over key tiles),
Newton's method for entmax at other alphas and for a learnable alpha (its stopping test), random
masks (their subset sizes) and ``update_steps > 1`` (each head's early stop).
"""

from __future__ import annotations

import collections
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import hopfield.functional.native as native
import hopfield.functional.separation as separation
import hopfield.functional.structures as structures
from hopfield.functional import ClippedSoftmax, Entmax, Sink, SoftmaxN, Sparsemax, TopK, Window
from hopfield.models.sink_lm import ATTENTIONS, SinkLM, SinkLMConfig
from hopfield.nn import GatedAttention, Hopfield, HopfieldLayer, HopfieldPooling, OutEffHop

#: Tensor methods and functions whose result the host must wait for.
_READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__index__,
    torch.Tensor.numpy,
    torch.Tensor.cpu,
    torch.Tensor.nonzero,
    torch.nonzero,
    torch.masked_select,
    torch.Tensor.masked_select,
    torch.unique,
}
_FROM_HOST = {torch.tensor, torch.as_tensor, torch.scalar_tensor}


class HostSyncs(TorchFunctionMode):
    """Records ``(function, file:line)`` of every call that would synchronise with a device:
    a value read back (``bool``, ``item``, ``nonzero``, boolean indexing) or a tensor made from
    Python data (copied from the host)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()

    @property
    def copies(self) -> dict[str, int]:
        """The calls that made a tensor from Python data (a host-to-device copy)."""
        made = tuple(f"{f.__name__} at " for f in _FROM_HOST)
        return {call: n for call, n in self.calls.items() if call.startswith(made)}

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        boolean_index = (
            func is torch.Tensor.__getitem__
            and len(args) > 1
            and isinstance(args[1], torch.Tensor)
            and args[1].dtype == torch.bool
        )
        made_from_host = func in _FROM_HOST and bool(args) and not isinstance(args[0], torch.Tensor)
        if func in _READS or boolean_index or made_from_host:
            caller = traceback.extract_stack()[-2]
            where = f"{caller.filename}:{caller.lineno} ({caller.name})"
            self.calls[f"{getattr(func, '__name__', func)} at {where}"] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def accelerator_paths(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The paths a CUDA tensor takes: no CPU flash kernel, no native kernels, and reading a
    value counts as waiting for the device."""
    monkeypatch.setenv("HOPFIELD_NATIVE", "0")
    monkeypatch.setattr(structures, "CPU_FLASH_AVAILABLE", False)
    monkeypatch.setattr(structures, "reading_waits", lambda tensor: True)
    monkeypatch.setattr(separation, "reading_waits", lambda tensor: True)
    monkeypatch.setattr(native, "reading_waits", lambda tensor: True)
    yield


WIDTH, HEADS = 16, 2

LAYERS: dict[str, Callable[[], nn.Module]] = {
    "dense": lambda: Hopfield(WIDTH, HEADS),
    "outeffhop": lambda: OutEffHop(WIDTH, HEADS),
    "softmax_2": lambda: Hopfield(WIDTH, HEADS, separation=SoftmaxN(2.0)),
    "sink": lambda: Hopfield(WIDTH, HEADS, separation=Sink(0.3, value=WIDTH // HEADS)),
    "sink-learnable": lambda: Hopfield(
        WIDTH, HEADS, separation=Sink(0.3, learnable=True, heads=HEADS)
    ),
    "clipped": lambda: Hopfield(WIDTH, HEADS, separation=ClippedSoftmax(gamma=-0.1, zeta=1.1)),
    "gated": lambda: Hopfield(WIDTH, HEADS, gate=GatedAttention(WIDTH, HEADS)),
    "window": lambda: Hopfield(WIDTH, HEADS, structure=Window(2)),
    "topk": lambda: Hopfield(WIDTH, HEADS, structure=TopK(3)),
}
SPARSE: dict[str, Callable[[], nn.Module]] = {
    "sparsemax": lambda: Hopfield(WIDTH, HEADS, separation=Sparsemax()),
    "entmax": lambda: Hopfield(WIDTH, HEADS, separation=Entmax(1.5)),
}
#: Short rows (one whole-row threshold) and long ones (partial sorts, the blockwise path).
LENGTHS = (6, 512)


def _padding(length: int = 6) -> torch.Tensor:
    """``key_padding_mask (3, length)``: one full row, one half padded, one fully padded."""
    mask = torch.zeros(3, length, dtype=torch.bool)
    mask[1, length // 2 :] = True
    mask[2] = True
    return mask


def _step(module: nn.Module, length: int = 6, **kwargs: Any) -> None:
    module(torch.randn(3, length, WIDTH), **kwargs).sum().backward()


def _syncs_of_steps(module: nn.Module, length: int, masked: bool) -> HostSyncs:
    """The calls of a training step and an evaluation (after a first step, which builds what
    later ones keep) that would synchronise."""
    kwargs = {"key_padding_mask": _padding(length)} if masked else {}
    _step(module, length, **kwargs)
    with HostSyncs() as syncs:
        _step(module, length, **kwargs)
        with torch.no_grad():
            module.eval()(torch.randn(3, length, WIDTH), **kwargs)
    return syncs


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "padded"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_a_training_step_of_a_layer_does_not_synchronise(
    name: str, masked: bool, length: int, accelerator_paths: None
) -> None:
    torch.manual_seed(0)
    syncs = _syncs_of_steps(LAYERS[name](), length, masked)
    assert not syncs.calls, dict(syncs.calls)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "padded"])
@pytest.mark.parametrize("name", list(SPARSE))
def test_the_sparse_maps_copy_no_number_to_the_device(
    name: str, masked: bool, length: int, accelerator_paths: None
) -> None:
    """Their reads are by design (module docstring); a fixed alpha was copied at every call."""
    torch.manual_seed(0)
    syncs = _syncs_of_steps(SPARSE[name](), length, masked)
    assert not syncs.copies, syncs.copies


@pytest.mark.parametrize("length", [64, 200])
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "padded"])
@pytest.mark.parametrize("name", ["sparsemax", "entmax"])
def test_exact_sparse_maps_below_the_blockwise_size_do_not_synchronise(
    name: str, masked: bool, length: int, accelerator_paths: None
) -> None:
    """On a device the exact thresholds sort whole rows in one pass: a partial sort's refinement
    read back which rows to sort again (twice a step and evaluation at 64 keys)."""
    torch.manual_seed(0)
    syncs = _syncs_of_steps(SPARSE[name](), length, masked)
    assert not syncs.calls, dict(syncs.calls)


@pytest.mark.parametrize("name", ["pooling", "layer"])
def test_a_training_step_of_learned_patterns_does_not_synchronise(
    name: str, accelerator_paths: None
) -> None:
    torch.manual_seed(0)
    module = HopfieldPooling(WIDTH, HEADS) if name == "pooling" else HopfieldLayer(WIDTH, HEADS)
    _step(module)
    with HostSyncs() as syncs:
        _step(module)
    assert not syncs.calls, dict(syncs.calls)


def test_the_device_path_of_padded_dense_attention_is_the_host_path() -> None:
    """With a mask, SDPA gives NaN in a fully masked row, so the dense path adds one zero key
    that only such rows see. On the host it is added only when a row is fully masked (reading
    the mask is free there); on a device always (reading would synchronise): the same values
    and gradients either way, with and without a fully masked row."""
    for fully_masked in (False, True):
        mask = _padding()
        mask[2] = fully_masked
        results = []
        for waits in (False, True):
            torch.manual_seed(0)
            layer = Hopfield(WIDTH, HEADS, dtype=torch.float64)
            x = torch.randn(3, 6, WIDTH, dtype=torch.float64, requires_grad=True)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(structures, "CPU_FLASH_AVAILABLE", False)
                patch.setattr(structures, "reading_waits", lambda tensor, w=waits: w)
                out = layer(x, key_padding_mask=mask)
            out.sum().backward()
            assert x.grad is not None
            results.append((out.detach(), x.grad))
        torch.testing.assert_close(results[0], results[1], rtol=1e-12, atol=1e-12)
        assert bool(torch.isfinite(results[1][1]).all())


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_a_training_step_of_the_sink_lm_does_not_synchronise(
    attention: str, accelerator_paths: None
) -> None:
    torch.manual_seed(0)
    model = SinkLM(
        SinkLMConfig(vocab_size=20, seq_len=8, d_model=16, num_heads=2, attention=attention)
    )
    tokens = torch.randint(0, 20, (2, 8))
    model.loss(tokens).backward()
    with HostSyncs() as syncs:
        model.loss(tokens).backward()
    assert not syncs.calls, dict(syncs.calls)


@pytest.mark.parametrize("variant", ["softmax", "softmax1", "clipped", "gated"])
@pytest.mark.parametrize("family", ["bert", "opt"])
def test_a_training_step_of_a_padded_hf_model_does_not_synchronise_in_its_attention(
    family: str, variant: str, accelerator_paths: None
) -> None:
    """Only this package's files are judged (``transformers`` has synchronisations of its own,
    e.g. OPT's position ids from the padding mask)."""
    integrations = pytest.importorskip("hopfield.integrations")
    sizes: dict[str, Any] = dict(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, vocab_size=50
    )
    sizes.update(ffn_dim=64, word_embed_proj_dim=32) if family == "opt" else sizes.update(
        intermediate_size=64
    )
    torch.manual_seed(0)
    model = integrations.build_model(family, variant, max_position_embeddings=16, **sizes)
    ids = torch.randint(3, 50, (3, 10))
    padding = torch.ones(3, 10, dtype=torch.long)
    padding[2, 6:] = 0

    def step() -> None:
        model(input_ids=ids, attention_mask=padding, labels=ids).loss.backward()

    step()
    with HostSyncs() as syncs:
        step()
    ours = {call: n for call, n in syncs.calls.items() if "/hopfield/" in call}
    assert not ours, ours


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", list(LAYERS))
def test_on_cuda_a_padded_training_step_does_not_synchronise(name: str) -> None:
    """The same on a GPU, judged by PyTorch itself (``set_sync_debug_mode("error")`` raises at
    a synchronising call)."""
    torch.manual_seed(0)
    layer = LAYERS[name]().cuda()
    x = torch.randn(3, 6, WIDTH, device="cuda")
    mask = _padding().cuda()
    layer(x, key_padding_mask=mask).sum().backward()
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        layer(x, key_padding_mask=mask).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def test_a_trainer_step_reads_back_only_when_it_logs(tmp_path: Path) -> None:
    """The Trainer keeps its running loss, metrics and gradient norm on the device and reads
    them at a log record only: the reads in ``trainer.py`` over a run that logs once do not
    grow with its steps (they were one per micro-batch, metric and step). The preemption flag,
    a host tensor reduced over the processes, is read every step by design."""
    from hopfield.training import Trainer, TrainingConfig

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    data = list(zip(x, x.sum(1, keepdim=True), strict=True))

    def loss_fn(model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        error = model(batch[0]) - batch[1]
        return error.square().mean(), {"mae": error.abs().mean(), "constant": 1.0}

    def reads(steps: int) -> dict[str, int]:
        torch.manual_seed(0)
        config = TrainingConfig(
            max_steps=steps, batch_size=8, micro_batch_size=4, lr=1e-2, log_every=steps, cpu=True
        )
        trainer = Trainer(
            nn.Linear(4, 1), data, loss_fn, config, tmp_path / str(steps), progress=False
        )
        with HostSyncs() as syncs:
            trainer.fit()
        return {
            call: n
            for call, n in syncs.calls.items()
            if "trainer.py" in call and "(_preempted)" not in call
        }

    few, many = reads(2), reads(6)
    assert few == many, (few, many)


@pytest.mark.parametrize("alpha", [2.0, 1.5, 1.3])
def test_the_device_thresholds_are_the_host_thresholds(alpha: float) -> None:
    """Whole rows in one pass on a device, partial sorts refined row by row on the host: the
    same weights and gradients in float64, on rows with small and large supports."""
    g = torch.Generator().manual_seed(0)
    peaked = 6 * torch.randn(4, 300, generator=g, dtype=torch.float64)
    flat = 0.01 * torch.randn(4, 300, generator=g, dtype=torch.float64)
    results = []
    for waits in (False, True):
        scores = torch.cat([peaked, flat]).requires_grad_()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(separation, "reading_waits", lambda tensor, w=waits: w)
            weights = separation.entmax(scores, alpha)
        (grad,) = torch.autograd.grad((weights * torch.arange(300.0)).sum(), scores)
        results.append((weights.detach(), grad))
    torch.testing.assert_close(results[0], results[1], rtol=1e-10, atol=1e-12)


def test_the_device_top_k_selection_is_the_host_selection() -> None:
    """On a device Top-K ranks whole rows with ``topk``; the host's two passes (group maxima,
    then the candidates above their bound) keep the same scores (without ties: the same keys)."""
    from hopfield.functional.efficient import top_scores

    scores = torch.randn(6, 3, 700, generator=torch.Generator().manual_seed(0))
    scores[0, 0, :] = float("-inf")  # a row without finite candidates
    kept = []
    for waits in (False, True):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(native, "reading_waits", lambda tensor, w=waits: w)
            patch.setenv("HOPFIELD_NATIVE", "0")
            values, idx = top_scores(scores, 20)
        order = values.argsort(-1)
        kept.append((values.gather(-1, order), idx.gather(-1, order)))
    torch.testing.assert_close(kept[0][0], kept[1][0], rtol=0, atol=0)
    assert torch.equal(kept[0][1][1:], kept[1][1][1:])

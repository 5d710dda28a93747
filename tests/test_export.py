"""Export: ``torch.export`` and ONNX (dynamo exporter, legacy exporter) of the Hopfield layers,
run at two input shapes under dynamic batch and length and compared with eager to 1e-5."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.export import Dim

from hopfield.functional import Sink, SoftmaxN
from hopfield.nn import Hopfield, HopfieldPooling, OutEffHop, OutEffHopLayer

#: Two input shapes ``(B, N)`` that differ in batch and length.
SHAPES = ((2, 5), (3, 9))
SIZE = 16


def layer(name: str) -> nn.Module:
    torch.manual_seed(0)
    made: dict[str, Callable[[], nn.Module]] = {
        "hopfield": lambda: Hopfield(SIZE, 4),
        "outeffhop": lambda: OutEffHop(SIZE, 4),
        "pooling": lambda: HopfieldPooling(SIZE, quantity=2, num_heads=4),
        "sink_n2": lambda: Hopfield(SIZE, 4, separation=SoftmaxN(2.0)),
        "sink_half": lambda: Hopfield(SIZE, 4, separation=SoftmaxN(0.5)),  # explicit path
        "sink_learned": lambda: Hopfield(SIZE, 4, separation=Sink(0.3, learnable=True, heads=4)),
        "outeffhop_iterated": lambda: OutEffHop(SIZE, 4, update_steps=3, update_eps=0.0),
        "outeffhop_layer": lambda: OutEffHopLayer(SIZE, quantity=3, num_heads=4),
    }
    return made[name]().eval()


LAYERS = (
    "hopfield",
    "outeffhop",
    "pooling",
    "sink_n2",
    "sink_half",
    "sink_learned",
    "outeffhop_iterated",
    "outeffhop_layer",
)


def inputs(batch: int, length: int, masked: bool) -> tuple[tuple[Tensor], dict[str, Tensor]]:
    g = torch.Generator().manual_seed(batch * 100 + length)
    x = torch.randn(batch, length, SIZE, generator=g)
    if not masked:
        return (x,), {}
    padding = torch.zeros(batch, length, dtype=torch.bool)
    padding[0, length - 2 :] = True  # the first sequence is padded
    return (x,), {"key_padding_mask": padding}


def dynamic(masked: bool) -> dict[str, Any]:
    batch, length = Dim("batch", min=1, max=64), Dim("length", min=2, max=512)
    shapes: dict[str, Any] = {"input": {0: batch, 1: length}}
    if masked:
        shapes["key_padding_mask"] = {0: batch, 1: length}
    return shapes


def eager(module: nn.Module, args: tuple[Tensor], kwargs: dict[str, Tensor]) -> Tensor:
    with torch.no_grad():
        out = module(*args, **kwargs)
    assert isinstance(out, Tensor)
    return out


def cases() -> list[tuple[str, bool]]:
    masked = [("hopfield", True), ("outeffhop", True)]
    return [(name, False) for name in LAYERS] + masked


@pytest.mark.parametrize(("name", "masked"), cases())
def test_torch_export_matches_eager_at_two_shapes(name: str, masked: bool) -> None:
    module = layer(name)
    args, kwargs = inputs(*SHAPES[0], masked)
    program = torch.export.export(module, args, kwargs, dynamic_shapes=dynamic(masked))
    exported = program.module()
    for shape in SHAPES:
        args, kwargs = inputs(*shape, masked)
        torch.testing.assert_close(
            exported(*args, **kwargs), eager(module, args, kwargs), rtol=0, atol=1e-5
        )


def run_onnx(path: Path, names: list[str], args: tuple[Tensor], kwargs: dict[str, Tensor]) -> Any:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    values = [*args, *kwargs.values()]
    assert [i.name for i in session.get_inputs()] == names
    return session.run(None, {n: v.numpy() for n, v in zip(names, values, strict=True)})[0]


@pytest.mark.slow  # 1-7 s each: the dynamo exporter and an onnxruntime session
@pytest.mark.parametrize(("name", "masked"), cases())
def test_onnx_export_runs_in_onnxruntime_at_two_shapes(
    tmp_path: Path, name: str, masked: bool
) -> None:
    pytest.importorskip("onnxscript")
    module = layer(name)
    args, kwargs = inputs(*SHAPES[0], masked)
    path = tmp_path / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module, args, kwargs=kwargs, dynamic_shapes=dynamic(masked), dynamo=True
        )
    assert program is not None
    program.save(str(path))
    names = ["input", *kwargs]
    for shape in SHAPES:
        args, kwargs = inputs(*shape, masked)
        got = torch.from_numpy(run_onnx(path, names, args, kwargs))
        torch.testing.assert_close(got, eager(module, args, kwargs), rtol=0, atol=1e-5)


class TensorsOnly(nn.Module):
    """A layer behind a forward of tensors only, as the legacy exporter calls it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        out = self.inner(x)
        assert isinstance(out, Tensor)
        return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hopfield", "outeffhop", "pooling", "sink_n2"])
def test_legacy_onnx_export_through_a_tensor_forward(tmp_path: Path, name: str) -> None:
    module = layer(name)
    path = tmp_path / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            TensorsOnly(module),
            inputs(*SHAPES[0], False)[0],
            str(path),
            dynamo=False,
            input_names=["input"],
            dynamic_axes={"input": {0: "batch", 1: "length"}},
        )
    for shape in SHAPES:
        args, _ = inputs(*shape, False)
        got = torch.from_numpy(run_onnx(path, ["input"], args, {}))
        torch.testing.assert_close(got, eager(module, args, {}), rtol=0, atol=1e-5)


def test_capture_takes_the_exportable_paths_with_the_same_answer() -> None:
    """The CPU flash kernel (no ONNX rule) and the data-dependent early stop of iterated
    retrieval step aside while a graph is captured; eager keeps them."""
    module = layer("outeffhop_iterated")
    args, _ = inputs(*SHAPES[1], False)
    reference = eager(module, args, {})
    with torch.no_grad():
        traced = torch.jit.trace(TensorsOnly(module), args, check_trace=False)
    torch.testing.assert_close(traced(*args), reference, rtol=0, atol=1e-5)
    assert "flash_attention" not in str(traced.inlined_graph)

"""Trains a Hopfield pooling layer with random features (``seed=None``: torch's global
generator, which the trainer gives each process a stream of its own) under
:class:`hopfield.training.Trainer`; run by ``tests/test_distributed_training.py`` under
``torchrun``: ``python distributed_projection_script.py OUT [REDRAW]`` (redraw the projection
every ``REDRAW`` calls; never by default). The main process writes ``OUT/projections.json``:
for every process, the sum of the projection each of its forward calls used."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hopfield.functional import RandomFeatures
from hopfield.nn import HopfieldPooling
from hopfield.training import Trainer, TrainingConfig, leave_process_group


class Pooled(nn.Module):
    def __init__(self, redraw: int | None) -> None:
        super().__init__()
        features = RandomFeatures(4, redraw=redraw)
        self.pool = HopfieldPooling(6, num_heads=2, structure=features, batch_first=True)
        self.head = nn.Linear(6, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.pool(x.unsqueeze(1).expand(-1, 3, -1)).squeeze(1))


USED: list[float] = []


def main(out: Path, redraw: int | None) -> None:
    torch.manual_seed(0)
    model = Pooled(redraw)
    structure = model.pool.hopfield.structure
    assert isinstance(structure, RandomFeatures)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 6, generator=g)
    data = list(zip(x, torch.sin(x).sum(1, keepdim=True), strict=True))

    def loss_fn(model: nn.Module, batch: Any) -> Tensor:
        inputs, targets = batch
        prediction = model(inputs)
        assert structure.projection is not None
        USED.append(float(structure.projection.sum()))  # the call's (a redraw comes before it)
        return (prediction - targets).square().mean()

    config = TrainingConfig(epochs=1, batch_size=16, micro_batch_size=8, lr=1e-3, cpu=True)
    trainer = Trainer(model, data, loss_fn, config, out, progress=False)
    result = trainer.fit()
    used: list[Any] = [None] * result.processes
    torch.distributed.all_gather_object(used, USED)
    if trainer.accelerator.is_main_process:
        (out / "projections.json").write_text(json.dumps(used))
    leave_process_group(exit_status=0)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)

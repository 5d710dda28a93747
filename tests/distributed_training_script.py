"""Trains a small regression network with :class:`hopfield.training.Trainer`; run by
``tests/test_distributed_training.py`` under ``torchrun`` and in one process.

Usage: ``python distributed_training_script.py OUT MICRO_BATCH [UNTIL_STEP|- [LOG_EVERY
[BATCH]]]`` (``BATCH``: the global batch, 16 by default). The main process
writes ``OUT/final.pt`` (weights) and ``OUT/result.json`` (log, steps, processes, and the first
random draw in ``loss_fn`` of every process).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hopfield.training import Trainer, TrainingConfig, leave_process_group


def examples(n: int = 64) -> list[tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    y = torch.sin(x).sum(1, keepdim=True)
    return list(zip(x, y, strict=True))


DRAWS: list[float] = []
"""What each ``loss_fn`` call drew from the global torch RNG (as dropout or masking would)."""


def loss_fn(model: nn.Module, batch: Any) -> tuple[Tensor, dict[str, Tensor]]:
    DRAWS.append(float(torch.rand(())))
    x, y = batch
    error = model(x) - y
    return (error**2).mean(), {"mae": error.abs().mean()}


def main(
    out: Path, micro_batch: int, until_step: int | None, log_every: int = 1, batch: int = 16
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 1))
    config = TrainingConfig(
        epochs=3,
        batch_size=batch,
        micro_batch_size=micro_batch,
        lr=3e-3,
        warmup_steps=2,
        schedule="cosine",
        log_every=log_every,
        eval_every="epoch",
        checkpoint_every=3,
        cpu=True,
    )
    probe = torch.randn(16, 6, generator=torch.Generator().manual_seed(1))
    trainer = Trainer(
        model,
        examples(),
        loss_fn,
        config,
        out,
        monitor=[r"1"],
        progress=False,
        evaluate=lambda m: {"probe": float(m(probe).sum())},
    )
    result = trainer.fit(until_step=until_step)
    first_draws: list[Any] = [DRAWS[:1]]
    if torch.distributed.is_initialized():
        first_draws = [None] * result.processes
        torch.distributed.all_gather_object(first_draws, DRAWS[:1])
    if trainer.accelerator.is_main_process:
        torch.save(trainer.unwrapped.state_dict(), out / "final.pt")
        summary = {
            "log": result.log,
            "step": result.step,
            "processes": result.processes,
            "resumed_from": result.resumed_from,
            "first_draws": first_draws,
        }
        (out / "result.json").write_text(json.dumps(summary))
    leave_process_group(exit_status=0)


if __name__ == "__main__":
    until = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] != "-" else None
    numbers = [int(a) for a in sys.argv[4:6]]
    main(Path(sys.argv[1]), int(sys.argv[2]), until, *numbers)

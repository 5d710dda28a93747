"""Run by ``tests/test_preemption.py`` (one process, or 2 under ``torchrun``): ``hopfield run``
of a small regression trained by :class:`hopfield.training.Trainer` for 8 optimiser steps, where
the last process sends itself ``SIGNAL`` during step ``STEP`` (1-based) of the first sitting.

Usage: ``python preemption_script.py OUT STEP SIGNAL [WORKERS]`` (``STEP`` 0: no signal;
``WORKERS`` > 0: that many data workers, and the signal goes to the whole process group, as a
scheduler sends it, workers included).
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hopfield.cli import main
from hopfield.experiments.registry import Experiment, register
from hopfield.experiments.results import Results, RunContext
from hopfield.training import Trainer, process_layout


@dataclass
class Config:
    seed: int = 0
    signal_step: int = 0
    signal_name: str = "SIGUSR1"
    group: bool = False


def run(config: Config, ctx: RunContext) -> Results:
    rank, processes = process_layout()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=generator)
    dataset = list(zip(x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0]), strict=True))
    model = nn.Linear(4, 1)
    marker = ctx.out_dir / f"signalled-{rank}"
    calls = [0]
    micro = 8 // 2 // processes  # micro-batches of a step on each process

    def loss_fn(model: nn.Module, batch: Any) -> torch.Tensor:
        calls[0] += 1
        sender = rank == processes - 1 and not marker.exists()
        # the first of the step's micro-batches: the others are read after the signal
        if sender and calls[0] == (config.signal_step - 1) * micro + 1:
            marker.touch()
            signum = getattr(signal, config.signal_name)
            if config.group:
                os.killpg(os.getpgid(0), signum)
            else:
                os.kill(os.getpid(), signum)
        inputs, targets = batch
        noise = 0.01 * torch.randn(targets.shape)  # the RNG states must resume too
        return ((model(inputs).squeeze(-1) + noise - targets) ** 2).mean()

    cfg = ctx.training_config(
        max_steps=8, batch_size=8, micro_batch_size=2, lr=0.05, log_every=1, cpu=True
    )
    trainer = Trainer(model, dataset, loss_fn, cfg, ctx.out_dir / "train", progress=False)
    result = trainer.fit()
    trainer.close()
    if ctx.is_main_process:
        torch.save(trainer.unwrapped.state_dict(), ctx.out_dir / "weights.pt")
    return Results(metrics={"loss": result.log[-1]["loss"], "step": float(result.step)})


if __name__ == "__main__":
    out, step, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    workers = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    config = Config(signal_step=step, signal_name=name, group=workers > 0)
    register(
        Experiment("test-preempt", "test", dict.fromkeys(("tiny", "small", "paper"), config), run)
    )
    command = ["run", "test-preempt", "--preset", "tiny", "--out", out, "--no-progress"]
    sys.exit(main([*command, "--data-workers", str(workers)]))

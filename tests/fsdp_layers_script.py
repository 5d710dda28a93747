"""Trains a stack of Hopfield layers sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``)
and, beside it in every process, the same stack unsharded on the whole batch; run by
``tests/test_distributed_training.py`` under ``torchrun``: ``python fsdp_layers_script.py OUT``.
The main process writes ``OUT/fsdp.json``: the largest difference between the two stacks'
weights after the steps, and whether the sharded stack's parameters were sharded (DTensors)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from hopfield.functional import Entmax, RandomFeatures, Sink, SoftmaxN, TopK
from hopfield.models.energy_transformer import EnergyLayerNorm
from hopfield.nn import GatedAttention, Hopfield, HopfieldPooling
from hopfield.training import leave_process_group

WIDTH, HEADS, LENGTH, BATCH, STEPS = 16, 4, 12, 8, 3


def stack() -> nn.Sequential:
    """Self-association (the stacked no-grad projection), OutEffHop with a gate, learnable
    scalars (entmax's alpha, a sink logit, the energy transformer's gain: one-element vectors,
    as FSDP2 refuses 0-d parameters), seeded random features, Top-K and a pooling layer."""
    torch.manual_seed(0)
    return nn.Sequential(
        Hopfield(WIDTH, HEADS, update_steps=2),
        Hopfield(WIDTH, HEADS, separation=SoftmaxN(1.0), gate=GatedAttention(WIDTH, HEADS)),
        Hopfield(WIDTH, HEADS, separation=Entmax(alpha=1.5, learnable=True)),
        Hopfield(WIDTH, HEADS, separation=Sink(0.5, learnable=True, value=WIDTH // HEADS)),
        EnergyLayerNorm(WIDTH),
        Hopfield(WIDTH, HEADS, structure=RandomFeatures(32, seed=5, redraw=2)),
        Hopfield(WIDTH, HEADS, structure=TopK(4)),
        HopfieldPooling(WIDTH, HEADS),
    )


def train(model: nn.Module, batches: list[Tensor]) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # Adam would amplify rounding
    # in gradients that are zero in exact arithmetic (a key bias under softmax)
    for x in batches:
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():  # an evaluation between steps (the stacked projections)
            model(x)


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank, processes = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randn(BATCH, LENGTH, WIDTH, generator=generator) for _ in range(STEPS)]
    reference = stack()
    train(reference, batches)
    sharded = stack()
    for layer in sharded:
        fully_shard(layer)
    fully_shard(sharded)
    share = BATCH // processes
    train(sharded, [x[rank * share : (rank + 1) * share] for x in batches])
    state = sharded.state_dict()
    is_sharded = all(isinstance(state[name], DTensor) for name, _ in sharded.named_parameters())
    full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state.items()}
    difference = max(
        float((full[k] - v).abs().max()) for k, v in reference.state_dict().items() if v.numel()
    )
    if rank == 0:
        (out / "fsdp.json").write_text(
            json.dumps({"difference": difference, "sharded": is_sharded, "processes": processes})
        )
    leave_process_group(exit_status=0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

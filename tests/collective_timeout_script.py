"""Run by ``tests/test_collective_timeout.py`` under ``torchrun`` (2 processes): the process
group of the experiment runner, then process 1 keeps process 0 waiting in a barrier for much
longer than ``$HOPFIELD_COLLECTIVE_TIMEOUT``."""

from __future__ import annotations

import time

import torch.distributed as dist

from hopfield.experiments.runner import distributed_state

if __name__ == "__main__":
    distributed_state()
    if dist.get_rank() == 1:
        time.sleep(120)
    dist.barrier()

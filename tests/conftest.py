"""Shared test fixtures: the project's shared data folder (skipped where absent), determinism."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> None:
    """Tests use small tensors: one thread avoids oversubscribing a shared 2-core machine."""
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)


@pytest.fixture
def shared_data() -> Path:
    """The real datasets of ``../shared/data`` (or ``$HOPFIELD_DATA``); skips the test where absent."""
    root = Path(os.environ.get("HOPFIELD_DATA", SHARED_DATA))
    if not root.is_dir():
        pytest.skip(f"real datasets not available: {root} does not exist (set $HOPFIELD_DATA)")
    return root

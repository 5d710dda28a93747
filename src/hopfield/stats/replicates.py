"""How a record names a model's independent replicates (training seeds).

A record with replicates keys its runs ``"<model>.seed<r>"`` for the model's run with seed
``seed + r`` (``r >= 1``); the first replicate keeps the model's name as its key, so a record
written before replicates existed reads as that replicate. Experiments write these keys and the
claims ledger reads them, both through this module.
"""

from __future__ import annotations

__all__ = ["REPLICATE_MARK", "replicate_key", "split_replicate_key"]

#: Separates a model's name from its replicate index in a run key.
REPLICATE_MARK = ".seed"


def replicate_key(name: str, replicate: int) -> str:
    """The run key (and run folder name) of model ``name``'s replicate ``replicate`` (``>= 0``)."""
    if replicate < 0:
        raise ValueError(f"replicate must be >= 0, got {replicate}")
    return name if replicate == 0 else f"{name}{REPLICATE_MARK}{replicate}"


def split_replicate_key(key: str) -> tuple[str, int]:
    """``(model name, replicate)`` of a key of :func:`replicate_key` (a plain name is replicate 0)."""
    name, mark, replicate = key.rpartition(REPLICATE_MARK)
    if mark and replicate.isdigit() and not replicate.startswith("0"):
        return name, int(replicate)
    return key, 0

"""Learnable scalars stored as one-element vectors.

FSDP2 (:func:`torch.distributed.fsdp.fully_shard`) shards every parameter along its first
dimension and refuses 0-d ones, so a module of this package that learns one number (a sink
logit shared by every head, entmax's alpha, a gain) keeps it as a ``(1,)`` parameter and reads
it as ``()`` where its computation needs a scalar. State dicts written while such parameters were
0-d (before 29 Nov 2026) load into them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor, nn


class OneElementScalars(nn.Module):
    """Mix-in for modules whose parameters named in :attr:`one_element_scalars` hold one number
    as ``(1,)`` (or several, per head, in other shapes): a 0-d tensor under such a name in a
    loaded state dict is read as ``(1,)``."""

    one_element_scalars: ClassVar[tuple[str, ...]] = ()

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        for name in self.one_element_scalars:
            value = state_dict.get(prefix + name)
            if isinstance(value, Tensor) and value.dim() == 0:
                state_dict[prefix + name] = value.reshape(1)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

"""``max |x|`` of module outputs during training (the OutEffHop outlier curves)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle


class MaxAbsMonitor:
    """Forward hooks recording ``max |x|`` of module outputs while active.

    Args:
        model: the model.
        patterns: regular expressions, full-matched against ``named_modules()`` names.

    Tuple outputs use their first element. :meth:`collect` returns ``{name: max |x|}`` over the
    forward passes since :meth:`start` and stops recording.
    """

    def __init__(self, model: nn.Module, patterns: Sequence[str]) -> None:
        if isinstance(patterns, str):
            raise TypeError("patterns must be a sequence of regular expressions, not a str")
        compiled = [re.compile(p) for p in patterns]
        self.names: list[str] = [
            n for n, _ in model.named_modules() if n and any(p.fullmatch(n) for p in compiled)
        ]
        if patterns and not self.names:
            raise ValueError(f"patterns: no module of the model matches {list(patterns)}")
        modules = dict(model.named_modules())
        self.active = False
        self._values: dict[str, Tensor] = {}
        self._handles: list[RemovableHandle] = [
            modules[n].register_forward_hook(self._hook(n)) for n in self.names
        ]

    def _hook(self, name: str) -> Callable[[nn.Module, Any, Any], None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not self.active:
                return
            x = output[0] if isinstance(output, tuple | list) and output else output
            if isinstance(x, Tensor) and x.is_floating_point() and x.numel():
                value = x.detach().abs().amax().float()
                old = self._values.get(name)
                self._values[name] = value if old is None else torch.maximum(old, value)

        return hook

    def start(self) -> None:
        """Record from the next forward pass on."""
        self._values = {}
        self.active = True

    def collect(self) -> dict[str, float]:
        """``{name: max |x|}`` since :meth:`start` (modules not run are left out); stops."""
        self.active = False
        values, self._values = self._values, {}
        return {n: float(values[n]) for n in self.names if n in values}

    def remove(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

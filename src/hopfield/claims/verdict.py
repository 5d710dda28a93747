"""The ledger's verdict vocabulary; the statistics behind the verdicts are in
:mod:`hopfield.stats`."""

from __future__ import annotations

__all__ = ["VERDICTS"]

#: The verdict vocabulary of the claims ledger, exactly.
VERDICTS = ("holds", "does not hold", "inconclusive", "not tested at this scale", "not implemented")

"""The ledger's verdict vocabulary; the statistics behind the verdicts are in
:mod:`hopfield.stats`."""

from __future__ import annotations

__all__ = ["NOT_RUN", "PREMISE_ABSENT", "TOY_STAND_IN", "UNTESTED", "VERDICTS"]

#: A record tests the claim only where the phenomenon it is about formed: where it did not (no
#: outliers, a failed validity gate) the claim is untested, and the note shows the premise.
PREMISE_ABSENT = "premise absent at this scale"
#: The experiment ran a toy stand-in for the paper's setting (digits for ImageNet-100).
TOY_STAND_IN = "toy stand-in"
#: No record of the experiment tests it: a defect of the evidence (run it; a smoke run, a record
#: of an older layout or a preset without the model count here too).
NOT_RUN = "not run"
#: The three ways a claim goes untested, most informative first.
UNTESTED = (PREMISE_ABSENT, TOY_STAND_IN, NOT_RUN)

#: The verdict vocabulary of the claims ledger, exactly.
VERDICTS = ("holds", "does not hold", "inconclusive", *UNTESTED, "not implemented")

"""Training premises: what a record must show before its claims about trained models are judged.

A claim about a trained model needs a model that trained. Each experiment that trains a baseline
the papers compare against states here, before any verdict, the least the baseline must reach;
a record below it tests none of the experiment's empirical claims (``premise absent at this
scale``, the note showing the measured value), whatever its other numbers say. Exact claims
(parameter counts) need no training and are judged regardless.

The thresholds are deliberately low, a fraction of what the papers report, so that they ask
"did it learn at all", not "did it match the paper":

* ``hyperset-sudoku``: the weight-shared Transformer solves at least 5 % of the test boards
  (Fig. 3a: 49.3 %);
* ``hyperset-images``: the Transformer reaches twice the chance top-1 accuracy (Table 1: 89.9 %
  on CIFAR-10, chance 10 %);
* ``convergence``: the dense model reaches twice the chance test accuracy on every dataset.
"""

from __future__ import annotations

from collections.abc import Callable

from hopfield.claims.claim import NotTested
from hopfield.claims.records import ExperimentRecord
from hopfield.claims.verdict import PREMISE_ABSENT

__all__ = ["PREMISES", "check_premise"]

#: Least share of test boards the Sudoku Transformer baseline must solve, in percent.
SUDOKU_BOARDS_PCT = 5.0
#: The baselines' accuracy must reach this multiple of chance.
TIMES_CHANCE = 2.0
#: Classes of the image datasets the experiments train on (chance = 1 / classes).
CLASSES = {"digits": 10, "mnist": 10, "fashion-mnist": 10, "cifar10": 10, "cifar100": 100}


def _classes(dataset: str) -> int:
    if dataset not in CLASSES:
        raise NotTested(f"no chance level known for dataset {dataset!r}")
    return CLASSES[dataset]


def _sudoku(record: ExperimentRecord) -> None:
    boards = record.metric("transformer_board_acc")
    if boards < SUDOKU_BOARDS_PCT:
        raise NotTested(
            f"the Transformer baseline solved {boards:.3g} % of the test boards, below the "
            f"premise's {SUDOKU_BOARDS_PCT:g} % (the paper: 49.3 %): no model here learned Sudoku",
            PREMISE_ABSENT,
        )


def _images(record: ExperimentRecord) -> None:
    dataset = str(record.config.get("dataset"))
    needed = TIMES_CHANCE * 100.0 / _classes(dataset)
    accuracy = record.metric("transformer_accuracy")
    if accuracy < needed:
        raise NotTested(
            f"the Transformer baseline reached {accuracy:.3g} % top-1 on {dataset}, below the "
            f"premise's {needed:g} % ({TIMES_CHANCE:g}x chance)",
            PREMISE_ABSENT,
        )


def _convergence(record: ExperimentRecord) -> None:
    datasets = record.config.get("datasets") or []
    if not datasets:
        raise NotTested("convergence records no datasets")
    for dataset in datasets:
        needed = TIMES_CHANCE / _classes(str(dataset))
        accuracy = record.metric(f"{dataset}/dense/final_test_accuracy")
        if accuracy < needed:
            raise NotTested(
                f"the dense model reached {accuracy:.3g} test accuracy on {dataset}, below the "
                f"premise's {needed:g} ({TIMES_CHANCE:g}x chance)",
                PREMISE_ABSENT,
            )


#: Experiment name -> its premise check (a :class:`NotTested` when the record falls short).
PREMISES: dict[str, Callable[[ExperimentRecord], None]] = {
    "hyperset-sudoku": _sudoku,
    "hyperset-images": _images,
    "convergence": _convergence,
}


def check_premise(record: ExperimentRecord) -> None:
    """Raise :class:`NotTested`: ``not run`` for a smoke run, ``premise absent at this scale``
    when ``record``'s experiment states a training premise the record does not meet; nothing
    otherwise."""
    premise = PREMISES.get(record.name)
    if record.smoke_run is not None:
        raise NotTested(record.smoke_run)  # tests nothing, whatever it trained
    if premise is not None:
        premise(record)

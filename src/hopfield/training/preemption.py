"""Preemption: SIGUSR1/SIGTERM stop a run at the next step boundary (:func:`preemptible`)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: Signals that preempt a run (:func:`preemptible`): SLURM's ``--signal=USR1@T`` warning and the
#: SIGTERM a scheduler sends before it kills a job.
PREEMPTION_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGUSR1, signal.SIGTERM)


class Preempted(KeyboardInterrupt):
    """A preemption signal stopped the run (:func:`preemptible`).

    Attributes:
        signal_name: the signal this process received (``None``: another process received it).
        step: the optimiser step the run stopped after (``None``: outside a training loop).
        checkpoint: the checkpoint written at that step (``None``: outside a training loop).
    """

    def __init__(
        self, signal_name: str | None, step: int | None = None, checkpoint: Path | None = None
    ) -> None:
        where = "" if step is None else f" after step {step} (checkpoint {checkpoint})"
        super().__init__(f"preempted by {signal_name or 'a signal to another process'}{where}")
        self.signal_name = signal_name
        self.step = step
        self.checkpoint = checkpoint


class _Preemption:
    """The state of :func:`preemptible` in this process: the signal received (if any), how many
    blocks installed the handlers and how many defer the stop to a step boundary."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.installed = 0
        self.deferred = 0


_PREEMPTION = _Preemption()


def _on_preemption_signal(signum: int, frame: Any) -> None:
    _PREEMPTION.signal_name = signal.Signals(signum).name
    if not _PREEMPTION.deferred:
        raise Preempted(_PREEMPTION.signal_name)


@contextmanager
def preemptible(*, defer: bool = False) -> Iterator[None]:
    """While the block runs, a signal of :data:`PREEMPTION_SIGNALS` preempts it.

    With ``defer=False`` the signal raises :class:`Preempted` (a ``KeyboardInterrupt``) at once;
    with ``defer=True`` (:meth:`Trainer.fit`'s step loop) it is only noted, and the code asks
    :func:`preemption_requested` at its next safe point (a step boundary, where the trainer
    writes a checkpoint and raises :class:`Preempted` itself); a signal noted but not acted on
    when the last deferring block ends raises :class:`Preempted` there. Blocks nest (the runner
    wraps the whole experiment, each fit its loop); the handlers are installed by the outermost
    block and the previous ones restored when it ends. Outside the main thread (where Python
    cannot install handlers) the block runs without them.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    state = _PREEMPTION
    previous = {}
    if state.installed == 0:
        state.signal_name = None
        previous = {s: signal.signal(s, _on_preemption_signal) for s in PREEMPTION_SIGNALS}
    state.installed += 1
    state.deferred += int(defer)
    try:
        yield
    finally:
        state.deferred -= int(defer)
        state.installed -= 1
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if defer and state.deferred == 0 and state.signal_name is not None:
        raise Preempted(state.signal_name)


def ignore_preemption(worker: int) -> None:
    """A data worker ignores the preemption signals (a scheduler signals every process of the
    job): the training process stops at its step boundary and ends the workers then, instead
    of a worker's death failing the step."""
    for signum in PREEMPTION_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def preemption_requested() -> str | None:
    """The name of the preemption signal this process received under :func:`preemptible`
    (``None``: none)."""
    return _PREEMPTION.signal_name

"""How a long command stops on a signal: Ctrl-C, and what docker, SLURM, systemd and ``timeout`` send
(SIGTERM) or a closed terminal sends (SIGHUP). A training run saves a checkpoint first
(:class:`StopOnSignals`); other commands stop as on Ctrl-C (:func:`signals_interrupt`)."""
from __future__ import annotations

import contextlib
import signal
import sys

EXIT_INTERRUPTED = 130
STOP_SIGNALS = {"SIGINT": "Ctrl-C", "SIGTERM": "SIGTERM", "SIGHUP": "SIGHUP"}


class StopOnSignals:
    """First Ctrl-C, SIGTERM or SIGHUP: finish the current step, save, exit ``128 + signal``
    (130, 143, 129). The same signal again: stop at once, without saving.

    ``trainer_of()`` is what gets ``stop_requested`` (None before the trainer exists); :meth:`restore`
    puts the previous handlers back; :attr:`exit_status` is the status to exit with once stopped.
    """

    def __init__(self, trainer_of, say, echo):
        self.trainer_of, self.say, self.echo = trainer_of, say, echo
        self.received: int | None = None
        self.previous = {}
        for name in STOP_SIGNALS:
            number = getattr(signal, name, None)
            if number is None:
                continue  # SIGHUP does not exist on Windows
            try:
                self.previous[number] = signal.signal(number, self._handler)
            except ValueError:  # not the main thread (e.g. inside a test runner's worker)
                break

    @property
    def exit_status(self) -> int:
        return 128 + self.received if self.received is not None else EXIT_INTERRUPTED

    def _handler(self, signum, frame):
        name = STOP_SIGNALS[signal.Signals(signum).name]
        trainer = self.trainer_of()
        if trainer is not None and not trainer.stop_requested:
            self.received = signum
            trainer.stop_requested = True
            self.say(f"\n{name}: stopping after this step and saving a checkpoint ({name} again to stop at once "
                     f"without saving)", err=True)
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.echo(f"\n{name}: stopped at once, nothing saved", err=True)
        sys.exit(128 + signum)

    def restore(self) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)
        self.previous = {}


@contextlib.contextmanager
def signals_interrupt(names, on_signal=None):
    """While the block runs, the signals ``names`` (e.g. ``("SIGTERM", "SIGHUP")``) stop it as Ctrl-C
    does: ``on_signal(signum)``, then a ``KeyboardInterrupt`` in the main thread. The previous
    handlers come back after it. Off the main thread (a test runner's worker) nothing is installed."""
    def interrupt(signum, frame):
        if on_signal is not None:
            on_signal(signum)
        raise KeyboardInterrupt

    previous = {}
    for name in names:
        number = getattr(signal, name, None)
        if number is not None:
            try:
                previous[number] = signal.signal(number, interrupt)
            except ValueError:  # not the main thread
                break
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)

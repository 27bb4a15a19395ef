"""When a run writes its checkpoint: every N epochs, and also whenever M minutes have passed.

Epochs alone are not enough: with long epochs (or a slow machine) ten epochs can be an hour
of work that a crash throws away. The clock bounds the loss to about M minutes whatever
the epoch length; a checkpoint may then fall mid-epoch, which resuming handles (the epoch's
order and position are saved).
"""
from __future__ import annotations

import time

from ksae_cupy.errors import KsaeError


class CheckpointPolicy:
    """``after_epoch(epoch)`` and ``after_batch(done, total)`` say whether to save now."""

    def __init__(self, every_epochs: int, minutes: float, clock=time.monotonic):
        if every_epochs <= 0:
            raise KsaeError(f"--checkpoint-every {every_epochs} is not allowed; use a positive number of epochs")
        if not minutes >= 0:
            raise KsaeError(f"--checkpoint-minutes {minutes} is not allowed; use minutes >= 0 (0: by epochs only)")
        self.every_epochs, self.seconds, self.clock = every_epochs, 60.0 * minutes, clock
        self.last = clock()

    def restart(self) -> None:
        """Count the minutes from now (e.g. from the first step, not from loading the data)."""
        self.last = self.clock()

    def _time_is_up(self) -> bool:
        return self.seconds > 0 and self.clock() - self.last >= self.seconds

    def after_epoch(self, epoch: int) -> bool:
        due = epoch % self.every_epochs == 0 or self._time_is_up()
        if due:
            self.last = self.clock()
        return due

    def after_batch(self, done: int, total: int) -> bool:
        # The epoch's last batch is left to after_epoch, which saves with the epoch finished.
        due = done < total and self._time_is_up()
        if due:
            self.last = self.clock()
        return due

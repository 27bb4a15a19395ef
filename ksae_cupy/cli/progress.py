"""What ``ksae-train`` shows while it runs: a progress bar or periodic lines, the ETA, epoch lines.

* On a terminal, a bar on stderr redrawn at most ten times a second:
  ``  epoch 3/5000 [#####.........] batch 216/469  9,800 samples/s  ETA 6h 58m``
* Not on a terminal (output to a file), the same text as a line every ``interval_s`` seconds.
* After the first epoch of the session, one line with the estimated total time.
* After every epoch, one line (to stdout) with its k, learning rate, losses and speed.

The rate is measured over this session (every step since it started, validation included),
so the ETA settles after the first epoch and is not thrown off by one slow batch.
"""
from __future__ import annotations

import datetime as _dt
import time

import click


def format_duration(seconds: float) -> str:
    """``45s``, ``3m 05s``, ``7h 12m``, ``2d 04h``: two units at most, for a person."""
    seconds = max(0, int(round(seconds)))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def epoch_line(report, epochs: int, eta: str = "") -> str:
    valid = f"  valid {report.valid_loss:.4f}" if report.valid_loss is not None else ""
    tail = f"  ETA {eta}" if eta else ""
    return (f"epoch {report.epoch}/{epochs}  k {report.k}  lr {report.lr:g}  loss {report.train_loss:.4f}{valid}  "
            f"dead {100 * report.dead_fraction:.1f}%  {report.samples_per_s:,.0f} samples/s  {report.seconds:.1f} s{tail}")


class RunProgress:
    """Progress of one session of a run; reads the trainer's epoch, step and configuration."""

    def __init__(self, trainer, n_train: int, enabled: bool, tty: bool, interval_s: float = 30.0,
                 clock=time.monotonic, echo=click.echo):
        self.trainer, self.enabled, self.tty, self.interval_s = trainer, enabled, tty, interval_s
        self.n_batches = -(-n_train // trainer.config.batch_size)
        self.clock, self.echo = clock, echo
        self.started, self.step_at_start = clock(), trainer.step
        self.last_draw = self.last_line = self.started
        self.drawn = 0  # characters of the bar now on the screen
        self.estimated = False

    # -- rates -------------------------------------------------------------------------
    def steps_left(self) -> int:
        t = self.trainer
        return max(0, (t.config.epochs - t.epoch) * self.n_batches - t.batch_in_epoch)

    def seconds_per_step(self) -> float | None:
        steps = self.trainer.step - self.step_at_start
        return (self.clock() - self.started) / steps if steps > 0 else None

    def eta(self) -> str:
        per_step = self.seconds_per_step()
        return format_duration(per_step * self.steps_left()) if per_step else "?"

    def status(self) -> str:
        t = self.trainer
        per_step = self.seconds_per_step()
        rate = f"{t.config.batch_size / per_step:,.0f} samples/s" if per_step else "? samples/s"
        return (f"epoch {t.epoch + 1}/{t.config.epochs}  batch {t.batch_in_epoch}/{self.n_batches}  "
                f"{rate}  ETA {self.eta()}")

    # -- callbacks ---------------------------------------------------------------------
    def on_batch(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if self.tty and (now - self.last_draw > 0.1 or done == total):
            self.last_draw = now
            width = 20
            filled = width * done // total
            text = f"  {self.status()}  [{'#' * filled}{'.' * (width - filled)}]"
            self.echo("\r" + text.ljust(self.drawn), nl=False, err=True)
            self.drawn = len(text)
        elif not self.tty and now - self.last_line >= self.interval_s:
            self.last_line = now
            self.echo(f"  {self.status()}", err=True)

    def clear(self) -> None:
        if self.enabled and self.tty and self.drawn:
            self.echo("\r" + " " * self.drawn + "\r", nl=False, err=True)
            self.drawn = 0

    def after_epoch(self, report) -> list[str]:
        """The lines to print after an epoch: its epoch line and, once, the estimate."""
        self.clear()
        lines = [epoch_line(report, self.trainer.config.epochs, self.eta() if not self.trainer.finished else "")]
        per_step = self.seconds_per_step()
        if not self.estimated and per_step and not self.trainer.finished:
            self.estimated = True
            per_epoch = per_step * self.n_batches
            epochs = self.trainer.config.epochs
            left = per_step * self.steps_left()
            end = _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=left)
            lines.append(f"estimate: {epochs} epochs at {per_epoch:.1f} s each take {format_duration(epochs * per_epoch)} "
                         f"on this device; {epochs - self.trainer.epoch} left, done around "
                         f"{end:%Y-%m-%d %H:%M} UTC")
        return lines

"""What a training command shows while it runs: a progress bar or periodic lines, the ETA, epoch lines.

* On a terminal, a bar on stderr redrawn at most ten times a second:
  ``  epoch 3/5000 [#####.........] batch 216/469  9,800 samples/s  ETA 6h 58m``
* Not on a terminal (output to a file), the same text as a line every ``interval_s`` seconds.
* After the first epoch of the session, one line with the estimated total time.
* After every epoch, one line (to stdout) with its k, learning rate, losses and speed.

The rate is measured over this session (every step since it started, validation included),
so the ETA settles after the first epoch and is not thrown off by one slow batch. One-time costs
are kept off that clock: the first step (which compiles the CPU kernels) runs before the
progress exists, and the seconds spent measuring ``step_cost`` are subtracted. Under the
sparsity schedule a step's cost falls with k (100 -> 25 on MNIST); given ``step_cost`` (seconds
of a step at a k, measured on a sample batch), the ETA counts the work left in steps of each
epoch's k, with the cost linear in k between the first k and the last.
"""
from __future__ import annotations

import datetime as _dt
import sys
import time

from ksae_cupy.schedules import sparsity_at_epoch
from ksae_cupy.training.wording import epoch_line, format_duration  # noqa: F401 (used here and by the commands)


class RunProgress:
    """Progress of one session of a run; reads the trainer's epoch, step and configuration."""

    def __init__(self, trainer, n_train: int, enabled: bool, tty: bool, interval_s: float = 30.0,
                 clock=time.monotonic, echo=None, step_cost=None):
        self.trainer, self.enabled, self.tty, self.interval_s = trainer, enabled, tty, interval_s
        self.n_batches = -(-n_train // trainer.config.batch_size)
        self.clock, self.echo = clock, echo or _echo
        self.started, self.step_at_start = clock(), trainer.step
        self.epoch_at_start = trainer.epoch  # above 0: a resumed run (made at the first batch of a session)
        self.last_draw = self.last_line = self.started
        self.drawn = 0  # characters of the bar now on the screen
        self.estimated = False
        self.step_cost = step_cost  # k -> seconds of one step at k (None: every step costs the same)
        self.cost_line = None  # (k_a, cost_a, k_b, cost_b), measured once, when first needed
        self.k_runs = None  # (epochs, the runs of epochs of each k of the schedule), made once

    # -- rates -------------------------------------------------------------------------
    def _epoch_k(self, epoch: int) -> int:
        cfg = self.trainer.config
        return sparsity_at_epoch(epoch, cfg.k_schedule_epochs or cfg.epochs, cfg.k, cfg.k_start)

    def _relative_cost(self, k: int) -> float:
        """A step's cost at ``k`` relative to one at the first k of the schedule (1 without step_cost)."""
        cfg = self.trainer.config
        k_first, k_last = self._epoch_k(0), cfg.k
        if self.step_cost is None or k_first == k_last:
            return 1.0
        if self.cost_line is None:
            # Measuring is a one-time cost, not the run's pace: its seconds are taken off the clock.
            before = self.clock()
            self.cost_line = self._measure_cost_line(k_first, k_last)
            self.started += self.clock() - before
        k_a, cost_a, k_b, cost_b = self.cost_line
        return (cost_a + (cost_b - cost_a) * (k - k_a) / (k_b - k_a)) / cost_a

    def _measure_cost_line(self, k_first: int, k_last: int, rounds: int = 3):
        """``(k_first, cost, k_last, cost)``: each k timed ``rounds`` times, the two in turn so that both
        see the same load, and the least time of each kept (other jobs only ever add time). A step
        keeping fewer units never costs more, so a measurement that says otherwise (load that came
        and went) is capped at the other's cost."""
        costs = {k_first: [], k_last: []}
        for _ in range(rounds):
            for k in (k_first, k_last):
                costs[k].append(self.step_cost(k))
        cost_first, cost_last = min(costs[k_first]), min(costs[k_last])
        if k_last < k_first:
            cost_last = min(cost_last, cost_first)
        elif k_last > k_first:
            cost_first = min(cost_first, cost_last)
        return k_first, cost_first, k_last, cost_last

    def _work(self, first_step: int, last_step: int) -> float:
        """Steps ``first_step .. last_step - 1`` (counted over the whole run), each weighed by its k's cost."""
        return self._work_before(last_step) - self._work_before(first_step)

    def _work_before(self, step: int) -> float:
        """The weighed steps before run step ``step``, in closed form: a step's cost is linear in k
        (:meth:`_relative_cost`), so the epochs before ``step`` weigh ``epochs * cost(0) + slope * (sum of
        their k)``, a sum made of one term per k of the schedule, never one per epoch (``--epochs`` of
        10^8 once built a list of 10^8 entries here, and the run never got back to its stop check)."""
        cfg = self.trainer.config
        if self.step_cost is None or self._epoch_k(0) == cfg.k:
            return float(step)  # every step costs the same
        epoch = min(step // self.n_batches, cfg.epochs)
        in_epoch = step - epoch * self.n_batches
        cost_0 = self._relative_cost(0)
        slope = self._relative_cost(1) - cost_0
        before = self.n_batches * (epoch * cost_0 + slope * self._k_sum(epoch))
        return before + (in_epoch * self._relative_cost(self._epoch_k(epoch)) if in_epoch else 0.0)

    def _k_sum(self, epochs_before: int) -> int:
        """``sum(k of epoch e for e < epochs_before)``, from the runs of epochs of each k (:meth:`_k_runs`)."""
        total = 0
        for k, first, stop in self._k_runs():
            if first >= epochs_before:
                break
            total += k * (min(stop, epochs_before) - first)
        return total

    def _k_runs(self) -> list[tuple[int, int, int]]:
        """``(k, first epoch, stop epoch)`` for each k the schedule takes, made once per epoch count. The
        schedule is monotone in the epoch, so each k holds for one run of epochs, whose end is found by
        bisection: one entry per k (at most ``|k - k_start| + 1``), whatever ``--epochs``."""
        epochs = self.trainer.config.epochs
        if self.k_runs is not None and self.k_runs[0] == epochs:
            return self.k_runs[1]
        runs, first = [], 0
        while first < epochs:
            k = self._epoch_k(first)
            low, high = first + 1, epochs  # the first epoch whose k differs from k
            while low < high:
                middle = (low + high) // 2
                if self._epoch_k(middle) != k:
                    high = middle
                else:
                    low = middle + 1
            runs.append((k, first, low))
            first = low
        self.k_runs = (epochs, runs)
        return runs

    def _step_number(self) -> int:
        """Steps of the run done so far, counted as ``epoch * n_batches + batch`` (what the ETA needs)."""
        return self.trainer.epoch * self.n_batches + self.trainer.batch_in_epoch

    def steps_left(self) -> int:
        t = self.trainer
        return max(0, (t.config.epochs - t.epoch) * self.n_batches - t.batch_in_epoch)

    def seconds_per_step(self) -> float | None:
        steps = self.trainer.step - self.step_at_start
        return (self.clock() - self.started) / steps if steps > 0 else None

    def seconds_left(self) -> float | None:
        """The time the run still needs at this session's rate, each step weighed by its k's cost."""
        steps = self.trainer.step - self.step_at_start
        if steps <= 0:
            return None
        now = self._step_number()
        done = self._work(now - steps, now)
        left = self._work(now, self.trainer.config.epochs * self.n_batches)
        return (self.clock() - self.started) / done * left if done > 0 else None

    def eta(self) -> str:
        left = self.seconds_left()
        return format_duration(left) if left is not None else "?"

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
        elif not self.tty and done < total and now - self.last_line >= self.interval_s:
            # a line between epoch lines only: the epoch's last batch is told by its epoch line, just after
            self.last_line = now
            self.echo(f"  {self.status()}", err=True)

    def clear(self) -> None:
        if self.enabled and self.tty and self.drawn:
            self.echo("\r" + " " * self.drawn + "\r", nl=False, err=True)
            self.drawn = 0

    def after_epoch(self, report) -> list[str]:
        """The lines to print after an epoch: its epoch line and, once, the estimate."""
        self.clear()
        self.last_line = self.clock()  # the next progress line a full interval after this epoch line
        lines = [epoch_line(report, self.trainer.config.epochs, self.eta() if not self.trainer.finished else "")]
        per_step = self.seconds_per_step()
        if not self.estimated and per_step and not self.trainer.finished:
            self.estimated = True
            per_epoch = per_step * self.n_batches
            epochs = self.trainer.config.epochs
            left = self.seconds_left()
            total = left * self._work(0, epochs * self.n_batches) / self._work(self._step_number(), epochs * self.n_batches)
            at_k = ""
            if self._relative_cost(self.trainer.config.k) != 1.0:
                at_k = (f" (k {report.k}; at k {self.trainer.config.k} "
                        f"{per_epoch * self._relative_cost(self.trainer.config.k) / self._relative_cost(report.k):.1f} s)")
            remaining = epochs - self.trainer.epoch
            if self.epoch_at_start > 0:  # a resumed run: what is left, not the whole run's time
                lines.append(f"estimate: {remaining} of {epochs} epochs left at {per_epoch:.1f} s each{at_k}: "
                             f"{format_duration(left)} on this device, {done_around(left)}")
            else:
                lines.append(f"estimate: {epochs} epochs at {per_epoch:.1f} s each{at_k} take {format_duration(total)} "
                             f"on this device; {remaining} left, {done_around(left)}")
        return lines


def done_around(seconds_left: float) -> str:
    """``done around 2026-11-29 14:32 UTC``, or, past what a date can hold (``--epochs`` of 10^12), the year."""
    try:
        end = _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=seconds_left)
    except OverflowError:
        return "done after the year 9999"
    return f"done around {end:%Y-%m-%d %H:%M} UTC"


def _echo(message: str = "", nl: bool = True, err: bool = False) -> None:
    """``click.echo``'s signature, without click (the commands pass theirs)."""
    stream = sys.stderr if err else sys.stdout
    stream.write(message + ("\n" if nl else ""))
    stream.flush()

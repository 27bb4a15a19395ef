"""What ``ksae-finetune`` shows while it runs: each epoch's line with the time left, timed phase by
phase (:class:`PhasePace`), and between them the progress bar of :mod:`ksae_cupy.session.progress`
worded by phase (:class:`PhaseProgress`)."""
from __future__ import annotations

from ksae_cupy.session.progress import RunProgress


class PhasePace:
    """The time a fine-tuning run still needs, from this session's epochs.

    Phases cost differently (``softmax`` trains only the top layer, ``all`` every layer), so each
    phase is timed on its own; a phase not yet seen in this session is not guessed at: the ETA
    then covers the current phase and says how many phases follow it.
    """

    def __init__(self, phases: list[str], epochs: int):
        self.phases, self.epochs = list(phases), epochs
        self.seconds: dict[str, float] = {}
        self.count: dict[str, int] = {}

    def add(self, report) -> None:
        self.seconds[report.phase] = self.seconds.get(report.phase, 0.0) + report.seconds
        self.count[report.phase] = self.count.get(report.phase, 0) + 1

    def eta(self, trainer) -> str:
        """``3m 05s``, ``3m 05s for this phase, then 2 more phases``, or '' when nothing is timed yet."""
        from ksae_cupy.training.wording import format_duration

        phase = None if trainer.finished else trainer.phase
        if phase not in self.count:
            return ""
        left = (self.epochs - trainer.epoch) * self.seconds[phase] / self.count[phase]
        later = len(self.phases) - trainer.phase_index - 1  # phases come in order: none of them timed yet
        if later:
            return f"{format_duration(left)} for this phase, then {later} more phase{'s' * (later > 1)}"
        return format_duration(left)

    def line(self, report, trainer) -> str:
        """The epoch's line, with the ETA once a phase is timed."""
        self.add(report)
        eta = self.eta(trainer)
        return (f"phase {report.phase} epoch {report.epoch}/{trainer.config.epochs}  lr {report.lr:.4g}  "
                + ("" if trainer.config.momentum_end is None else f"momentum {report.momentum:.3g}  ")
                + f"loss {report.train_loss:.4f}  "
                + ("" if report.valid_error is None else f"valid error {100 * report.valid_error:.2f}%  ")
                + f"{report.seconds:.1f} s"
                + (f"  ETA {eta}" if eta else ""))


class PhaseProgress(RunProgress):
    """The progress bar (or, off a terminal, a line every ``interval_s``) of a fine-tuning run, worded by
    phase; its ETA is :class:`PhasePace`'s, which times each phase on its own."""

    def __init__(self, trainer, pace: PhasePace, n_train: int, **options):
        super().__init__(trainer, n_train, **options)
        self.pace = pace

    def status(self) -> str:
        t, per_step = self.trainer, self.seconds_per_step()
        rate = f"{t.config.batch_size / per_step:,.0f} samples/s" if per_step else "? samples/s"
        return (f"phase {t.phase} epoch {t.epoch + 1}/{t.config.epochs}  batch {t.batch_in_epoch}/{self.n_batches}  "
                f"{rate}  ETA {self.pace.eta(t) or '?'}")

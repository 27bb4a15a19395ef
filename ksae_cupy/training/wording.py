"""How a run's progress is worded, the same by every command and the Python API: durations, the
epoch line, the point a run stands at (its stop and resume lines name it alike)."""
from __future__ import annotations


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
    """One epoch's line: its k, learning rate, losses, the fraction of variance explained (train, valid),
    L0 (non-zero code units per example), the units no example kept during the epoch (``unkept``: not the
    dead count, which the done line gives for the final weights) and speed (an :class:`EpochReport`)."""
    valid = f"  valid {report.valid_loss:.4f}" if report.valid_loss is not None else ""
    fve = getattr(report, "fve", None)
    valid_fve = getattr(report, "valid_fve", None)
    explained = "" if fve is None else f"  FVE {fve:.4f}" + ("" if valid_fve is None else f" valid {valid_fve:.4f}")
    l0 = getattr(report, "l0", None)
    sparsity = "" if l0 is None else f"  L0 {l0:.1f}"
    tail = f"  ETA {eta}" if eta else ""
    return (f"epoch {report.epoch}/{epochs}  k {report.k}  lr {report.lr:g}  loss {report.train_loss:.4f}{valid}"
            f"{explained}{sparsity}  unkept {100 * report.dead_fraction:.1f}%  {report.samples_per_s:,.0f} samples/s  "
            f"{report.seconds:.1f} s{tail}")


def position(epoch: int, batch_in_epoch: int) -> str:
    """Where a run stands, worded the same by the stop line and the resume line: ``after epoch 8,
    batch 173`` (epochs finished, then batches of the next one), or ``after epoch 8``."""
    return f"after epoch {epoch}, batch {batch_in_epoch}" if batch_in_epoch else f"after epoch {epoch}"


def epochs_done(n: int) -> str:
    """``1 epoch``, ``3 epochs``."""
    return f"{n} epoch" if n == 1 else f"{n} epochs"


def interrupted(where: str, checkpoint, command: str, run) -> str:
    """The line of a run stopped by a signal: where it stands, its checkpoint, and how to go on."""
    return f"interrupted {where}; checkpoint saved to {checkpoint}; continue with: {command} --resume {run}"


def nothing_to_train(epoch: int) -> str:
    """The line of a resumed run that had already trained all its epochs ("done: 3 epochs in 0.0 s"
    would read as if it had trained them)."""
    return (f"nothing to train: the run had already trained all its {epoch} epochs (options given are recorded); "
            f"to train longer, give --epochs N with N > {epoch}")


# What "dead" means wherever a run's dead units are counted: the end of ksae-train (this line), ksae-eval's
# train row, ksae-plot and the export (ksae_cupy.metrics.DEAD_DEFINITION). The epoch lines say "unkept": the
# units no example kept during the epoch, as the weights moved (a few more or fewer than the dead count).
DEAD_MEANING = "units non-zero in the k-code of no training example, with the final weights"
# Above this fraction a run says that its dead units are a problem, and what fixes them.
DEAD_NOTE_ABOVE = 1 / 3


def done_dead(n_dead: int | None, hidden: int) -> str:
    """The done line's words on the final dead count: `` (dead 534 of 1000, 53.4%: units ...)``."""
    if n_dead is None:
        return ""
    return f" (dead {n_dead} of {hidden}, {100 * n_dead / hidden:.1f}%: {DEAD_MEANING})"


def dead_units_note(n_dead: int | None, hidden: int, aux_k: int = 0, center_input: bool = False) -> str | None:
    """One line when more than a third of the units ended dead, naming the options that keep them alive, but
    only those the run did not use already (``aux_k``, ``center_input``: the run's)."""
    if n_dead is None or n_dead / hidden <= DEAD_NOTE_ABOVE:
        return None
    advice = []
    if not center_input:
        advice.append("--center-input")
    if aux_k < min(256, hidden):  # Gao et al.'s 256 (docs/dead-units.md), within what --aux-k allows
        advice.append(f"--aux-k {min(256, hidden)}")
    used = " and ".join(([f"--aux-k {aux_k}"] if aux_k else []) + (["--center-input"] if center_input else []))
    if advice:
        fix = f"{' or '.join(advice)} keeps more units alive" + (f" (this run had {used})" if used else "")
    else:
        fix = (f"this run had {used} already; a larger --aux-coef, a longer --dead-window or a smaller --k start "
               f"(--k-start) may help")
    return (f"dead units: {n_dead} of {hidden} ended dead, more than a third: their features are always 0 and "
            f"their filters noise; {fix} (docs/dead-units.md)")

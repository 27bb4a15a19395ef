"""A run folder's state, read without changing anything: what the reports and scripts ask of it.

Every command writes ``config.json`` first and one ``metrics.jsonl`` line per finished epoch
(:mod:`ksae_cupy.session.runs`); ``ksae-eval`` adds ``eval.json`` and ``ksae-finetune``
``finetune.json`` when they end. From those files alone: which command made the folder, how many
epochs it asked for and has done, the seconds they took, and whether its evaluation is current.
"""
from __future__ import annotations

import datetime as _dt
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from ksae_cupy.reports.kept_checkpoints import RESTORE_COMMAND, kept_checkpoint
from ksae_cupy.session.runs import (CHECKPOINT, CONFIG, FINETUNE, METRICS, PRETRAIN_LAYER, TRAIN, config_kind,
                                    metrics_file, parse_metrics)

BASELINE = "ksae-baseline"
EVAL, FINETUNE_RESULTS = "eval.json", "finetune.json"
DIVERGED = "diverged.json"  # written by the scripts into the folder of a run that diverged (kept: remove it to retry)


def read_json(path: Path):
    """The JSON in ``path``, or None when it is missing or unreadable (a file being written, say)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_metrics(folder: Path) -> list[dict]:
    """The epochs ``folder``'s run logged; [] before the first. A last line cut short by a kill
    is left out (:func:`ksae_cupy.session.runs.parse_metrics`); a gzipped metrics.jsonl.gz reads alike."""
    path = metrics_file(folder)
    return parse_metrics(path)[0] if path.is_file() else []


def progress(folder: Path) -> tuple[int, float]:
    """``(epochs done, training seconds)`` from metrics.jsonl: its last epoch and the sum of every
    epoch's seconds (every session of a resumed run counts once: a resume drops the lines after
    its checkpoint)."""
    records = read_metrics(folder)
    return (records[-1].get("epoch", 0) if records else 0), float(sum(r.get("seconds", 0.0) for r in records))


def epochs_asked(config: dict) -> int | None:
    """The epochs a run's config.json asks for (a fine-tuning run: per phase times phases)."""
    kind = config_kind(config)
    if kind == TRAIN:
        return (config.get("train") or {}).get("epochs")
    if kind == BASELINE:
        return (config.get("baseline") or {}).get("epochs")
    if kind == FINETUNE:
        finetune = config.get("finetune") or {}
        if finetune.get("epochs") is None:
            return None
        return finetune["epochs"] * len(finetune.get("phases") or ["all"])
    return None


@dataclass
class RunState:
    """What one run folder holds. ``epochs_done`` counts metrics.jsonl's lines (a fine-tuning run
    logs one per epoch of every phase); ``results`` is eval.json or finetune.json, when written."""

    path: Path
    kind: str | None
    config: dict = field(repr=False)
    epochs_asked: int | None
    epochs_done: int
    seconds: float
    has_checkpoint: bool
    results: dict | None = field(repr=False)
    locked: str | None = None  # why another live process holds the folder (a run writing it now)
    diverged: str | None = None  # the message of a run that diverged (diverged.json)
    # No checkpoint in the folder, but one kept in git history (results/checkpoints.json): a resume restores it first
    checkpoint_kept: bool = False

    @property
    def resumable(self) -> bool:
        """Its checkpoint is there, or ``ksae-data restore-checkpoint`` can put it back."""
        return self.has_checkpoint or self.checkpoint_kept
    broken: str | None = None  # why its files cannot be read as a run (broken_reason): no command runs there

    @property
    def pretraining(self) -> bool:
        """A ``ksae-finetune --baseline`` run stopped while pretraining its layers: no checkpoint of its own
        yet, but its layer 1's (``--resume`` goes on from there)."""
        return (self.kind == FINETUNE and not self.has_checkpoint and bool(self.config.get("pretrain_layers"))
                and (self.path / PRETRAIN_LAYER.format(1) / CHECKPOINT).is_file())

    @property
    def trained(self) -> bool:
        return self.epochs_asked is not None and self.epochs_done >= self.epochs_asked

    @property
    def done(self) -> bool:
        """Nothing left to run: fine-tuning wrote finetune.json; training is evaluated at its last epoch."""
        if self.results is None:
            return False
        if self.kind == FINETUNE:
            return True
        return self.epochs_asked is not None and (self.results.get("epoch") or 0) >= self.epochs_asked

    def describe(self) -> str:
        """A few words on where the run stands."""
        if self.broken:
            return f"broken: {self.broken}"
        if self.done:
            return "done"
        if self.diverged:
            return f"diverged: {self.diverged}"
        if self.locked:
            return f"running: epoch {self.epochs_done} of {self.epochs_asked}"
        if self.trained:
            return f"trained ({self.epochs_done} epochs), not evaluated"
        if self.resumable:
            return f"stopped at epoch {self.epochs_done} of {self.epochs_asked}"
        if self.pretraining:
            return "stopped while pretraining its layers"
        return "not started" + (f" (stopped at epoch {self.epochs_done}, before its first checkpoint)"
                                if self.epochs_done else "")


def run_state(folder: Path) -> RunState:
    """The state of the run folder ``folder`` (one that has a config.json)."""
    folder = Path(folder)
    has_checkpoint = (folder / CHECKPOINT).is_file()
    config = read_json(folder / CONFIG) or {}
    kind = config_kind(config)
    records = read_metrics(folder)
    results = read_json(folder / (FINETUNE_RESULTS if kind == FINETUNE else EVAL))
    return RunState(path=folder, kind=kind, config=config, epochs_asked=epochs_asked(config),
                    epochs_done=len(records) if kind == FINETUNE else (records[-1].get("epoch", 0) if records else 0),
                    seconds=float(sum(r.get("seconds", 0.0) for r in records)),
                    has_checkpoint=has_checkpoint, results=results, locked=locked_by(folder),
                    diverged=(read_json(folder / DIVERGED) or {}).get("message"),
                    checkpoint_kept=not has_checkpoint and kept_checkpoint(folder / CHECKPOINT) is not None,
                    broken=broken_reason(folder))


def broken_reason(folder: Path) -> str | None:
    """Why ``folder``'s run files cannot be read as a run, in a few words, or None (none there, or readable):
    a config.json that is not JSON or names no command's run, or run files without one. A report shows it
    as broken rather than missing, since every command would refuse that folder. Only config.json is read
    (a checkpoint cut short is the command's to name, when it loads it)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        return "a file, not a folder"
    if not folder.is_dir():
        return None
    config_path = folder / CONFIG
    if config_path.exists():
        try:
            config = json.loads(config_path.read_text())
        except OSError as exc:
            return f"{CONFIG} cannot be read ({exc.strerror or exc})"
        except ValueError:
            return f"{CONFIG} is not JSON (cut short or overwritten)"
        if not isinstance(config, dict) or config_kind(config) is None:
            return f"{CONFIG} names no command's run"
    elif (folder / CHECKPOINT).exists() or (folder / METRICS).exists():
        return f"run files without a {CONFIG}"
    return None


def find_runs(root: Path) -> list[RunState]:
    """Every run folder under ``root`` (a folder holding a config.json), sorted by path."""
    root = Path(root)
    if not root.is_dir():
        return []
    return [run_state(path.parent) for path in sorted(root.rglob(CONFIG)) if path.is_file()]


def evaluation_is_current(folder: Path, alphas=None, l2_grid=None, raw_baseline: bool = False) -> bool:
    """eval.json was written after the checkpoint (and, where given, with these alphas and L2
    grid, and with the raw-pixel baseline), so the classifiers need not be fit again."""
    folder = Path(folder)
    evaluation, checkpoint = folder / EVAL, folder / CHECKPOINT
    if not evaluation.is_file() or not checkpoint.is_file() or \
            evaluation.stat().st_mtime < checkpoint.stat().st_mtime:
        return False
    result = read_json(evaluation) or {}
    if alphas is not None and result.get("alphas") != [float(a) for a in alphas]:
        return False
    if l2_grid is not None and result.get("l2_grid") != sorted((float(v) for v in l2_grid), reverse=True):
        return False
    return not raw_baseline or "raw_baseline" in result


def record_diverged(folder: Path, message: str) -> None:
    """Write ``diverged.json`` into ``folder``: the scripts then leave its run alone (remove it to retry)."""
    from ksae_cupy.atomic import write_json_atomic

    Path(folder).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(folder) / DIVERGED, {"message": message, "time": utc_now()}, sort_keys=False)


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# -- before a command runs in a folder -------------------------------------------------------------------

def locked_by(folder: Path) -> str | None:
    """Why another live process holds ``folder`` (a run writing it), or None when none does."""
    from ksae_cupy.errors import KsaeError
    from ksae_cupy.session.runlock import check_unlocked

    try:
        check_unlocked(Path(folder))
    except KsaeError as exc:
        return str(exc)
    return None


def wait_unlocked(folder: Path, on_wait, poll_seconds: float = 1.0) -> None:
    """Wait while another process holds ``folder`` (a child of a killed session, still saving);
    ``on_wait(message)`` is called once when waiting starts, and again every poll (it may raise to stop)."""
    said = False
    while (message := locked_by(folder)) is not None:
        on_wait(None if said else message)
        said = True
        time.sleep(poll_seconds)


def clear_unstarted(folder: Path, log=print) -> list[str]:
    """Remove the run files of a run stopped before its first checkpoint (nothing to resume
    there), so that the command starts it again; returns the names removed. A folder whose checkpoint is
    kept in git history (results/checkpoints.json) is a stopped run, not an unstarted one: refused."""
    from ksae_cupy.errors import KsaeError

    if not (Path(folder) / CHECKPOINT).is_file() and kept_checkpoint(Path(folder) / CHECKPOINT) is not None:
        raise KsaeError(f"{folder}: its checkpoint is kept in git history, not in the folder; put it back first "
                        f"({RESTORE_COMMAND} {folder}), then resume")
    removed = []
    for name in (CONFIG, METRICS, CONFIG + ".tmp", METRICS + ".tmp", CHECKPOINT + ".tmp"):
        if (Path(folder) / name).exists() and not (Path(folder) / CHECKPOINT).is_file():
            (Path(folder) / name).unlink()
            removed.append(name)
            log(f"  removed {Path(folder) / name}: its run stopped before its first checkpoint; starting it again")
    return removed


def checkpoint_epochs(folder: Path) -> tuple[int, int]:
    """``(epochs trained, epochs configured)`` of a ksae-train run folder's checkpoint (reads it)."""
    from ksae_cupy.training.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(Path(folder) / CHECKPOINT)
    return checkpoint.epoch, checkpoint.config["epochs"]

"""A run folder: where one training run keeps its checkpoint, configuration and metrics.

    RUN_DIR/checkpoint.h5   the latest checkpoint (see :mod:`ksae_cupy.training.checkpoint`)
    RUN_DIR/config.json     the resolved configuration, dataset and device included
    RUN_DIR/metrics.jsonl   one JSON object per finished epoch
    RUN_DIR/.lock           held by the one process writing the run (:mod:`ksae_cupy.training.runlock`)

A run killed while it wrote a checkpoint leaves ``checkpoint.h5.tmp`` beside the intact
previous checkpoint; :meth:`RunFolder.create` removes such leftovers when the run starts again.
A new run never writes into a folder holding another run's files (a dead run's metrics
included) unless told to ``overwrite`` them.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
from pathlib import Path

from ksae_cupy.errors import KsaeError, note
from ksae_cupy.paths import check_writable_folder
from ksae_cupy.training.runlock import RunLock, check_unlocked

CHECKPOINT = "checkpoint.h5"
CONFIG = "config.json"
METRICS = "metrics.jsonl"
# What makes a folder a run's, and what the commands compute from a run into its folder:
# a new run with overwrite removes both (results of the old run beside the new one would mislead).
RUN_FILES = (CHECKPOINT, CONFIG, METRICS)
RESULT_FILES = ("eval.json", "eval.md", "variants.json", "variants.md", "coherence.json", "iti.json",
                "compare.json", "filters.png", "finetune.json")


def default_run_dir(dataset: str, hidden: int, k: int, root: Path = Path("runs")) -> Path:
    """``runs/<dataset>-h<hidden>-k<k>-<UTC time>`` (a user file's stem stands for its name)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    name = Path(dataset.split(":")[0]).stem if ("/" in dataset or "." in dataset) else dataset
    return root / f"{name}-h{hidden}-k{k}-{stamp}"


class RunFolder:
    """Paths and writers of one run folder."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = RunLock(self.path)

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT

    def run_files(self) -> list[str]:
        """The names of the run files (and their leftover temporaries) the folder holds."""
        if not self.path.is_dir():
            return []
        return sorted(name for name in RUN_FILES + tuple(n + ".tmp" for n in RUN_FILES) if (self.path / name).exists())

    def check_new(self, overwrite: bool = False, command: str = "ksae-train") -> None:
        """A new run must be able to write its folder and must not mix with another run's files
        (a finished, a running or a dead one): those need --resume or, to discard them, --overwrite."""
        check_writable_folder(self.path, "run folder")
        if not self._lock.held:
            check_unlocked(self.path)
        found = self.run_files()
        if found and not overwrite:
            raise KsaeError(f"run folder {self.path} already holds a run ({', '.join(found)}); continue it with "
                            f"{command} --resume {self.path}, discard it with --overwrite, or choose another --run-dir")

    def check_resumable(self) -> None:
        if not self.path.is_dir():
            raise KsaeError(f"--resume {self.path}: no such run folder")
        if not self.checkpoint.is_file():
            raise KsaeError(f"--resume {self.path}: the folder holds no {CHECKPOINT}")
        check_writable_folder(self.path, "--resume")  # its checkpoints are rewritten
        check_unlocked(self.path)

    def lock(self, log=None) -> None:
        """Make the folder and hold its lock until :meth:`release` (or the process's end);
        a lock a dead run left is taken over (saying so through ``log``)."""
        self.path.mkdir(parents=True, exist_ok=True)
        stale = self._lock.acquire()
        if stale is not None and log is not None:
            log(f"took over {self._lock.path} from PID {stale}, a run that ended without releasing it")

    def release(self) -> None:
        self._lock.release()

    def create(self, log=None, new: bool = False, overwrite: bool = False) -> None:
        """Make and lock the folder; for a ``new`` run, check again (now that no other writer can
        come in between) that it holds no other run, or remove that run's files with ``overwrite``;
        remove temporary files a killed run left. Messages go through ``log``."""
        self.lock(log)
        if new:
            self.check_new(overwrite)
            if overwrite:
                for name in self.run_files() + [n for n in RESULT_FILES if (self.path / n).exists()]:
                    (self.path / name).unlink()
                    if log is not None:
                        log(f"--overwrite: removed {self.path / name}")
        for leftover in sorted(self.path.glob("*.tmp")):
            leftover.unlink()
            if log is not None:
                log(f"removed {leftover}, left by a run that was stopped while writing it")

    def write_config(self, config: dict) -> None:
        tmp = self.path / (CONFIG + ".tmp")
        tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.path / CONFIG)

    def read_config(self) -> dict:
        try:
            return json.loads((self.path / CONFIG).read_text())
        except (OSError, ValueError) as exc:
            raise KsaeError(f"{self.path / CONFIG} is missing or unreadable ({exc})") from None

    def append_metrics(self, report) -> None:
        record = dataclasses.asdict(report) if dataclasses.is_dataclass(report) else dict(report)
        record["time"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        with open(self.path / METRICS, "a") as f:
            f.write(json.dumps(record) + "\n")

    def truncate_metrics(self, step: int) -> int:
        """Drop the lines of epochs that ended after optimiser step ``step`` (the checkpoint's),
        so that a resumed run logs each epoch once, and a last line cut short by a kill. Returns
        how many lines were dropped."""
        path = self.path / METRICS
        if not path.exists():
            return 0
        records, cut = parse_metrics(path)
        kept = [record for record in records if record.get("step", 0) <= step]
        if len(kept) != len(records) or cut:
            tmp = self.path / (METRICS + ".tmp")
            tmp.write_text("".join(json.dumps(record) + "\n" for record in kept))
            os.replace(tmp, path)
        return len(records) - len(kept) + cut

    def read_metrics(self) -> list[dict]:
        """The epochs logged so far; a last line cut short (a run killed as it wrote it) is left out, with a note."""
        path = self.path / METRICS
        if not path.exists():
            return []
        records, cut = parse_metrics(path)
        if cut:
            note(f"{path}: its last line was cut short (the run stopped while writing it) and is left out")
        return records


def parse_metrics(path: Path) -> tuple[list[dict], bool]:
    """``(records, cut)``: the JSON objects of a ``metrics.jsonl``, one per line, and whether its
    last line was cut short. Lines are appended whole, newline last, so a last line without its
    newline that does not parse is a write a kill interrupted: left out. Any other line that is
    not a JSON object is damage: one line naming the file and the line."""
    lines = path.read_text(errors="replace").split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):  # no newline after it: an append cut short
                return records, True
            raise KsaeError(f"{path}: line {number} is not a JSON record ({exc.msg}); the file was damaged or "
                            f"edited; remove that line (the checkpoint does not depend on it)") from None
        if not isinstance(record, dict):
            raise KsaeError(f"{path}: line {number} is not a JSON object; the file was damaged or edited; remove "
                            f"that line (the checkpoint does not depend on it)")
        records.append(record)
    return records, False


def dataset_record(dataset: str, with_sha256: bool = True) -> dict:
    """How config.json names the data: a user file by its absolute path (a run can then be
    resumed from any folder) and its SHA-256 (a changed file is noticed); a built-in name as is."""
    from ksae_cupy.datasets import is_user_file

    if not is_user_file(dataset):
        return {"dataset": dataset}
    path_text, member = dataset, ""
    if ".h5:" in dataset or ".hdf5:" in dataset:
        path_text, member = dataset.rsplit(":", 1)
    path = Path(path_text).resolve()
    record = {"dataset": str(path) + (f":{member}" if member else "")}
    if with_sha256 and path.is_file():
        record["dataset_sha256"] = file_sha256(path)
    return record


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

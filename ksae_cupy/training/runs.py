"""A run folder: where one training run keeps its checkpoint, configuration and metrics.

    RUN_DIR/checkpoint.h5   the latest checkpoint (see :mod:`ksae_cupy.training.checkpoint`)
    RUN_DIR/config.json     the resolved configuration, dataset and device included
    RUN_DIR/metrics.jsonl   one JSON object per finished epoch

A run killed while it wrote a checkpoint leaves ``checkpoint.h5.tmp`` beside the intact
previous checkpoint; :meth:`RunFolder.create` removes such leftovers when the run starts again.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
from pathlib import Path

from ksae_cupy.errors import KsaeError
from ksae_cupy.paths import check_writable_folder

CHECKPOINT = "checkpoint.h5"
CONFIG = "config.json"
METRICS = "metrics.jsonl"


def default_run_dir(dataset: str, hidden: int, k: int, root: Path = Path("runs")) -> Path:
    """``runs/<dataset>-h<hidden>-k<k>-<UTC time>`` (a user file's stem stands for its name)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    name = Path(dataset.split(":")[0]).stem if ("/" in dataset or "." in dataset) else dataset
    return root / f"{name}-h{hidden}-k{k}-{stamp}"


class RunFolder:
    """Paths and writers of one run folder."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT

    def check_new(self) -> None:
        """A new run must not overwrite another run's checkpoint, and must be able to write its own."""
        check_writable_folder(self.path, "run folder")
        if self.checkpoint.exists():
            raise KsaeError(f"run folder {self.path} already holds a run; continue it with --resume {self.path} "
                            f"or choose another --run-dir")

    def check_resumable(self) -> None:
        if not self.path.is_dir():
            raise KsaeError(f"--resume {self.path}: no such run folder")
        if not self.checkpoint.is_file():
            raise KsaeError(f"--resume {self.path}: the folder holds no {CHECKPOINT}")
        check_writable_folder(self.path, "--resume")  # its checkpoints are rewritten

    def create(self, log=None) -> None:
        """Make the folder; remove temporary files a killed run left (saying so through ``log``)."""
        self.path.mkdir(parents=True, exist_ok=True)
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

    def read_metrics(self) -> list[dict]:
        path = self.path / METRICS
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

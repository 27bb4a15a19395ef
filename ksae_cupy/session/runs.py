"""A run folder: where one training run keeps its checkpoint, configuration and metrics.

    RUN_DIR/checkpoint.h5   the latest checkpoint (see :mod:`ksae_cupy.training.checkpoint`)
    RUN_DIR/config.json     the resolved configuration, dataset and device included, the
                            run's identity: ``run_id`` and ``kind`` (the command that made it),
                            and ``provenance``: the package version, commit, libraries and device
                            of the session that created the run and of the last one that ran it
    RUN_DIR/metrics.jsonl   one JSON object per finished epoch (a finished run's long log in results/ may be
                            gzipped, metrics.jsonl.gz: read alike, see :func:`metrics_file`)
    RUN_DIR/.lock           held by the one process writing the run (:mod:`ksae_cupy.session.runlock`)

A run killed while it wrote a checkpoint leaves ``checkpoint.h5.tmp`` beside the intact
previous checkpoint; :meth:`RunFolder.create` removes such leftovers when the run starts again.
A new run never writes into a folder holding another run's files (a dead run's metrics
included) unless told to ``overwrite`` them.

Identity: a new run draws a ``run_id`` and writes it into config.json and into every checkpoint
it saves. A command that reads a folder's checkpoint (resume, eval, plot, fine-tuning) refuses one
whose ``run_id`` is not the folder's (a checkpoint copied in from another run), and a folder of
another command's kind. Folders written before identities existed (no ``run_id``) are read as
before; a resumed one gets an identity from then on.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import gzip
import json
import uuid
from pathlib import Path

from ksae_cupy.atomic import write_json_atomic, write_text_atomic
from ksae_cupy.errors import KsaeError, note
from ksae_cupy.paths import check_writable_folder, file_sha256
from ksae_cupy.session.trained_on import codes_origin, data_files_record
from ksae_cupy.session.runlock import RunLock, check_unlocked

CHECKPOINT = "checkpoint.h5"
CONFIG = "config.json"
METRICS = "metrics.jsonl"
# What makes a folder a run's, and what the commands compute from a run into its folder:
# a new run with overwrite removes both (results of the old run beside the new one would mislead).
RUN_FILES = (CHECKPOINT, CONFIG, METRICS)
# The commands whose run folders hold a checkpoint, and what each one's checkpoint is.
TRAIN, FINETUNE = "ksae-train", "ksae-finetune"
# Layer l's folder inside a ksae-finetune --baseline run (supervised/baseline_pretrain.py): a ksae-baseline run.
PRETRAIN_LAYER = "pretrain-layer{}"
# Model- and batch-shaping options a checkpoint and config.json's "train" must agree on when
# either lacks a run_id (folders written before identities existed).
SHAPING = ("hidden", "k", "batch_size", "seed", "dtype", "sigma", "momentum")
RESULT_FILES = ("units.json", "eval.json", "eval.md", "variants.json", "variants.md", "coherence.json", "iti.json",
                "compare.json", "filters.png", "firing.png", "finetune.json")


def default_run_dir(dataset: str, hidden: int, k: int, root: Path = Path("runs")) -> Path:
    """``runs/<dataset>-h<hidden>-k<k>-<UTC time>`` (a user file's stem stands for its name)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    name = Path(dataset.split(":")[0]).stem if ("/" in dataset or "." in dataset) else dataset
    return root / f"{name}-h{hidden}-k{k}-{stamp}"


def new_run_id() -> str:
    return uuid.uuid4().hex


def config_kind(config: dict) -> str | None:
    """The command whose run a config.json describes: its ``kind``, or for a folder written
    before kinds were recorded, what its keys show (``finetune`` or ``train``)."""
    if config.get("kind"):
        return config["kind"]
    if "finetune" in config:
        return FINETUNE
    if "train" in config:
        return TRAIN
    return None


class RunFolder:
    """Paths and writers of one run folder of ``kind`` (the command that writes it)."""

    def __init__(self, path: Path, kind: str = TRAIN):
        self.path = Path(path)
        self.kind = kind
        self.run_id: str | None = None  # set by create(new=True) or check_checkpoint
        self._lock = RunLock(self.path)

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT

    def run_files(self) -> list[str]:
        """The names of the run files (and their leftover temporaries) the folder holds."""
        if not self.path.is_dir():
            return []
        return sorted(name for name in RUN_FILES + tuple(n + ".tmp" for n in RUN_FILES) if (self.path / name).exists())

    def check_new(self, overwrite: bool = False, command: str | None = None) -> None:
        """A new run must be able to write its folder and must not mix with another run's files
        (a finished, a running or a dead one): those need --resume or, to discard them, --overwrite.
        ``command`` is how the advice names the command that resumes (default: the kind); every
        command that writes run folders has --overwrite, and a run of another kind is never offered to it."""
        check_writable_folder(self.path, "run folder")
        if not self._lock.held:
            check_unlocked(self.path)
        found = self.run_files()
        if not found or overwrite:
            return
        other = self.folder_kind()
        if other is not None and other != self.kind:
            raise KsaeError(f"run folder {self.path} holds a {other} run ({', '.join(found)}); a {self.kind} run "
                            f"cannot start there; choose another --run-dir")
        raise KsaeError(f"run folder {self.path} already holds a run ({', '.join(found)}); continue it with "
                        f"{command or self.kind} --resume {self.path}, discard it with --overwrite, or choose another "
                        f"--run-dir")

    def check_resumable(self, needs_checkpoint: bool = True) -> None:
        """A folder ``--resume`` may continue: there, of this kind, writable, not running; with its
        checkpoint unless ``needs_checkpoint`` is False (a fine-tuning run still pretraining its layers)."""
        if not self.path.is_dir():
            raise KsaeError(f"--resume {self.path}: no such run folder")
        if needs_checkpoint and not self.checkpoint.is_file():
            raise KsaeError(f"--resume {self.path}: the folder holds no {CHECKPOINT}")
        self.check_kind("--resume", f"continue it with {{kind}} --resume {self.path}")
        check_writable_folder(self.path, "--resume")  # its checkpoints are rewritten
        check_unlocked(self.path)

    # -- identity ------------------------------------------------------------------------
    def folder_config(self) -> dict:
        """config.json, or {} when there is none or it cannot be read (the callers that need
        it read it with :meth:`read_config`, which says why)."""
        try:
            config = json.loads((self.path / CONFIG).read_text())
        except (OSError, ValueError):
            return {}
        return config if isinstance(config, dict) else {}

    def folder_kind(self) -> str | None:
        return config_kind(self.folder_config())

    def check_kind(self, what: str, advice: str) -> None:
        """Refuse a folder whose config.json says another command's run lives there; ``advice``
        may name that command as ``{kind}``."""
        other = self.folder_kind()
        if other is not None and other != self.kind:
            raise KsaeError(f"{what} {self.path}: a {other} run folder, not a {self.kind} one; "
                            + advice.format(kind=other))

    def check_checkpoint(self, run_id: str | None, ckpt_config: dict | None = None) -> None:
        """Refuse a checkpoint that is not this folder's run: its ``run_id`` differs from
        config.json's, or (either written before identities) its shaping options differ from
        config.json's ``train``. Then :attr:`run_id` is the run's (a legacy folder gets one)."""
        config = self.folder_config()
        folder_id = config.get("run_id")
        if run_id is not None and folder_id is not None and run_id != folder_id:
            raise KsaeError(f"{self.checkpoint} belongs to run {run_id}, not to this folder's run {folder_id} "
                            f"(config.json); it was copied from another run folder: put this run's checkpoint "
                            f"back, or use that run's own folder")
        trained = config.get("train")
        if (run_id is None or folder_id is None) and isinstance(trained, dict) and ckpt_config:
            differing = [f"{key} {ckpt_config[key]} (config.json: {trained[key]})" for key in SHAPING
                         if key in trained and key in ckpt_config and trained[key] != ckpt_config[key]]
            if differing:
                raise KsaeError(f"{self.checkpoint} is not the run config.json describes: {', '.join(differing)}; "
                                f"it was copied from another run folder: put this run's checkpoint back, or use "
                                f"that run's own folder")
        self.run_id = folder_id or run_id or new_run_id()

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
            self.run_id = new_run_id()
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
        """Write config.json (atomically), with the run's identity when it has one, and what code made the
        run: ``provenance`` (:func:`code_record`)."""
        if self.run_id is not None:
            config = {**config, "run_id": self.run_id, "kind": self.kind}
        config = {**config, "provenance": code_record(self.folder_config(), config.get("device"))}
        write_json_atomic(self.path / CONFIG, config)

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
            write_text_atomic(path, "".join(json.dumps(record) + "\n" for record in kept))
        return len(records) - len(kept) + cut

    def drop_metrics_after(self, step: int, epoch: int, epochs: int) -> str | None:
        """:meth:`truncate_metrics` for a run resumed from a checkpoint at optimiser step ``step``
        (after epoch ``epoch``) that now ends at epoch ``epochs``; returns the line that says what
        was dropped and whether those epochs run again (None when nothing was)."""
        path = self.path / METRICS
        if not path.exists():
            return None
        records, cut = parse_metrics(path)
        after = [record.get("epoch") for record in records if record.get("step", 0) > step]
        dropped = self.truncate_metrics(step)
        if not dropped:
            return None
        parts = []
        if after:
            again = [e for e in after if isinstance(e, int) and e <= epochs]
            beyond = [e for e in after if not (isinstance(e, int) and e <= epochs)]
            said = f"{_epochs_text(after)}, logged after the checkpoint (epoch {epoch})"
            if again and not beyond:
                said += f", which {_run(again)} again"
            elif again:
                said += (f"; {_epochs_text(again)} {_run(again)} again, {_epochs_text(beyond)} {_run(beyond, 'not')} "
                         f"(the run now ends at epoch {epochs})")
            else:
                said += f", which {_run(beyond, 'not')} run again (the run now ends at epoch {epochs})"
            parts.append(said)
        if cut:
            parts.append("a last line cut short by a kill (an epoch's record never completed)")
        return f"metrics.jsonl: dropped {dropped} line(s): {' and '.join(parts)}"

    def read_metrics(self) -> list[dict]:
        """The epochs logged so far; a last line cut short (a run killed as it wrote it) is left out, with a note."""
        path = metrics_file(self.path)
        if not path.exists():
            return []
        records, cut = parse_metrics(path)
        if cut:
            note(f"{path}: its last line was cut short (the run stopped while writing it) and is left out")
        return records


def code_record(previous: dict, device: str | None) -> dict:
    """config.json's ``provenance``: ``created_by``, the code that started the run (kept from ``previous``,
    the folder's config.json; None for a run started before it was recorded), and ``last_run_by``, this
    session's (:func:`ksae_cupy.made_with.provenance`). A resume with other code or other libraries is
    recorded, never refused."""
    from ksae_cupy.made_with import provenance

    now = provenance(device)
    if not previous:  # a new run: no config.json yet
        return {"created_by": now, "last_run_by": now}
    recorded = previous.get("provenance")
    return {"created_by": recorded.get("created_by") if isinstance(recorded, dict) else None, "last_run_by": now}


def _run(epochs: list, negated: str = "") -> str:
    single = len(epochs) == 1
    if negated:
        return "does not" if single else "do not"
    return "runs" if single else "run"


def _epochs_text(epochs: list) -> str:
    numbers = [e for e in epochs if isinstance(e, int)]
    if len(numbers) != len(epochs) or not numbers:
        return f"{len(epochs)} record(s)"
    if len(numbers) == 1:
        return f"epoch {numbers[0]}"
    if numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"epochs {numbers[0]}-{numbers[-1]}"
    return "epochs " + ", ".join(map(str, numbers))


def metrics_file(folder: Path) -> Path:
    """``folder``'s metrics.jsonl, or where only its gzip copy is there, ``metrics.jsonl.gz``: the finished runs
    under results/ with a log over 1 MB keep it so (tests/test_repository_size.py)."""
    path = Path(folder) / METRICS
    packed = path.with_name(METRICS + ".gz")
    return packed if packed.is_file() and not path.exists() else path


def parse_metrics(path: Path) -> tuple[list[dict], bool]:
    """``(records, cut)``: the JSON objects of a ``metrics.jsonl`` (or a gzipped ``metrics.jsonl.gz``), one per
    line, and whether its last line was cut short. Lines are appended whole, newline last, so a last line without
    its newline that does not parse is a write a kill interrupted: left out. Any other line that is
    not a JSON object is damage: one line naming the file and the line."""
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    lines = data.decode(errors="replace").split("\n")
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
    resumed from any folder) and its SHA-256 (a changed file is noticed), and for codes written by
    ``ksae-data codes`` their origin (:mod:`ksae_cupy.session.trained_on`); a built-in name as is."""
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
        origin = codes_origin(path, record["dataset_sha256"])  # layer 2: the layer its codes came from
        if origin is not None:
            record["codes_origin"] = origin
    return record


def data_record(spec) -> dict:
    """config.json's record of a run's data (:class:`~ksae_cupy.datasets.user_files.DataSpec`): the
    dataset (:func:`dataset_record`) and, for a user file, its labels and splits (for ksae-eval and --resume)."""
    record = dataset_record(spec.data)
    if spec.is_user_file:
        record["data"] = data_files_record(spec.record())
    return record

"""Checkpoints: one HDF5 file of host arrays, checksummed, written to a temporary name and renamed.

Layout (``format = "ksae-cupy checkpoint"``, ``format_version = 2``):

* root attributes: ``format``, ``format_version``, ``epoch`` (completed epochs), ``step``
  (optimiser steps taken), ``batch_in_epoch`` (batches done in the unfinished epoch, 0 at
  an epoch boundary), ``config`` (JSON of every option that shaped the run), and ``run_id``
  (the run folder's identity, see :mod:`ksae_cupy.session.runs`; absent in older files and in
  files the Python API saved outside a run folder); in files written before ``epoch_tally/``
  existed, mid-epoch, ``epoch_loss_sum`` and ``epoch_loss_batches`` (still read); ``provenance``
  (JSON: the package version, commit, libraries and device of the code that wrote the file,
  :func:`ksae_cupy.made_with.provenance`; absent in older files, never checked on load);
* ``params/``: ``W_dh``, ``b_h``, ``c_d``;  ``optim/``: their velocities (same names);
* ``rng/``: attribute ``state`` (JSON of NumPy's bit-generator state) and, mid-epoch,
  dataset ``epoch_perm`` (the order of the unfinished epoch);
* ``preprocess/``: statistics of the data preprocessing (means, stds, ZCA matrix);
* ``epoch_tally/`` (mid-epoch only; absent in older files): the unfinished epoch's statistics so far
  (:class:`~ksae_cupy.training.epochs.EpochTally`: loss and error sums, per-unit counts, ...), so
  that the resumed epoch's metrics line covers all its batches;
* ``units/`` (absent in older files): per hidden unit, ``since_kept_h``, the examples trained on
  since an example last kept it (the dead units of ``aux_k`` and the dead-window metric);
* on every group and array, attribute ``sha256`` (see :mod:`ksae_cupy.training.checksums`).

Loading checks the format version, every checksum, the presence, shapes and dtypes of the
arrays, and fails with one line naming what differs. Version 1 files (before checksums)
load with a one-line note. A crash never leaves half a checkpoint under the real name: the
file is built in memory, written as ``<name>.tmp``, reopened to verify, renamed.
"""
from __future__ import annotations

import io
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ksae_cupy.errors import KsaeError, note, one_line
from ksae_cupy.made_with import provenance
from ksae_cupy.training import checksums

FORMAT = "ksae-cupy checkpoint"
FORMAT_VERSION = 2  # 2: checksums; 1 is still read, without them
UNSEALED_VERSIONS = (1,)
PARAM_NAMES = ("W_dh", "b_h", "c_d")


class CheckpointWriteError(KsaeError):
    """A checkpoint (or model file) that could not be written; ``kept`` says whether an earlier
    one is still at its path. Its message ends with generic advice; a command replaces it with
    :meth:`advise`, naming what the folder's state allows (resume from the kept checkpoint, or
    start again when none was ever written)."""

    def __init__(self, what: str, kept: bool):
        super().__init__(f"{what}; free space or fix the folder, then try again")
        self.what, self.kept = what, kept

    def advise(self, then: str) -> KsaeError:
        return KsaeError(f"{self.what}; free space or fix the folder, then {then}")


@dataclass
class Checkpoint:
    """Everything needed to resume a run or use its model (all host arrays)."""

    params: dict
    velocities: dict
    config: dict
    epoch: int = 0
    step: int = 0
    batch_in_epoch: int = 0
    rng_state: dict | None = None
    epoch_perm: np.ndarray | None = None
    preprocess: dict = field(default_factory=dict)
    run_id: str | None = None  # the run folder's identity (None: saved outside one, or before identities)
    # Mid-epoch: the unfinished epoch's statistics so far (EpochTally.state()); None at an epoch's
    # boundary and in files written before tallies, which kept (mid-epoch) the loss sum only:
    epoch_tally: dict | None = None
    epoch_loss_sum: float = 0.0
    epoch_loss_batches: int = 0
    units: dict = field(default_factory=dict)  # per-unit training state (since_kept_h); {} in older files
    provenance: dict | None = None  # the code that wrote the file, as loaded (saving records the current code)


def write_hdf5_atomically(path: Path, write_fn, verify_fn) -> None:
    """Write an HDF5 file so that ``path`` only ever holds a complete, verified file.

    ``write_fn(f)`` fills an open ``h5py.File`` (then the root attribute ``provenance`` is added: the
    code writing it, :func:`ksae_cupy.made_with.provenance`), built in memory and then written to
    ``<name>.tmp`` by plain file I/O; ``verify_fn(tmp_path)`` reopens and checks it (raising on
    damage); only then is it renamed to ``path``. A crash or a failed check leaves the previous
    file at ``path`` untouched; a failed write (``OSError``, e.g. a full disk) removes the
    temporary file and is one :class:`KsaeError`.

    Why in memory: HDF5 writing straight to a full disk fails in its cache and then crashes the
    interpreter on closing the file (a segmentation fault after pages of "Exception ignored"
    tracebacks, h5py 3.16 / HDF5 2.0); a plain ``write`` fails with ``ENOSPC``, one clean error.
    The cost is one copy of the checkpoint in host memory while it is written.
    """
    import h5py

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        image = io.BytesIO()
        try:
            with h5py.File(image, "w") as f:
                write_fn(f)
                f.attrs["provenance"] = json.dumps(provenance(), sort_keys=True)  # the code writing it, every format
                checksums.seal(f)
        except RuntimeError as exc:  # h5py's errors on closing a file whose write failed hide why it failed
            raise _write_failure(exc) from None
        with open(tmp, "wb") as out:
            out.write(image.getbuffer())
        del image
        verify_fn(tmp)  # verify what was written before it takes the real name
        os.replace(tmp, path)
    except OSError as exc:  # a full disk, a lost mount: stop with one line, keep the previous file
        tmp.unlink(missing_ok=True)
        kept = f"the previous {path.name} is intact" if path.exists() else f"no {path.name} was written"
        reason = _failure_reason(_write_failure(exc))
        raise CheckpointWriteError(f"could not write {path} ({reason}); {kept}", path.exists()) from None


def _write_failure(exc: BaseException) -> OSError:
    """The first failure behind ``exc``, as an ``OSError``: h5py's errors raised while handling
    an earlier one (``RuntimeError`` or ``OSError``) are followed back to the earliest."""
    first = exc
    while isinstance(first.__context__, (OSError, RuntimeError)):
        first = first.__context__
    return first if isinstance(first, OSError) else OSError(str(first) or type(first).__name__)


def _failure_reason(exc: OSError) -> str:
    """One short line saying why a write failed. HDF5's messages run over several lines and bury
    the reason (``error message = 'No space left on device'``) among times, descriptors and
    buffer addresses: that reason comes first, then what HDF5 was doing."""
    text = one_line(exc.strerror or exc) or type(exc).__name__
    found = re.search(r"error message = '([^']*)'", text)
    if found:
        return f"{found.group(1)}; HDF5: {text.split(' (', 1)[0]}"
    return text


def read_hdf5_checked(path: Path, what: str, fmt: str, version: int, read_fn, unsealed_versions=()):
    """``read_fn(f)`` on the open HDF5 file at ``path`` once its ``format`` and
    ``format_version`` attributes say it is a ``what`` this code reads and every checksum
    matches (:func:`ksae_cupy.training.checksums.verify`).

    A missing, foreign, newer, damaged or altered file is a one-line :class:`KsaeError`.
    Files of ``unsealed_versions`` (written before checksums) are read with a one-line note.
    """
    import h5py

    path = Path(path)
    if not path.is_file():
        raise KsaeError(f"{what} {path} does not exist")
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != fmt:
                raise KsaeError(f"{path} is not a ksae-cupy {what} (format attribute {f.attrs.get('format')!r})")
            found = int(f.attrs.get("format_version", -1))
            if found in unsealed_versions:
                note(f"{path} is a {what} of format_version {found}, written before checksums existed: it is read "
                     f"without an integrity check (the next one written will carry them)")
            elif found != version:
                readable = ", ".join(str(v) for v in (*unsealed_versions, version))
                raise KsaeError(f"{path} has {what} format_version {found}; this version reads {readable}")
            else:
                checksums.verify(f, path)
            return read_fn(f)
    except KsaeError:
        raise
    except OSError as exc:
        cause = _system_cause(exc)
        if cause is not None:  # the file could not be read at all: say why, not that it is damaged
            raise KsaeError(one_line(f"cannot read {what} {path}: {cause}")) from None
        other = _other_format(path)
        if other is not None:  # an intact file of another kind (a data file given as a run): not damaged
            raise KsaeError(f"{path} is {other}, not a {what} (an HDF5 file); give a run folder or its "
                            f"checkpoint.h5") from None
        raise KsaeError(one_line(f"{path} is corrupt or truncated ({type(exc).__name__}: {exc})")) from None
    except (KeyError, ValueError, TypeError) as exc:
        raise KsaeError(one_line(f"{path} is corrupt or truncated ({type(exc).__name__}: {exc})")) from None


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
OTHER_FORMATS = ((b"\x93NUMPY", "a NumPy .npy file"), (b"PK\x03\x04", "a zip archive (a NumPy .npz file?)"),
                 (b"{", "a JSON file"), (b"\x80", "a Python pickle (a PyTorch file?)"))


def _other_format(path) -> str | None:
    """What ``path`` is when its first bytes say it is a known kind of file other than HDF5 (whose signature
    may also sit at 512, 1024, ... bytes: a file that holds it anywhere there is HDF5, damaged or not)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if head.startswith(HDF5_SIGNATURE):
                return None
            for offset in (512, 1024, 2048):
                f.seek(offset)
                if f.read(8) == HDF5_SIGNATURE:
                    return None
    except OSError:
        return None
    return next((kind for magic, kind in OTHER_FORMATS if head.startswith(magic)), None)


def _system_cause(exc: OSError) -> str | None:
    """The operating system's reason behind an HDF5 open or read failure (permission denied, an I/O
    error, ...), or None when HDF5 itself found the file damaged. h5py keeps the errno on the
    exception or inside its message (``errno = 13, error message = 'Permission denied'``)."""
    import errno as errnos

    number = exc.errno
    if not number:
        found = re.search(r"errno = (\d+)", str(exc))
        number = int(found.group(1)) if found else 0
    if not number or number == errnos.ENOENT and "errno" not in str(exc):
        return None
    return f"{os.strerror(number)} (errno {number}); check the file's permissions and the disk"


def save_checkpoint(path: Path, ckpt: Checkpoint, fmt: str = FORMAT) -> None:
    """Write ``ckpt`` to ``path`` atomically (temporary file, verify, rename). ``fmt`` names the
    format: the baselines keep this layout under their own name (see supervised/baseline_trainer.py)."""

    def write(f) -> None:
        f.attrs["format"] = fmt
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["epoch"] = int(ckpt.epoch)
        f.attrs["step"] = int(ckpt.step)
        f.attrs["batch_in_epoch"] = int(ckpt.batch_in_epoch)
        f.attrs["config"] = json.dumps(ckpt.config, sort_keys=True)
        if ckpt.run_id is not None:
            f.attrs["run_id"] = str(ckpt.run_id)
        groups = [("params", ckpt.params), ("optim", ckpt.velocities), ("preprocess", ckpt.preprocess)]
        if ckpt.batch_in_epoch and ckpt.epoch_tally is not None:
            groups.append(("epoch_tally", ckpt.epoch_tally))
        if ckpt.units:
            groups.append(("units", ckpt.units))
        for group, arrays in groups:
            g = f.create_group(group)
            for name, value in arrays.items():
                g.create_dataset(name, data=np.asarray(value))
        rng = f.create_group("rng")
        rng.attrs["state"] = json.dumps(ckpt.rng_state) if ckpt.rng_state is not None else ""
        if ckpt.epoch_perm is not None:
            rng.create_dataset("epoch_perm", data=np.asarray(ckpt.epoch_perm))

    if fmt == FORMAT:
        write_hdf5_atomically(path, write, lambda written: load_checkpoint(written))
    else:
        write_hdf5_atomically(path, write, lambda written: load_checkpoint(written, fmt))


def load_checkpoint(path: Path, fmt: str = FORMAT, what: str = "checkpoint") -> Checkpoint:
    """Read and validate a checkpoint of format ``fmt`` (a ``what``); a missing, corrupt or
    foreign file is a KsaeError."""
    path = Path(path)

    def read(f) -> Checkpoint:
        state_text = f["rng"].attrs.get("state", "")
        return Checkpoint(params=_read_group(f, "params", path), velocities=_read_group(f, "optim", path),
                          config=json.loads(f.attrs["config"]),
                          epoch=int(f.attrs["epoch"]), step=int(f.attrs["step"]),
                          batch_in_epoch=int(f.attrs.get("batch_in_epoch", 0)),
                          rng_state=json.loads(state_text) if state_text else None,
                          epoch_perm=f["rng"]["epoch_perm"][()] if "epoch_perm" in f["rng"] else None,
                          preprocess=_read_group(f, "preprocess", path) if "preprocess" in f else {},
                          run_id=_text_attribute(f, "run_id"),
                          epoch_loss_sum=float(f.attrs.get("epoch_loss_sum", 0.0)),
                          epoch_loss_batches=int(f.attrs.get("epoch_loss_batches", 0)),
                          epoch_tally=_read_group(f, "epoch_tally", path) if "epoch_tally" in f else None,
                          units=_read_group(f, "units", path) if "units" in f else {},
                          provenance=_json_attribute(f, "provenance"))

    ckpt = read_hdf5_checked(path, what, fmt, FORMAT_VERSION, read, UNSEALED_VERSIONS if fmt == FORMAT else ())
    _check_shapes(ckpt, path)
    return ckpt


def _text_attribute(f, name: str) -> str | None:
    value = f.attrs.get(name)
    return value.decode() if isinstance(value, bytes) else (None if value is None else str(value))


def _json_attribute(f, name: str) -> dict | None:
    """A JSON attribute kept as a record only: absent or unreadable is None, never an error."""
    text = _text_attribute(f, name)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _read_group(f, name: str, path: Path) -> dict:
    if name not in f:
        raise KsaeError(f"{path} has no group {name}/")
    return {key: f[name][key][()] for key in f[name]}


def _check_shapes(ckpt: Checkpoint, path: Path) -> None:
    missing = [n for n in PARAM_NAMES if n not in ckpt.params]
    if missing:
        raise KsaeError(f"{path} lacks parameters {missing}")
    D, H = ckpt.params["W_dh"].shape
    expected = {"W_dh": (D, H), "b_h": (H,), "c_d": (D,)}
    dtype = ckpt.params["W_dh"].dtype
    for group_name, group in (("params", ckpt.params), ("optim", ckpt.velocities)):
        for name, shape in expected.items():
            if name not in group:
                raise KsaeError(f"{path} lacks {group_name}/{name}")
            if group[name].shape != shape or group[name].dtype != dtype:
                raise KsaeError(f"{path}: {group_name}/{name} has shape {group[name].shape} {group[name].dtype}, "
                                f"expected {shape} {dtype}")
    since = ckpt.units.get("since_kept_h")
    if since is not None and (since.shape != (H,) or since.dtype.kind not in "iu"):
        raise KsaeError(f"{path}: units/since_kept_h has shape {since.shape} {since.dtype}, expected ({H},) integers")
    hidden = ckpt.config.get("hidden")
    if hidden is not None and hidden != H:
        raise KsaeError(f"{path}: config says hidden={hidden} but W_dh has {H} columns")

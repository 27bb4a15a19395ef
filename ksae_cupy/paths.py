"""Checks of the paths a user gives, made before any work starts, and :func:`file_sha256`, the one hash of
a file's bytes (a run's data files, checkpoints kept by commit).

A folder in the way of a file, a file in the way of a folder, or a place we may not write
to is a one-line :class:`KsaeError` naming the path, instead of an ``OSError`` traceback
halfway through a run. Nothing here creates or changes anything.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ksae_cupy.errors import KsaeError


def writable(folder: Path) -> bool:
    """Whether this process may create files in the existing ``folder``."""
    return os.access(folder, os.W_OK | os.X_OK)


def nearest_existing(path: Path) -> Path:
    """``path`` itself or the closest ancestor that exists (``mkdir -p`` would start there)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_folder(path: Path, what: str) -> None:
    """``path`` is a folder, or could be made one: no file stands at it or above it."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise KsaeError(f"{what} {path} is a file, not a folder; give a folder")
    start = nearest_existing(path)
    if not start.is_dir():
        raise KsaeError(f"{what} {path} cannot be made: {start} is a file, not a folder")


def check_writable_folder(path: Path, what: str) -> None:
    """``path`` is (or can be created as) a folder this process may write files into."""
    check_folder(path, what)
    start = nearest_existing(path)
    if not writable(start):
        raise KsaeError(f"{what} {path}: {start} is not writable; choose a folder you may write to")


def check_output_file(path: Path, what: str) -> None:
    """A file may be written at ``path``: its folder exists and is writable, no folder stands at it."""
    path = Path(path)
    if path.is_dir():
        raise KsaeError(f"{what} {path} is a folder; give a file name")
    folder = Path(os.path.abspath(path)).parent
    if not folder.is_dir():
        start = nearest_existing(folder)
        if not start.is_dir():  # a file stands where the folder would be: "create it" could not be done
            raise KsaeError(f"{what} {path}: {start} is a file, not a folder; name a file in a folder")
        raise KsaeError(f"{what} {path}: folder {folder} does not exist; create it first")
    if not writable(folder):
        raise KsaeError(f"{what} {path}: folder {folder} is not writable; choose a folder you may write to")


def check_recorded_file(what: str, path) -> None:
    """A file path a file records (a run's ``config.json``, not the user's typing) names a regular file where
    anything is there: never a folder, a device (``/dev/zero`` would be read forever) or a pipe. A missing
    file is left to its reader to name; None (nothing recorded) is nothing to check."""
    if path is None:
        return
    if not isinstance(path, (str, Path)) or not str(path).strip() or "\0" in str(path):
        raise KsaeError(f"config.json records {what} {path!r}, which is not a file name; the run folder's "
                        f"config.json was edited or damaged")
    if os.path.lexists(path) and not Path(path).is_file():
        raise KsaeError(f"config.json records {what} {path}, which is not a regular file (a folder, a device or a "
                        f"pipe); the run folder's config.json was edited or damaged")


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of the file's bytes, read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

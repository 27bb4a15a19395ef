"""One writer per run folder: an OS file lock on ``RUN_DIR/.lock``, held for the run's life.

Two processes training into one folder would leave one run's config beside the other's
checkpoint, with their metrics interleaved. The lock is ``flock`` on ``.lock``: the kernel
releases it when the holder exits, however it exits (``kill -9`` included), so a lock left by
a dead run is simply taken over. The holder's PID is written into the file so that a second
writer can be told who holds the folder; a clean release empties the file, so a PID found
there at the next start names a run that died.

Where ``fcntl`` does not exist (not a POSIX system) there is no lock and nothing is refused.
"""
from __future__ import annotations

import os
from pathlib import Path

from ksae_cupy.errors import KsaeError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

LOCK = ".lock"


def _busy_error(folder: Path, lock_path: Path) -> KsaeError:
    try:
        holder = lock_path.read_text().strip() or "unknown"
    except OSError:
        holder = "unknown"
    return KsaeError(f"run folder {folder} is in use by another process (PID {holder} holds {lock_path}); "
                     f"wait for it to finish or stop it, or choose another --run-dir")


def check_unlocked(folder: Path) -> None:
    """Refuse, before any work, a folder another live process holds (creates nothing)."""
    lock_path = Path(folder) / LOCK
    if fcntl is None or not lock_path.is_file():
        return
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return  # unreadable: acquire() will report it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _busy_error(Path(folder), lock_path) from None
    finally:
        os.close(fd)  # closing drops the test lock


class RunLock:
    """The exclusive lock of one run folder; :meth:`acquire` once, :meth:`release` at the end."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / LOCK
        self.fd: int | None = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def acquire(self) -> str | None:
        """Take the lock (the folder must exist); returns the PID a dead holder left in the file,
        if any. Another live holder is a one-line :class:`KsaeError` naming it."""
        if self.fd is not None or fcntl is None:
            return None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _busy_error(self.folder, self.path) from None
        stale = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return stale

    def release(self) -> None:
        """Empty the file (a clean end) and drop the lock; the file stays, so that a process
        waiting on the same file never locks one that was unlinked under it."""
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = None

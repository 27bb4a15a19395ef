"""How an MPI job fails: checks agreed over the ranks (one line, every rank leaves together) and,
for an error only one rank meets mid-run, one line and ``MPI_Abort``.

A rank that leaves alone (even with a clean ``sys.exit``) leaves the others blocked in their next
collective forever, so an error on one rank used to mean ``MPI_Abort`` and MPICH's own line per
aborting rank ("Abort(2) on node 0 ... application called MPI_Abort") beside ours, the ranks'
lines interleaved. Most mistakes are found before any work, by checks every rank can reach at
the same point: :func:`agree` runs such a check on this rank (or on rank 0 only), then one
all-gather tells every rank whether it failed anywhere; if so every rank raises the same
:class:`RanksFailed`, :func:`abort_on_error` prints it once (rank 0) and every rank exits with the
same status without ``MPI_Abort``. An error one rank meets alone mid-run (the others are inside a
collective) still needs ``MPI_Abort``: one line, written whole, then MPICH's line silenced.

A bad parameter is an :class:`~ksae_cupy.errors.OptionError`, named as Python spells it; a command
that wants its own spelling (``--threads`` for ``n_threads``) gives :func:`abort_on_error` its
``spell``, and the lines it prints name the flag, as the single-process commands' do.

mpi4py is imported only inside functions.
"""
from __future__ import annotations

import functools
import os
import sys
import warnings

from ksae_cupy.errors import KsaeError, KsaeNote, OptionError, TrainingDiverged, one_line

EXIT_DIVERGED, EXIT_USAGE = 1, 2


def describe(exc: BaseException, spell=None) -> tuple[str, int]:
    """``(line, exit status)`` for an error, as the single-process commands print it: a
    :class:`KsaeError` by its message (status 2; a divergence 1), an ``OSError`` by its file and
    reason (2), anything else with its type's name (1). ``spell(field)``, when given, names an
    :class:`OptionError`'s parameter (a command's flag)."""
    if isinstance(exc, OptionError) and spell is not None:
        return one_line(exc.spelled(spell(exc.field), spell)), EXIT_USAGE
    if isinstance(exc, TrainingDiverged):
        return one_line(exc) or type(exc).__name__, EXIT_DIVERGED
    if isinstance(exc, KsaeError):
        return one_line(exc) or type(exc).__name__, EXIT_USAGE
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{one_line(exc.strerror)}", EXIT_USAGE
    return f"{type(exc).__name__}: {one_line(exc)}", 1


class RanksFailed(KsaeError):
    """Raised alike on every rank after :func:`agree` found a failure on one or more ranks.

    ``failures`` is ``[(rank, line, status), ...]``, or ``(rank, line, status, (field, template))``
    for an :class:`OptionError`; ``lines()`` the text to print once: one line per distinct message,
    prefixed with the ranks that met it unless every rank did (or the check ran on rank 0 alone,
    for the job as a whole), each parameter named by ``spell(field)`` when ``spell`` is given.
    """

    def __init__(self, failures: list, size: int, job_wide: bool = False):
        self.failures, self.size, self.job_wide = failures, size, job_wide
        self.status = failures[0][2]
        super().__init__("; ".join(self.lines()))

    def lines(self, spell=None) -> list[str]:
        groups: dict[str, list[int]] = {}
        for rank, line, _, *option in self.failures:
            if option and option[0] is not None and spell is not None:
                field, template = option[0]
                line = one_line(OptionError(field, template).spelled(spell(field), spell))
            groups.setdefault(line, []).append(rank)
        out = []
        for line, ranks in groups.items():
            if self.job_wide or len(ranks) == self.size:
                out.append(line)
            else:
                out.append(f"[rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}] {line}")
        return out


def agree(comm, fn, *args, rank0_only: bool = False, **kwargs):
    """``fn(*args, **kwargs)`` on this rank (with ``rank0_only``, on rank 0; the others get None),
    then one all-gather: when it raised on any rank, every rank raises the same :class:`RanksFailed`.

    ``fn`` must not communicate: a rank whose ``fn`` failed would miss its collectives. A signal
    is not an error here (the stop handlers only note it).
    """
    result, failure = None, None
    if comm.rank == 0 or not rank0_only:
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every error is reported, once, by rank 0
            # an OptionError travels with its field, for the command to spell (RanksFailed.lines)
            failure = (*describe(exc), (exc.field, exc.template) if isinstance(exc, OptionError) else None)
    failures = comm.allgather(failure)
    failed = [(rank, *f) for rank, f in enumerate(failures) if f is not None]
    if failed:
        raise RanksFailed(failed, comm.size, job_wide=rank0_only)
    return result


def abort_on_error(func=None, *, spell=None):
    """Run ``func`` (one MPI job's body, on every rank); whatever it raises ends the whole job.
    ``@abort_on_error`` or ``@abort_on_error(spell=...)``: ``spell(field)`` names a bad parameter
    in the lines printed (a command's flag; by default its Python name).

    * :class:`RanksFailed` (every rank raised it alike): rank 0 prints ``error: <line>``; every
      rank leaves with its status, together, without ``MPI_Abort``.
    * ``SystemExit`` above 128 (every rank stopped by a signal, saved, together): leave together.
    * Anything else (one rank, alone, mid-run): ``error: [rank r] <line>`` and ``MPI_Abort``,
      which ends the ranks blocked in a collective.

    :class:`~ksae_cupy.errors.KsaeNote` warnings are printed as ``note: <line>`` (rank 0's).
    """
    if func is None:
        return functools.partial(abort_on_error, spell=spell)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _show_note
                return func(*args, **kwargs)
        except RanksFailed as exc:
            if _rank() in (0, "?"):
                _write("".join(f"error: {line}\n" for line in exc.lines(spell)))
            _exit_together(exc.status)
        except SystemExit as exc:
            if exc.code in (0, None):
                raise
            if isinstance(exc.code, int) and exc.code > 128:
                _exit_together(exc.code)
            _abort(int(exc.code) if isinstance(exc.code, int) else 1, None)
        except BaseException as exc:  # noqa: BLE001 - anything else: report, abort everyone
            _abort(describe(exc)[1] if isinstance(exc, Exception) else 1, exc, spell)

    return wrapper


def _show_note(message, category, filename, lineno, file=None, line=None):
    if issubclass(category, KsaeNote):
        _write(f"note: {one_line(message)}\n")
    else:  # other libraries' warnings keep Python's own format
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _rank():
    try:
        from mpi4py import MPI
    except ImportError:
        return "?"
    return MPI.COMM_WORLD.rank if MPI.Is_initialized() and not MPI.Is_finalized() else "?"


def _size() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.size


def _write(text: str) -> None:
    """One write of the whole text: lines of ranks that fail together must not run into each other."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(sys.stderr.fileno(), text.encode("utf-8", "replace"))


def _exit_together(status: int) -> None:
    """Leave with ``status`` on every rank without MPI_Abort: finalize MPI, then exit as Python
    does (mpi4py's runner would turn a non-zero exit into MPI_Abort, adding a line per rank to a
    clean stop, but not once MPI is finalized). Not ``os._exit`` right after the finalize: under
    load, MPICH's mpiexec then often reported a rank as killed (status 9, its "BAD TERMINATION" box)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()
    except ImportError:
        pass
    raise SystemExit(status)


def _wait_until_read(fd: int, limit_s: float = 10.0) -> None:
    """Wait (at most ``limit_s``) until the reader of the pipe ``fd`` (mpiexec's proxy) has taken
    everything written to it; at once when ``fd`` is not a pipe (a file, a terminal)."""
    import fcntl
    import stat
    import struct
    import termios
    import time

    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        deadline = time.monotonic() + limit_s
        while struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0] and time.monotonic() < deadline:
            time.sleep(0.01)
    except (OSError, ValueError):  # no FIONREAD on this pipe: nothing to wait for
        return


def _abort(status: int, exc, spell=None) -> None:
    rank = _rank()
    if exc is not None:
        line, _ = describe(exc, spell)
        _write(f"error: [rank {rank}] {line}\n" if isinstance(rank, int) and _size() > 1 else f"error: {line}\n")
    try:
        from mpi4py import MPI
    except ImportError:
        MPI = None
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.size > 1:
        sys.stdout.flush()
        for fd in (sys.stdout.fileno(), sys.stderr.fileno()):
            _wait_until_read(fd)  # else mpiexec, torn down by the abort, may drop the line unread
        # MPICH prints "Abort(N) on node R (rank R in comm 0): application called MPI_Abort(...)"
        # for every aborting rank: the line above already said what happened.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stderr.fileno())
        MPI.COMM_WORLD.Abort(status)
    sys.exit(status)

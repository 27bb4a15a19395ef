"""How many threads the CPU's BLAS (NumPy's matrix products) and the CPU kernels may use: ``--threads``.

NumPy's BLAS starts one thread per core. On a machine that other jobs share, those threads
wait for each other and a training step can be several times slower than with one thread
(116.8 vs 18.7 ms measured on a busy 2-core machine), so the count is set and printed.

The same count goes to the Numba kernels of :mod:`ksae_cupy.cpu.numba_kernels` (the sparse step after
``X W``, and the momentum update), which run between the BLAS calls, never beside them.

The BLAS count is set at run time with ``threadpoolctl`` (installed with the package). A count
the environment set before Python started (``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``,
``BLIS_NUM_THREADS``, ``OMP_NUM_THREADS``) is left as it is unless ``--threads`` is given, and
the printed line names the variable.

A bad count is an :class:`~ksae_cupy.errors.OptionError` on the estimator's parameter ``n_threads``
(a command prints its ``--threads``). The lines that say how the count was chosen name the knob as
the caller's user knows it (``--threads`` for a command, ``n_threads`` for the estimator).
"""
from __future__ import annotations

import contextlib
import os

import numpy as np

from ksae_cupy.errors import OptionError, literal, note


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers and ``taskset`` limit)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def set_blas_threads(threads: int | None) -> tuple[str, int | None]:
    """Limit the BLAS and the CPU kernels to ``threads``; return the line that says so and the count used.

    ``threads`` None: a count the environment set, else one thread per core that other jobs
    leave free (the 1-minute load average, rounded, counts the busy ones; at least one). A
    parallel loop waits for its slowest thread, and a thread parked behind another job holds
    all of them up: on this project's 2-core machine, with one other job running, two threads made
    an MNIST epoch about 3-5x slower than one. A count given explicitly without threadpoolctl is
    a one-line error, since it could not be honoured. The count used is None only when nothing
    could set it (no threadpoolctl, nothing given).
    """
    global _process_threads
    cores = usable_cores()
    wanted, how, from_environment = choose_threads(threads)
    _process_threads = wanted or cores
    from ksae_cupy.cpu import numba_kernels as cpu_kernels
    cpu_kernels.set_threads(wanted or cores)
    # SciPy bundles a BLAS of its own (L-BFGS-B's, scipy.linalg's): loaded after the limit it would run on every
    # core, since a limit reaches only the libraries loaded; so it is loaded before the limit is set.
    import scipy.linalg  # noqa: F401
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        if threads is not None:
            raise OptionError("n_threads", f"{{name}} {threads} needs threadpoolctl (pip install threadpoolctl); "
                              f"without it, start the run with OMP_NUM_THREADS={threads} "
                              f"OPENBLAS_NUM_THREADS={threads} MKL_NUM_THREADS={threads}") from None
        return (f"BLAS threads: the library's default (threadpoolctl not installed; set OMP_NUM_THREADS before "
                f"starting to change it); {cores} usable cores"), None
    if from_environment is None:
        threadpool_limits(limits=wanted, user_api="blas")  # stays in force for the rest of the process
    blas = [info for info in threadpool_info() if info.get("user_api") == "blas"]
    if not blas:
        return f"BLAS threads: no BLAS library found; {cores} usable cores", wanted
    counts = sorted({info["num_threads"] for info in blas})
    names = ", ".join(sorted({info.get("internal_api", "blas") for info in blas}))
    return f"BLAS threads: {', '.join(map(str, counts))} ({names}; {cores} usable cores; {how})", wanted


def choose_threads(threads: int | None, flag: str = "--threads") -> tuple[int | None, str, str | None]:
    """``(wanted, how, from_environment)``: the count ``threads`` asks for, else the one the
    environment set, else one per free core; ``wanted`` is None when the environment's value is
    not a count (it is then left to the library). ``how`` names the knob as ``flag``."""
    cores = usable_cores()
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, (int, np.integer))
                                or threads <= 0):
        raise OptionError("n_threads", f"{{name}} {literal(repr(threads))} is not allowed; use a positive number "
                          f"of threads (this machine has {cores} cores)")
    from_environment = environment_threads()
    if threads is not None and threads > cores:
        # More threads than cores only wait for each other, and each lane is a Python thread: 10^5 of
        # them ran the system out of threads after 86 s, so the count is capped, and said.
        note(f"{flag} {threads} is more than the {cores} cores this process may use; using {cores}")
        return cores, f"{flag} {threads} capped at the {cores} usable cores", None
    if threads is not None:
        return int(threads), flag, None  # given: it wins over the environment's count
    if from_environment is not None:
        value = from_environment.split("=", 1)[1]
        wanted = int(value) if value.isdigit() and int(value) > 0 else None
        if wanted is not None and wanted > cores:  # the BLAS keeps it; this package's lanes need not wait
            note(f"{from_environment} is more than the {cores} cores this process may use; the CPU kernels use {cores}")
            wanted = cores
        return wanted, f"set by {from_environment}; {flag} N to change", from_environment  # the user's: kept
    wanted, how = free_cores(cores)
    return wanted, how.replace("--threads", flag), None


# The count a command chose for this whole process (set_blas_threads), which the estimator's
# default n_threads=None then keeps; None until a command chose.
_process_threads: int | None = None


@contextlib.contextmanager
def estimator_threads(n_threads: int | None):
    """The thread counts of :meth:`KSparseAutoencoder.fit`, for the ``with`` block only; yields
    ``(count, how)``. ``n_threads`` None: what a command chose for this process (``ksae-train
    --threads``), else as a command would choose (the environment's count, else one per free core)."""
    if n_threads is None and _process_threads is not None:
        yield _process_threads, "as the command set it"
        return
    wanted, how, from_environment = choose_threads(n_threads, "n_threads")
    from ksae_cupy.cpu import numba_kernels as cpu_kernels
    before = cpu_kernels.threads()
    cpu_kernels.set_threads(wanted or usable_cores())
    try:
        if from_environment is not None and n_threads is None:
            limits = contextlib.nullcontext()  # the environment's count is already the BLAS's
        else:
            try:
                from threadpoolctl import threadpool_limits
                limits = threadpool_limits(limits=wanted, user_api="blas")
            except ImportError:
                limits = contextlib.nullcontext()
        with limits:
            yield wanted, how
    finally:
        cpu_kernels.set_threads(before)


def free_cores(cores: int) -> tuple[int, str]:
    """``(threads, how)``: one thread per core other jobs leave free, by the 1-minute load average."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not Unix: no load average to read
        return cores, "default: one per core; --threads N to change"
    busy = min(cores - 1, int(load + 0.5))
    if busy <= 0:
        return cores, "default: one per core; --threads N to change"
    return cores - busy, (f"default: one per free core, load average {load:.1f} from other jobs; "
                          f"--threads N to change")


# The variables BLAS libraries read at start-up for their thread count, most specific first.
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS", "OMP_NUM_THREADS")


def environment_threads() -> str | None:
    """``NAME=value`` of the first thread-count variable set in the environment, else None."""
    for name in THREAD_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return f"{name}={value}"
    return None

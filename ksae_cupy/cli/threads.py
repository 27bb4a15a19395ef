"""How many threads the CPU's BLAS (NumPy's matrix products) and the CPU kernels may use: ``--threads``.

NumPy's BLAS starts one thread per core. On a machine that other jobs share, those threads
wait for each other and a training step can be several times slower than with one thread
(116.8 vs 18.7 ms measured on a busy 2-core machine), so the count is set and printed.

The same count goes to the Numba kernels of :mod:`ksae_cupy.cpu.kernels` (the sparse step after
``X W``, and the momentum update), which run between the BLAS calls, never beside them.

The BLAS count is set at run time with ``threadpoolctl`` (installed with the package). A count
the environment set before Python started (``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``,
``BLIS_NUM_THREADS``, ``OMP_NUM_THREADS``) is left as it is unless ``--threads`` is given, and
the printed line names the variable.
"""
from __future__ import annotations

import os

from ksae_cupy.errors import KsaeError


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers and ``taskset`` limit)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def set_blas_threads(threads: int | None) -> str:
    """Limit the BLAS to ``threads`` (None: one per usable core); return the line that says so.

    A count given explicitly without threadpoolctl is a one-line error, since it could not
    be honoured.
    """
    cores = usable_cores()
    if threads is not None and threads <= 0:
        raise KsaeError(f"--threads {threads} is not allowed; use a positive number of threads (this machine has {cores} cores)")
    _set_kernel_threads(threads, cores)
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        if threads is not None:
            raise KsaeError(f"--threads {threads} needs threadpoolctl (pip install threadpoolctl); without it, "
                            f"start the run with OMP_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} "
                            f"MKL_NUM_THREADS={threads}") from None
        return (f"BLAS threads: the library's default (threadpoolctl not installed; set OMP_NUM_THREADS before "
                f"starting to change it); {cores} usable cores")
    from_environment = environment_threads()
    if threads is not None:
        how = "--threads"
        threadpool_limits(limits=threads, user_api="blas")  # stays in force for the rest of the process
    elif from_environment is not None:
        how = f"set by {from_environment}; --threads N to change"  # the user's choice: left as it is
    else:
        how = "default: one per core; --threads N to change"
        threadpool_limits(limits=cores, user_api="blas")
    blas = [info for info in threadpool_info() if info.get("user_api") == "blas"]
    if not blas:
        return f"BLAS threads: no BLAS library found; {cores} usable cores"
    counts = sorted({info["num_threads"] for info in blas})
    names = ", ".join(sorted({info.get("internal_api", "blas") for info in blas}))
    line = f"BLAS threads: {', '.join(map(str, counts))} ({names}; {cores} usable cores; {how})"
    return line + _busy_hint(cores, threads if from_environment is None else 0)


def _set_kernel_threads(threads: int | None, cores: int) -> None:
    """The CPU kernels run on ``--threads``, else on a count the environment set, else one per core."""
    from ksae_cupy.cpu import kernels as cpu_kernels

    if threads is None:
        variable = environment_threads()
        value = variable.split("=", 1)[1] if variable else ""
        threads = int(value) if value.isdigit() and int(value) > 0 else cores
    cpu_kernels.set_threads(threads)


# The variables BLAS libraries read at start-up for their thread count, most specific first.
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS", "OMP_NUM_THREADS")


def environment_threads() -> str | None:
    """``NAME=value`` of the first thread-count variable set in the environment, else None."""
    for name in THREAD_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return f"{name}={value}"
    return None


def _busy_hint(cores: int, threads: int | None) -> str:
    """A hint when other jobs already keep the cores busy and the count was not chosen."""
    if threads is not None or cores < 2:
        return ""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return ""
    if load < cores - 0.5:
        return ""
    return f"; load average {load:.1f}: other jobs share these cores, --threads 1 may be faster"

"""Lanes: one call's work split over threads by hand, each lane a contiguous share of it.

Why not Numba's own threads for the training step: on the 2-core machines this package is
measured on, Numba's thread pool gained only ~1.3x from the second core. After the encoder
product, OpenBLAS's worker thread spins (sched_yield) for a while, and Numba's worker shares
its core with it (a kernel took 1.12 ms right after ``X W`` against 0.76 ms alone, measured).
A lane instead runs its share of ``X W`` itself, with BLAS on one thread, then its share of
the kernels (serial Numba builds that release the GIL), so no thread ever waits on a spinner.

Each lane owns whole rows (examples) or whole hidden units, and computes them in the order
one thread would: results are the same bits whatever the lane count (tested).
"""
from __future__ import annotations

import queue
import threading


class Lanes:
    """``n`` lanes: the calling thread is lane 0; lanes 1..n-1 are daemon threads, started once.

    :meth:`run` calls ``task(lane)`` for every lane at once and returns when all have finished;
    an exception in any lane is raised in the caller. One caller at a time (the trainer's loop).
    """

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"lanes must be at least 1; got {n}")
        self.n = n
        self._todo = [queue.SimpleQueue() for _ in range(n - 1)]
        self._done = queue.SimpleQueue()
        for lane in range(1, n):
            threading.Thread(target=self._serve, args=(lane,), daemon=True, name=f"ksae-lane-{lane}").start()

    def _serve(self, lane: int) -> None:
        todo = self._todo[lane - 1]
        while True:
            task = todo.get()
            try:
                task(lane)
                self._done.put(None)
            except BaseException as exc:  # handed to the caller, which raises it
                self._done.put(exc)

    def run(self, task) -> None:
        """``task(lane)`` on every lane, lane 0 on the calling thread; waits for all of them."""
        for todo in self._todo:
            todo.put(task)
        error = None
        try:
            task(0)
        except BaseException as exc:
            error = exc
        for _ in self._todo:  # wait for every lane, even after a failure: none may still write
            outcome = self._done.get()
            error = error or outcome
        if error is not None:
            raise error


def share(lane: int, lanes: int, size: int) -> tuple[int, int]:
    """``[start, stop)`` of lane ``lane``'s contiguous share of ``size`` items."""
    return lane * size // lanes, (lane + 1) * size // lanes


_lanes = {}  # lane count -> its Lanes, made on first use


def lanes(n: int) -> Lanes:
    """The process's :class:`Lanes` of ``n`` lanes (threads are started once and kept)."""
    if n not in _lanes:
        _lanes[n] = Lanes(n)
    return _lanes[n]

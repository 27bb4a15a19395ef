"""Bytes the distributed methods hand to MPI per step: computed from the shapes, and counted.

Two views of the same quantity, so each checks the other (``ksae-bench dist`` and the tests
require them to be equal):

* the formulas (:func:`topk_volume`, :func:`dp_allreduce_volume`) read the code of
  :mod:`ksae_cupy.parallel.sharded_topk` and :mod:`ksae_cupy.parallel.data_parallel` call by call;
* :class:`CountingComm` wraps a real communicator and records every collective's buffers.

For one rank and one call, ``sent`` is the size of the send buffer passed to MPI (an
in-place buffer counts once as sent and once as received) and ``received`` the size of the
buffer MPI fills. Neither is what crosses the network, which depends on MPI's algorithm;
:attr:`Volume.wire` is an estimate of the bytes one rank transmits, assuming
bandwidth-optimal algorithms: all-reduce ``2 (R-1)/R S`` (reduce-scatter + all-gather),
all-gather ``total - own`` (ring), exclusive scan ``ceil(log2 R) S`` (recursive doubling,
MPICH's choice). It is zero on one rank.
"""
from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass

import numpy as np

from ksae_cupy.errors import KsaeError

HIST_BINS = 256  # one radix digit of 8 bits per pass of the threshold method
COUNT_BYTES = 4  # the threshold's histograms are int32
ROW_COUNT_BYTES = 8  # per-row counts (above, ties) and block sizes are int64
KEY_BYTES = {"float32": 4, "float64": 8}


@dataclass(frozen=True)
class Volume:
    """What one rank passes to MPI: collective calls, bytes sent and received, wire estimate."""

    calls: int = 0
    sent: int = 0
    received: int = 0
    wire: float = 0.0  # estimated bytes this rank transmits (see the module docstring)

    def __add__(self, other: "Volume") -> "Volume":
        return Volume(self.calls + other.calls, self.sent + other.sent, self.received + other.received,
                      self.wire + other.wire)

    def to_dict(self) -> dict:
        return asdict(self)


def allreduce(nbytes: int, R: int) -> Volume:
    return Volume(1, nbytes, nbytes, 2 * (R - 1) / R * nbytes)


def allgather(own_bytes: int, total_bytes: int) -> Volume:
    return Volume(1, own_bytes, total_bytes, total_bytes - own_bytes)


def exscan(nbytes: int, R: int) -> Volume:
    return Volume(1, nbytes, nbytes, math.ceil(math.log2(R)) * nbytes if R > 1 else 0.0)


def block_sizes_r(H: int, R: int) -> list[int]:
    """Hidden units per rank, as the trainers split them (contiguous, sizes differ by <= 1)."""
    base, extra = divmod(H, R)
    return [base + (1 if r < extra else 0) for r in range(R)]


def topk_volume(method: str, N: int, H: int, k: int, R: int, rank: int = 0, dtype: str = "float32") -> Volume:
    """What ``sharded_topk`` passes to MPI on ``rank`` for one (N, H) batch over R ranks."""
    from ksae_cupy.parallel.sharded_topk import DIST_TOPK_METHODS

    if method not in DIST_TOPK_METHODS:
        raise KsaeError(f"method {method!r} is not allowed; use {' or '.join(DIST_TOPK_METHODS)}")
    if dtype not in KEY_BYTES:
        raise KsaeError(f"dtype {dtype!r} is not allowed; use one of {', '.join(KEY_BYTES)}")
    if not (1 <= R <= H and 0 <= rank < R and 1 <= k <= H and N >= 1):
        raise KsaeError(f"N={N}, H={H}, k={k}, R={R}, rank={rank} is not allowed; "
                        f"use N >= 1, 1 <= k <= H, 1 <= R <= H, 0 <= rank < R")
    key_bytes = KEY_BYTES[dtype]
    volume = allgather(ROW_COUNT_BYTES, ROW_COUNT_BYTES * R)  # every rank's block size
    if method == "threshold":
        passes = key_bytes  # one 8-bit digit per pass
        for _ in range(passes):
            volume += allreduce(N * HIST_BINS * COUNT_BYTES, R)
        volume += allreduce(N * ROW_COUNT_BYTES, R)  # entries above the k-th key, per row
        volume += exscan(N * ROW_COUNT_BYTES, R)  # ties at the k-th key on lower ranks, per row
        return volume
    # gather: each rank's top min(k, H_r) (key, column) pairs of every row.
    k_r = [min(k, h) for h in block_sizes_r(H, R)]
    pair_bytes = 2 * key_bytes
    return volume + allgather(N * k_r[rank] * pair_bytes, N * sum(k_r) * pair_bytes)


def dp_allreduce_volume(D: int, H: int, R: int, dtype: str = "float32") -> Volume:
    """The data-parallel step's one all-reduce: W (D x H), b (H), c (D) and the loss, flat."""
    if dtype not in KEY_BYTES:
        raise KsaeError(f"dtype {dtype!r} is not allowed; use one of {', '.join(KEY_BYTES)}")
    return allreduce((D * H + H + D + 1) * KEY_BYTES[dtype], R)


class CountingComm:
    """An mpi4py communicator that records the buffers of every collective it passes on.

    Only the buffer collectives the distributed code uses are forwarded; any other
    attribute (for instance a pickling ``allgather``) raises, so a new kind of message
    cannot go uncounted. ``volume(R)`` sums what was recorded.
    """

    def __init__(self, comm):
        self._comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.calls: list[tuple[str, int, int]] = []  # (name, sent bytes, received bytes)

    def __getattr__(self, name):
        raise AttributeError(f"CountingComm does not forward {name!r}; add it (and its byte count) first")

    def Allreduce(self, sendbuf, recvbuf, op=None):
        self._record("Allreduce", recvbuf if _in_place(sendbuf) else sendbuf, recvbuf)
        return self._comm.Allreduce(sendbuf, recvbuf, **_op_kwargs(op))

    def Exscan(self, sendbuf, recvbuf, op=None):
        self._record("Exscan", recvbuf if _in_place(sendbuf) else sendbuf, recvbuf)
        return self._comm.Exscan(sendbuf, recvbuf, **_op_kwargs(op))

    def Allgather(self, sendbuf, recvbuf):
        self._record("Allgather", sendbuf, recvbuf)
        return self._comm.Allgather(sendbuf, recvbuf)

    def Allgatherv(self, sendbuf, recvbuf):
        self._record("Allgatherv", sendbuf, recvbuf)
        return self._comm.Allgatherv(sendbuf, recvbuf)

    def _record(self, name, sendbuf, recvbuf):
        self.calls.append((name, _nbytes(sendbuf), _nbytes(recvbuf)))

    def reset(self) -> None:
        self.calls.clear()

    def volume(self) -> Volume:
        """The recorded calls, with the same wire estimate as the formulas."""
        total, R = Volume(), self.size
        for name, sent, received in self.calls:
            if name == "Allreduce":
                total += allreduce(sent, R)
            elif name == "Exscan":
                total += exscan(sent, R)
            else:
                total += allgather(sent, received)
        return total


def _in_place(buf) -> bool:
    # Without mpi4py.MPI loaded nobody can hold MPI.IN_PLACE (and we do not load it here).
    MPI = sys.modules.get("mpi4py.MPI")
    return MPI is not None and buf is MPI.IN_PLACE


def _op_kwargs(op) -> dict:
    return {} if op is None else {"op": op}  # mpi4py's default is MPI.SUM


def _nbytes(spec) -> int:
    """Bytes of a buffer argument: an array, or ``[array, counts...]`` as mpi4py takes them."""
    if isinstance(spec, (list, tuple)):
        spec = spec[0]
    return int(np.asarray(spec).nbytes)

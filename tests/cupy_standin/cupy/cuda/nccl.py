"""``cupy.cuda.nccl`` of the stand-in: a communicator over the MPI ranks of the test (mpi4py's
COMM_WORLD), summing device buffers given by address as NCCL does. It checks what NCCL needs: the
same unique id on every rank, ``ndev`` and ``rank`` matching the job, a known type and operation,
and buffers given as addresses (``a.data.ptr``), not arrays. On a capturing stream a collective is
recorded and runs at each launch of the graph (every rank must launch its graph), as NCCL's
collectives are captured in CUDA graphs."""
from __future__ import annotations

import ctypes
import os

import numpy as np

NCCL_INT32, NCCL_INT64, NCCL_FLOAT32, NCCL_FLOAT64 = 2, 4, 7, 8
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3
_TYPES = {NCCL_INT32: np.int32, NCCL_INT64: np.int64, NCCL_FLOAT32: np.float32, NCCL_FLOAT64: np.float64}


class NcclError(RuntimeError):
    pass


def get_version() -> int:
    return 22300


def get_unique_id() -> tuple:
    return tuple(int(b) - 128 for b in os.urandom(128))


def _mpi():
    from mpi4py import MPI

    return MPI


class NcclCommunicator:
    def __init__(self, ndev: int, commId: tuple, rank: int):
        MPI = _mpi()
        world = MPI.COMM_WORLD
        if ndev != world.size or rank != world.rank:
            raise NcclError(f"ncclInvalidArgument: ndev={ndev}, rank={rank} in an MPI job of {world.size} ranks "
                            f"(this is rank {world.rank})")
        if not isinstance(commId, tuple) or len(commId) != 128:
            raise NcclError("ncclInvalidArgument: the unique id must be get_unique_id()'s 128-entry tuple")
        if len(set(world.allgather(commId))) != 1:
            raise NcclError("ncclInvalidUsage: the ranks passed different unique ids (broadcast rank 0's)")
        self._comm = world.Dup()
        self._rank, self._size = rank, ndev

    def rank_id(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def _view(self, ptr, count: int, datatype: int) -> np.ndarray:
        if not isinstance(ptr, int):
            raise TypeError(f"NCCL takes buffer addresses (a.data.ptr); got {type(ptr).__name__}")
        if datatype not in _TYPES:
            raise NcclError(f"ncclInvalidArgument: datatype {datatype}")
        dtype = np.dtype(_TYPES[datatype])
        return np.ctypeslib.as_array((ctypes.c_byte * (count * dtype.itemsize)).from_address(ptr)).view(dtype)

    def allReduce(self, sendbuf, recvbuf, count: int, datatype: int, op: int, stream) -> None:
        MPI = _mpi()
        ops = {NCCL_SUM: MPI.SUM, NCCL_PROD: MPI.PROD, NCCL_MAX: MPI.MAX, NCCL_MIN: MPI.MIN}
        if op not in ops:
            raise NcclError(f"ncclInvalidArgument: reduction op {op}")
        if not isinstance(stream, int):
            raise TypeError(f"NCCL takes a stream address (stream.ptr); got {type(stream).__name__}")
        recv = self._view(recvbuf, count, datatype)
        if sendbuf == recvbuf:
            self._on(stream, lambda: self._comm.Allreduce(MPI.IN_PLACE, recv, op=ops[op]), "allReduce")
        else:
            send = self._view(sendbuf, count, datatype)
            self._on(stream, lambda: self._comm.Allreduce(send, recv, op=ops[op]), "allReduce")

    def bcast(self, buff, count: int, datatype: int, root: int, stream) -> None:
        buf = self._view(buff, count, datatype)
        self._on(stream, lambda: self._comm.Bcast(buf, root=root), "bcast")

    @staticmethod
    def _on(stream, work, what: str) -> None:
        """Runs ``work`` now, or records it when ``stream`` (a handle) is capturing a graph."""
        from cupy.cuda import graph

        capture = graph.recording(stream)
        if capture is None:
            work()
        else:
            graph.record(capture, work, f"nccl {what}")

    def destroy(self) -> None:
        self._comm.Free()

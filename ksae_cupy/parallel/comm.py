"""Collective communication for multi-process training: MPI on the host, NCCL on GPUs.

mpi4py is imported only inside functions, never at package import, so the package works
without the ``mpi`` extra and a plain ``import ksae_cupy`` never initialises MPI.

* :class:`MPIAllreducer` sums NumPy buffers in place with ``MPI_Allreduce``.
* :class:`NCCLAllreducer` sums CuPy buffers in place with ``ncclAllReduce``; MPI only
  starts the ranks and broadcasts NCCL's unique id. (Written against
  ``cupy.cuda.nccl``; it has not been run: the machine it was written on has no GPU.)
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.errors import KsaeError, TrainingDiverged


def world():
    """``MPI.COMM_WORLD``; a :class:`~ksae_cupy.errors.KsaeError` when mpi4py is missing."""
    from ksae_cupy.errors import KsaeError

    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise KsaeError(f"distributed training needs mpi4py and an MPI library ({exc}); "
                        f"install them with: pip install 'ksae-cupy[mpi]'") from None
    return MPI.COMM_WORLD


class StopAgreedOverRanks:
    """Mixin of the distributed trainers: ``stop_requested`` is true on every rank once it was
    set on any (SIGTERM may reach only some ranks), and a divergence is found on all of them. The trainer's loop reads it at the same
    point of every step on every rank, so all stop after the same step and save together."""

    _stop_here = False

    @property
    def stop_requested(self) -> bool:
        from mpi4py import MPI

        return bool(self.comm.allreduce(int(self._stop_here), op=MPI.MAX))

    @stop_requested.setter
    def stop_requested(self, value: bool) -> None:
        self._stop_here = bool(value)

    def check_params_finite(self) -> None:
        """The trainer's parameter check, agreed: a rank whose block holds NaN or infinities
        stops every rank at the same point (each rank holds only its block when hidden units
        are sharded). With the all-reduced losses, every divergence is met by all ranks alike."""
        try:
            super().check_params_finite()
            mine = None
        except KsaeError as exc:
            mine = str(exc)
        found = [message for message in self.comm.allgather(mine) if message is not None]
        if found:
            raise TrainingDiverged(found[0])


def mpi_sum_inplace(comm, buf: np.ndarray) -> np.ndarray:
    """Sum ``buf`` over all ranks, in place, and return it (host arrays only)."""
    from mpi4py import MPI

    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    return buf


class MPIAllreducer:
    """In-place sum of a contiguous NumPy buffer over the ranks of ``comm``."""

    name = "mpi"

    def __init__(self, comm):
        self.comm = comm

    def __call__(self, flat):
        return mpi_sum_inplace(self.comm, flat)


class NCCLAllreducer:
    """In-place sum of a contiguous CuPy buffer over the ranks of ``comm``, with NCCL.

    Rank 0 creates NCCL's unique id and MPI broadcasts it; every rank must already have
    selected its GPU (``cupy.cuda.Device(local_rank).use()``). Not run here (no GPU).
    """

    name = "nccl"

    _NCCL_TYPES = {np.dtype(np.float32): "NCCL_FLOAT32", np.dtype(np.float64): "NCCL_FLOAT64"}

    def __init__(self, comm):
        import cupy
        from cupy.cuda import nccl

        self.cupy, self.nccl = cupy, nccl
        uid = nccl.get_unique_id() if comm.rank == 0 else None
        uid = comm.bcast(uid, root=0)
        self.nccl_comm = nccl.NcclCommunicator(comm.size, uid, comm.rank)

    def __call__(self, flat):
        dtype = getattr(self.nccl, self._NCCL_TYPES[np.dtype(flat.dtype)])
        stream = self.cupy.cuda.get_current_stream()
        self.nccl_comm.allReduce(flat.data.ptr, flat.data.ptr, flat.size, dtype, self.nccl.NCCL_SUM, stream.ptr)
        return flat


COMMS = ("mpi", "nccl")  # the allreducers make_allreducer builds: ksae-train-mpi --comm


def make_allreducer(comm, kind: str):
    """``mpi`` or ``nccl`` (the latter needs CuPy and a GPU per rank): the run setting ``comm``."""
    from ksae_cupy.errors import OptionError, literal

    if kind == "mpi":
        return MPIAllreducer(comm)
    if kind == "nccl":
        return NCCLAllreducer(comm)
    raise OptionError("comm", f"{{name}} {literal(repr(kind))} is not allowed; use {' or '.join(COMMS)}")


def shard_bounds(n: int, size: int, rank: int) -> tuple[int, int]:
    """``[start, stop)`` of rank ``rank``'s contiguous share of ``n`` items (sizes differ by <= 1)."""
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)

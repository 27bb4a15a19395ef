"""The byte-count formulas of ksae_cupy.parallel.commvolume against sizes worked out by hand.

(That the formulas match what the code really passes to MPI is checked on 2 and 3 ranks
in tests/test_distributed.py.)
"""
import numpy as np
import pytest

from ksae_cupy.parallel.commvolume import CountingComm, Volume, dp_allreduce_volume, topk_volume
from ksae_cupy.errors import KsaeError


def test_threshold_bytes_by_hand():
    # Block sizes: one int64 sent, R received. Then 4 passes of an int32 (128, 256)
    # histogram = 131072 B each, the per-row 'above' counts (128 int64 = 1024 B) and
    # the per-row tie scan (1024 B): 8 + 524288 + 2048 sent, whatever k and R.
    v = topk_volume("threshold", N=128, H=1000, k=25, R=2)
    assert (v.calls, v.sent, v.received) == (7, 526_344, 526_352)
    assert topk_volume("threshold", 128, 1000, 250, 16).sent == 526_344
    # Wire estimate on 2 ranks: all-reduce (R-1)/R * 2 = 1 x size, scan 1 round, 8 B of block sizes.
    assert v.wire == pytest.approx(524_288 + 1024 + 1024 + 8)
    assert topk_volume("threshold", 128, 1000, 25, 1).wire == 0
    # float64 keys: 8 passes.
    assert topk_volume("threshold", 128, 1000, 25, 2, dtype="float64").calls == 11


def test_gather_bytes_by_hand():
    # k=25 pairs of (uint32 key, uint32 column) = 8 B per candidate per row: 128*25*8 = 25600.
    v = topk_volume("gather", N=128, H=1000, k=25, R=4)
    assert (v.calls, v.sent, v.received) == (2, 8 + 25_600, 32 + 4 * 25_600)
    assert v.wire == 24 + 3 * 25_600
    # k=250 over 8 ranks of 125 columns: each rank has only 125 candidates per row.
    v = topk_volume("gather", 128, 1000, 250, 8, rank=0)
    assert (v.sent, v.received) == (8 + 128 * 125 * 8, 64 + 128 * 1000 * 8)
    # 1000 over 16 ranks: 63 columns on ranks 0-7, 62 on ranks 8-15.
    assert topk_volume("gather", 128, 1000, 250, 16, rank=15).sent == 8 + 128 * 62 * 8
    assert topk_volume("gather", 128, 1000, 25, 2, dtype="float64").sent == 8 + 128 * 25 * 16


def test_data_parallel_allreduce_bytes_by_hand():
    # W 784x1000 + b 1000 + c 784 + the loss = 785,785 float32.
    v = dp_allreduce_volume(784, 1000, 2)
    assert (v.calls, v.sent, v.received, v.wire) == (1, 3_143_140, 3_143_140, 3_143_140)


@pytest.mark.parametrize("args, message", [
    (("median", 128, 1000, 25, 2), "method 'median'"),
    (("gather", 128, 1000, 0, 2), "k=0"),
    (("gather", 128, 10, 5, 11), "R=11"),
    (("gather", 128, 1000, 25, 2, 2), "rank=2"),
])
def test_volume_rejects_bad_values(args, message):
    with pytest.raises(KsaeError, match=message):
        topk_volume(*args)
    with pytest.raises(KsaeError, match="dtype 'float16'"):
        dp_allreduce_volume(4, 4, 2, dtype="float16")


class _FakeComm:
    rank, size = 0, 2

    def Allreduce(self, sendbuf, recvbuf, op=None):
        recvbuf[...] = 2 * np.asarray(sendbuf)

    def allgather(self, obj):  # a pickling call: CountingComm must not pass it on uncounted
        return [obj, obj]


def test_counting_comm_counts_buffers_and_refuses_uncounted_calls():
    comm = CountingComm(_FakeComm())
    out = np.empty(10, np.float32)
    comm.Allreduce(np.ones(10, np.float32), out)
    assert comm.calls == [("Allreduce", 40, 40)] and comm.volume() == Volume(1, 40, 40, 40.0)
    with pytest.raises(AttributeError, match="allgather"):
        comm.allgather(1)

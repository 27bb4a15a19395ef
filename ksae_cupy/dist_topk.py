"""Global top-k over hidden units split across ranks (section 4.3.3's distributed case).

Rank r holds the columns ``[col_offset, col_offset + H_local)`` of ``Z_nh``; ranks hold
consecutive column blocks in rank order. :func:`sharded_topk` returns which local entries
belong to the *global* top-k under the contract of :mod:`ksae_cupy.topk` (rank by
:func:`~ksae_cupy.topk.order_keys`, exactly k per row, ties to the lower global column),
so the union over ranks is exactly the single-process set.

Two methods:

* ``threshold`` -- the iterative threshold with counts only. Per radix digit (8 bits) each
  rank histograms the digit of its surviving candidates per row; the (N, 256) histograms
  are summed by one all-reduce and every rank picks the same digit of the k-th key from
  the summed counts. After 4 passes (float32) every rank knows the k-th key per row. Then
  one all-reduce of per-row counts above it tells how many ties are wanted, and an
  exclusive scan (``MPI_Exscan``) of per-rank tie counts tells each rank how many
  lower-column ties precede its block, so the first ties in global column order are kept.
  Traffic per row: 4 x 256 counts + 2 counts, whatever k and the rank count; 6 rounds.
* ``gather`` -- each rank's local top-min(k, H_local) keys and global columns are
  all-gathered (N x k x P pairs), and every rank selects the global top-k from those
  candidates (any global winner is among its own rank's local winners, ties included,
  because the local tie rule is the global one restricted to a block). One round.

When each wins (reasoned, not measured at scale here): ``gather`` moves about
``8 k P`` bytes per row in one round, ``threshold`` about ``4 x 256 x 4 = 4 KiB`` per
row (int32 counts) in 6 rounds, independent of k and P. So ``gather`` wins for the small
k of this paper (k <= 100) on few ranks and whenever latency dominates (small batches);
``threshold`` wins once ``k P`` exceeds roughly 500 (large alpha*k at encoding time, many
ranks), and its work per rank stays O(H_local) with no O(k P log) merge.

Measured only on one small shared CPU machine (2 cores, busy; shared-memory MPICH; N=128,
H=1000, float32, ms per call): P=2, k=25: threshold 22, gather 4.4; P=2, k=250:
threshold 18, gather 29; P=3, k=25: threshold 27, gather 15; P=3, k=250: threshold 28,
gather 107. So on this machine gather wins at the paper's k and threshold at large k P,
as argued; the crossover on a real network (where rounds cost more) is not measured.

Works on host (NumPy) arrays; CuPy input is copied to the host and back.
"""
from __future__ import annotations

import numpy as np

from .backend import array_module, to_host
from .errors import KsaeError
from .topk import check_topk_args, order_keys, topk_sort

DIST_TOPK_METHODS = ("threshold", "gather")


def sharded_topk(Z_local_nh, k: int, comm, col_offset: int, method: str = "threshold"):
    """Boolean ``(N, H_local)`` mask of this rank's entries in the global top-k of each row.

    ``np.nonzero(mask)`` gives the kept (row, local column) pairs; add ``col_offset`` for
    global columns. Summed over ranks, every row holds exactly ``k`` kept entries.
    Collective: every rank of ``comm`` must call it with the same ``k`` and ``method``.
    """
    xp = array_module(Z_local_nh)
    Z = np.ascontiguousarray(to_host(Z_local_nh))
    H_total = comm.allreduce(Z.shape[1])
    if Z.ndim != 2 or not (1 <= k <= H_total):
        raise KsaeError(f"k={k} is not allowed for H={H_total} hidden units; use 1 <= k <= {H_total}")
    if Z.shape[1]:
        check_topk_args(Z, 1)
    if method == "threshold":
        keep = _threshold(Z, k, comm)
    elif method == "gather":
        keep = _gather(Z, k, comm, col_offset)
    else:
        raise KsaeError(f"--topk-dist {method!r} is not allowed; use one of {', '.join(DIST_TOPK_METHODS)}")
    return keep if xp is np else xp.asarray(keep)


def _threshold(Z, k: int, comm):
    from mpi4py import MPI

    N = Z.shape[0]
    keys_nh = order_keys(Z) if Z.shape[1] else np.zeros((N, 0), np.uint32)
    key_type, bits = keys_nh.dtype.type, keys_nh.dtype.itemsize * 8
    rows_n = np.arange(N)
    cand_nh = np.ones(keys_nh.shape, dtype=bool)  # entries still sharing the k-th key's prefix
    kth_n = np.zeros(N, dtype=key_type)
    need_n = np.full(N, k, dtype=np.int64)  # rank of the k-th key among the candidates
    hist_n256 = np.empty((N, 256), dtype=np.int32)
    for shift in range(bits - 8, -1, -8):
        digit_nh = ((keys_nh >> key_type(shift)) & key_type(0xFF)).astype(np.intp)
        r, c = np.nonzero(cand_nh)
        hist_n256[...] = np.bincount(r * 256 + digit_nh[r, c], minlength=N * 256).reshape(N, 256)
        comm.Allreduce(MPI.IN_PLACE, hist_n256, op=MPI.SUM)  # only counts cross the wire
        at_or_above_n256 = np.cumsum(hist_n256[:, ::-1], axis=1)[:, ::-1]
        digit_n = (at_or_above_n256 >= need_n[:, None]).sum(axis=1) - 1
        need_n -= at_or_above_n256[rows_n, digit_n] - hist_n256[rows_n, digit_n]
        kth_n |= digit_n.astype(key_type) << key_type(shift)
        cand_nh &= digit_nh == digit_n[:, None]
    above_nh = keys_nh > kth_n[:, None]
    tie_nh = keys_nh == kth_n[:, None]
    counts_2n = np.stack([above_nh.sum(axis=1), tie_nh.sum(axis=1)]).astype(np.int64)
    above_n = np.empty(N, dtype=np.int64)
    comm.Allreduce(counts_2n[0].copy(), above_n, op=MPI.SUM)
    ties_before_n = np.zeros(N, dtype=np.int64)
    comm.Exscan(counts_2n[1].copy(), ties_before_n, op=MPI.SUM)
    if comm.rank == 0:
        ties_before_n[...] = 0  # MPI leaves rank 0's Exscan result undefined
    ties_wanted_n = k - above_n
    # A tie is kept when fewer than ties_wanted ties precede it in global column order.
    tie_rank_nh = ties_before_n[:, None] + np.cumsum(tie_nh, axis=1)
    return above_nh | (tie_nh & (tie_rank_nh <= ties_wanted_n[:, None]))


def _gather(Z, k: int, comm, col_offset: int):
    N, H_local = Z.shape
    k_local = min(k, H_local)
    if k_local:
        idx_nk, _ = topk_sort(Z, k_local)
        keys_nk = np.take_along_axis(order_keys(Z), idx_nk, axis=1).astype(np.uint64)
        cols_nk = idx_nk.astype(np.int64) + col_offset
    else:
        keys_nk = np.zeros((N, 0), np.uint64)
        cols_nk = np.zeros((N, 0), np.int64)
    parts = comm.allgather((keys_nk, cols_nk))
    keys_nc = np.concatenate([p[0] for p in parts], axis=1)
    cols_nc = np.concatenate([p[1] for p in parts], axis=1)
    # Global rank: key descending, then global column ascending (lexsort: last key is primary).
    order_nc = np.lexsort((cols_nc, ~keys_nc), axis=1)[:, :k]
    win_cols_nk = np.take_along_axis(cols_nc, order_nc, axis=1) - col_offset
    keep = np.zeros((N, H_local), dtype=bool)
    mine = (win_cols_nk >= 0) & (win_cols_nk < H_local)
    rows = np.broadcast_to(np.arange(N)[:, None], win_cols_nk.shape)
    keep[rows[mine], win_cols_nk[mine]] = True
    return keep

"""Global top-k over hidden units split across ranks (section 4.3.3's distributed case).

Rank r holds the columns ``[col_offset, col_offset + H_local)`` of ``Z_nh``; ranks hold
consecutive column blocks in rank order. :func:`sharded_topk` returns which local entries
belong to the *global* top-k under the contract of :mod:`ksae_cupy.topk` (rank by
:func:`~ksae_cupy.topk.order_keys`, exactly k per row, ties to the lower global column),
so the union over ranks is exactly the single-process set.

Both methods first all-gather every rank's block width (one int64 each). Then:

* ``threshold`` -- the iterative threshold with counts only. Per radix digit (8 bits) each
  rank histograms the digit of its surviving candidates per row; the (N, 256) int32
  histograms are summed by one all-reduce and every rank picks the same digit of the k-th
  key from the summed counts. After 4 passes (float32; 8 for float64) every rank knows the
  k-th key per row. Then one all-reduce of per-row counts above it tells how many ties are
  wanted, and an exclusive scan (``MPI_Exscan``) of per-rank tie counts tells each rank how
  many lower-column ties precede its block, so the first ties in global column order are
  kept. Per row: 4 x 1 KiB of counts + 16 B, whatever k and the rank count R; 7 calls.
* ``gather`` -- each rank's local top-min(k, H_local) (key, global column) pairs, both as
  the key's unsigned type (8 B per pair for float32), are all-gathered in one
  ``MPI_Allgatherv``, and every rank selects the global top-k from those candidates (any
  global winner is among its own rank's local winners, ties included, because the local
  tie rule is the global one restricted to a block). Per row: 8 min(k, H_local) B sent,
  8 min(k R, H) B received (about); 2 calls.

Every message is a NumPy buffer, so :mod:`ksae_cupy.parallel.commvolume` gives the bytes exactly
(and the tests check them against the real calls). When each wins, from those formulas
(float32, per row, bytes one rank transmits with bandwidth-optimal algorithms):
threshold about ``8 KiB (R-1)/R``, gather about ``8 (min(kR, H) - k)``. So ``gather`` moves
fewer bytes whenever ``k R < 1024``, and for any k and R when ``H <= 1024`` (at most it
sends whole rows): always at MNIST's H = 1000. ``threshold`` moves fewer bytes only for wide
layers (H > 1024) with ``k R > 1024`` (large alpha*k at encoding time, many ranks); it
also avoids the gather's merge of up to ``k R`` candidates per row, but pays 7 rounds of
latency against 2. Measured (``ksae-bench dist``, N=128, H=1000, 2-3 ranks on a shared
2-core CPU, shared-memory MPICH, ms per call over three runs): k=25, threshold 6-28,
gather 1.4-9; k=250, threshold 8-29, gather 13-59. Through shared memory bytes are cheap
and the gather's cost grows with k (local top-k, merge of kR candidates), so there gather
wins at the paper's k and threshold at large k; on a network the bytes and the rounds
would count more (not measured).

Works on host (NumPy) arrays; CuPy input is copied to the host and back.
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.backend import array_module, to_host
from ksae_cupy.errors import KsaeError, OptionError, literal
from ksae_cupy.topk import order_keys, topk_sort

DIST_TOPK_METHODS = ("threshold", "gather")


def sharded_topk(Z_local_nh, k: int, comm, col_offset: int, method: str = "threshold"):
    """Boolean ``(N, H_local)`` mask of this rank's entries in the global top-k of each row.

    ``np.nonzero(mask)`` gives the kept (row, local column) pairs; add ``col_offset`` for
    global columns. Summed over ranks, every row holds exactly ``k`` kept entries.
    Collective: every rank of ``comm`` must call it with the same ``k`` and ``method``.
    Every message is a NumPy buffer (no pickling), so the bytes sent are exactly those
    :func:`ksae_cupy.parallel.commvolume.topk_volume` computes.
    """
    xp = array_module(Z_local_nh)
    Z = np.ascontiguousarray(to_host(Z_local_nh))
    if Z.ndim != 2 or np.dtype(Z.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise KsaeError(f"sharded top-k expects a 2-D float32 or float64 array; got {Z.dtype} of shape {Z.shape}")
    H_r = block_sizes(comm, Z.shape[1])
    H_total = int(H_r.sum())
    if not 1 <= k <= H_total:
        raise KsaeError(f"k={k} is not allowed for H={H_total} hidden units; use 1 <= k <= {H_total}")
    if method == "threshold":
        keep = _threshold(Z, k, comm)
    elif method == "gather":
        keep = _gather(Z, k, comm, col_offset, H_r)
    else:
        raise OptionError("topk_dist", f"{{name}} {literal(repr(method))} is not allowed; use one of "
                                       f"{', '.join(DIST_TOPK_METHODS)}")
    return keep if xp is np else xp.asarray(keep)


def block_sizes(comm, H_local: int) -> np.ndarray:
    """Every rank's number of columns, in rank order (one all-gather of one int64 each)."""
    H_r = np.empty(comm.size, dtype=np.int64)
    comm.Allgather(np.array([H_local], dtype=np.int64), H_r)
    return H_r


def _threshold(Z, k: int, comm):
    from mpi4py import MPI

    N = Z.shape[0]
    keys_nh = order_keys(Z)  # also for an empty block: the key type must match the other ranks'
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


def _gather(Z, k: int, comm, col_offset: int, H_r: np.ndarray):
    N, H_local = Z.shape
    keys_nh = order_keys(Z)
    key_type = keys_nh.dtype
    k_r = np.minimum(k, H_r)  # candidates per row from each rank
    k_local = int(k_r[comm.rank])
    # (key, global column) pairs, both in the key's unsigned type (columns fit: H < 2^32),
    # so one buffer and one round carry them.
    mine_nk2 = np.empty((N, k_local, 2), dtype=key_type)
    if k_local:
        idx_nk, _ = topk_sort(Z, k_local)
        idx_nk = idx_nk.astype(np.int64)
        mine_nk2[..., 0] = np.take_along_axis(keys_nh, idx_nk, axis=1)
        mine_nk2[..., 1] = idx_nk + col_offset
    counts_r = N * k_r * 2
    displs_r = np.concatenate([[0], np.cumsum(counts_r)[:-1]])
    all_flat = np.empty(int(counts_r.sum()), dtype=key_type)
    comm.Allgatherv(mine_nk2, [all_flat, (counts_r, displs_r)])
    blocks = [all_flat[d:d + c].reshape(N, kr, 2) for d, c, kr in zip(displs_r, counts_r, k_r)]
    pairs_nc2 = np.concatenate(blocks, axis=1)
    keys_nc, cols_nc = pairs_nc2[..., 0], pairs_nc2[..., 1].astype(np.int64)
    # Global rank: key descending, then global column ascending (lexsort: last key is primary).
    order_nc = np.lexsort((cols_nc, ~keys_nc), axis=1)[:, :k]
    win_cols_nk = np.take_along_axis(cols_nc, order_nc, axis=1) - col_offset
    keep = np.zeros((N, H_local), dtype=bool)
    mine = (win_cols_nk >= 0) & (win_cols_nk < H_local)
    rows = np.broadcast_to(np.arange(N)[:, None], win_cols_nk.shape)
    keep[rows[mine], win_cols_nk[mine]] = True
    return keep

"""The encoder product from each example's non-zero inputs: ``Z_nh = X_nd W_dh + b_h`` with ``X`` in CSR form.

MNIST is 19% non-zero: BLAS's ``X W`` spends four fifths of its multiply-adds on zeros. Here each
example's non-zero inputs ``(d, x_nd)`` add ``x_nd * W_dh[d]`` to its code, one tile of
:data:`TILE` hidden units at a time, so the tile's rows of ``W`` stay in cache while every example
of the batch uses them. The sparse step stores ``W`` by hidden unit (``W_dh`` in Fortran order,
see :func:`ksae_cupy.sparse_step.sparse_layout`); each tile is first copied into a ``(D, TILE)``
buffer by input dimension, in 16 x 16 blocks (for all of ``W``, 0.2-0.26 ms per step measured on the
shared machine: a small part of the product; BLAS packs its tiles of ``W`` likewise).

The inputs are put in CSR form once per run and set (:class:`SparseInputs`); a minibatch is a set of
row ids into it (:class:`InputRows`), so no batch is converted. :class:`RunInputs` is what a trainer
keeps: it builds a set's CSR on first use, or declines a set too dense for this to pay
(:data:`MAX_DENSITY`); the step then keeps BLAS's product.

Order: every ``Z_nh[n, h]`` is the sum over row n's non-zero inputs in increasing ``d``, one fused
multiply-add at a time, then ``+ b_h[h]``; nothing of it depends on the tile, the passes, or on who
computes it. Lanes
(:mod:`ksae_cupy.cpu.lanes`) each own whole tiles of units: the same bits at any lane count (tested).
It differs from BLAS's product by float rounding only (BLAS sums in its own order).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ksae_cupy.cpu import numba_kernels as kernels
from ksae_cupy.cpu.numba_kernels import _compiled, _helper, _kernel
from ksae_cupy.cpu.register_block import BLOCK
from ksae_cupy.errors import KsaeError, literal

register_block = None  # ksae_cupy.cpu.register_block's, bound by _compiled before a kernel here is compiled

# Hidden units per tile: one register block of sums. (Measured on MNIST batches, N = 128, H = 1000, with the
# sums in memory: 96 to 256 within noise of each other, 32 and 64 slower: every tile walks each example's
# non-zeros again.) The result does not depend on it. Written out here, not taken from register_block.py:
# Numba's disk cache of the kernel below knows only this file's changes.
TILE = 128
if TILE != BLOCK:
    raise RuntimeError(f"sparse_encoder.TILE {TILE} must equal register_block.BLOCK {BLOCK}: change both")
# Input dimensions per pass over a group of examples, and examples per group: 64 rows of a float32 tile are
# 32 KB, the group's sums 8 KB. Measured on MNIST batches (one thread, interleaved, a loaded machine): X W
# from the non-zeros, against the sums in memory and no passes, in 0.75-0.79 of the time at 32-64
# dimensions per pass over all 128 examples, 0.82 at 96, 0.83 with the sums in registers but no passes;
# then groups of 16 examples with 64 dimensions in 0.90-0.93 of the time of all examples with 48 (groups of
# 8-32, 48-96 dimensions: 0.92-1.02). The result depends on neither.
DIMS_PER_PASS = 64
EXAMPLES_PER_GROUP = 16
_BLOCK = 16  # the copy of a tile by input dimension goes in BLOCK x BLOCK blocks (0.26 ms for all of W
# against 0.51 ms row by row, measured)

# The sparse encoder is chosen where the inputs' fraction of non-zeros is at most this. Measured on the
# 2-core AMD EPYC (Zen 4) machine, N = 128, D = 784, H = 1000, random inputs of each density, X W + b from
# the non-zeros over BLAS's (interleaved medians; the machine shared, load average 7-11):
#   one thread:                  0.44 at 10% non-zero, 0.65 at 20%, 1.06 at 30%, 1.30 at 40%
#   two lanes (BLAS in lanes):   0.51 at 10%, 0.77 at 20%, 0.89 at 30%, 1.16 at 40%
#   MNIST batches (19%):         0.62 on one thread, 0.66 in two lanes
# and again with `ksae-bench train` (its "density_sweep";
# results/benchmarks/train-cpu-20261127T22*-shared-machine.json):
#   one thread:  0.44 at 10%, 0.65 at 20%, 0.83 at 30%, 1.01 at 40%;  two lanes: 0.42, 0.75, 0.92, 1.12
# so it wins below 30-40%; 0.25 keeps a margin for a loaded machine's noise.
MAX_DENSITY = 0.25

ENCODERS = ("dense", "sparse", "auto")


def chosen_encoder() -> str:
    """The encoder setting of this process: ``KSAE_ENCODER`` (``dense``, ``sparse`` or ``auto``, the default).
    ``dense`` keeps BLAS's product everywhere; ``sparse`` takes this one whatever the density (to time it)."""
    setting = os.environ.get("KSAE_ENCODER", "auto")
    if setting not in ENCODERS:
        raise KsaeError(f"KSAE_ENCODER {literal(repr(setting))} is not allowed; use one of {', '.join(ENCODERS)}")
    return setting


def takes_sparse_encoder(density: float, setting: str = "auto") -> bool:
    """Whether inputs with this fraction of non-zeros are encoded from their non-zeros, under ``setting``."""
    if setting not in ENCODERS:
        raise KsaeError(f"encoder {literal(repr(setting))} is not allowed; use one of {', '.join(ENCODERS)}")
    return setting == "sparse" or (setting == "auto" and density <= MAX_DENSITY)


@_kernel(parallel=False)
def _count_nonzeros(X_nd, count_n):
    for n in range(X_nd.shape[0]):
        c = 0
        for d in range(X_nd.shape[1]):
            if X_nd[n, d] != 0:
                c += 1
        count_n[n] = c


@_kernel(parallel=False)
def _fill_csr(X_nd, indptr_n, indices_z, values_z):
    for n in range(X_nd.shape[0]):
        p = indptr_n[n]
        for d in range(X_nd.shape[1]):
            if X_nd[n, d] != 0:
                indices_z[p] = d
                values_z[p] = X_nd[n, d]
                p += 1


def nonzeros_per_row(X_nd):
    """How many non-zero inputs each row of ``X_nd`` holds (one pass, nothing else built)."""
    count_n = np.empty(X_nd.shape[0], dtype=np.int64)
    _compiled(_count_nonzeros)(np.ascontiguousarray(X_nd), count_n)
    return count_n


class SparseInputs:
    """A whole ``(N, D)`` set's non-zero inputs in CSR form: row n's are ``indices_z[indptr_n[n]:indptr_n[n + 1]]``
    (increasing) with values ``values_z[...]``. Built once per set (:meth:`of`), read by row ids."""

    def __init__(self, indptr_n, indices_z, values_z, shape):
        self.indptr_n, self.indices_z, self.values_z, self.shape = indptr_n, indices_z, values_z, shape

    @classmethod
    def of(cls, X_nd, count_n=None) -> SparseInputs:
        """The CSR form of the host array ``X_nd`` (any float dtype; NaN counts as non-zero);
        ``count_n``: its rows' counts of non-zeros, when :func:`nonzeros_per_row` already counted them."""
        X_nd = np.ascontiguousarray(X_nd)
        count_n = nonzeros_per_row(X_nd) if count_n is None else count_n
        indptr_n = np.zeros(X_nd.shape[0] + 1, dtype=np.int64)
        np.cumsum(count_n, out=indptr_n[1:])
        indices_z = np.empty(int(indptr_n[-1]), dtype=np.int32)
        values_z = np.empty(int(indptr_n[-1]), dtype=X_nd.dtype)
        _compiled(_fill_csr)(X_nd, indptr_n, indices_z, values_z)
        return cls(indptr_n, indices_z, values_z, X_nd.shape)

    @property
    def density(self) -> float:
        """The fraction of non-zero inputs."""
        return self.values_z.shape[0] / max(1, self.shape[0] * self.shape[1])

    def rows(self, row_ids) -> InputRows:
        """The examples ``row_ids`` of this set (a minibatch, or a chunk of the validation set)."""
        return InputRows(self, np.ascontiguousarray(row_ids, dtype=np.int64))


@dataclass(frozen=True)
class InputRows:
    """Examples ``row_ids`` of a :class:`SparseInputs`: what the sparse step takes beside the dense rows."""

    inputs: SparseInputs
    row_ids: np.ndarray


class RunInputs:
    """What a trainer keeps: each input set's CSR form, built the first time the set is encoded.

    :meth:`of` returns the set's :class:`SparseInputs`, or None where BLAS's product stays (the set is
    denser than :data:`MAX_DENSITY`, ``KSAE_ENCODER=dense``, not of the parameters' dtype, or ``applies``
    is False: not a NumPy trainer of the sparse step).
    Sets are known by identity (the training and validation arrays a run passes every epoch): the last
    training set, and the last two sets evaluated (``role`` ``evaluation``: the validation set, and
    another a caller evaluates now and then, such as the progress estimate's sample). A set changed
    in place after its first use is not seen: the arrays of a run are fixed.
    """

    KEEP = {"training": 1, "evaluation": 2}

    def __init__(self, applies: bool):
        self.applies = applies
        self._known = {role: [] for role in self.KEEP}  # role -> [(array, SparseInputs or None)], most recent last

    def of(self, X_nd, dtype, role: str = "training") -> SparseInputs | None:
        """``X_nd``'s CSR form (built on its first call), or None: BLAS's product for this set."""
        if not self.applies or not isinstance(X_nd, np.ndarray) or X_nd.ndim != 2 or X_nd.dtype != dtype:
            return None
        known = self._known[role]
        for i, (array, inputs) in enumerate(known):
            if array is X_nd:
                known.append(known.pop(i))
                return inputs
        setting = chosen_encoder()
        inputs = None
        if setting != "dense":
            count_n = nonzeros_per_row(X_nd)  # the density first: a dense set's CSR is never built
            if takes_sparse_encoder(int(count_n.sum()) / max(1, X_nd.size), setting):
                inputs = SparseInputs.of(X_nd, count_n)
        known.append((X_nd, inputs))
        del known[:-self.KEEP[role]]
        return inputs


@_kernel(fastmath={"contract"}, parallel=False)
def _encode_tiles(indptr_n, indices_z, values_z, row_ids, W_hd, b_h, Z_bh, tile_start, tile_stop):
    """``Z_bh[i, tile] = sum over row_ids[i]'s non-zeros (d, x) of x W[d, tile] + b[tile]`` for the tiles
    ``[tile_start, tile_stop)`` of :data:`TILE` units. ``W_hd``: one row per hidden unit, any layout."""
    H, D = W_hd.shape
    B = row_ids.shape[0]
    Wt_dt = np.empty((D, TILE), dtype=W_hd.dtype)  # the tile by input dimension (columns past H: zero)
    sums_bt = np.empty((B, TILE), dtype=W_hd.dtype)  # each example's sums so far, between passes
    next_b = np.empty(B, dtype=np.int64)  # each example's first non-zero not yet added
    for tile in range(tile_start, tile_stop):
        h0 = tile * TILE
        width = min(H, h0 + TILE) - h0
        _copy_tile(W_hd, Wt_dt, h0, width)
        if width < TILE:  # the last tile: its columns past H are added into sums never written out
            Wt_dt[:, width:] = 0
        for i in range(B):
            next_b[i] = indptr_n[row_ids[i]]
            sums_bt[i, :] = 0
        # A group of examples at a time, in one pass per DIMS_PER_PASS input dimensions: those rows of the tile
        # and the group's sums stay in the core's first caches while each example of the group adds its
        # non-zeros among them, its sums held in registers.
        for group_start in range(0, B, EXAMPLES_PER_GROUP):
            group_stop = min(B, group_start + EXAMPLES_PER_GROUP)
            for d_stop in range(DIMS_PER_PASS, D + DIMS_PER_PASS, DIMS_PER_PASS):
                _add_pass(indices_z, values_z, row_ids, indptr_n, Wt_dt, sums_bt, next_b, group_start, group_stop,
                          d_stop)
        for i in range(B):
            for t in range(width):
                Z_bh[i, h0 + t] = sums_bt[i, t] + b_h[h0 + t]


@_helper
def _add_pass(indices_z, values_z, row_ids, indptr_n, Wt_dt, sums_bt, next_b, group_start, group_stop, d_stop):
    """Each example ``i`` of ``[group_start, group_stop)`` adds its next non-zero inputs below ``d_stop`` to its
    sums ``sums_bt[i]``, held in a register block meanwhile; ``next_b[i]`` moves past them."""
    for i in range(group_start, group_stop):
        p = next_b[i]
        stop = indptr_n[row_ids[i] + 1]
        if p == stop or indices_z[p] >= d_stop:
            continue
        sums_t = sums_bt[i]
        acc_t = register_block(sums_t[0])
        for t in range(TILE):
            acc_t[t] = sums_t[t]
        # Unsigned positions: Numba's negative-index wraparound is then no instruction of this innermost loop.
        q = np.uint64(p)
        q_stop = np.uint64(stop)
        while q < q_stop and indices_z[q] < d_stop:
            x = values_z[q]
            w_t = Wt_dt[np.uint64(indices_z[q])]
            for t in range(TILE):
                acc_t[t] += x * w_t[t]
            q += np.uint64(1)
        p = np.int64(q)
        for t in range(TILE):
            sums_t[t] = acc_t[t]
        next_b[i] = p


@_helper
def _copy_tile(W_hd, Wt_dt, h0, width):
    """``Wt_dt[d, t] = W_hd[h0 + t, d]`` for ``t < width``: in BLOCK x BLOCK blocks, each read and written in cache."""
    D = W_hd.shape[1]
    full_t = width - width % _BLOCK
    full_d = D - D % _BLOCK
    for t0 in range(0, full_t, _BLOCK):
        for d0 in range(0, full_d, _BLOCK):
            for dd in range(_BLOCK):
                for tt in range(_BLOCK):
                    Wt_dt[d0 + dd, t0 + tt] = W_hd[h0 + t0 + tt, d0 + dd]
        for d in range(full_d, D):
            for tt in range(_BLOCK):
                Wt_dt[d, t0 + tt] = W_hd[h0 + t0 + tt, d]
    for t in range(full_t, width):
        for d in range(D):
            Wt_dt[d, t] = W_hd[h0 + t, d]


def encode_rows(X_rows: InputRows, W_dh, b_h, lanes: int = 1):
    """``Z_nh = X W_dh + b_h`` for the examples ``X_rows`` from their non-zero inputs, in ``lanes`` lanes
    sharing whole tiles of units. ``W_dh`` in Fortran order (the sparse step's) or C order."""
    inputs, row_ids = X_rows.inputs, X_rows.row_ids
    H = W_dh.shape[1]
    if W_dh.shape[0] != inputs.shape[1]:
        raise ValueError(f"W_dh has {W_dh.shape[0]} input rows; the inputs have {inputs.shape[1]} dimensions")
    if inputs.values_z.dtype != W_dh.dtype:
        raise ValueError(f"the inputs are {inputs.values_z.dtype}, W_dh is {W_dh.dtype}: use one dtype")
    Z_nh = np.empty((row_ids.shape[0], H), dtype=W_dh.dtype)
    args = (inputs.indptr_n, inputs.indices_z, inputs.values_z, row_ids, W_dh.T, b_h, Z_nh)
    kernel = _compiled(_encode_tiles, serial=True)
    tiles = -(-H // TILE)
    if lanes == 1:
        kernel(*args, 0, tiles)
    else:
        from ksae_cupy.cpu.lanes import lanes as lanes_of, share

        lanes_of(lanes).run(lambda lane: kernel(*args, *share(lane, lanes, tiles)))
    return Z_nh


def _check_same_examples(X_rows: InputRows, X_nd) -> None:
    if X_rows.row_ids.shape[0] != X_nd.shape[0]:
        raise ValueError(f"X_rows holds {X_rows.row_ids.shape[0]} examples, X_nd {X_nd.shape[0]}: "
                         f"the same ones are needed")


def encode_select_decode_and_backprop(X_rows: InputRows, W_dh, b_h, c_d, X_nd, k: int, descending: bool, relu: bool,
                                      lanes: int = 1):
    """:func:`ksae_cupy.cpu.numba_kernels.encode_select_decode_and_backprop` with ``X W + b`` from the non-zero
    inputs: ``(loss, idx_nk, val_nk, R_nd, dZ_nk)``. ``X_rows`` are the examples of ``X_nd`` (the decoder's
    residual reads the dense rows)."""
    _check_same_examples(X_rows, X_nd)
    Z_nh = encode_rows(X_rows, W_dh, b_h, lanes)
    return kernels.select_decode_and_backprop(Z_nh, k, descending, np.ascontiguousarray(W_dh.T), c_d, X_nd, relu,
                                              lanes)


def encode_and_reconstruction_error(X_rows: InputRows, W_dh, b_h, c_d, X_nd, k: int, descending: bool, relu: bool,
                                    lanes: int = 1) -> float:
    """:func:`ksae_cupy.cpu.numba_kernels.encode_and_reconstruction_error` (the validation loss's sum) with
    ``X W + b`` from the non-zero inputs of ``X_rows``, the examples of ``X_nd``."""
    _check_same_examples(X_rows, X_nd)
    Z_nh = encode_rows(X_rows, W_dh, b_h, lanes)
    return kernels.select_and_reconstruction_error(Z_nh, k, descending, np.ascontiguousarray(W_dh.T), c_d, X_nd, relu,
                                                   lanes)

"""Batched top-k selection: the k largest entries of every row of ``Z_nh``.

The contract shared by every implementation (these NumPy ones, and the CUDA kernels in
``kernels/`` that must match them bit for bit):

* input ``Z_nh`` float32 (float64 accepted for gradient checks), ``1 <= k <= H``;
* output ``idx_nk`` (int32) and ``val_nk`` (same dtype as ``Z_nh``), exactly ``k`` per row;
* values are ranked by their *order-preserving integer keys* (:func:`order_keys`): so
  ``-0.0`` ranks just below ``+0.0``, and every NaN ranks below ``-inf``;
* among equal keys the lower column index wins, so all implementations keep the same set.

Two algorithms, the two the paper names (section 4.3.3):

* :func:`topk_sort` -- selection by sorting. Rows come back in descending order
  (ties in ascending index order).
* :func:`topk_threshold` -- iterative threshold: the k-th key of each row is found by
  refining a threshold one radix digit (8 bits) at a time, counting the survivors of each
  candidate digit; then the survivors are emitted, plus the first remaining ties in index
  order. Only counts are ever compared, which is why it suits parallel and distributed
  use. Rows come back in ascending index order.

Both are written against the array module of their input, so they run on NumPy arrays
and, unchanged, on CuPy arrays (the fallback until the CUDA kernels are used).
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.backend import array_module
from ksae_cupy.errors import KsaeError, OptionError, literal

TOPK_METHODS = ("sort", "threshold")

# Unsigned key type and bit width for each supported float type.
_KEY_TYPES = {np.dtype(np.float32): (np.uint32, 32), np.dtype(np.float64): (np.uint64, 64)}


def check_topk_args(Z_nh, k: int) -> None:
    """Validate the shared contract's inputs; raise :class:`KsaeError` naming the bad value."""
    if Z_nh.ndim != 2:
        raise KsaeError(f"top-k expects a 2-D array (N, H); got shape {tuple(Z_nh.shape)}")
    if np.dtype(Z_nh.dtype) not in _KEY_TYPES:
        raise KsaeError(f"top-k expects float32 or float64; got {Z_nh.dtype}")
    H = Z_nh.shape[1]
    if not (1 <= int(k) <= H):
        raise KsaeError(f"k={k} is not allowed for H={H} hidden units; use 1 <= k <= {H}")


def order_keys(Z_nh):
    """Map floats to unsigned integers whose order is the contract's ranking.

    Positive floats get their sign bit set; negative floats have all bits flipped; NaN
    maps to 0, below the key of -inf. Works on NumPy and CuPy arrays.
    """
    xp = array_module(Z_nh)
    key_type, bits = _KEY_TYPES[np.dtype(Z_nh.dtype)]
    signed_type = np.int32 if bits == 32 else np.int64
    signed = xp.ascontiguousarray(Z_nh).view(signed_type)
    # Arithmetic shift: all ones for negatives, zero otherwise; then force the sign bit.
    flip = (signed >> signed_type(bits - 1)).view(key_type) | key_type(1 << (bits - 1))
    keys = signed.view(key_type) ^ flip
    nan = xp.isnan(Z_nh)
    if bool(nan.any()):
        keys[nan] = 0
    return keys


def emit_at_threshold(keys_nh, kth_n, k: int):
    """Columns of the k kept entries per row, in ascending index order.

    Keeps every key above the row's k-th key ``kth_n`` and then the first ties at
    ``kth_n`` in column order until the row holds exactly ``k``.
    """
    xp = array_module(keys_nh)
    N = keys_nh.shape[0]
    keep_nh = keys_nh >= kth_n[:, None]
    if int(xp.count_nonzero(keep_nh)) != N * k:
        # Some row has more ties at its threshold than places left: keep the first ones.
        tie_nh = keys_nh == kth_n[:, None]
        ties_wanted_n = k - (keys_nh > kth_n[:, None]).sum(axis=1)
        keep_nh &= ~tie_nh | (xp.cumsum(tie_nh, axis=1) <= ties_wanted_n[:, None])
    # Flat positions then ``% H``: several times faster than 2-D ``nonzero`` on NumPy.
    return (xp.flatnonzero(keep_nh) % keys_nh.shape[1]).reshape(N, k).astype(np.int32)


def topk_sort(Z_nh, k: int):
    """Top-k by sorting: ``(idx_nk int32, val_nk)``, each row in descending order.

    The k-th largest key of each row is selected by partitioning (introselect, a
    partial quicksort), the kept set is emitted at that threshold, and the k kept
    entries are then sorted (ties stay in ascending column order).
    """
    check_topk_args(Z_nh, k)
    xp = array_module(Z_nh)
    H = Z_nh.shape[1]
    keys_nh = order_keys(Z_nh)
    kth_n = xp.partition(keys_nh, H - k, axis=1)[:, H - k]
    idx_nk = emit_at_threshold(keys_nh, kth_n, k)
    kept_keys_nk = xp.take_along_axis(keys_nh, idx_nk, axis=1)
    order_nk = xp.argsort(~kept_keys_nk, axis=1, kind="stable")
    idx_nk = xp.ascontiguousarray(xp.take_along_axis(idx_nk, order_nk, axis=1))
    return idx_nk, xp.take_along_axis(Z_nh, idx_nk, axis=1)


def kth_key_by_radix(keys_nh, k: int):
    """Per row, the k-th largest key, found 8 bits at a time by counting survivors.

    Each pass histograms the next digit of the row's remaining candidates, picks the
    digit bin that holds the k-th key from the counts alone, and keeps only the
    candidates in that bin, so later passes touch few entries.
    """
    xp = array_module(keys_nh)
    N, H = keys_nh.shape
    key_type = keys_nh.dtype.type
    bits = keys_nh.dtype.itemsize * 8
    rows_n = xp.arange(N)
    cand_keys = keys_nh.ravel()  # candidates of all rows, flattened
    cand_rows = xp.repeat(rows_n, H)  # the row of each candidate
    kth_n = xp.zeros(N, dtype=key_type)  # digits of the k-th key found so far
    need_n = xp.full(N, k, dtype=np.int64)  # rank of the k-th key among the candidates
    for shift in range(bits - 8, -1, -8):
        digit = ((cand_keys >> key_type(shift)) & key_type(0xFF)).astype(np.intp)
        hist_n256 = xp.bincount(cand_rows * 256 + digit, minlength=N * 256).reshape(N, 256)
        # Candidates at or above each digit value, counted from the top digit down.
        at_or_above_n256 = xp.cumsum(hist_n256[:, ::-1], axis=1)[:, ::-1]
        # The k-th key's digit is the largest d with at_or_above[d] >= need.
        digit_n = (at_or_above_n256 >= need_n[:, None]).sum(axis=1) - 1
        need_n -= at_or_above_n256[rows_n, digit_n] - hist_n256[rows_n, digit_n]
        kth_n |= digit_n.astype(key_type) << key_type(shift)
        in_bin = digit == digit_n[cand_rows]
        cand_keys, cand_rows = cand_keys[in_bin], cand_rows[in_bin]
    return kth_n


def topk_threshold(Z_nh, k: int):
    """Top-k by iterative threshold: ``(idx_nk int32, val_nk)``, rows in ascending index order."""
    check_topk_args(Z_nh, k)
    xp = array_module(Z_nh)
    keys_nh = order_keys(Z_nh)
    idx_nk = emit_at_threshold(keys_nh, kth_key_by_radix(keys_nh, k), k)
    return idx_nk, xp.take_along_axis(Z_nh, idx_nk, axis=1)


def topk(Z_nh, k: int, method: str = "sort"):
    """Dispatch to one implementation by name (``sort`` or ``threshold``).

    CuPy arrays go to the CUDA kernels of :mod:`ksae_cupy.gpu.cuda_kernels` (same contract, same sets).
    """
    if array_module(Z_nh) is not np:
        from ksae_cupy.gpu.cuda_kernels import topk_gpu

        return topk_gpu(Z_nh, k, method)
    if method == "sort":
        return topk_sort(Z_nh, k)
    if method == "threshold":
        return topk_threshold(Z_nh, k)
    raise OptionError("topk", f"{{name}} {literal(repr(method))} is not allowed; use one of {', '.join(TOPK_METHODS)}")


def scatter_rows(idx_nk, val_nk, H: int):
    """Dense ``(N, H)`` array holding ``val_nk`` at ``idx_nk`` and zeros elsewhere."""
    xp = array_module(val_nk)
    out_nh = xp.zeros((val_nk.shape[0], H), dtype=val_nk.dtype)
    out_nh[xp.arange(val_nk.shape[0])[:, None], idx_nk] = val_nk
    return out_nh

"""The features of section 4.5, ``supp_{alpha k}(W^T x + b)``: the largest units of every row, encoded once
and cut to each alpha's ``alpha * k`` columns, as the matrix the classifier reads (CSR on the CPU)."""
from __future__ import annotations

import threading

import numpy as np
from threadpoolctl import threadpool_limits

from ksae_cupy.backend import CPU, Backend, array_module
from ksae_cupy.errors import KsaeError
from ksae_cupy.model import alpha_k, hidden_preactivations, select_units

# On the CPU the encoder's product X W is made in pieces of this many rows, each by one BLAS call on one
# thread, and the lanes (threads) share out whole pieces. A row's features are then the same bits at every
# thread count: OpenBLAS on several threads adds a row's products in another order, and even on one thread
# a row's bits depend on the rows around it in the call (ksae-eval of mnist-k25-5000 gave 1.84% on one
# thread and 1.89% on two when the BLAS threads made X W).
ROWS_PER_PIECE = 1000


def top_units(params, X_nd, kept: int, topk_method: str = "sort", backend: Backend = CPU, batch: int = 10_000,
              activation: str = "linear", lanes: int = 1):
    """``(idx_nk, val_nk)``: the ``kept`` largest units of every row of host ``X_nd`` (after
    ``activation``), each row in descending order of value (ties: ascending unit), on ``backend``.

    The first ``m`` columns are then the ``m`` largest units: one encoding serves every alpha.
    On the CPU, ``lanes`` threads share the rows in pieces of :data:`ROWS_PER_PIECE`, with BLAS on one
    thread: the same bits at any ``lanes`` (``batch`` is the GPU's batch of rows).
    """
    if not backend.is_gpu:
        return _top_units_in_pieces(params, X_nd, kept, topk_method, activation, lanes)
    dev_params = {name: backend.asarray(value) for name, value in params.items()}
    idx_parts, val_parts = [], []
    for start in range(0, len(X_nd), batch):
        X_part = backend.asarray(X_nd[start:start + batch], dtype=dev_params["W_dh"].dtype)
        idx_nk, val_nk = _descending_top(dev_params, X_part, kept, topk_method, activation)
        idx_parts.append(idx_nk)
        val_parts.append(val_nk)
    return backend.xp.concatenate(idx_parts), backend.xp.concatenate(val_parts)


def _top_units_in_pieces(params, X_nd, kept: int, topk_method: str, activation: str, lanes: int):
    """:func:`top_units` on the CPU: lane ``l`` encodes its contiguous share of the row pieces, each piece one
    single-threaded BLAS call, so no row's sums depend on the lane count."""
    from concurrent.futures import ThreadPoolExecutor

    from ksae_cupy.cpu.lanes import share

    if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1:
        raise KsaeError(f"lanes={lanes!r} is not allowed; use a positive number of threads")
    N = len(X_nd)
    n_pieces = max(1, -(-N // ROWS_PER_PIECE))
    n_lanes = min(lanes, n_pieces)
    dtype = params["W_dh"].dtype
    parts: list = [None] * n_pieces

    def encode_share(lane: int) -> None:
        for piece in range(*share(lane, n_lanes, n_pieces)):
            rows = slice(piece * ROWS_PER_PIECE, (piece + 1) * ROWS_PER_PIECE)
            parts[piece] = _descending_top(params, np.asarray(X_nd[rows], dtype=dtype), kept, topk_method, activation)

    with threadpool_limits(limits=1, user_api="blas"):
        if n_lanes == 1:
            encode_share(0)
        else:
            with ThreadPoolExecutor(max_workers=n_lanes, thread_name_prefix="ksae-encode") as pool:
                list(pool.map(encode_share, range(n_lanes)))  # list(): a lane's exception is raised here
    return np.concatenate([idx for idx, _ in parts]), np.concatenate([val for _, val in parts])


def _descending_top(params, X_nd, kept: int, topk_method: str, activation: str):
    """The ``kept`` largest units of each row of ``X_nd`` (on the parameters' array module), in descending
    order of value (ties: ascending unit)."""
    xp = array_module(params["W_dh"])
    idx_nk, val_nk = select_units(hidden_preactivations(params, X_nd), kept, topk_method, activation)
    if topk_method != "sort" or activation != "linear":  # rows not yet in descending order of value
        by_unit_nk = xp.argsort(idx_nk, axis=1)
        idx_nk, val_nk = (xp.take_along_axis(a_nk, by_unit_nk, axis=1) for a_nk in (idx_nk, val_nk))
        stable = {"kind": "stable"} if xp is np else {}  # CuPy's sort is always stable
        by_value_nk = xp.argsort(-val_nk, axis=1, **stable)
        idx_nk, val_nk = (xp.take_along_axis(a_nk, by_value_nk, axis=1) for a_nk in (idx_nk, val_nk))
    return idx_nk, val_nk


def codes_matrix(idx_nk, val_nk, kept: int, H: int, backend: Backend = CPU):
    """The codes of the first ``kept`` columns of :func:`top_units`' rows, as an ``(N, H)`` matrix: a
    ``scipy.sparse.csr_matrix`` on the CPU (the classifier's products then cost O(kept) per row,
    not O(H)), a dense CuPy array on a GPU."""
    idx_nk, val_nk = idx_nk[:, :kept], val_nk[:, :kept]
    if backend.is_gpu:
        from ksae_cupy.topk import scatter_rows

        return scatter_rows(idx_nk, val_nk, H)
    import scipy.sparse as sp

    N = len(idx_nk)
    # Every row holds exactly `kept` entries, so the row pointers are a plain range.
    return sp.csr_matrix((np.ascontiguousarray(val_nk).ravel(), np.ascontiguousarray(idx_nk).ravel(),
                          np.arange(0, N * kept + 1, kept)), shape=(N, H))


def sparse_features(params, X_nd, k: int, alpha: float = 1.0, topk_method: str = "sort",
                    backend: Backend = CPU, batch: int = 10_000, activation: str = "linear"):
    """``supp_{alpha k}(W^T x + b)`` for every row of host ``X_nd``, in batches.

    Same values as :func:`ksae_cupy.model.encode`; on the CPU they come back as a
    ``scipy.sparse.csr_matrix``, on a GPU as a dense CuPy array (:func:`codes_matrix`).
    """
    H = params["W_dh"].shape[1]
    kept = alpha_k(k, alpha, H)
    return codes_matrix(*top_units(params, X_nd, kept, topk_method, backend, batch, activation), kept, H, backend)


class CodesByAlpha:
    """``encode(alpha, X_nd)`` for every alpha of ``alphas`` from one encoding of each data split.

    The largest alpha's units are found once per split (the matrix product and the top-k are
    most of an encoding's time) and each alpha's codes are its first alpha*k columns. ``lanes``:
    threads that share an encoding on the CPU (:func:`top_units`; the same bits at any count).
    """

    def __init__(self, params, k: int, alphas, topk_method: str = "sort", backend: Backend = CPU,
                 activation: str = "linear", lanes: int = 1):
        self.params, self.k, self.backend, self.lanes = params, k, backend, lanes
        self.topk_method, self.activation = topk_method, activation
        self.H = params["W_dh"].shape[1]
        self.kept_max = max(alpha_k(k, alpha, self.H) for alpha in alphas)
        self._tops: dict = {}  # id(X_nd) -> (X_nd, (idx_nk, val_nk)); X_nd held so its id stays its own
        self._lock = threading.Lock()

    def __call__(self, alpha, X_nd):
        # Fits side by side wait for one encoding (the lock in top), not make their own.
        return codes_matrix(*self.top(X_nd), alpha_k(self.k, alpha, self.H), self.H, self.backend)

    def top(self, X_nd):
        """``(idx_nK, val_nK)`` of :func:`top_units` for the largest alpha: the encoding of ``X_nd`` kept for the
        fits (made now if there is none), which the reconstruction metrics read too."""
        with self._lock:
            entry = self._tops.get(id(X_nd))
            if entry is None or entry[0] is not X_nd:
                entry = X_nd, top_units(self.params, X_nd, self.kept_max, self.topk_method, self.backend,
                                        activation=self.activation, lanes=self.lanes)
                self._tops[id(X_nd)] = entry
            return entry[1]

    def forget(self, X_nd) -> None:
        """Drop the encoding of ``X_nd`` (the test set's, read once)."""
        with self._lock:
            self._tops.pop(id(X_nd), None)

"""CPU kernels for the sparse step and the momentum update, compiled with Numba.

Each kernel is a plain loop that NumPy would have to spell as several passes with
temporaries. Shapes follow the package's names: ``W_hd`` is the weight matrix stored with
one contiguous row per hidden unit (the ``W_dh.T`` view of a Fortran-ordered ``W_dh``),
``idx_nk``/``val_nk`` the kept units of each row and their values.

Numba is optional (``pip install 'ksae-cupy[fast]'``). :func:`available` says whether the
kernels run; callers keep a NumPy/SciPy path for when they do not. Kernels are compiled
on first use, once per dtype, and cached on disk (``cache=True``) so later runs start at once.

Threads: the loops run in parallel (``numba.prange``) over independent pieces (examples, or
whole hidden units), so every output element is computed by one thread in the same order
whatever the thread count: results are bit for bit those of one thread (tested).
:func:`set_threads` (what ``--threads`` calls) sets the count.

Over 400 lines: every Numba loop of the CPU step sits here, beside the one switch (:func:`available`,
the thread count, the disk cache) that decides whether any of them runs; its callers keep their NumPy paths.
"""
from __future__ import annotations

import functools
import importlib.util
import os

import numpy as np



@functools.cache  # asked on every step (optimizer, sparse step); the answer cannot change in a process
def available() -> bool:
    """Whether Numba is installed, so the kernels below can run (found without importing it)."""
    return importlib.util.find_spec("numba") is not None


def enabled() -> bool:
    """Whether NumPy steps and updates use these kernels: Numba is installed, and the environment
    does not set ``KSAE_CPU_KERNELS=0`` (which keeps the NumPy/SciPy paths, to time or test them)."""
    return os.environ.get("KSAE_CPU_KERNELS", "1") != "0" and available()


_OPTIONS = {}  # kernel -> the numba.njit options it is compiled with
_COMPILED = {}  # (kernel, parallel) -> its Numba dispatcher, made on first use (importing Numba takes ~0.5 s)
_threads = None  # the count set_threads asked for (None: Numba's default, one per core)
# The kernels' parallel loops say ``prange``: plain ``range`` until Numba is imported, then
# ``numba.prange`` (set in _compiled, in the kernel's module, before a compilation reads it).
prange = range


def _kernel(fastmath=False, parallel=True):
    """Mark a loop as a kernel, compiled with ``numba.njit(cache=True)`` when first called."""
    def mark(fn):
        # nogil: lanes (ksae_cupy/cpu/lanes.py) run serial builds on several Python threads at once
        _OPTIONS[fn] = {"fastmath": fastmath, "parallel": parallel, "nogil": True}
        return fn
    return mark


_HELPERS = []  # (module globals, name) of functions the kernels call: compiled, and rebound there, before any kernel


def _helper(fn):
    """Mark a function that kernels call; compiled inline into them (``numba.njit(inline="always")``).

    Kernels of other modules (:mod:`ksae_cupy.cpu.finetune_kernels`) mark theirs here too: the
    compiled helper is rebound in the module that defines it, where its kernels look it up."""
    _HELPERS.append((fn.__globals__, fn.__name__))
    return fn


def _compiled(fn, serial: bool = False):
    """The compiled kernel: its parallel build, or its serial one on one thread or when ``serial``.

    Starting Numba's thread pool for a loop costs ~0.1 ms even on one thread (measured: a
    1,000-element update took 0.15 ms parallel), several times the work of a small kernel; the
    serial build runs the same loop body, so its results are the same bits (tested).
    """
    numba = _numba()
    parallel = _OPTIONS[fn]["parallel"] and not serial and numba.get_num_threads() > 1
    key = (fn, parallel)
    if key not in _COMPILED:
        _bind_compiled_names(fn.__globals__, numba)  # read from the kernel's own module (here, or another)
        _compile_helpers(numba)
        options = dict(_OPTIONS[fn], parallel=parallel)
        _COMPILED[key] = numba.njit(cache=True, **options)(fn if parallel or not _OPTIONS[fn]["parallel"]
                                                           else _serial_copy(fn))
    return _COMPILED[key]


def _serial_copy(fn):
    """``fn`` under another qualified name: Numba's disk cache keys on the source and the types, not
    on the options, so the serial build needs a cache file of its own. The name says its options: a
    build cached under it with other options would be loaded as it is (a cached build without
    ``nogil`` made the lanes take turns, measured), so change the name when the options change."""
    import types

    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__qualname__ = fn.__qualname__ + "_serial_nogil"
    return copy


@functools.cache
def _numba():
    """Numba, imported and set up once: its thread pool, and the kernels' helpers compiled."""
    import numba

    if "NUMBA_THREADING_LAYER" not in os.environ:
        # Numba's own thread pool. The OpenMP layer, between OpenBLAS calls on a 2-core machine,
        # made a step 10-20x slower (its threads and BLAS's spin-wait for the same cores);
        # workqueue threads sleep. It serves one calling thread at a time, as the trainer calls.
        numba.config.THREADING_LAYER = "workqueue"
    _apply_threads(numba)
    return numba


def _bind_compiled_names(module_globals, numba) -> None:
    """The names a kernel's (or a helper's) module reads as Numba's: ``prange``, and ``register_block``
    (:mod:`ksae_cupy.cpu.register_block`) where the module uses it."""
    module_globals["prange"] = numba.prange
    if "register_block" in module_globals:
        from ksae_cupy.cpu.register_block import compiled_register_block
        module_globals["register_block"] = compiled_register_block(numba)


def _compile_helpers(numba) -> None:
    for module_globals, name in _HELPERS:  # a kernel reads its helpers' compiled versions when it is compiled
        if not hasattr(module_globals[name], "py_func"):
            _bind_compiled_names(module_globals, numba)
            module_globals[name] = numba.njit(inline="always", fastmath={"contract"})(module_globals[name])


def _apply_threads(numba) -> None:
    if _threads is not None:
        numba.set_num_threads(min(_threads, numba.config.NUMBA_NUM_THREADS))


def set_threads(threads: int | None) -> None:
    """Run the kernels on ``threads`` threads (None: one per core, Numba's default).

    Capped at the threads Numba started with (``NUMBA_NUM_THREADS``, one per core). Applied at
    once if Numba is already imported, else when the first kernel is compiled.
    """
    global _threads
    _threads = threads
    import sys
    if "numba" in sys.modules and available():
        numba = sys.modules["numba"]
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS) if threads is not None
                              else numba.config.NUMBA_NUM_THREADS)


def threads() -> int:
    """The thread count the kernels run on now."""
    import sys
    if "numba" in sys.modules:
        return sys.modules["numba"].get_num_threads()
    return _threads if _threads is not None else (os.cpu_count() or 1)




# ---- Top-k inside the kernels: the contract of ksae_cupy.topk, one row at a time ----
# Rows are ranked by their order-preserving integer keys (ksae_cupy.topk.order_keys), ties to
# the lower column: the same set, in the same order, as topk_sort (descending) and
# topk_threshold (ascending columns). The k best so far are kept sorted, best first: an entry
# that beats the worst kept moves up past the kept entries it beats, and no sort is needed at
# the end. Measured against a heap of the k best (128 rows of 1,000, one thread): 0.52 against
# 0.67 ms at k = 25, 2.0 against 2.2 ms at k = 100.

@_helper
def _select_row(z_h, bits_h, sign_bit, sign_shift, all_ones, descending, spread_s, key_k, col_k):
    """The ``k = len(col_k)`` largest entries of ``z_h`` into ``col_k``: in descending order when
    ``descending`` (the sort method), else in ascending column order (the threshold method).
    ``bits_h`` is ``z_h``'s bits as unsigned integers; ``key_k`` is scratch. Returns how far the
    candidates had to reach (:func:`selection_passes` counts it): 1 the first threshold sufficed, 2 a
    lower one, 3 none did and the whole row was looked at, 0 the whole row from the start.

    First the candidates: the entries at or above ``tau = mean + spread * std`` of the row (one pass, no
    branches). When at least k of them are, every one of the k largest is among them (an entry below
    tau is below each of them, and NaN ranks lowest), so keeping the k best of the candidates, in column
    order, keeps the same entries in the same order as a pass over the whole row: only fewer of them
    enter the kept list and are pushed out again. ``tau`` only decides how many are looked at.

    ``spread_s`` (:func:`candidate_spreads`) are the normal quantiles above which 2k, 4k, 8k, ... of H
    entries would lie, tried in turn while fewer than k entries pass. Trained codes are not normal: a
    long tail of negative units widens the std, so that on 27-94% of MNIST rows fewer than k passed the
    first; each lower threshold costs one more branch-free pass, where a look at the whole row (the last
    resort) costs 6-19x the kept list's work. An empty ``spread_s``: the whole row (2k >= H).
    """
    H = z_h.shape[0]
    k = col_k.shape[0]
    candidates_c = np.empty(H, dtype=np.int64)
    count = 0
    reach = 0
    if spread_s.shape[0] > 0:
        total = z_h[0] - z_h[0]
        squares = total
        for h in range(H):
            total += z_h[h]
            squares += z_h[h] * z_h[h]
        mean = total / H
        std = np.sqrt(max(squares / H - mean * mean, 0))
        for s in range(spread_s.shape[0]):
            tau = mean + spread_s[s] * std
            count = 0
            for h in range(H):
                candidates_c[count] = h
                count += z_h[h] >= tau
            if count >= k:
                reach = 1 if s == 0 else 2
                break
    if count < k:
        reach = 3 if spread_s.shape[0] > 0 else 0
        for h in range(H):
            candidates_c[h] = h
        count = H
    size = 0
    for c in range(count):
        h = candidates_c[c]
        u = bits_h[h]
        # Negative: all bits flipped; else the sign bit set (branch-free: the sign is a coin toss).
        key = u ^ ((all_ones * (u >> sign_shift)) | sign_bit)
        if z_h[h] != z_h[h]:  # NaN ranks below -inf
            key = u ^ u
        if size == k:
            if not key > key_k[k - 1]:  # an equal key here has the higher column: it loses
                continue
            i = k - 1
        else:
            i = size
            size += 1
        while i > 0 and key_k[i - 1] < key:  # past the kept entries it beats; after equal keys
            key_k[i], col_k[i] = key_k[i - 1], col_k[i - 1]
            i -= 1
        key_k[i], col_k[i] = key, h
    if not descending:
        col_k.sort()
    return reach


@functools.cache  # asked once per batch, for the same few (k, H)
def candidate_spreads(k: int, H: int) -> tuple[float, ...]:
    """``spread_s`` of :func:`_select_row`: the normal quantiles above which 2k, 4k, 8k, ... of H entries would
    lie, the later ones while that is at most half the row (past it, a look at the whole row costs less than
    picking the candidates first); none (every entry at once) where 2k >= H."""
    import statistics

    spreads = []
    multiple = 2
    while multiple * k < H and (multiple == 2 or 2 * multiple * k <= H):
        spreads.append(statistics.NormalDist().inv_cdf(1 - multiple * k / H))
        multiple *= 2
    return tuple(spreads)


def _key_constants(dtype):
    """``(unsigned view type, sign bit, its position, all ones)`` of a float type's order keys."""
    key_type = np.uint32 if np.dtype(dtype).itemsize == 4 else np.uint64
    bits = np.dtype(key_type).itemsize * 8
    return key_type, key_type(1 << (bits - 1)), key_type(bits - 1), key_type((1 << bits) - 1)


# Reassociation lets the compiler vectorise the dot products (and sums) below; it changes
# only the order of a sum within one row, i.e. float rounding, never which terms are added,
# and the order is the same whatever the thread count.
@_kernel(fastmath={"reassoc", "contract"})
def _decode_and_backprop(select, Z_nh, bits_nh, sign_bit, sign_shift, all_ones, descending, spread_s, W_hd, c_d, X_nd,
                         idx_nk, val_nk, relu, batch, R_nd, dZ_nk, row_error_n, passes_n, n_start, n_stop):
    k = idx_nk.shape[1]
    D = X_nd.shape[1]
    zero = batch - batch  # 0 in the arrays' float type (batch is N in it)
    for n in prange(n_start, n_stop):  # examples are independent: one thread owns a row of R and of dZ
        if select:  # the top k of Z's row first, written to idx_nk and val_nk
            col_k = np.empty(k, dtype=np.int64)
            passes_n[n] = _select_row(Z_nh[n], bits_nh[n], sign_bit, sign_shift, all_ones, descending, spread_s,
                                      np.empty(k, dtype=np.uint64), col_k)
            for j in range(k):
                idx_nk[n, j] = col_k[j]
                value = Z_nh[n, col_k[j]]
                val_nk[n, j] = zero if relu and value < zero else value  # relu: a negative survivor is 0
        gradients = batch > zero  # batch 0: the validation pass, the error only
        r = R_nd[n] if gradients else np.empty(D, dtype=X_nd.dtype)
        x = X_nd[n]
        for d in range(D):
            r[d] = c_d[d] - x[d]
        # Decoder: Xhat_n - X_n = c - X_n + sum over kept units of val * (row of W).
        for j in range(k):
            w = W_hd[idx_nk[n, j]]
            v = val_nk[n, j]
            for d in range(D):
                r[d] += v * w[d]
        row_error = zero
        for d in range(D):
            row_error += r[d] * r[d]
        row_error_n[n] = row_error
        if not gradients:
            continue
        for d in range(D):
            r[d] /= batch
        # The gradient at the kept units: R_n . (row of W), while those rows are still in cache.
        for j in range(k):
            if relu and not val_nk[n, j] > 0:  # a kept unit clipped to zero passes no gradient
                dZ_nk[n, j] = 0
                continue
            w = W_hd[idx_nk[n, j]]
            acc = zero  # accumulate in the arrays' own float type, so the loop vectorises
            for d in range(D):
                acc += w[d] * r[d]
            dZ_nk[n, j] = acc


def _sum_in_order(row_error_n) -> float:
    """Sum of the per-example errors in example order, in float64: the same whatever the threads."""
    return float(sum(row_error_n.astype(np.float64).tolist()))


def _run_decoder(W_hd, c_d, X_nd, idx_nk, val_nk, relu, Z_nh=None, descending=True, gradients=True, lanes=1,
                 passes_n=None):
    """The decoder kernel, selecting the top k of ``Z_nh`` first when it is given: ``(R_nd, dZ_nk, row_error_n)``.
    ``passes_n`` (int8, one per example): where given, each row's selection pass is written there (see
    :func:`selection_passes`).

    ``lanes`` > 1: each lane (:mod:`ksae_cupy.cpu.lanes`) runs the serial kernel on a contiguous
    share of the examples; else one call, on Numba's threads.
    """
    N, D = X_nd.shape
    dtype = X_nd.dtype
    select = Z_nh is not None
    key_type, sign_bit, sign_shift, all_ones = _key_constants(Z_nh.dtype if select else dtype)
    if not select:
        Z_nh = np.zeros((1, 1), dtype=dtype)
    bits_nh = Z_nh.view(key_type)
    R_nd = np.empty((N, D) if gradients else (1, D), dtype=dtype)  # no (N, D) residual for an error alone
    dZ_nk = np.empty(idx_nk.shape if gradients else (1, 1), dtype=dtype)
    row_error_n = np.empty(N, dtype=dtype)
    spread_s = np.array(candidate_spreads(idx_nk.shape[1], Z_nh.shape[1]) if select else (), dtype=Z_nh.dtype)
    if passes_n is None:
        passes_n = np.empty(N if select else 0, dtype=np.int8)
    args = (select, Z_nh, bits_nh, sign_bit, sign_shift, all_ones, bool(descending), spread_s, W_hd, c_d,
            np.ascontiguousarray(X_nd), idx_nk, val_nk, bool(relu), dtype.type(N if gradients else 0), R_nd, dZ_nk,
            row_error_n, passes_n)
    if lanes == 1:
        _compiled(_decode_and_backprop)(*args, 0, N)
    else:
        from ksae_cupy.cpu.lanes import lanes as lanes_of, share

        kernel = _compiled(_decode_and_backprop, serial=True)
        lanes_of(lanes).run(lambda lane: kernel(*args, *share(lane, lanes, N)))
    return R_nd, dZ_nk, row_error_n


def decode_and_backprop(W_hd, c_d, X_nd, idx_nk, val_nk, relu: bool):
    """``(loss, R_nd, dZ_nk)`` from the kept units, reading each kept row of ``W_hd`` twice.

    ``R_nd = (Xhat_nd - X_nd) / N`` with ``Xhat_nd = Zs W_hd + c_d``; ``loss = 0.5 / N * sum
    (Xhat - X)^2``; ``dZ_nk[n, j] = R_n . W_hd[idx_nk[n, j]]``, zero where ``relu`` clipped
    the unit. ``N k D`` multiply-adds each for the decoder and for ``dZ``; parallel over examples.
    """
    R_nd, dZ_nk, row_error_n = _run_decoder(W_hd, c_d, X_nd, idx_nk, val_nk, relu)
    return 0.5 * _sum_in_order(row_error_n) / X_nd.shape[0], R_nd, dZ_nk


def select_decode_and_backprop(Z_nh, k: int, descending: bool, W_hd, c_d, X_nd, relu: bool, lanes: int = 1):
    """:func:`decode_and_backprop` with the top-k selection of ``Z_nh`` in the same pass over examples:
    ``(loss, idx_nk, val_nk, R_nd, dZ_nk)``. ``idx_nk``/``val_nk`` are exactly those of
    :func:`ksae_cupy.topk.topk_sort` (``descending``) or ``topk_threshold`` (not), after ``relu``."""
    from ksae_cupy.topk import check_topk_args

    check_topk_args(Z_nh, k)
    idx_nk = np.empty((Z_nh.shape[0], k), dtype=np.int32)
    val_nk = np.empty((Z_nh.shape[0], k), dtype=Z_nh.dtype)
    R_nd, dZ_nk, row_error_n = _run_decoder(W_hd, c_d, X_nd, idx_nk, val_nk, relu, Z_nh, descending, lanes=lanes)
    return 0.5 * _sum_in_order(row_error_n) / X_nd.shape[0], idx_nk, val_nk, R_nd, dZ_nk


def reconstruction_error(W_hd, c_d, X_nd, idx_nk, val_nk) -> float:
    """``sum_n ||Xhat_n - X_n||^2`` through the kept units only (the validation loss's sum), as a float."""
    return _sum_in_order(_run_decoder(W_hd, c_d, X_nd, idx_nk, val_nk, False, gradients=False)[2])


def select_and_reconstruction_error(Z_nh, k: int, descending: bool, W_hd, c_d, X_nd, relu: bool,
                                    lanes: int = 1) -> float:
    """:func:`reconstruction_error` of the top k of ``Z_nh`` (after ``relu``), selected in the same pass."""
    from ksae_cupy.topk import check_topk_args

    check_topk_args(Z_nh, k)
    idx_nk = np.empty((Z_nh.shape[0], k), dtype=np.int32)
    val_nk = np.empty((Z_nh.shape[0], k), dtype=Z_nh.dtype)
    return _sum_in_order(_run_decoder(W_hd, c_d, X_nd, idx_nk, val_nk, relu, Z_nh, descending, gradients=False,
                                      lanes=lanes)[2])


def selection_passes(Z_nh, k: int) -> dict:
    """How the kernels' top-k selection went on the rows of ``Z_nh``: ``{"rows": N, "beyond_first": rows whose
    first threshold let fewer than k entries through, "whole_row": rows that then scanned every entry}``
    (``whole_row`` counts within ``beyond_first``; where 2k >= H every row is looked at whole from the start,
    and counts in neither). The selection is the one the step runs, on the same rows, with no decoder."""
    from ksae_cupy.topk import check_topk_args

    check_topk_args(Z_nh, k)
    N, H = Z_nh.shape
    idx_nk = np.empty((N, k), dtype=np.int32)
    val_nk = np.empty((N, k), dtype=Z_nh.dtype)
    passes_n = np.zeros(N, dtype=np.int8)
    empty_hd, empty_d, empty_nd = (np.zeros(shape, dtype=Z_nh.dtype) for shape in ((H, 0), 0, (N, 0)))
    _run_decoder(empty_hd, empty_d, empty_nd, idx_nk, val_nk, False, np.ascontiguousarray(Z_nh), True,
                 gradients=False, passes_n=passes_n)
    return {"rows": N, "beyond_first": int(np.count_nonzero(passes_n > 1)),
            "whole_row": int(np.count_nonzero(passes_n == 3))}


# X W is computed in this many pieces of columns (hidden units), which the lanes share. The pieces
# are fixed, not one per lane, because a product's bits can depend on its shape (OpenBLAS picks
# kernels by size: a float64 product's row differed in its last bit between 131 and 65 rows); and
# columns, not rows, because each BLAS call packs its whole share of W first (two 64-row calls
# took 2.36 ms against 1.84 ms for one 128-row call; two 500-column calls 1.96 ms, measured).
ENCODE_PIECES = 2


def encode(W_dh, b_h, X_nd, lanes: int = 1):
    """``Z_nh = X_nd W_dh + b_h`` in :data:`ENCODE_PIECES` column pieces, shared by ``lanes`` lanes
    (BLAS must then run on one thread: the caller sets it). The same bits at any lane count."""
    from ksae_cupy.cpu.lanes import lanes as lanes_of, share

    H = W_dh.shape[1]
    Z_nh = np.empty((X_nd.shape[0], H), dtype=X_nd.dtype)

    def pieces(lane):
        for piece in range(*share(lane, lanes, ENCODE_PIECES)):
            start, stop = share(piece, ENCODE_PIECES, H)
            np.matmul(X_nd, W_dh[:, start:stop], out=Z_nh[:, start:stop])  # X W's BLAS call, no temporary
            Z_nh[:, start:stop] += b_h[start:stop]

    if lanes == 1:
        pieces(0)
    else:
        lanes_of(lanes).run(pieces)
    return Z_nh


def encode_select_decode_and_backprop(W_dh, b_h, c_d, X_nd, k: int, descending: bool, relu: bool, lanes: int = 1):
    """The sparse step's forward and backward pass up to the weight gradient, ``Z = X W + b`` included:
    ``(loss, idx_nk, val_nk, R_nd, dZ_nk)``, as :func:`select_decode_and_backprop` of that ``Z``.

    ``lanes`` > 1 splits ``X W`` (:func:`encode`) and then the examples over that many threads.
    ``W_dh`` in Fortran order (``W_dh.T`` contiguous) avoids a copy of it."""
    from ksae_cupy.topk import check_topk_args

    N = X_nd.shape[0]
    check_topk_args(np.empty((0, W_dh.shape[1]), dtype=X_nd.dtype), k)
    Z_nh = encode(W_dh, b_h, X_nd, lanes)
    idx_nk = np.empty((N, k), dtype=np.int32)
    val_nk = np.empty((N, k), dtype=X_nd.dtype)
    R_nd, dZ_nk, row_error_n = _run_decoder(np.ascontiguousarray(W_dh.T), c_d, X_nd, idx_nk, val_nk, relu, Z_nh,
                                            descending, lanes=lanes)
    return 0.5 * _sum_in_order(row_error_n) / N, idx_nk, val_nk, R_nd, dZ_nk


def encode_and_reconstruction_error(W_dh, b_h, c_d, X_nd, k: int, descending: bool, relu: bool,
                                    lanes: int = 1) -> float:
    """``sum_n ||Xhat_n - X_n||^2`` through the top k of ``X W + b``: the validation loss's sum, in lanes."""
    from ksae_cupy.topk import check_topk_args

    N = X_nd.shape[0]
    check_topk_args(np.empty((0, W_dh.shape[1]), dtype=X_nd.dtype), k)
    Z_nh = encode(W_dh, b_h, X_nd, lanes)
    idx_nk = np.empty((N, k), dtype=np.int32)
    val_nk = np.empty((N, k), dtype=X_nd.dtype)
    return _sum_in_order(_run_decoder(np.ascontiguousarray(W_dh.T), c_d, X_nd, idx_nk, val_nk, relu, Z_nh,
                                      descending, gradients=False, lanes=lanes)[2])


@_kernel(parallel=False)  # N k steps: cheaper than starting threads
def _pairs_by_unit(idx_nk, H):
    """Counting sort of the kept (example, slot) pairs by unit: ``(start_h, pair_n, pair_j)``,
    unit h's pairs at ``start_h[h]:start_h[h + 1]``, in increasing example order."""
    N, k = idx_nk.shape
    start_h = np.zeros(H + 1, dtype=np.int64)
    for n in range(N):
        for j in range(k):
            start_h[idx_nk[n, j] + 1] += 1
    for h in range(H):
        start_h[h + 1] += start_h[h]
    fill_h = start_h[:H].copy()
    pair_n = np.empty(N * k, dtype=np.int64)
    pair_j = np.empty(N * k, dtype=np.int64)
    for n in range(N):
        for j in range(k):
            h = idx_nk[n, j]
            pair_n[fill_h[h]] = n
            pair_j[fill_h[h]] = j
            fill_h[h] += 1
    return start_h, pair_n, pair_j


# Work is split over blocks of whole hidden units: one thread owns a unit's row of the
# gradient (and of W and its velocity), so no two threads write one element and each row's
# sum is in example order, as one thread would add it.
_UNITS_PER_BLOCK = 8


@_helper
def _gradient_row(g, h, X_nd, R_nd, dZ_nk, val_nk, start_h, pair_n, pair_j):
    """Unit ``h``'s row of ``dW_hd`` into ``g``: the sum, in example order, of ``dZ_nj X_n + val_nj R_n``."""
    D = g.shape[0]
    for d in range(D):
        g[d] = 0
    for p in range(start_h[h], start_h[h + 1]):
        n = pair_n[p]
        a = dZ_nk[n, pair_j[p]]
        b = val_nk[n, pair_j[p]]
        x = X_nd[n]
        r = R_nd[n]
        for d in range(D):
            g[d] += a * x[d] + b * r[d]


@_kernel(fastmath={"contract"})
def _scatter_weight_gradient(X_nd, R_nd, dZ_nk, val_nk, start_h, pair_n, pair_j, dW_hd):
    H = dW_hd.shape[0]
    for block in prange((H + _UNITS_PER_BLOCK - 1) // _UNITS_PER_BLOCK):
        for h in range(block * _UNITS_PER_BLOCK, min(H, (block + 1) * _UNITS_PER_BLOCK)):
            _gradient_row(dW_hd[h], h, X_nd, R_nd, dZ_nk, val_nk, start_h, pair_n, pair_j)


def weight_gradient(X_nd, R_nd, idx_nk, dZ_nk, val_nk, H: int):
    """``dW_hd = dZ^T X + Zs^T R`` as a scatter of rows: unit ``idx_nk[n, j]`` gets
    ``dZ_nk[n, j] X_n + val_nk[n, j] R_n``. ``2 N k D`` multiply-adds; rows of units no row
    kept stay zero. Parallel over hidden units."""
    dW_hd = np.empty((H, X_nd.shape[1]), dtype=X_nd.dtype)
    start_h, pair_n, pair_j = _compiled(_pairs_by_unit)(idx_nk, H)
    _compiled(_scatter_weight_gradient)(np.ascontiguousarray(X_nd), R_nd, dZ_nk, val_nk, start_h, pair_n, pair_j,
                                        dW_hd)
    return dW_hd


_CHUNK = 16384  # elements per parallel piece of the flat momentum update


@_helper
def _flushed(x, tiny):
    """``x``, or +0 where ``|x| < tiny`` (the float type's smallest normal): a denormal, or a signed zero.

    Why: a unit no example keeps has a zero gradient, so its velocity decays by the momentum every step, and
    the momentum times the smallest denormals rounds back to themselves: without this the velocity never
    reaches 0, and arithmetic on denormals is many times slower on x86 (the W update took 2.5-3.5x as long
    from the third MNIST epoch on). NaN and infinities pass unchanged. The same rule as
    :func:`ksae_cupy.momentum_sgd.flush_denormals`, the NumPy reference."""
    return tiny - tiny if abs(x) < tiny else x


# No fastmath here: ``m v - lr g`` then ``theta + v``, each rounded as NumPy rounds them, then each
# flushed (:func:`_flushed`), so this update is bit for bit the NumPy one (tests/cpu/test_kernels.py checks it).
@_kernel()
def _momentum_update(theta, velocity, grad, momentum, lr, tiny):
    size = theta.shape[0]
    for chunk in prange((size + _CHUNK - 1) // _CHUNK):
        for i in range(chunk * _CHUNK, min(size, (chunk + 1) * _CHUNK)):
            v = velocity[i] * momentum
            v = _flushed(v - lr * grad[i], tiny)
            velocity[i] = v
            theta[i] = _flushed(theta[i] + v, tiny)


def _flat_view(a):
    """A 1-D view of ``a`` in memory order, or None when ``a`` is not one contiguous block."""
    if a.flags.c_contiguous:
        return a.reshape(-1)
    if a.flags.f_contiguous:
        return a.T.reshape(-1)
    return None


def momentum_update(theta, velocity, grad, momentum: float, lr: float) -> bool:
    """``v <- m v - lr g; theta <- theta + v`` in one pass, in place; False (nothing done)
    when the three arrays do not share one contiguous memory layout and dtype."""
    flat = [_flat_view(a) for a in (theta, velocity, grad)]
    same_layout = theta.strides == velocity.strides == grad.strides
    if any(f is None for f in flat) or not same_layout or not theta.dtype == velocity.dtype == grad.dtype:
        return False
    scalar = theta.dtype.type
    # A bias vector is a few microseconds of work: starting threads for it would cost more.
    _compiled(_momentum_update, serial=flat[0].size <= _CHUNK)(flat[0], flat[1], flat[2], scalar(momentum), scalar(lr),
                                                              smallest_normal(theta.dtype))
    return True


def smallest_normal(dtype):
    """The smallest positive normal number of a float type, in that type: below it lie the denormals."""
    return np.dtype(dtype).type(np.finfo(dtype).tiny)


@_kernel(fastmath={"contract"})
def _momentum_update_rows(W_hd, V_hd, X_nd, R_nd, dZ_nk, val_nk, start_h, pair_n, pair_j, momentum, lr, tiny, still_h,
                          block_start, block_stop):
    H, D = W_hd.shape
    for block in prange(block_start, block_stop):
        g = np.empty(D, dtype=W_hd.dtype)  # this thread's gradient row, kept in cache
        for h in range(block * _UNITS_PER_BLOCK, min(H, (block + 1) * _UNITS_PER_BLOCK)):
            if still_h[h] and start_h[h] == start_h[h + 1]:
                continue  # no gradient, no velocity: the update would add zero to every entry
            w = W_hd[h]
            v = V_hd[h]
            _gradient_row(g, h, X_nd, R_nd, dZ_nk, val_nk, start_h, pair_n, pair_j)
            moving = False
            for d in range(D):
                step = v[d] * momentum
                step = _flushed(step - lr * g[d], tiny)
                v[d] = step
                w[d] = _flushed(w[d] + step, tiny)
                moving |= step != 0
            still_h[h] = not moving


def momentum_update_rows(W_hd, V_hd, X_nd, R_nd, idx_nk, dZ_nk, val_nk, momentum: float, lr: float,
                         lanes: int = 1, still_h=None) -> None:
    """The momentum update of ``W_hd`` (velocity ``V_hd``) by the gradient
    :func:`weight_gradient` would build, without building it: one pass over the rows of ``W``
    and ``V``, each unit's gradient row summed in a buffer that stays in cache. In place; the
    same arithmetic as :func:`weight_gradient` followed by :func:`momentum_update`. Parallel over
    hidden units: Numba's threads, or ``lanes`` > 1 lanes of whole blocks of units.

    ``still_h`` (bool, one per unit; None: every unit is updated): True where the unit's row of ``V`` is all
    zero. Such a unit that no example kept in this batch is skipped: its update would add 0 to every entry
    (a dead unit, once its velocity has decayed to 0). The kernel keeps the flags true to ``V`` for every
    unit it updates; whoever writes ``V`` otherwise clears the unit's flag (:class:`StillRows`)."""
    scalar = W_hd.dtype.type
    start_h, pair_n, pair_j = _compiled(_pairs_by_unit)(idx_nk, W_hd.shape[0])
    if still_h is None:
        still_h = np.zeros(W_hd.shape[0], dtype=np.bool_)
    args = (W_hd, V_hd, np.ascontiguousarray(X_nd), R_nd, dZ_nk, val_nk, start_h, pair_n, pair_j, scalar(momentum),
            scalar(lr), smallest_normal(W_hd.dtype), still_h)
    blocks = (W_hd.shape[0] + _UNITS_PER_BLOCK - 1) // _UNITS_PER_BLOCK
    if lanes == 1:
        _compiled(_momentum_update_rows)(*args, 0, blocks)
        return
    from ksae_cupy.cpu.lanes import lanes as lanes_of

    kernel = _compiled(_momentum_update_rows, serial=True)
    bounds = _blocks_balanced_by_work(start_h, still_h, lanes)
    lanes_of(lanes).run(lambda lane: kernel(*args, int(bounds[lane]), int(bounds[lane + 1])))


# A unit's fixed work (zeroing its gradient row, then updating its rows of W and V) in units of one kept
# pair's pass over the row: about one and a half.
_FIXED_WORK_PER_UNIT = 1.5


def _blocks_balanced_by_work(start_h, still_h, lanes: int):
    """``lanes + 1`` block boundaries that give each lane about the same work: a unit costs its kept pairs
    plus :data:`_FIXED_WORK_PER_UNIT`, and nothing when the update skips it (``still_h`` and no pairs). Kept
    units are not spread evenly (in a trial at initialisation, 60% of a batch's pairs fell in the lower half of
    the units: that lane took 0.31 ms against 0.26), nor are dead ones. Which lane updates a unit changes no bit
    of it. Compiled: NumPy's spelling cost 15 us a step."""
    bounds = np.empty(lanes + 1, dtype=np.int64)
    _compiled(_balanced_bounds)(start_h, still_h, _UNITS_PER_BLOCK, _FIXED_WORK_PER_UNIT, bounds)
    return bounds


@_kernel(parallel=False)
def _balanced_bounds(start_h, still_h, units_per_block, fixed_per_unit, bounds):
    """``bounds[0] = 0``, ``bounds[-1]`` = the block count; each inner boundary the block boundary whose work
    before it is nearest its even share of all the work."""
    H = start_h.shape[0] - 1
    lanes = bounds.shape[0] - 1
    blocks = (H + units_per_block - 1) // units_per_block
    work_before_b = np.zeros(blocks + 1)  # the work of the units before each block boundary
    for b in range(blocks):
        work = work_before_b[b]
        for h in range(b * units_per_block, min(H, (b + 1) * units_per_block)):
            pairs = start_h[h + 1] - start_h[h]
            if pairs > 0 or not still_h[h]:
                work += pairs + fixed_per_unit
        work_before_b[b + 1] = work
    total = work_before_b[blocks]
    bounds[0] = 0
    block = 0
    for lane in range(1, lanes):
        share = total * lane / lanes
        # move on while the next boundary is no farther from the share than this one (past blocks of no work)
        while block < blocks and abs(work_before_b[block + 1] - share) <= abs(work_before_b[block] - share):
            block += 1
        bounds[lane] = block
    bounds[lanes] = blocks

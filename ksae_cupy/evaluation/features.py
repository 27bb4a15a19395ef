"""Feature evaluation of section 4.5: logistic regression on ``supp_{alpha k}(W^T x + b)``.

Protocol (fixed here so every run is judged the same way):

1. Encode the training and validation sets with ``alpha * k`` kept units for each alpha.
2. For each (alpha, L2) pair, fit the softmax classifier on the TRAINING set only and
   measure its VALIDATION error. L2 values are visited from strongest to weakest, each fit
   warm-started from the previous one (same optimum, fewer iterations).
3. Pick the pair with the lowest validation error (ties: smaller alpha, then stronger L2).
4. Refit with the chosen pair on ``refit`` = ``"train+valid"`` (default: all 60k labelled
   MNIST images, the usual protocol once hyper-parameters are fixed) or ``"train"``.
5. Only now encode the test set and report its error, once.

The test labels are never read before step 5, so the choice cannot depend on them.
The raw-pixel baseline (paper: 7.20% on MNIST) goes through the same steps with the
identity as encoder.

Over 400 lines: the protocol above is one piece (the walk over alpha and L2, the choice, the refit and the
one test read) and its report (eval.json / eval.md) is written from the same trials; split, the choice and
what the report says of it could drift apart.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from ksae_cupy.evaluation import classifier, grid
from ksae_cupy.backend import CPU, Backend, array_module
from ksae_cupy.errors import KsaeError, OptionError, literal
from ksae_cupy.model import alpha_k, hidden_preactivations, select_units
from ksae_cupy.atomic import write_text_atomic
from ksae_cupy.paper import DATASET, HIDDEN, err_mnist_error, ksparse_key

DEFAULT_ALPHAS = (1.0, 2.0, 3.0, 4.0)
# Mean cross-entropy + l2/2 ||W||^2: on 50k MNIST images the useful range sits around
# 1e-4 (raw pixels and alpha*k features alike); a decade either side brackets it.
DEFAULT_L2 = (1e-3, 1e-4, 1e-5)
DEFAULT_L2_EXTEND = 3  # decades tried beyond DEFAULT_L2's edge while the best L2 is on it
# The selection protocol, in eval.json and in the kept fits' fingerprint (fits of another protocol are
# not reused). 1: every (alpha, L2) of the grid, L-BFGS to 1e-6 with 20 pairs (until 2026-11-26/27);
# 2: the walk of select_and_test, L-BFGS to classifier.TOL / FTOL with classifier.HISTORY pairs (until 2026-11-27);
# 3: the same walk, its fits to classifier.CHOICE_TOL (the refit still to TOL) (until 2026-12-07);
# 4: the same, with the encoder's X W in pieces of ROWS_PER_PIECE rows and all of it on one BLAS thread (the same
# bits at every thread count).
PROTOCOL = 4
REFIT_CHOICES = ("train+valid", "train")


@dataclass
class Trial:
    """One (alpha, L2) fit on the training set, judged on the validation set."""

    alpha: float | None
    l2: float
    valid_error: float
    train_error: float
    n_iter: int
    converged: bool
    seconds: float


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


def evaluation_code() -> dict:
    """What made an evaluation, for its ``eval.json``: the protocol version (:data:`PROTOCOL`), the package's
    version, and the commit of the checkout it ran from (None outside one; ``code_clean`` false when the package's
    own files differed from it; results rewritten in the tree, as a re-evaluation does, do not count). Tables
    refuse to mix protocols (:mod:`ksae_cupy.reports.paper_tables`)."""
    from ksae_cupy.provenance import code_commit, package_code_clean, package_version

    return {"protocol": PROTOCOL, "package_version": package_version(), "commit": code_commit()[0],
            "code_clean": package_code_clean()}


def l2_lattice(l2_grid, extend: int) -> list[float]:
    """The L2 values a walk may visit, strongest first: the grid, and with two values or more,
    ``extend`` decades beyond each edge (none below an edge of 0)."""
    grid_values = sorted(set(float(v) for v in l2_grid), reverse=True)
    if len(grid_values) < 2 or extend <= 0:
        return grid_values
    stronger = [_decade(grid_values[0], +j) for j in range(extend, 0, -1)]
    weaker = [_decade(grid_values[-1], -j) for j in range(1, extend + 1)] if grid_values[-1] > 0 else []
    return stronger + grid_values + weaker


# The classifier's fits, the walk and the reports run with BLAS on one thread: its sums (L-BFGS's, dense
# features' products) then have one order at every --threads, and the threads work side by side instead
# (alphas' fits, the encoder's lanes).
@threadpool_limits.wrap(limits=1, user_api="blas")
def select_and_test(encode, dataset, alphas, l2_grid, refit: str = "train+valid", max_iter: int = 500,
                    backend: Backend = CPU, log=print, workers: int = 1, store=None, block: str = "sparse",
                    extend: int = 0, *, early_stop: bool = False, max_iter_name: str = "max_iter",
                    choice_tol: float = classifier.CHOICE_TOL, keep_test_codes: bool = False) -> dict:
    """Choose (alpha, L2) on validation error, refit, and report the test error once.

    Each alpha walks the L2 values (:func:`l2_lattice`: the grid, and ``extend`` decades beyond each
    edge) in rounds, all alphas side by side: first the grid's middle value (the stronger of two
    middles; the first alpha from zero, then the others warm-started from its fit), then its weaker
    neighbour; from then on the next value beyond the alpha's best so far,
    warm-started from that best fit. An alpha stops when both neighbours of its best are tried, or
    when the untried one cannot beat the best of every alpha so far if the validation error is
    convex in log L2: next >= best_alpha - (other_neighbour - best_alpha). The full grid (the
    protocol until 2026-11-27) fitted every value of every alpha; on MNIST runs of 10 and 5000
    epochs the walk made 10 fits where it made 16 and 12, and chose a pair whose validation error
    is within 0.01 point of the full grid's choice (docs/guide/evaluation.md).

    The walk's fits stop at a gradient of ``max(l2, classifier.TOL)``, at most ``choice_tol``: they only
    choose; the refit goes on to ``classifier.TOL`` (protocol 3).

    ``encode(alpha, X_nd)`` returns the classifier's features for host rows ``X_nd``.
    Returns a JSON-ready dict: every trial, the choice, and the test error.
    ``workers``: alphas fitted side by side (threads, CPU only); ``store``: a
    :class:`~ksae_cupy.evaluation.grid.FitStore` whose fits (under keys starting with
    ``block``) are reused and to which new fits are added as they finish. ``early_stop``: the
    iteration cap is the regulariser (no warning when a fit reaches it); ``max_iter_name``: how
    a warning names the cap (the command line's ``--max-iter``). ``keep_test_codes``: ``encode``'s
    encoding of the test set is left for the caller to read again and forget (else forgotten here).
    """
    if refit not in REFIT_CHOICES:
        raise KsaeError(f"refit={refit!r} is not allowed; use one of {', '.join(REFIT_CHOICES)}")
    if dataset.y_train is None or dataset.y_valid is None:
        raise OptionError("labels", f"dataset {literal(dataset.name)} has no labels; the classifier needs labelled "
                                    f"data: give {{name}} (an .npy, file.h5:y or file.npz:y), or an .npz holding y")
    if dataset.X_test is None or dataset.y_test is None:
        raise OptionError("test", f"dataset {literal(dataset.name)} has no labelled test set; give {{name}} (with "
                                  f"{{test_labels}} unless it is an .npz holding y), or train with {{test_fraction}}")
    n_classes = dataset.n_classes or int(max(dataset.y_train.max(), dataset.y_valid.max())) + 1
    lattice = l2_lattice(l2_grid, extend)
    grid_values = sorted(set(float(v) for v in l2_grid), reverse=True)
    start_l2 = grid_values[(len(grid_values) - 1) // 2]
    y_train, y_valid = backend.asarray(dataset.y_train), backend.asarray(dataset.y_valid)
    workers = 1 if backend.is_gpu else max(1, min(workers, len(alphas)))
    n_fit = len(dataset.y_train) + (len(dataset.y_valid) if refit == "train+valid" else 0)
    progress = grid.GridProgress(workers, log, refit_scale=n_fit / len(dataset.y_train))
    stop = threading.Event()
    fits = {alpha: {} for alpha in alphas}  # alpha -> {l2: (trial, model)}

    def fit_key(alpha, l2) -> str:
        return f"{block}|alpha={_fmt_alpha(alpha)}|l2={l2!r}"

    kept = sum(store.get(fit_key(a, l2)) is not None for a in alphas for l2 in lattice) if store is not None else 0
    side = f", {workers} side by side" if workers > 1 else ""
    again = f"; {kept} kept from an interrupted run" if kept else ""
    log(f"classifier fits: {len(alphas)} alpha x L2 from {start_l2:g} on, at most {len(alphas) * len(lattice)} "
        f"({_fmt_l2s(lattice)}){side}, and a refit{again}")
    features, features_lock = {}, threading.Lock()

    def train_valid(alpha):
        with features_lock:  # each alpha's codes made once, when a fit first needs them
            if alpha not in features:
                features[alpha] = encode(alpha, dataset.X_train), encode(alpha, dataset.X_valid)
            return features[alpha]

    def step(task) -> None:
        """Fit ``alpha`` at ``l2`` (warm-started from ``init``), or take the stored fit."""
        alpha, l2, init = task
        stored = store.get(fit_key(alpha, l2)) if store is not None else None
        if stored is not None:
            trial, model = Trial(**stored[0]), stored[1]
            progress.reused(alpha)
        else:
            F_train, F_valid = train_valid(alpha)
            what = f"alpha={_fmt_alpha(alpha)} l2={l2:g}"
            model = classifier.fit(F_train, y_train, n_classes, l2, max_iter=max_iter, init=init,
                                   tol=min(max(l2, classifier.TOL), choice_tol),
                                   should_stop=progress.watch(what, stop))
            trial = Trial(alpha=alpha, l2=float(l2), valid_error=classifier.error_rate(model, F_valid, y_valid),
                          train_error=classifier.error_rate(model, F_train, y_train), n_iter=model.n_iter,
                          converged=model.converged, seconds=round(model.seconds, 3))
            if store is not None:
                store.put(fit_key(alpha, l2), asdict(trial), model)
            iterations = _iterations(model, max_iter, early_stop)
            progress.fitted(alpha, f"{what}: valid error {100 * trial.valid_error:.2f}% "
                                   f"(train {100 * trial.train_error:.2f}%, {iterations}, {trial.seconds:.1f}s)",
                            model.seconds)
        fits[alpha][l2] = (trial, model)

    # The first alpha starts from zero, the others from its fit: a third fewer passes than from zero (the
    # codes of two alphas share most of their units).
    tasks = [(alphas[0], start_l2, None)]
    while tasks:
        best, _ = _best(fits, alphas)
        progress.start_round(*_plan(alphas, fits, tasks, start_l2, lattice),
                             best.alpha if best is not None else tasks[0][0])
        try:
            grid.run_chains(step, tasks, workers, stop)
        except (KeyboardInterrupt, classifier.FitStopped):
            raise grid.EvaluationInterrupted(*_kept(store)) from None
        best, _ = _best(fits, alphas)
        if any(not fits[alpha] for alpha in alphas):
            tasks = [(alpha, start_l2, fits[alphas[0]][start_l2][1]) for alpha in alphas if not fits[alpha]]
            continue
        tasks = [task for alpha in alphas if (task := _next_step(alpha, fits[alpha], lattice, best.valid_error))]
        walking = {alpha for alpha, _, _ in tasks} | {best.alpha}  # codes still needed: the walks' and the refit's
        for alpha in [alpha for alpha in features if alpha not in walking]:
            del features[alpha]
    best, best_model = _best(fits, alphas)
    _say_edge(best, fits[best.alpha], lattice, grid_values, log)
    trials = [fits[alpha][l2][0] for alpha in alphas for l2 in lattice if l2 in fits[alpha]]
    log(f"chosen on validation: alpha={_fmt_alpha(best.alpha)} l2={best.l2:g} "
        f"(valid error {100 * best.valid_error:.2f}%, {len(trials)} fits); refit on {refit}")
    if not early_stop:
        _warn_unconverged(best_model, f"the chosen fit (alpha={_fmt_alpha(best.alpha)} l2={best.l2:g})", max_iter,
                          max_iter_name, log)
    refit_key = f"{fit_key(best.alpha, best.l2)}|refit={refit}"
    stored = store.get(refit_key) if store is not None else None
    if stored is not None:
        final = stored[1]
    else:
        F_fit, _ = train_valid(best.alpha)
        y_fit = dataset.y_train
        if refit == "train+valid":
            F_fit = _stack(F_fit, train_valid(best.alpha)[1])
            y_fit = np.concatenate([dataset.y_train, dataset.y_valid])
        features.clear()  # the grid's codes are done with
        try:
            final = classifier.fit(F_fit, backend.asarray(y_fit), n_classes, best.l2, max_iter=max_iter,
                                   init=best_model, should_stop=progress.watch(f"refit on {refit}", stop))
        except (KeyboardInterrupt, classifier.FitStopped):
            raise grid.EvaluationInterrupted(*_kept(store)) from None
        del F_fit
        if store is not None:
            store.put(refit_key, {"l2": best.l2}, final)
        progress.refitted(f"refit on {refit}: {_iterations(final, max_iter, early_stop)}, {final.seconds:.1f}s",
                          final.seconds)
        if not early_stop:
            _warn_unconverged(final, f"the refit (alpha={_fmt_alpha(best.alpha)} l2={best.l2:g})", max_iter,
                              max_iter_name, log)
    # The test set is encoded and its labels read here, after the choice, and only once.
    test_error = classifier.error_rate(final, encode(best.alpha, dataset.X_test), dataset.y_test)
    if hasattr(encode, "forget") and not keep_test_codes:
        encode.forget(dataset.X_test)
    log(f"test error {100 * test_error:.2f}%")
    return {
        "trials": [asdict(t) for t in trials],
        "selected": {"alpha": best.alpha, "l2": best.l2, "valid_error": best.valid_error},
        "refit": refit,
        "refit_n_iter": final.n_iter,
        "refit_converged": final.converged,
        "test_error": test_error,
    }


def _alpha_best(alpha_fits: dict):
    """The L2 of an alpha's lowest validation error (ties: the stronger L2), or None before any fit."""
    if not alpha_fits:
        return None
    return min(alpha_fits, key=lambda l2: (alpha_fits[l2][0].valid_error, -l2))


def _next_step(alpha, alpha_fits: dict, lattice: list, best_error: float):
    """``(alpha, l2, warm start)`` of the alpha's next fit in the walk, or None when it is done.

    Its best so far has two neighbours on ``lattice``; the weaker is tried first. An untried one is
    skipped when, the validation error being convex in log L2, it cannot beat ``best_error``: it is
    at least ``best - (other - best)`` once the other neighbour is tried.
    """
    b = _alpha_best(alpha_fits)
    i = lattice.index(b)
    weaker = lattice[i + 1] if i + 1 < len(lattice) else None
    stronger = lattice[i - 1] if i > 0 else None
    error = alpha_fits[b][0].valid_error
    for candidate, other in ((weaker, stronger), (stronger, weaker)):
        if candidate is None or candidate in alpha_fits:
            continue
        if other is not None and other in alpha_fits and 2 * error - alpha_fits[other][0].valid_error >= best_error:
            continue
        return alpha, candidate, alpha_fits[b][1]
    return None


def _plan(alphas, fits: dict, tasks: list, start_l2: float, lattice: list) -> tuple:
    """For the time-left estimate: ``(alphas of the fits sure to come, {alpha: most fits it may add
    beyond those})``. Sure: this round's fits, the starts still to come, and after a start the
    weaker neighbour (always tried). A walk goes one way from its best, so it reaches at most the
    untried values on one side (from the start: all weaker ones, or the first weaker one and then
    all stronger ones)."""
    sure, later = [], {}
    i_start = lattice.index(start_l2)
    from_start = max(len(lattice) - 1 - i_start, min(len(lattice) - 1 - i_start, 1) + i_start)
    for alpha in alphas:
        task = next((task for task in tasks if task[0] == alpha), None)
        tried = sorted(lattice.index(l2) for l2 in fits[alpha])
        if task is None and not tried:  # its start: in a later round
            task = (alpha, start_l2, None)
        if task is not None and tried:  # a step beyond the run of values tried, on one side
            i = lattice.index(task[1])
            sure.append(alpha)
            later[alpha] = len(lattice) - 1 - i if i > tried[-1] else i
        elif task is not None or tried == [i_start]:  # its start now or to come, or only its start made
            sure += [alpha] * ((task is not None) + (from_start > 0))
            later[alpha] = max(0, from_start - 1)
    return sure, later


def _say_edge(best, alpha_fits: dict, lattice: list, grid_values: list, log) -> None:
    """A line when the chosen L2 lies beyond the grid, or on the edge of what the walk could reach."""
    if len(grid_values) < 2:
        return
    if best.l2 not in grid_values:
        log(f"the best L2 ({best.l2:g}) lies beyond the --l2 grid ({_fmt_l2s(grid_values)}): the walk went "
            f"{'weaker' if best.l2 < grid_values[-1] else 'stronger'}")
    if best.l2 in (lattice[0], lattice[-1]) and not (best.l2 == 0 and best.l2 == lattice[-1]):
        log(f"the best L2 ({best.l2:g}) is on the edge of the values tried ({_fmt_l2s(lattice)}); "
            f"a wider --l2 grid (or a larger --l2-extend) may do better")


def _fmt_l2s(values) -> str:
    return ", ".join(f"{v:g}" for v in values)


def _iterations(model, max_iter: int, early_stop: bool) -> str:
    """``"83 L-BFGS iterations"``, marked when the fit stopped before converging."""
    text = f"{model.n_iter} L-BFGS iterations"
    if model.converged:
        return text
    if model.n_iter >= max_iter:
        return text + (" (the cap)" if early_stop else ", at the cap, not converged")
    return text + ", not converged"


def _decade(l2: float, step: int) -> float:
    """``l2`` times ten to the ``step``, without the float noise (1e-5 / 10 is 1.0000000000000002e-06)."""
    return float(f"{l2 * 10.0 ** step:.6g}")


def _best(fits: dict, alphas) -> tuple:
    """The (trial, model) of lowest validation error, alpha order then L2 strongest first; strict, so that
    ties keep the earlier (simpler) pair. ``(None, None)`` before any fit."""
    best, best_model = None, None
    for alpha in alphas:
        for l2 in sorted(fits[alpha], reverse=True):
            trial, model = fits[alpha][l2]
            if best is None or trial.valid_error < best.valid_error:
                best, best_model = trial, model
    return best, best_model


def _kept(store) -> tuple:
    return (0, None) if store is None else (len(store), store.path)


def _warn_unconverged(model, what: str, max_iter: int, max_iter_name: str, log) -> None:
    """A chosen fit or refit that stopped before converging is said at once, naming the option
    that lets it go further. (The other fits' stops are in their progress lines and the table,
    not a warning each: the weakest L2 values are the slow ones, and are rarely the choice.)"""
    if model.converged:
        return
    if model.n_iter >= max_iter:
        why = f"reached {max_iter_name} {max_iter} before converging; a higher {max_iter_name} fits it further"
    else:
        why = f"stopped after {model.n_iter} iterations before converging: {model.message}"
    log(f"  warning: {what}: L-BFGS {why}")


def _stack(A, B):
    """Row-stack two feature matrices of one kind (CSR, NumPy or CuPy)."""
    import scipy.sparse as sp

    if sp.issparse(A):
        return sp.vstack([A, B], format="csr")
    from ksae_cupy.backend import array_module

    return array_module(A).concatenate([A, B])


def _fmt_alpha(alpha) -> str:
    return "-" if alpha is None else f"{alpha:g}"


def parse_alphas(text: str) -> list[float]:
    """``"1,2,3,4"`` -> [1.0, 2.0, 3.0, 4.0] (``alphas``); every alpha must be a number >= 1."""
    return _parse_at_least(text, "alphas", "alpha", 1, " (section 2.2)")


def parse_l2(text: str) -> list[float]:
    """``"1e-3,1e-4"`` -> [0.001, 0.0001] (``l2_grid``); every value must be >= 0."""
    return _parse_at_least(text, "l2_grid", "l2", 0, "")


def _parse_at_least(text: str, field: str, what: str, low: float, why: str) -> list[float]:
    """The comma-separated numbers of ``text``, each finite and at least ``low``."""
    values = _parse_floats(text, field)
    bad = [v for v in values if not low <= v < float("inf")]
    if bad:
        raise OptionError(field, f"{{name}} {literal(repr(text))}: {what}={bad[0]:g} is not allowed; use a finite "
                                 f"{what} >= {low:g}{why}")
    return values


def _parse_floats(text: str, field: str) -> list[float]:
    """Comma-separated numbers given for the parameter ``field``."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts:
        raise OptionError(field, "{name} is empty; give comma-separated numbers, e.g. 1,2,3")
    try:
        return [float(p) for p in parts]
    except ValueError:
        raise OptionError(field, f"{{name}} {literal(repr(text))}: not a comma-separated list of numbers") from None


@dataclass
class Run:
    """A trained run folder, opened: its checkpoint, k, H and dataset name."""

    path: Path
    ckpt: object
    k: int
    H: int
    dataset: str
    data_record: dict | None = None  # labels and splits of a user's file (config.json's "data")

    @property
    def params(self) -> dict:
        """The parameters as they act on the dataset's raw rows: a ``--center-input`` run's have the
        training mean folded into ``b`` and ``c`` (:func:`~ksae_cupy.datasets.preprocess.raw_input_params`)."""
        from ksae_cupy.datasets.preprocess import raw_input_params

        return raw_input_params(self.ckpt.params, self.ckpt.preprocess)


def open_run(run_dir) -> Run:
    """Open ``run_dir``: read ``checkpoint.h5`` and the dataset name from ``config.json``.

    The dataset comes from ``config.json`` (the trainer records it there), else from the
    checkpoint's own config. Any problem is a one-line :class:`KsaeError`.
    """
    from ksae_cupy.training.checkpoint import load_checkpoint

    from ksae_cupy.session.runs import RunFolder

    path = Path(run_dir)
    if path.exists() and not path.is_dir():  # a file (a data file, a checkpoint) where a folder is asked for
        raise KsaeError(f"{path} is a file, not a run folder; give the folder that holds checkpoint.h5 and "
                        f"config.json")
    if not path.is_dir():
        raise KsaeError(f"run folder {path} does not exist")
    folder = RunFolder(path)
    folder.check_kind("run folder", "this command reads ksae-train run folders")
    ckpt = load_checkpoint(path / "checkpoint.h5")
    folder.check_checkpoint(ckpt.run_id, ckpt.config)  # this folder's run, not a copy
    dataset, data_record = ckpt.config.get("dataset"), None
    config_path = path / "config.json"
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
        except ValueError:
            raise KsaeError(f"{config_path} is not valid JSON") from None
        dataset, data_record = config.get("dataset", dataset), config.get("data")
    k, H = ckpt.config.get("k"), ckpt.params["W_dh"].shape[1]
    if not isinstance(k, int) or not 1 <= k <= H:
        raise KsaeError(f"{path / 'checkpoint.h5'}: config has no valid k for {H} hidden units ({k!r})")
    return Run(path=path, ckpt=ckpt, k=k, H=H, dataset=dataset, data_record=data_record)


def load_run_dataset(run: Run, data_root=None, log=print, overrides: dict | None = None):
    """The run's dataset with the labels and splits it was trained with, checked against the
    checkpoint's input dimension. ``overrides`` (``labels``, ``test``, ``test_labels``: a
    command's data options) add or replace labels and the test set; the splits stay the run's."""
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.datasets.user_files import DataSpec

    from ksae_cupy.session.provenance import check_run_data

    if not run.dataset:
        raise KsaeError(f"{run.path}: neither config.json nor the checkpoint names the dataset")
    given = {key for key, value in (overrides or {}).items() if value is not None}
    check_run_data(run.path, given=given)  # the rows the run was trained on, not a file replaced since
    spec = DataSpec.from_record(run.dataset, run.data_record).for_run(**(overrides or {}))
    dataset = load_dataset(spec, data_root, log=log)
    D = run.params["W_dh"].shape[0]
    if dataset.dim != D:
        raise KsaeError(f"dataset {dataset.name} has {dataset.dim} dimensions but the checkpoint's W_dh has {D} rows")
    return dataset


@threadpool_limits.wrap(limits=1, user_api="blas")  # as select_and_test: one order of every sum
def evaluate_run(run_dir, alphas=DEFAULT_ALPHAS, l2_grid=DEFAULT_L2, refit: str = "train+valid",
                 raw_baseline: bool = False, backend: Backend = CPU, dataset=None, data_root=None,
                 max_iter: int = 500, linear_svm: bool = False, log=print, data_overrides: dict | None = None,
                 workers: int = 1, l2_extend: int = DEFAULT_L2_EXTEND, max_iter_name: str = "max_iter") -> dict:
    """Evaluate the checkpoint of ``run_dir``; write ``eval.json`` and ``eval.md`` there.

    ``dataset`` defaults to the run's own (named in ``config.json``, with the labels and
    splits recorded there and ``data_overrides``' labels or test set), loaded from ``data_root``.
    ``linear_svm`` adds the classifier bracketing rows of :mod:`ksae_cupy.evaluation.svm`.
    ``l2_extend``: decades tried beyond the grid's edge while the best L2 is on it (:func:`select_and_test`).
    ``max_iter_name``: how a warning names ``max_iter`` (the command's ``--max-iter``).
    ``workers``: classifier fits run side by side. Finished fits are kept in
    ``RUN_DIR/eval-fits.npz`` until the report is written, so an interrupted evaluation
    (:class:`~ksae_cupy.evaluation.grid.EvaluationInterrupted`) continues where it stopped.
    """
    from ksae_cupy.datasets.preprocess import raw_input_params

    run = open_run(run_dir)
    run_dir, ckpt, k, H = run.path, run.ckpt, run.k, run.H
    for alpha in alphas:
        alpha_k(k, alpha, H)  # fail before any work on an alpha that cannot be used
    if dataset is None:
        dataset = load_run_dataset(run, data_root, log, data_overrides)
    elif dataset.dim != ckpt.params["W_dh"].shape[0]:
        raise KsaeError(f"dataset {dataset.name} has {dataset.dim} dimensions but the checkpoint's W_dh has "
                        f"{ckpt.params['W_dh'].shape[0]} rows")
    topk_method = ckpt.config.get("topk", "sort")
    activation = ckpt.config.get("activation", "linear")  # checkpoints before the option: linear
    start = time.perf_counter()
    log(f"evaluating {run_dir} (k={k}, H={H}, epoch {ckpt.epoch}) on {dataset.summary()}; {backend.description}")

    params = raw_input_params(ckpt.params, ckpt.preprocess)  # a --center-input run: the mean in b (issue 35)

    encode = CodesByAlpha(params, k, alphas, topk_method, backend, activation, lanes=max(1, workers))
    store = grid.FitStore(run_dir / grid.FITS_FILE, grid.fingerprint(
        run_dir / "checkpoint.h5", dataset, max_iter=max_iter, topk=topk_method, activation=activation,
        protocol=PROTOCOL))
    result = {
        "run_dir": str(run_dir), "dataset": dataset.name, "k": k, "hidden": H, "epoch": ckpt.epoch,
        "device": backend.name, "alphas": list(alphas), "l2_grid": sorted(l2_grid, reverse=True), "max_iter": max_iter,
        "l2_extend": l2_extend, **evaluation_code(),
        "features": select_and_test(encode, dataset, alphas, l2_grid, refit, max_iter, backend, log, workers, store,
                                    extend=l2_extend, max_iter_name=max_iter_name, keep_test_codes=True),
    }
    if linear_svm:
        from ksae_cupy.evaluation.svm import linear_svm_rows
        log("classifier bracketing: a linear SVM on the chosen alpha's features")
        result["linear_svm"] = linear_svm_rows(encode, dataset, result["features"]["selected"]["alpha"], log=log)
    if raw_baseline:
        log("raw-pixel baseline through the same classifier")
        result["raw_baseline"] = select_and_test(lambda alpha, X_nd: backend.asarray(X_nd), dataset, [None],
                                                 l2_grid, refit, max_iter, backend, log, workers, store, "raw",
                                                 extend=l2_extend, max_iter_name=max_iter_name)
    # The field's metrics of the autoencoder itself (FVE, L0, dead units), after the choice: alpha is the chosen one.
    # Read from the fits' encoding of each split (the test set's too, kept after its error was measured).
    result["reconstruction"] = reconstruction_splits(params, dataset, k, result["features"]["selected"]["alpha"],
                                                     topk_method, activation, backend, tops=encode.top)
    from ksae_cupy.metrics import DEAD_DEFINITION

    result["dead_definition"] = DEAD_DEFINITION  # the train row's n_dead: the run's one dead count
    encode.forget(dataset.X_test)
    result["seconds"] = round(time.perf_counter() - start, 1)
    if (dataset.name, H) == (DATASET, HIDDEN):  # the paper's setting: its figure (None for a k it lacks)
        result["paper_test_error"] = err_mnist_error(ksparse_key(k), dataset.name, H)
    write_report(run_dir, result)
    store.remove()  # the report holds every result now
    return result


SPLITS = ("train", "valid", "test")  # the reconstruction table's rows, in this order (eval.json sorts its keys)


def reconstruction_splits(params, dataset, k: int, alpha: float, topk_method: str, activation: str,
                          backend: Backend = CPU, tops=None) -> dict:
    """``{split: metrics}`` of :func:`ksae_cupy.metrics.reconstruction_metrics` on each split the dataset has
    (train, valid, test): FVE, L0 of the k-code and of the ``alpha*k`` features, dead fraction.
    ``tops(X_nd)``: the split's largest units in descending order (:meth:`CodesByAlpha.top`), decoded
    instead of encoding the split again."""
    from ksae_cupy.metrics import reconstruction_metrics

    splits = dict(zip(SPLITS, (dataset.X_train, dataset.X_valid, dataset.X_test)))
    return {name: reconstruction_metrics(params, X_nd, k, alpha, topk_method, activation, backend,
                                         top=tops(X_nd) if tops is not None else None)
            for name, X_nd in splits.items() if X_nd is not None and len(X_nd)}


def write_report(run_dir: Path, result: dict) -> None:
    """``eval.json`` (everything) and ``eval.md`` (tables), each written atomically."""
    _write_atomic(Path(run_dir) / "eval.json", json.dumps(result, indent=2, sort_keys=True) + "\n")
    _write_atomic(Path(run_dir) / "eval.md", markdown_report(result))


def markdown_report(result: dict) -> str:
    """A short Markdown summary: the chosen setting, test errors, and every trial."""
    feats = result["features"]
    sel = feats["selected"]
    lines = [f"# Evaluation of {result['run_dir']}", "",
             f"k = {result['k']}, {result['hidden']} hidden units, epoch {result['epoch']}, dataset {result['dataset']}, "
             f"device {result['device']}. Alpha and L2 chosen on the validation set; classifier refit on "
             f"{feats['refit']}; test set used once.", "",
             "| features | alpha | L2 | valid error | test error | paper |", "|---|---|---|---|---|---|"]
    paper = result.get("paper_test_error")
    lines.append(f"| supp_(alpha k)(W^T x + b) | {_fmt_alpha(sel['alpha'])} | {sel['l2']:g} | "
                 f"{_pct(sel['valid_error'])} | {_pct(feats['test_error'])} | {_pct(paper) if paper else '-'} |")
    raw = result.get("raw_baseline")
    if raw:
        raw_paper = err_mnist_error("raw", result["dataset"], HIDDEN)  # raw pixels have no hidden units
        lines.append(f"| raw pixels | - | {raw['selected']['l2']:g} | {_pct(raw['selected']['valid_error'])} | "
                     f"{_pct(raw['test_error'])} | {_pct(raw_paper) if raw_paper else '-'} |")
    svm = result.get("linear_svm")
    if svm:
        lines.append(f"| same features, linear SVM (C {svm['selected_C']:g}), fit on {svm['n_train']:,} | "
                     f"{_fmt_alpha(svm['alpha'])} | - | {_pct(svm['valid_error'])} | "
                     f"{_pct(svm['test_error_fit_on_train'])} | - |")
        lines.append(f"| same features, linear SVM (C {svm['selected_C']:g}), refit on {svm['n_train_valid']:,} | "
                     f"{_fmt_alpha(svm['alpha'])} | - | - | {_pct(svm['test_error_refit_on_train_valid'])} | - |")
    lines += reconstruction_table(result.get("reconstruction"), result["k"])
    lines += trials_table((("sparse", feats), ("raw", raw)))
    return "\n".join(lines) + "\n"


def reconstruction_table(splits: dict | None, k: int) -> list[str]:
    """The lines of the table of FVE, L0 and dead units per split (none for a report written before them)."""
    if not splits:
        return []
    alpha = next(iter(splits.values()))["alpha"]
    lines = ["", f"The autoencoder on each split: FVE, the fraction of variance explained by the reconstruction through "
                 f"the k = {k} largest units (1 is perfect, 0 is the split's mean); L0, the non-zero units per example "
                 f"of that k-code and of the alpha*k features (alpha {_fmt_alpha(alpha)}); dead, the units non-zero "
                 f"in the k-code of no example of the split (the train row: the run's dead count, as the end of "
                 f"ksae-train, ksae-plot and the export give it).", "",
             "| split | examples | FVE | L0 (k) | L0 (alpha*k) | dead units |", "|---|---|---|---|---|---|"]
    for name, m in ((name, splits[name]) for name in SPLITS if name in splits):
        lines.append(f"| {name} | {m['rows']:,} | {m['fve']:.4f} | {m['l0']:.2f} | {m['l0_alpha_k']:.2f} | "
                     f"{_dead_cell(m)} |")
    return lines


def _dead_cell(m: dict) -> str:
    """``529 (52.90%)``; the percentage alone for a report written before the count."""
    return _pct(m["dead_fraction"]) if m.get("n_dead") is None else f"{m['n_dead']:,} ({_pct(m['dead_fraction'])})"


def trials_table(blocks, alpha: bool = True) -> list[str]:
    """The lines of the table of every setting tried: a row per trial of each ``(name, block)`` (a block
    None or without trials adds none); with ``alpha``, the features' alpha column (ksae-eval's; the
    baselines' features have none)."""
    alpha_head, alpha_rule = (" alpha |", "---|") if alpha else ("", "")
    lines = ["", "Every setting tried (classifier fit on the training set only):", "",
             f"| features |{alpha_head} L2 | valid error | train error | L-BFGS iterations | converged |",
             f"|---|{alpha_rule}---|---|---|---|---|"]
    for name, block in blocks:
        for t in (block or {}).get("trials", []):
            alpha_cell = f" {_fmt_alpha(t['alpha'])} |" if alpha else ""
            lines.append(f"| {name} |{alpha_cell} {t['l2']:g} | {_pct(t['valid_error'])} | {_pct(t['train_error'])} | "
                         f"{t['n_iter']} | {'yes' if t['converged'] else 'no'} |")
    return lines


def _pct(x) -> str:
    return f"{100 * x:.2f}%"


_write_atomic = write_text_atomic  # the name variants.py and baseline_eval.py import

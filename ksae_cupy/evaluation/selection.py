"""The classifier chosen and tested on a run's features (section 4.5), the same way for every run:

1. For each (alpha, L2) pair, fit the softmax classifier on the TRAINING set only and measure its
   VALIDATION error; each alpha walks the L2 values from its start (:func:`select_and_test`), each
   fit warm-started from a previous one (same optimum, fewer iterations).
2. Pick the pair with the lowest validation error (ties: smaller alpha, then stronger L2).
3. Refit with the chosen pair on ``refit`` = ``"train+valid"`` (default: all 60k labelled
   MNIST images, the usual protocol once hyper-parameters are fixed) or ``"train"``.
4. Only now encode the test set and report its error, once.

The test labels are never read before step 4, so the choice cannot depend on them. The raw-pixel
baseline (paper: 7.20% on MNIST) goes through the same steps with the identity as encoder.
"""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from ksae_cupy.evaluation import classifier, grid
from ksae_cupy.backend import CPU, Backend, array_module
from ksae_cupy.errors import KsaeError, OptionError, literal

DEFAULT_ALPHAS = (1.0, 2.0, 3.0, 4.0)
# Mean cross-entropy + l2/2 ||W||^2: on 50k MNIST images the useful range sits around
# 1e-4 (raw pixels and alpha*k features alike); a decade either side brackets it.
DEFAULT_L2 = (1e-3, 1e-4, 1e-5)
DEFAULT_L2_EXTEND = 3  # decades tried beyond DEFAULT_L2's edge while the best L2 is on it
# The selection protocol's version, in eval.json and in the kept fits' fingerprint (fits of another protocol are
# not reused, and bin/paper-tables refuses to mix them): the walk of select_and_test, its fits to
# classifier.CHOICE_TOL and the refit to TOL, the encoder's X W in pieces of features.ROWS_PER_PIECE rows on
# one BLAS thread (the same bits at every thread count). docs/guide/evaluation.md tells the earlier versions apart.
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


def evaluation_code() -> dict:
    """What made an evaluation, for its ``eval.json``: the protocol version (:data:`PROTOCOL`), the package's
    version, and the commit of the checkout it ran from (None outside one; ``code_clean`` false when the package's
    own files differed from it; results rewritten in the tree, as a re-evaluation does, do not count). Tables
    refuse to mix protocols (:mod:`ksae_cupy.reports.paper_tables`)."""
    from ksae_cupy.made_with import code_commit, package_code_clean, package_version

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
    convex in log L2: next >= best_alpha - (other_neighbour - best_alpha). On MNIST runs of 10 and
    5000 epochs the walk made 10 fits where the full grid of every value of every alpha made 16 and
    12, and chose a pair whose validation error is within 0.01 point of the grid's choice
    (docs/guide/evaluation.md).

    The walk's fits stop at a gradient of ``max(l2, classifier.TOL)``, at most ``choice_tol``: they only
    choose; the refit goes on to ``classifier.TOL``.

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
        return f"{block}|alpha={fmt_alpha(alpha)}|l2={l2!r}"

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
            what = f"alpha={fmt_alpha(alpha)} l2={l2:g}"
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
    log(f"chosen on validation: alpha={fmt_alpha(best.alpha)} l2={best.l2:g} "
        f"(valid error {100 * best.valid_error:.2f}%, {len(trials)} fits); refit on {refit}")
    if not early_stop:
        _warn_unconverged(best_model, f"the chosen fit (alpha={fmt_alpha(best.alpha)} l2={best.l2:g})", max_iter,
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
            _warn_unconverged(final, f"the refit (alpha={fmt_alpha(best.alpha)} l2={best.l2:g})", max_iter,
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
    return array_module(A).concatenate([A, B])


def fmt_alpha(alpha) -> str:
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

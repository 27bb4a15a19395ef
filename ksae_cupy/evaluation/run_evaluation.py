"""``ksae-eval``'s work on a trained run: its features encoded once per split (:mod:`.features`), alpha and
L2 chosen and the test error read once (:mod:`.selection`), the autoencoder's own metrics per split, and the
report written (:mod:`.eval_report`)."""
from __future__ import annotations

import time

from threadpoolctl import threadpool_limits

from ksae_cupy.evaluation import grid, selection
from ksae_cupy.evaluation.eval_report import SPLITS, write_report
from ksae_cupy.evaluation.features import CodesByAlpha
from ksae_cupy.evaluation.trained_run import load_run_dataset, open_run
from ksae_cupy.backend import CPU, Backend
from ksae_cupy.errors import KsaeError
from ksae_cupy.model import alpha_k
from ksae_cupy.paper import DATASET, HIDDEN, err_mnist_error, ksparse_key
from ksae_cupy.evaluation.selection import DEFAULT_ALPHAS, DEFAULT_L2, DEFAULT_L2_EXTEND


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

    params = raw_input_params(ckpt.params, ckpt.preprocess)  # a --center-input run: its mean folded into b and c

    encode = CodesByAlpha(params, k, alphas, topk_method, backend, activation, lanes=max(1, workers))
    store = grid.FitStore(run_dir / grid.FITS_FILE, grid.fingerprint(
        run_dir / "checkpoint.h5", dataset, max_iter=max_iter, topk=topk_method, activation=activation,
        protocol=selection.PROTOCOL))
    result = {
        "run_dir": str(run_dir), "dataset": dataset.name, "k": k, "hidden": H, "epoch": ckpt.epoch,
        "device": backend.name, "alphas": list(alphas), "l2_grid": sorted(l2_grid, reverse=True), "max_iter": max_iter,
        "l2_extend": l2_extend, **selection.evaluation_code(),
        "features": selection.select_and_test(encode, dataset, alphas, l2_grid, refit, max_iter, backend, log,
                                              workers, store, extend=l2_extend, max_iter_name=max_iter_name,
                                              keep_test_codes=True),
    }
    if linear_svm:
        from ksae_cupy.evaluation.svm import linear_svm_rows
        log("classifier bracketing: a linear SVM on the chosen alpha's features")
        result["linear_svm"] = linear_svm_rows(encode, dataset, result["features"]["selected"]["alpha"], log=log)
    if raw_baseline:
        log("raw-pixel baseline through the same classifier")
        result["raw_baseline"] = selection.select_and_test(lambda alpha, X_nd: backend.asarray(X_nd), dataset,
                                                           [None], l2_grid, refit, max_iter, backend, log, workers,
                                                           store, "raw", extend=l2_extend, max_iter_name=max_iter_name)
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

"""Classifier bracketing rows: a linear SVM on the same alpha*k features, beside the paper's protocol.

Not the default protocol (that is logistic regression, :mod:`ksae_cupy.evaluation.features`).
These rows say how much of a gap to the paper's figures the choice of linear classifier could
explain:

1. at the alpha the main protocol chose, a linear SVM (scikit-learn's ``LinearSVC``, liblinear)
   is fit on the training set for each C and judged on the validation set;
2. the best C's test error, fit on the training set alone;
3. the same C refit on training + validation (all 60,000 labelled MNIST images), its test error.

The test set is read after the choice of C, as in the main protocol. scikit-learn is the optional
extra ``ksae-cupy[compare]``.
"""
from __future__ import annotations

import time

import numpy as np

from ksae_cupy.errors import KsaeError

DEFAULT_C = (0.01, 0.1, 1.0)


def _host(F):
    """Features on the host: CSR from the CPU path stays CSR, a CuPy array comes back as NumPy."""
    return F.get() if hasattr(F, "get") and not hasattr(F, "tocsr") else F


def linear_svm_rows(encode, dataset, alpha, C_grid=DEFAULT_C, log=print) -> dict:
    """Choose C on validation, then test once fit on train and once refit on train + valid."""
    try:
        from sklearn.svm import LinearSVC
    except ImportError:
        raise KsaeError("the linear SVM rows need scikit-learn: pip install 'ksae-cupy[compare]'") from None
    if not C_grid or any(not c > 0 for c in C_grid):
        raise KsaeError(f"C values {list(C_grid)} are not allowed; use positive numbers")
    F_train, F_valid = _host(encode(alpha, dataset.X_train)), _host(encode(alpha, dataset.X_valid))

    def fit(F, y, C):
        # The primal problem: examples (50,000) far outnumber features (H), where liblinear advises it.
        return LinearSVC(C=C, dual=False, max_iter=2000).fit(F, y)

    trials, best = [], None
    for C in C_grid:
        start = time.perf_counter()
        svm = fit(F_train, dataset.y_train, C)
        valid_error = float(np.mean(svm.predict(F_valid) != dataset.y_valid))
        trials.append({"C": float(C), "valid_error": valid_error, "seconds": round(time.perf_counter() - start, 2)})
        log(f"  linear SVM alpha={alpha:g} C={C:g}: valid error {100 * valid_error:.2f}%")
        if best is None or valid_error < best[1]:
            best = (C, valid_error, svm)
    C, valid_error, svm = best
    # The test set is encoded and its labels read only now, after the choice of C.
    F_test = _host(encode(alpha, dataset.X_test))
    test_error_train = float(np.mean(svm.predict(F_test) != dataset.y_test))
    import scipy.sparse as sp
    F_all = sp.vstack([F_train, F_valid], format="csr") if sp.issparse(F_train) else np.concatenate([F_train, F_valid])
    refit = fit(F_all, np.concatenate([dataset.y_train, dataset.y_valid]), C)
    test_error_all = float(np.mean(refit.predict(F_test) != dataset.y_test))
    log(f"linear SVM, C={C:g} chosen on validation: test error {100 * test_error_train:.2f}% fit on "
        f"{F_train.shape[0]:,}, {100 * test_error_all:.2f}% refit on {F_all.shape[0]:,}")
    return {"alpha": alpha, "trials": trials, "selected_C": float(C), "valid_error": valid_error,
            "test_error_fit_on_train": test_error_train, "test_error_refit_on_train_valid": test_error_all,
            "n_train": int(F_train.shape[0]), "n_train_valid": int(F_all.shape[0])}

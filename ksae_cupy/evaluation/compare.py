"""Side by side with sparse coding: the k-sparse encoder vs OMP, and vs a learnt dictionary.

Three feature extractors, each with the same number of non-zeros per row (``alpha * k``),
judged by the same protocol as :mod:`ksae_cupy.evaluation.features` (L2 chosen on validation, refit on
train+valid, test error once):

* ``ksae``: ``supp_{alpha k}(W^T x + b)`` -- one matrix product and a top-k;
* ``omp``: orthogonal matching pursuit on the trained dictionary (unit-norm columns of W,
  signal ``x - c``), scikit-learn's ``SparseCoder`` -- the sparse-coding answer for that W;
* ``dict_learning``: scikit-learn's ``MiniBatchDictionaryLearning`` trained for a fixed
  wall time (by default the autoencoder's own training time), then OMP codes.

Encoding times are measured on the test set. scikit-learn is the optional extra
``compare`` and is imported only here, inside the functions.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from ksae_cupy.errors import KsaeError
from ksae_cupy.evaluation.selection import select_and_test
from ksae_cupy.evaluation.features import sparse_features


def require_sklearn():
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise KsaeError("this needs scikit-learn: pip install 'ksae-cupy[compare]'") from None


def _csr(codes):
    import scipy.sparse as sp

    return sp.csr_matrix(np.asarray(codes, dtype=np.float32))


def omp_encoder(atoms_hd, n_nonzero: int, offset_d=None):
    """``encode(X_nd)``: OMP codes of ``X_nd - offset_d`` over unit-norm rows ``atoms_hd``, as CSR."""
    from sklearn.decomposition import SparseCoder

    atoms_hd = np.asarray(atoms_hd, dtype=np.float64)
    norms_h = np.linalg.norm(atoms_hd, axis=1)
    if (norms_h == 0).any():
        atoms_hd = atoms_hd[norms_h > 0]  # dead atoms can never be chosen; OMP needs unit norms
        norms_h = norms_h[norms_h > 0]
    coder = SparseCoder(dictionary=atoms_hd / norms_h[:, None], transform_algorithm="omp",
                        transform_n_nonzero_coefs=n_nonzero)
    offset = 0 if offset_d is None else np.asarray(offset_d, dtype=np.float64)
    return lambda X_nd: _csr(coder.transform(np.asarray(X_nd, dtype=np.float64) - offset))


def learn_dictionary(X_nd, n_atoms: int, n_nonzero: int, seconds: float, seed: int = 0, batch: int = 256, log=print):
    """``MiniBatchDictionaryLearning`` fed minibatches until ``seconds`` have passed: ``(atoms_hd, epochs)``."""
    from sklearn.decomposition import MiniBatchDictionaryLearning

    learner = MiniBatchDictionaryLearning(n_components=n_atoms, batch_size=batch, random_state=seed,
                                          transform_algorithm="omp", transform_n_nonzero_coefs=n_nonzero)
    rng = np.random.default_rng(seed)
    X_nd = np.asarray(X_nd, dtype=np.float64)
    start, seen = time.perf_counter(), 0
    while time.perf_counter() - start < seconds or seen == 0:
        order = rng.permutation(len(X_nd))
        for i in range(0, len(X_nd), batch):
            learner.partial_fit(X_nd[order[i:i + batch]])
            seen += len(order[i:i + batch])
            if time.perf_counter() - start >= seconds:
                break
    log(f"dictionary learning: {seen / len(X_nd):.2f} epochs in {time.perf_counter() - start:.1f}s")
    return learner.components_, seen / len(X_nd)


def _timed_test_encoding(encode, X_test):
    start = time.perf_counter()
    encode(X_test)
    return time.perf_counter() - start


def compare_encoders(params, k: int, dataset, alpha: float = 1.0, l2_grid=(1e-3, 1e-4), n_train: int | None = 10_000,
                     dict_seconds: float | None = None, max_iter: int = 300, seed: int = 0, log=print) -> dict:
    """Test errors and test-set encoding times of the k-sparse encoder, OMP on its dictionary,
    and (when ``dict_seconds`` is given) a dictionary learnt by sparse coding in that time.

    ``n_train`` rows of the training set (a seeded random subset; None: all) train the
    classifiers: OMP on 50k rows takes minutes.
    """
    require_sklearn()
    from ksae_cupy.model import alpha_k

    H = params["W_dh"].shape[1]
    n_nonzero = alpha_k(k, alpha, H)
    if n_train is not None and n_train < len(dataset.X_train):
        rows = np.sort(np.random.default_rng(seed).choice(len(dataset.X_train), n_train, replace=False))
        dataset = replace(dataset, X_train=dataset.X_train[rows], y_train=dataset.y_train[rows])
    quiet = lambda *_: None  # noqa: E731
    encoders = {
        "ksae": lambda X: sparse_features(params, X, k, alpha),
        "omp": omp_encoder(np.asarray(params["W_dh"]).T, n_nonzero, params["c_d"]),
    }
    result = {"k": k, "alpha": alpha, "nonzeros": n_nonzero, "n_train": len(dataset.X_train),
              "n_test": len(dataset.X_test), "methods": {}}
    if dict_seconds is not None:
        log(f"learning a {H}-atom dictionary for {dict_seconds:g}s")
        atoms_hd, epochs = learn_dictionary(dataset.X_train, H, n_nonzero, dict_seconds, seed, log=log)
        encoders["dict_learning"] = omp_encoder(atoms_hd, n_nonzero, np.zeros(dataset.dim))
        result["dict_learning_epochs"] = epochs
        result["dict_learning_seconds"] = dict_seconds
    for name, encode in encoders.items():
        log(f"{name}: encoding and classifying")
        outcome = select_and_test(lambda _alpha, X, encode=encode: encode(X), dataset, [None], l2_grid,
                                  max_iter=max_iter, log=quiet)
        seconds = _timed_test_encoding(encode, dataset.X_test)
        result["methods"][name] = {"test_error": outcome["test_error"], "l2": outcome["selected"]["l2"],
                                   "valid_error": outcome["selected"]["valid_error"],
                                   "test_encode_seconds": round(seconds, 4),
                                   "rows_per_second": round(len(dataset.X_test) / max(seconds, 1e-9), 1)}
        log(f"  {name}: test error {100 * outcome['test_error']:.2f}%, "
            f"{result['methods'][name]['rows_per_second']:.0f} rows/s")
    return result

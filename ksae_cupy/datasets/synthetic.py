"""A synthetic dataset for quick runs with no download: k-sparse codes of a random dictionary.

``x = W z`` with ``W`` (D x H) Gaussian with unit-norm columns and ``z`` non-negative with
exactly ``k`` non-zeros drawn uniformly from [0.5, 1.5]. The label of a signal is the
dictionary column with the largest coefficient, modulo ``n_classes``, so the classifier
path can be exercised too.
"""
from __future__ import annotations

import numpy as np


def make_sparse_signals(n: int, D: int = 64, H: int = 128, k: int = 5, n_classes: int = 4, seed: int = 0):
    """``(X_nd float32, y_n int64, W_dh)`` of ``n`` k-sparse signals."""
    rng = np.random.default_rng(seed)
    W_dh = rng.standard_normal((D, H))
    W_dh /= np.linalg.norm(W_dh, axis=0)
    Z_nh = np.zeros((n, H))
    support_nk = np.argsort(rng.random((n, H)), axis=1)[:, :k]
    np.put_along_axis(Z_nh, support_nk, rng.uniform(0.5, 1.5, (n, k)), axis=1)
    X_nd = (Z_nh @ W_dh.T).astype(np.float32)
    y_n = (np.argmax(Z_nh, axis=1) % n_classes).astype(np.int64)
    return X_nd, y_n, W_dh

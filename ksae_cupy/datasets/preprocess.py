"""Random patches, local contrast normalisation and ZCA whitening (Coates, Ng & Lee 2011).

The paper (section 4.1) takes random 8 x 8 patches of CIFAR-10, "locally contrast-normalized
and ZCA whitened ... the same as [Coates et al. 2011]". Their code, on pixel values in
0..255, per patch (a row)::

    x = (x - mean(x)) / sqrt(var(x) + 10)          # LCN_EPSILON = 10
    C = cov(X);  [V, D] = eig(C)
    P = V diag(1 / sqrt(diag(D) + 0.1)) V^T        # ZCA_EPSILON = 0.1
    X = (X - mean(X)) P

Both variances are unbiased (divide by n - 1), as MATLAB's ``var`` and ``cov``.
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.errors import KsaeError

# 10 on the 0..255 scale (a standard deviation of ~3 grey levels): contrast of nearly flat
# patches, which is mostly quantisation noise, is not blown up to unit variance.
LCN_EPSILON = 10.0
# 0.1 against eigenvalues of LCN'd patches, which sum to about D (each patch has variance
# ~1 per pixel): directions with variance well under 0.1 (noise, and the zero-variance
# direction that LCN's mean subtraction creates) are damped instead of amplified.
ZCA_EPSILON = 0.1


def random_patches(images_nhwc: np.ndarray, n_patches: int, size: int, seed: int, chunk: int = 100_000) -> np.ndarray:
    """``n_patches`` random ``size x size`` patches, each flattened in (row, column, channel)
    order, as float32: image, top and left drawn uniformly with ``default_rng(seed)``."""
    n, h, w, c = images_nhwc.shape
    if h < size or w < size:
        raise KsaeError(f"images of {h} x {w} pixels are smaller than the {size} x {size} patches")
    rng = np.random.default_rng(seed)
    which = rng.integers(0, n, n_patches)
    tops = rng.integers(0, h - size + 1, n_patches)
    lefts = rng.integers(0, w - size + 1, n_patches)
    offsets = np.arange(size)
    X_nd = np.empty((n_patches, size * size * c), dtype=np.float32)
    for s in range(0, n_patches, chunk):  # bounded fancy-indexing temporaries
        i, t, l = which[s:s + chunk], tops[s:s + chunk], lefts[s:s + chunk]
        rows = (t[:, None] + offsets)[:, :, None]
        cols = (l[:, None] + offsets)[:, None, :]
        X_nd[s:s + chunk] = images_nhwc[i[:, None, None], rows, cols].reshape(len(i), -1)
    return X_nd


def local_contrast_normalise(X_nd: np.ndarray, epsilon: float = LCN_EPSILON) -> np.ndarray:
    """Each row minus its mean, divided by ``sqrt(unbiased variance + epsilon)``; in place."""
    X_nd -= X_nd.mean(axis=1, keepdims=True)
    var_n = (X_nd * X_nd).sum(axis=1, keepdims=True) / (X_nd.shape[1] - 1)
    X_nd /= np.sqrt(var_n + epsilon)
    return X_nd


def zca_fit(X_nd: np.ndarray, epsilon: float = ZCA_EPSILON, chunk: int = 100_000) -> tuple[np.ndarray, np.ndarray]:
    """``(mean_d, P_dd)`` of ZCA whitening, accumulated in float64 over row chunks."""
    n, d = X_nd.shape
    if n < 2:
        raise KsaeError(f"ZCA whitening needs at least 2 patches, got {n}")
    mean_d = X_nd.sum(axis=0, dtype=np.float64) / n
    C_dd = np.zeros((d, d))
    for s in range(0, n, chunk):
        B = X_nd[s:s + chunk].astype(np.float64) - mean_d
        C_dd += B.T @ B
    C_dd /= n - 1
    eigval_d, V_dd = np.linalg.eigh(C_dd)
    eigval_d = np.clip(eigval_d, 0.0, None)  # rounding can make a zero eigenvalue slightly negative
    P_dd = (V_dd / np.sqrt(eigval_d + epsilon)) @ V_dd.T
    return mean_d.astype(np.float32), P_dd.astype(np.float32)


def zca_apply(X_nd: np.ndarray, mean_d: np.ndarray, P_dd: np.ndarray, chunk: int = 100_000) -> np.ndarray:
    """``(X - mean) P`` in place, by row chunks."""
    for s in range(0, len(X_nd), chunk):
        X_nd[s:s + chunk] = (X_nd[s:s + chunk] - mean_d) @ P_dd
    return X_nd


def lcn_zca_patches(images_nhwc: np.ndarray, n_patches: int, size: int, seed: int,
                    lcn_epsilon: float = LCN_EPSILON, zca_epsilon: float = ZCA_EPSILON):
    """``(X_nd, mean_d, P_dd)``: random patches, LCN, ZCA fitted on them and applied."""
    return lcn_zca(random_patches(images_nhwc, n_patches, size, seed), lcn_epsilon, zca_epsilon)


def lcn_zca(X_nd: np.ndarray, lcn_epsilon: float = LCN_EPSILON, zca_epsilon: float = ZCA_EPSILON):
    """``(X_nd, mean_d, P_dd)``: LCN, then ZCA fitted on the result and applied (in place)."""
    local_contrast_normalise(X_nd, lcn_epsilon)
    mean_d, P_dd = zca_fit(X_nd, zca_epsilon)
    return zca_apply(X_nd, mean_d, P_dd), mean_d, P_dd


def split_rows(n: int, valid_fraction: float, seed: int):
    """Indices ``(train, valid)`` of a seeded random split, at least one row in each."""
    order = np.random.default_rng(seed).permutation(n)
    n_valid = min(n - 1, max(1, int(round(valid_fraction * n))))
    return np.sort(order[n_valid:]), np.sort(order[:n_valid])


# ---- Centred inputs (beyond the paper: ksae-train --center-input) ----
# The training rows' mean, kept in the checkpoint's preprocess dict under this name; a model trained
# on centred inputs sees x - mean wherever it is used (the estimator subtracts it; ksae-eval and
# fine-tuning, which read the parameters, take them through raw_input_params).
INPUT_MEAN = "input_mean"


def raw_input_params(params: dict, preprocess: dict) -> dict:
    """Parameters that act on raw inputs as ``params`` act on centred ones: with the mean ``m`` in
    ``preprocess``, ``b_h - m W_dh`` (so ``x W + b'`` = ``(x - m) W + b``) and ``c_d + m`` (the
    reconstruction of x, not of x - m); ``params`` itself when the run was not centred."""
    mean_d = preprocess.get(INPUT_MEAN) if preprocess else None
    if mean_d is None:
        return params
    from ksae_cupy.backend import array_module

    xp = array_module(params["W_dh"])
    m_d = (xp.asarray(mean_d) if xp is not np else np.asarray(mean_d)).astype(params["W_dh"].dtype)
    return {**params, "b_h": params["b_h"] - m_d @ params["W_dh"], "c_d": params["c_d"] + m_d}

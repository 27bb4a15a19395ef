"""Multinomial logistic regression (softmax) on fixed features, with hand-written gradients.

The paper (section 4.5) judges features by the test error of a logistic-regression
classifier trained on them. Parameters: weights ``W_hc`` (H features, C classes) and bias
``b_c``. The loss, for features ``X_nh`` and integer labels ``y_n``:

    E = 1/N sum_n [ logsumexp_c(L_nc) - L_n,y_n ] + l2/2 ||W_hc||^2,   L_nc = X_nh W_hc + b_c

(the bias is not penalised). With P_nc = softmax(L_nc) and Y_nc the one-hot labels:

    dW_hc = X_nh^T (P_nc - Y_nc) / N + l2 W_hc ,    db_c = sum_n (P_nc - Y_nc) / N

Optimiser: full-batch L-BFGS (``scipy.optimize.minimize``). The objective is smooth and
strictly convex for l2 > 0, so a quasi-Newton method converges to the optimum in a hundred
or so passes, with no learning rate or schedule to tune -- which matters here, because
the L2 strength is chosen on validation error and an under-converged classifier would
confound that choice. L-BFGS keeps :data:`HISTORY` = 100 gradient pairs, not SciPy's 10
(nor 20): the weakly regularised fits are ill-conditioned, and
the longer memory reaches the same optimum in half the passes (measured on MNIST codes,
k = 25, alpha = 3: 1015 passes over the L2 path 1e-3 .. 1e-6 with 20 pairs, 461 with 100),
for 16 MB of history at 1000 units. Loss and gradient are computed by the array module of the features
(NumPy, or CuPy on a GPU); only the (H+1)*C parameter vector crosses to the host per step. On the CPU,
features with the same number of entries in every row (the alpha*k codes) have their two products
``X W`` and ``X^T G`` computed by :mod:`~ksae_cupy.evaluation.softmax_kernels` when Numba is installed:
SciPy's sums, bit for bit, 2-3x faster.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ksae_cupy.backend import array_module, to_host
from ksae_cupy.evaluation import softmax_kernels
from ksae_cupy.errors import KsaeError


@dataclass
class SoftmaxModel:
    """A fitted classifier: host arrays ``W_hc``, ``b_c`` and how the fit ended."""

    W_hc: np.ndarray
    b_c: np.ndarray
    l2: float
    n_iter: int = 0
    converged: bool = False
    loss: float = float("nan")
    message: str = ""
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


def loss_and_grads(W_hc, b_c, X_nh, y_n, l2: float, rows=None):
    """Mean cross-entropy plus ``l2/2 ||W||^2``: ``(loss float, dW_hc, db_c)``.

    ``W_hc``, ``b_c``, ``X_nh`` and ``y_n`` live on one array module; the loss is summed in
    float64 so a float32 feature matrix still gives a line-search-grade objective. ``rows``:
    ``X_nh``'s ``(idx_nk, val_nk)`` when its rows all hold K entries
    (:func:`~ksae_cupy.evaluation.softmax_kernels.fixed_width_rows`), for the compiled products
    (the same sums as SciPy's, 2-3x faster); None: ``X_nh``'s own ``@``.
    """
    xp = array_module(X_nh)
    N = X_nh.shape[0]
    # Class-major (C, N) logits: the per-row max and sum then run along contiguous rows of N, which is
    # 20x faster than along rows of C = 10 (they were a fifth of a fit's time).
    if rows is not None:
        L_cn = softmax_kernels.gather_logits(*rows, W_hc, b_c)
    else:
        L_cn = xp.ascontiguousarray((X_nh @ W_hc + b_c).T)
    L_cn -= L_cn.max(axis=0)  # stable softmax: shift by each example's maximum
    E_cn = xp.exp(L_cn)
    S_n = E_cn.sum(axis=0)
    flat_n = xp.asarray(y_n) * N + xp.arange(N)  # each example's label entry in the flattened (C, N) arrays
    nll = float(xp.log(S_n).sum(dtype=np.float64) - L_cn.ravel().take(flat_n).sum(dtype=np.float64)) / N
    loss = nll + 0.5 * l2 * float(xp.vdot(W_hc, W_hc))
    # P - Y, already divided by N: the gradient of the mean loss with respect to the logits (in E's memory).
    G_cn = E_cn
    G_cn /= S_n * N
    G_cn.ravel()[flat_n] -= 1.0 / N
    if rows is not None:
        dW_hc = softmax_kernels.weight_gradient(*rows, G_cn, X_nh.shape[1])
        dW_hc += l2 * W_hc
    else:
        dW_hc = X_nh.T @ xp.ascontiguousarray(G_cn.T) + l2 * W_hc
    return loss, dW_hc, G_cn.sum(axis=1)


def check_labels(y_n, n_classes: int) -> None:
    """Labels must be integers in ``[0, n_classes)``."""
    y_host = to_host(y_n)
    if y_host.size and (y_host.min() < 0 or y_host.max() >= n_classes):
        raise KsaeError(f"labels must lie in [0, {n_classes}); got range [{y_host.min()}, {y_host.max()}]")


HISTORY = 100  # L-BFGS correction pairs kept (scipy's maxcor)
TOL = 1e-5  # largest gradient entry at which a fit has converged (scipy's gtol; scikit-learn's default: 1e-4)
# The walk's fits, which only choose (alpha, L2), stop at a gradient of max(l2, TOL), at most this (scikit-learn's
# default); the refit, whose weights meet the test set, goes on to TOL (features.select_and_test). Measured on
# MNIST codes (docs/guide/evaluation.md): at L2 >= 1e-4 the validation errors moved by at most 0.06 point, in
# 60% to 75% of the passes. Below, L2 W is smaller than 1e-4 and a looser stop would not see the L2 at all.
CHOICE_TOL = 1e-4
# ... or one iteration lowered the loss by less than this (relative, absolute below a loss of 1: scipy's ftol,
# its default). Looser, it stops a warm-started fit of small loss after an iteration or two, unconverged.
FTOL = 2.2e-9


class FitStopped(Exception):
    """Raised out of :func:`fit` when its ``should_stop()`` turned true (Ctrl-C elsewhere)."""


def fit(X_nh, y_n, n_classes: int, l2: float, max_iter: int = 500, tol: float = TOL, ftol: float = FTOL,
        init: SoftmaxModel | None = None, should_stop=None) -> SoftmaxModel:
    """Fit by full-batch L-BFGS; ``init`` warm-starts from another fit (e.g. a nearby l2).

    Stops when the projected gradient's largest entry falls below ``tol`` or one iteration
    lowers the loss by less than the fraction ``ftol`` (scipy's ``gtol`` / ``ftol``), or after
    ``max_iter`` iterations. (``tol`` 1e-5, not 1e-6, stops where the validation
    error no longer moves -- on MNIST codes, k = 25, alpha = 3, within 0.01 point at L2 >= 1e-5
    -- in two thirds of the passes.) Runs where ``X_nh`` lives (NumPy or CuPy). ``should_stop()``,
    asked before every pass over the data, abandons the fit with :class:`FitStopped` (a fit
    in a worker thread cannot be interrupted any other way).
    """
    from scipy.optimize import minimize

    if l2 < 0:
        raise KsaeError(f"l2={l2} is not allowed; use l2 >= 0")
    check_labels(y_n, n_classes)
    xp = array_module(X_nh)
    H, C = X_nh.shape[1], n_classes
    dtype = X_nh.dtype
    y_n = xp.asarray(y_n, dtype=np.int64)
    rows = softmax_kernels.fixed_width_rows(X_nh) if softmax_kernels.available() else None

    def unpack(theta):
        theta_x = xp.asarray(theta, dtype=dtype)
        return theta_x[: H * C].reshape(H, C), theta_x[H * C:]

    def objective(theta):
        if should_stop is not None and should_stop():
            raise FitStopped
        W_hc, b_c = unpack(theta)
        loss, dW_hc, db_c = loss_and_grads(W_hc, b_c, X_nh, y_n, l2, rows)
        grad = np.concatenate([to_host(dW_hc).ravel(), to_host(db_c)]).astype(np.float64)
        return loss, grad

    theta0 = np.zeros(H * C + C) if init is None else np.concatenate([init.W_hc.ravel(), init.b_c])
    start = time.perf_counter()
    result = minimize(objective, theta0, jac=True, method="L-BFGS-B",
                      options={"maxiter": max_iter, "gtol": tol, "ftol": ftol, "maxcor": HISTORY})
    theta = np.asarray(result.x, dtype=np.float64)
    return SoftmaxModel(
        W_hc=theta[: H * C].reshape(H, C).astype(dtype), b_c=theta[H * C:].astype(dtype), l2=float(l2),
        n_iter=int(result.nit), converged=bool(result.success), loss=float(result.fun),
        message=str(result.message), seconds=time.perf_counter() - start)


def decision_function(model: SoftmaxModel, X_nh):
    """Logits ``L_nc`` on the array module of ``X_nh``."""
    xp = array_module(X_nh)
    return X_nh @ xp.asarray(model.W_hc, dtype=X_nh.dtype) + xp.asarray(model.b_c, dtype=X_nh.dtype)


def predict(model: SoftmaxModel, X_nh) -> np.ndarray:
    """Predicted class per row, as a host int64 array."""
    return to_host(decision_function(model, X_nh).argmax(axis=1)).astype(np.int64)


def error_rate(model: SoftmaxModel, X_nh, y_n) -> float:
    """Fraction of rows whose predicted class differs from ``y_n``."""
    return float(np.mean(predict(model, X_nh) != to_host(y_n)))

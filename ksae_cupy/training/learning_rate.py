"""``lr="auto"``: a learning rate derived from the data, equal to the paper's 0.01 on MNIST.

The loss 0.5 ||x - xhat||^2 sums over the input's dimensions, so its curvature in W, and
with it the largest rate at which momentum SGD stays stable, scales with the data's mean
squared norm E||x||^2. Measured (docs/lr-auto.md, bin/measure-lr): the largest stable rate
times E||x||^2 is close to constant across MNIST, Fashion-MNIST, synthetic data and
rescaled copies of them. The auto rate keeps the paper's margin below that limit:

    lr = 0.01 * E_MNIST||x||^2 / E||x||^2     (rounded to two significant digits)
"""
from __future__ import annotations

import math

import numpy as np

from ksae_cupy.backend import array_module

PAPER_LR = 0.01  # the paper's rate on MNIST (section 4.3.2)
# E||x||^2 over MNIST's 50,000 training images with pixels in [0, 1] (our split of section 4.1).
MNIST_MEAN_SQUARED_NORM = 87.827


def mean_squared_norm(X_nd, chunk: int = 8192) -> float:
    """E||x||^2, the mean over rows of each row's squared Euclidean norm (in float64)."""
    xp = array_module(X_nd)
    total = 0.0
    for start in range(0, X_nd.shape[0], chunk):
        rows = X_nd[start:start + chunk].astype(np.float64)
        total += float(xp.vdot(rows, rows))
    return total / max(X_nd.shape[0], 1)


def auto_learning_rate(X_nd) -> float:
    """The rate ``lr="auto"`` / ``--lr auto`` trains ``X_nd`` with: 0.01 on MNIST, inversely
    proportional to E||x||^2 elsewhere, two significant digits."""
    msq = mean_squared_norm(X_nd)
    if msq <= 0:
        return PAPER_LR  # all-zero data: any rate is stable; keep the paper's
    return round_significant(PAPER_LR * MNIST_MEAN_SQUARED_NORM / msq, 2)


def round_significant(value: float, digits: int) -> float:
    exponent = math.floor(math.log10(abs(value)))
    return round(value, digits - 1 - exponent)

"""The :class:`Dataset` every loader returns, and the value checks every loader applies."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ksae_cupy.errors import KsaeError


@dataclass
class Dataset:
    """Training, validation and (when the data has one) test splits, float32 ``X`` and int64 ``y``.

    ``preprocess`` holds the statistics the preprocessing computed on the training set
    (means, standard deviations, a ZCA matrix); they travel with checkpoints so that
    evaluation reuses them. Labels are None for unlabelled data.
    """

    name: str
    X_train: np.ndarray
    X_valid: np.ndarray
    X_test: np.ndarray | None = None
    y_train: np.ndarray | None = None
    y_valid: np.ndarray | None = None
    y_test: np.ndarray | None = None
    n_classes: int | None = None
    image_shape: tuple | None = None  # e.g. (28, 28), for drawing filters
    preprocess: dict = field(default_factory=dict)

    @property
    def dim(self) -> int:
        return self.X_train.shape[1]

    def summary(self) -> str:
        sizes = f"{len(self.X_train)} train / {len(self.X_valid)} valid"
        if self.X_test is not None:
            sizes += f" / {len(self.X_test)} test"
        return f"{self.name}: {sizes}, {self.dim} dimensions"


def check_float_input(X: np.ndarray, what: str) -> None:
    """Refuse integer (and boolean) data with a hint to scale it: raw counts or pixel values
    of 0..255 make the squared error overflow and training diverge, and only the user knows
    the scale (the estimator and ``ksae-train`` both call this)."""
    if not (np.issubdtype(X.dtype, np.integer) or np.issubdtype(X.dtype, np.bool_)):
        return
    low, high = (X.min(), X.max()) if X.size else (0, 0)
    raise KsaeError(f"{what} holds {X.dtype} values (from {low} to {high}); only floating-point data is trained "
                    f"on: scale it first, e.g. save X.astype('float32') / {max(int(high), 1)}, or standardise "
                    f"each column")


def check_finite(X: np.ndarray, what: str) -> None:
    """Reject NaN and infinities with the position of the first one."""
    finite = np.isfinite(X)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise KsaeError(f"{what} holds {int((~finite).sum())} non-finite values (first at row {row}, "
                        f"column {col}: {X[row, col]}); only finite values are allowed")


def magnitude_limit(X: np.ndarray) -> float:
    """The largest |value| for which the squared error summed over all of ``X`` (an error
    can reach twice a value) stays finite in float32."""
    return float(np.sqrt(np.finfo(np.float32).max / (4.0 * max(X.size, 1))))


def check_magnitude(X: np.ndarray, what: str) -> None:
    """Refuse values so large that float32 training arithmetic would overflow, naming the first."""
    limit = magnitude_limit(X)
    if X.size == 0 or max(float(X.max()), -float(X.min())) <= limit:  # no copy of a large X when all is well
        return
    too_big = np.abs(X) > limit
    if too_big.any():
        row, col = np.argwhere(too_big)[0]
        raise KsaeError(f"{what} holds {int(too_big.sum())} values too large for float32 arithmetic (first at row "
                        f"{row}, column {col}: {X[row, col]:.3g}; |values| up to {limit:.3g} are allowed for "
                        f"{X.shape[0]} x {X.shape[1]} data); standardise it first (subtract each column's mean, "
                        f"divide by its standard deviation)")

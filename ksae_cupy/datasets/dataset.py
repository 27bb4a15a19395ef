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


def check_float_input(X, *, name: str) -> None:
    """Refuse integer (and boolean) arrays with a hint to scale them.

    Integer data is almost always unscaled (8-bit pixels 0..255, counts); trained as it is,
    the loss, which sums squared errors over dimensions, is thousands of times the scale the
    learning rates are set for, and training diverges.
    """
    kind = X.dtype.kind
    if kind in "biu":
        low, high = (int(X.min()), int(X.max())) if X.size else (0, 0)
        raise KsaeError(f"{name} holds integers (dtype {X.dtype}, values {low} to {high}); use floats on a scale "
                        f"near [0, 1], e.g. X / {max(high, 1)} (X / 255 for 8-bit pixels)")

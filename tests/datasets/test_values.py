"""The value checks every loader applies: finite, and small enough for float32 arithmetic."""
import numpy as np
import pytest

from ksae_cupy.datasets.dataset import check_magnitude, magnitude_limit
from ksae_cupy.errors import KsaeError


def test_the_limit_is_where_the_summed_squared_error_stops_being_finite():
    X = np.zeros((50, 20), np.float32)
    limit = magnitude_limit(X)
    at_limit = np.full_like(X, np.float32(limit) * np.float32(0.999))
    check_magnitude(at_limit, "x")
    assert np.isfinite(np.sum(np.square(2 * at_limit), dtype=np.float32))  # errors up to twice a value
    over = np.full_like(X, np.float32(limit) * np.float32(1.5))
    with np.errstate(over="ignore"):  # the overflow is the point
        assert not np.isfinite(np.sum(np.square(2 * over), dtype=np.float32))
    with pytest.raises(KsaeError, match="too large for float32"):
        check_magnitude(over, "x")


def test_first_offending_position_and_advice():
    X = np.ones((30, 6), np.float32)
    X[4, 2], X[9, 1] = -1e25, 1e25
    with pytest.raises(KsaeError) as info:
        check_magnitude(X, "data.npy")
    message = str(info.value)
    assert "row 4, column 2" in message and "2 values" in message and "standardise" in message
    check_magnitude(X / 1e20, "scaled")  # the same data, scaled, passes

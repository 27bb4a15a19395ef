"""Both NumPy top-k implementations against a brute-force reading of the contract."""
import numpy as np
import pytest

from ksae_cupy.errors import KsaeError
from ksae_cupy.topk import order_keys, topk, topk_sort, topk_threshold

IMPLEMENTATIONS = [topk_sort, topk_threshold]


def brute_force_support(Z_nh, k):
    """Sorted columns of the k entries ranked highest by (key desc, column asc), row by row."""
    keys_nh = order_keys(Z_nh)
    support = []
    for keys_h in keys_nh:
        ranked = sorted(range(len(keys_h)), key=lambda j: (-int(keys_h[j]), j))
        support.append(sorted(ranked[:k]))
    return np.array(support)


def draw_rows(kind, N, H, dtype, rng):
    if kind == "random":
        Z = rng.standard_normal((N, H))
    elif kind == "ties":  # small integers: many ties at every threshold
        Z = rng.integers(-2, 3, (N, H)).astype(float)
    elif kind == "negative":
        Z = -np.abs(rng.standard_normal((N, H))) - 1
    elif kind == "constant":
        Z = np.full((N, H), 3.0)
    else:  # special values: +-inf, NaN, signed zeros
        Z = rng.choice([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0, -1.0], (N, H))
    return Z.astype(dtype)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["random", "ties", "negative", "constant", "special"])
@pytest.mark.parametrize("H", [1, 7, 31, 100])
def test_matches_brute_force(impl, dtype, kind, H):
    rng = np.random.default_rng(H)
    Z_nh = draw_rows(kind, 9, H, dtype, rng)
    for k in sorted({1, max(1, H // 2), H}):
        idx_nk, val_nk = impl(Z_nh, k)
        assert idx_nk.dtype == np.int32 and idx_nk.shape == (9, k)
        assert val_nk.dtype == Z_nh.dtype
        np.testing.assert_array_equal(np.sort(idx_nk, axis=1), brute_force_support(Z_nh, k))
        np.testing.assert_array_equal(val_nk, np.take_along_axis(Z_nh, idx_nk, axis=1))


def test_orders_within_rows():
    Z = np.array([[1.0, 3.0, 3.0, 2.0, 3.0]], dtype=np.float32)
    idx_sort, val_sort = topk_sort(Z, 3)
    assert idx_sort.tolist() == [[1, 2, 4]] and val_sort.tolist() == [[3.0, 3.0, 3.0]]
    assert topk_sort(Z, 4)[0].tolist() == [[1, 2, 4, 3]]  # descending, ties by column
    assert topk_threshold(Z, 4)[0].tolist() == [[1, 2, 3, 4]]  # ascending column order


def test_ranking_puts_nan_last_and_negative_zero_below_zero():
    Z = np.array([[np.nan, -np.inf, -0.0, 0.0]], dtype=np.float32)
    assert topk_sort(Z, 1)[0].tolist() == [[3]]
    assert sorted(topk_threshold(Z, 3)[0][0].tolist()) == [1, 2, 3]


@pytest.mark.parametrize("k", [0, 6])
def test_rejects_k_outside_range(k):
    with pytest.raises(KsaeError, match=f"k={k}"):
        topk(np.zeros((2, 5), dtype=np.float32), k)


def test_rejects_bad_method_and_dtype():
    with pytest.raises(KsaeError, match="heap"):
        topk(np.zeros((2, 5), dtype=np.float32), 1, "heap")
    with pytest.raises(KsaeError, match="int64"):
        topk(np.zeros((2, 5), dtype=np.int64), 1)

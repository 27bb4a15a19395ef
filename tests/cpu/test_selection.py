"""The CPU kernels' top-k selection (``_select_row`` in ksae_cupy/cpu/numba_kernels.py): exactly NumPy's top-k
on rows built to defeat its candidate thresholds, and the counts of rows that needed a lower threshold or the
whole row (:func:`~ksae_cupy.cpu.numba_kernels.selection_passes`)."""
import statistics

import numpy as np
import pytest

from ksae_cupy.cpu import numba_kernels as kernels
from ksae_cupy.topk import topk_sort, topk_threshold

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason="Numba is not installed (pip install '.[fast]'): the CPU kernels cannot run")

H = 1000


def trained_like_codes(rng, N, H):
    """Codes shaped like those of trained MNIST models (``X W + b``, k = 25, H = 1000).

    Measured on the quick start's 10-epoch model and the 5000-epoch k = 25 checkpoints: a row's z-scores
    ((z - mean) / std) have a long negative tail (0.1% quantile -3.6 to -3.8, skew -0.3 to -0.8) and a
    compressed bulk above the mean (95% quantile 0.86-1.38, where a normal row has 1.64), with a few large
    positive units (99.9% quantile 3.3-4.9). The long negative tail widens the std, so the normal quantile
    for 2k of H (mean + 1.64 std) let fewer than k entries through on 27-94% of the rows. Here: a bulk of
    ``0.5 - lognormal`` (bounded above, long tail below) and 1.5% of the units active with a positive
    exponential value (z-quantiles -6.9, -1.7, 0.8, 1.8, 7.0 at 0.1, 5, 95, 99, 99.9%).
    """
    Z_nh = 0.5 - rng.lognormal(0.0, 0.75, size=(N, H))
    active_nh = rng.random((N, H)) < 0.015
    Z_nh[active_nh] += rng.exponential(3.0, size=int(active_nh.sum())) + 1.0
    return Z_nh


def adversarial_rows(dtype, rng):
    """Rows that reach every pass of the selection: (rows, what each block is)."""
    blocks = {
        "normal": rng.standard_normal((6, H)),
        "trained-like (skewed, heavy-tailed)": trained_like_codes(rng, 6, H),
        "one huge outlier (no threshold lets k through)": np.where(np.arange(H) == 17, 1e6, rng.random((4, H))),
        "few positive, rest one negative value": np.where(rng.random((4, H)) < 0.005, rng.random((4, H)) + 1, -1.0),
        "ties at every value": np.round(rng.standard_normal((4, H)) * 4) / 4,
        "constant": np.full((2, H), 3.0),
        "NaN and infinities": rng.choice([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0, -1.0], (4, H)),
        "one NaN in a normal row": np.where(np.arange(H) == 500, np.nan, rng.standard_normal((2, H))),
        "-inf below a few finite": np.where(rng.random((2, H)) < 0.01, rng.standard_normal((2, H)), -np.inf),
    }
    zeros = np.round(rng.standard_normal((6, H)) * 4) / 4
    zeros -= zeros.max(axis=1, keepdims=True)  # the largest entries are zeros ...
    zeros[:3][zeros[:3] == 0] = -0.0  # ... some rows' all -0.0, others' +0.0
    zeros[3:, ::7] = np.where(zeros[3:, ::7] == 0, -0.0, zeros[3:, ::7])  # and some mixed in one row
    blocks["signed zeros at the top"] = zeros
    return np.concatenate([block.astype(dtype) for block in blocks.values()]), list(blocks)


def _select(Z_nh, k, descending):
    N, _ = Z_nh.shape
    dtype = Z_nh.dtype
    W_hd, c_d, X_nd = np.zeros((Z_nh.shape[1], 2), dtype), np.zeros(2, dtype), np.zeros((N, 2), dtype)
    _, idx_nk, val_nk, _, _ = kernels.select_decode_and_backprop(Z_nh, k, descending, W_hd, c_d, X_nd, False)
    return idx_nk, val_nk


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_selection_is_exactly_numpys_top_k_on_rows_that_defeat_its_thresholds(dtype, threads):
    """Same units in the same order as topk_sort (descending) and topk_threshold (ascending columns): ties to the
    lower column, NaN lowest, -0.0 below +0.0; whichever threshold let the candidates through, or none."""
    Z_nh, _ = adversarial_rows(dtype, np.random.default_rng(7))
    try:
        kernels.set_threads(threads)
        for k in (1, 10, 25, 100, H // 2 - 1, H - 2, H - 1, H):
            for descending, numpy_topk in ((True, topk_sort), (False, topk_threshold)):
                idx_nk, val_nk = _select(Z_nh, k, descending)
                expected_idx, expected_val = numpy_topk(Z_nh, k)
                np.testing.assert_array_equal(idx_nk, expected_idx, err_msg=f"k={k} descending={descending}")
                # the same bits: -0.0 and +0.0 told apart, NaN where NaN was kept
                np.testing.assert_array_equal(val_nk.view(f"u{val_nk.itemsize}"),
                                              expected_val.view(f"u{val_nk.itemsize}"))
    finally:
        kernels.set_threads(None)


def test_the_adversarial_rows_reach_every_pass():
    """So that the test above checks each way a row is selected: the first threshold, a lower one, the whole row."""
    Z_nh, _ = adversarial_rows(np.float32, np.random.default_rng(7))
    passes = kernels.selection_passes(Z_nh, 25)
    assert passes["rows"] == Z_nh.shape[0]
    assert 0 < passes["whole_row"] < passes["beyond_first"] < passes["rows"]


def test_selection_passes_counts_rows_by_how_far_the_threshold_had_to_drop():
    rng = np.random.default_rng(3)
    normal_nh = rng.standard_normal((20, H))  # about 2k of H above the first threshold: it suffices
    skewed_nh = trained_like_codes(rng, 30, H)
    outlier_nh = np.where(np.arange(H) == 3, 1e6, rng.random((5, H)))  # std 31,600: no threshold lets 25 through
    Z_nh = np.concatenate([normal_nh, skewed_nh, outlier_nh]).astype(np.float32)
    first = statistics.NormalDist().inv_cdf(1 - 2 * 25 / H)
    z_nh = (Z_nh - Z_nh.mean(axis=1, keepdims=True)) / Z_nh.std(axis=1, keepdims=True)
    short_n = (z_nh >= first).sum(axis=1) < 25  # the rows whose first threshold lets fewer than k through
    assert not short_n[:20].any() and short_n[20:].all()
    assert kernels.selection_passes(Z_nh, 25) == {"rows": 55, "beyond_first": 35, "whole_row": 5}
    assert kernels.selection_passes(normal_nh.astype(np.float64), 25) == {"rows": 20, "beyond_first": 0,
                                                                          "whole_row": 0}
    # 2k >= H: every entry is looked at from the start, which counts as neither
    assert kernels.selection_passes(Z_nh, H // 2) == {"rows": 55, "beyond_first": 0, "whole_row": 0}


def test_selection_passes_refuses_what_top_k_refuses():
    from ksae_cupy.errors import KsaeError

    with pytest.raises(KsaeError, match="k=0"):
        kernels.selection_passes(np.zeros((2, 5), np.float32), 0)


@pytest.mark.parametrize("k", [10, 25, 40])
def test_no_row_of_trained_like_codes_is_looked_at_whole(k):
    """The first threshold (the normal quantile for 2k of H) falls short on most rows of codes shaped like a
    trained model's, where the selection once looked at the whole row; a lower threshold now lets k through."""
    Z_nh = trained_like_codes(np.random.default_rng(k), 512, H).astype(np.float32)
    passes = kernels.selection_passes(Z_nh, k)
    assert passes["beyond_first"] > 512 // 2  # these codes defeat the first threshold ...
    assert passes["whole_row"] == 0  # ... and never the later ones
    np.testing.assert_array_equal(_select(Z_nh, k, True)[0], topk_sort(Z_nh, k)[0])


def test_candidate_spreads_are_the_normal_quantiles_for_2k_4k_8k_of_the_row():
    spreads = kernels.candidate_spreads(25, 1000)
    assert len(spreads) == 4  # 50, 100, 200, 400 of 1000; not 800, past half the row
    for multiple, spread in zip((2, 4, 8, 16), spreads):
        assert spread == pytest.approx(statistics.NormalDist().inv_cdf(1 - multiple * 25 / 1000))
    assert kernels.candidate_spreads(400, 1000) == pytest.approx((statistics.NormalDist().inv_cdf(0.2),))
    assert kernels.candidate_spreads(500, 1000) == ()

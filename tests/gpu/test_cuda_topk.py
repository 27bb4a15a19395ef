"""The CUDA kernels against the NumPy reference: on a GPU with CuPy, and everywhere else against
the strict CuPy stand-in (tests/cupy_standin), whose kernels run in the CUDA host emulator.

Every top-k call writes into outputs poisoned beforehand (-1 indices, NaN values), so a slot the
kernel leaves unwritten shows up. Comparisons are exact: the kernels follow the contract of
ksae_cupy.topk bit for bit, so indices must match in order (sort: descending, ties by ascending
column; threshold: ascending column) and values bit for bit (NaN payloads and -0.0 included).
Under the stand-in the shapes are those of a GPU, with fewer rows per batch (see rows()).
"""
from __future__ import annotations

import numpy as np
import pytest

from ksae_cupy.errors import KsaeError
from ksae_cupy.gpu import cuda_kernels as cuda
from ksae_cupy.topk import topk_sort, topk_threshold
from training_setup import (TRAJECTORY_K, TRAJECTORY_LR, TRAJECTORY_MOMENTUM, TRAJECTORY_STEPS, setup,
                            trajectory_setup)

pytestmark = pytest.mark.gpu
cupy = None  # the module of the running test: CuPy on a GPU, else the stand-in (fixture gpu_cupy)


@pytest.fixture(autouse=True)
def _cupy(gpu_cupy):
    global cupy
    cupy = gpu_cupy
    yield
    cupy = None


def rows(n: int, standin: int) -> int:
    """``n`` rows on a GPU, ``standin`` under the stand-in: its emulated kernels run a few thousand
    rows a second, and tests/gpu/test_kernels_host.py already runs every instantiation on
    thousands of hard rows; here the launchers and the Python around them are what is new."""
    return standin if getattr(cupy, "STANDIN", False) else n


GRID_WRAP_ROWS = 1100  # more than one grid pass: 132 SMs x 8 blocks of 256 threads = 1,056 blocks

REFERENCE = {"sort": topk_sort, "threshold": topk_threshold}
HS = (1, 31, 784, 1000, 4000, 16384)
KINDS = ("random", "ties", "negative", "constant", "inf", "nan")


def make_rows(kind: str, N: int, H: int, seed: int, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "random":
        Z = rng.standard_normal((N, H))
    elif kind == "ties":  # small integers: long runs of equal keys at the threshold
        Z = rng.integers(-2, 3, size=(N, H)).astype(np.float64)
    elif kind == "negative":
        Z = -np.abs(rng.standard_normal((N, H)))
        Z[:, ::7] = -0.0
    elif kind == "constant":
        Z = np.full((N, H), 1.5)
    elif kind == "inf":
        Z = rng.standard_normal((N, H))
        Z[rng.random((N, H)) < 0.05] = np.inf
        Z[rng.random((N, H)) < 0.05] = -np.inf
    elif kind == "nan":
        Z = rng.standard_normal((N, H))
        Z[rng.random((N, H)) < 0.3] = np.nan
        Z[:, 0] = np.nan
    else:
        raise ValueError(kind)
    return np.ascontiguousarray(Z.astype(dtype))


def ks_for(H: int):
    return sorted({k for k in (1, 25, H // 2, H) if 1 <= k <= H})


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def run_and_check(Z: np.ndarray, k: int, method: str, *, dense: bool = False, max_blocks=None, variant: str = "block"):
    N, H = Z.shape
    Zd = cupy.asarray(Z)
    idx = cupy.full((N, k), -1, dtype=np.int32)
    val = cupy.full((N, k), np.nan, dtype=Z.dtype)
    outs = [idx, val]
    if dense:
        outs.append(cupy.full((N, H), np.nan, dtype=Z.dtype))
    result = cuda.topk_gpu(Zd, k, method, dense=dense, out=tuple(outs), max_blocks=max_blocks, variant=variant)
    assert all(r is o for r, o in zip(result, outs))
    ref_idx, ref_val = REFERENCE[method](Z, k)
    got_idx, got_val = idx.get(), val.get()
    assert (got_idx >= 0).all(), "unwritten index slots"
    np.testing.assert_array_equal(np.sort(got_idx, axis=1), np.sort(ref_idx, axis=1))  # the sets
    np.testing.assert_array_equal(got_idx, ref_idx)  # and the contract's order
    np.testing.assert_array_equal(bits(got_val), bits(ref_val))
    if dense:
        ref_dense = np.zeros_like(Z)
        np.put_along_axis(ref_dense, ref_idx, ref_val, axis=1)
        np.testing.assert_array_equal(bits(outs[2].get()), bits(ref_dense))


@pytest.mark.parametrize("method", ["sort", "threshold"])
@pytest.mark.parametrize("H", HS)
@pytest.mark.parametrize("kind", KINDS)
def test_topk_matches_reference(method, H, kind):
    N = rows(48, 12) if H <= 4000 else rows(12, 4)
    Z = make_rows(kind, N, H, seed=H * 31 + len(kind))
    for k in ks_for(H):
        # max_blocks=5: every block handles several rows (the grid-stride loop).
        run_and_check(Z, k, method, max_blocks=5)


@pytest.mark.parametrize("method", ["sort", "threshold"])
@pytest.mark.parametrize("H", [31, 1000, 4000])
def test_topk_float64_and_dense(method, H):
    for kind in ("random", "ties", "nan"):
        Z64 = make_rows(kind, rows(33, 9), H, seed=H + 7, dtype=np.float64)
        for k in ks_for(H):
            run_and_check(Z64, k, method, dense=True, max_blocks=4)
            run_and_check(Z64.astype(np.float32), k, method, dense=True)


@pytest.mark.parametrize("method", ["sort", "threshold"])
def test_topk_many_rows_beyond_one_grid_pass(method):
    # 70,001 rows: more than the default grid (a few thousand blocks), so the row loop wraps.
    Z = make_rows("random", rows(70_001, GRID_WRAP_ROWS), 784, seed=5)
    Z[::3] = np.round(Z[::3])  # some tie-heavy rows too
    run_and_check(Z, 25, method)
    run_and_check(Z[:rows(20_000, GRID_WRAP_ROWS)], 150, method, dense=True, max_blocks=1000)


@pytest.mark.parametrize("method", ["sort", "threshold"])
def test_topk_mixed_rows_in_one_batch(method):
    batches = [make_rows(kind, 5, 1000, seed=i) for i, kind in enumerate(KINDS)]
    Z = np.ascontiguousarray(np.concatenate(batches))
    for k in ks_for(1000):
        run_and_check(Z, k, method, dense=True, max_blocks=3)


def test_topk_empty_batch():
    Z = cupy.zeros((0, 100), dtype=np.float32)
    idx, val = cuda.topk_gpu(Z, 10, "threshold")
    assert idx.shape == (0, 10) and val.shape == (0, 10)


def test_topk_dispatch_from_topk():
    from ksae_cupy.topk import topk

    Z = make_rows("random", 16, 1000, seed=3)
    for method in ("sort", "threshold"):
        idx, val = topk(cupy.asarray(Z), 25, method)
        ref_idx, _ = REFERENCE[method](Z, 25)
        np.testing.assert_array_equal(idx.get(), ref_idx)


def test_topk_rejects_bad_arguments():
    Z = cupy.zeros((4, 10), dtype=np.float32)
    for k in (0, 11, -1):
        with pytest.raises(KsaeError, match=f"k={k}"):
            cuda.topk_gpu(Z, k, "sort")
    with pytest.raises(KsaeError, match="integer"):
        cuda.topk_gpu(Z, 2.0, "sort")
    with pytest.raises(KsaeError, match="C-contiguous"):
        cuda.topk_gpu(cupy.zeros((10, 4), dtype=np.float32).T, 2, "sort")
    with pytest.raises(KsaeError, match="dtype int32"):
        cuda.topk_gpu(cupy.zeros((4, 10), dtype=np.int32), 2, "sort")
    with pytest.raises(KsaeError, match="method"):
        cuda.topk_gpu(Z, 2, "heap")
    with pytest.raises(KsaeError, match="out idx_nk"):
        cuda.topk_gpu(Z, 2, "sort", out=(cupy.empty((4, 3), np.int32), cupy.empty((4, 2), np.float32)))
    # A row too long for shared memory: a clear error naming the limit, not a launch failure.
    with pytest.raises(KsaeError, match="H <= "):
        cuda.topk_gpu(cupy.zeros((1, 1 << 20), dtype=np.float32), 5, "sort")
    with pytest.raises(KsaeError, match="H <= "):
        cuda.topk_gpu(cupy.zeros((1, 1 << 20), dtype=np.float32), 5, "threshold")


@pytest.mark.parametrize("H, dtype", [(11997, np.float32), (12288, np.float32), (5999, np.float64)])
def test_threshold_rows_that_need_the_opt_in_for_the_static_part(H, dtype):
    # The dynamic part alone stays under 48 KiB; with the kernel's 1,168 static bytes it does not.
    Z = make_rows("random", 5, H, seed=H, dtype=dtype)
    run_and_check(Z, 100, "threshold", dense=True)


def test_h_16384_fits_both_methods_float32():
    Z = make_rows("random", 3, 16384, seed=1)
    for method in ("sort", "threshold"):
        run_and_check(Z, 512, method, dense=True)


# ------------------------------------------------------------------------------------------------
# The radix kernels (variant="radix"): the launcher's own plans on the device.

@pytest.mark.parametrize("method", ["sort", "threshold"])
@pytest.mark.parametrize("H", [1, 31, 1000, 4000, 16384])
def test_radix_matches_reference(method, H):
    """Rows packed 8 to a block (N above 2,048), one to a block (small N), ties and NaN, float32 and float64."""
    for kind in ("random", "ties", "nan"):
        Z = make_rows(kind, rows(3000, 300) if H <= 1000 else rows(64, 3), H, seed=H * 7 + len(kind))
        for k in sorted({k for k in (1, 25, 150, H - 1, H) if 1 <= k <= H}):
            run_and_check(Z, k, method, variant="radix", dense=k == 25)
        run_and_check(Z.astype(np.float64)[:5], min(H, 25), method, variant="radix", dense=True, max_blocks=2)


def test_radix_takes_rows_longer_than_the_block_kernels():
    """H = 65,536 (float32): the block kernels refuse it, the radix kernels re-read the row per digit."""
    Z = make_rows("random", rows(8, 1), 65536, seed=3)
    for method in ("sort", "threshold"):
        with pytest.raises(KsaeError, match="H <= "):
            cuda.topk_gpu(cupy.asarray(Z), 25, method)
        run_and_check(Z, 1000 if method == "sort" else 65535, method, variant="radix")


def test_radix_rejects_bad_variant_and_too_large_k():
    Z = cupy.zeros((2, 10), dtype=np.float32)
    with pytest.raises(KsaeError, match="variant 'warp' is not allowed; use one of block, radix"):
        cuda.topk_gpu(Z, 2, "sort", variant="warp")
    with pytest.raises(KsaeError, match="k=65535 is too large for the radix sort"):
        cuda.topk_gpu(cupy.zeros((1, 65536), dtype=np.float32), 65535, "sort", variant="radix")


# ------------------------------------------------------------------------------------------------
# Gathers and scatters.

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gather_scatter_mask(dtype):
    rng = np.random.default_rng(0)
    N, H, k = rows(3001, GRID_WRAP_ROWS), 1000, 25
    src = rng.standard_normal((N, H)).astype(dtype)
    idx, val = topk_threshold(rng.standard_normal((N, H)).astype(np.float32), k)
    src_d, idx_d = cupy.asarray(src), cupy.asarray(idx)
    out = cupy.full((N, k), np.nan, dtype=dtype)
    cuda.gather_rows_gpu(src_d, idx_d, out=out)
    np.testing.assert_array_equal(out.get(), np.take_along_axis(src, idx, axis=1))
    vals = np.take_along_axis(src, idx, axis=1)
    dense_ref = np.zeros_like(src)
    np.put_along_axis(dense_ref, idx, vals, axis=1)
    out_nh = cupy.full((N, H), np.nan, dtype=dtype)
    cuda.scatter_rows_gpu(idx_d, cupy.asarray(vals), H, out=out_nh)
    np.testing.assert_array_equal(out_nh.get(), dense_ref)
    np.testing.assert_array_equal(cuda.scatter_rows_gpu(idx_d, cupy.asarray(vals), H).get(), dense_ref)
    out_nh.fill(np.nan)
    cuda.mask_rows_gpu(src_d, idx_d, out=out_nh)
    np.testing.assert_array_equal(out_nh.get(), dense_ref)


def test_gather_rejects_bad_index_dtype():
    with pytest.raises(KsaeError, match="idx_nk has dtype int64"):
        cuda.gather_rows_gpu(cupy.zeros((2, 5), np.float32), cupy.zeros((2, 3), np.int64))
    with pytest.raises(KsaeError, match="rows"):
        cuda.gather_rows_gpu(cupy.zeros((2, 5), np.float32), cupy.zeros((3, 3), np.int32))


# ------------------------------------------------------------------------------------------------
# One training step and a short trajectory, GPU against NumPy.

@pytest.mark.parametrize("method", ["sort", "threshold"])
def test_training_step_matches_numpy(method):
    from ksae_cupy.model import loss_and_grads
    from ksae_cupy.momentum_sgd import MomentumSGD

    params, X = setup()
    gparams = {name: cupy.asarray(value) for name, value in params.items()}
    loss_c, grads_c, cache_c = loss_and_grads(params, X, 25, method)
    loss_g, grads_g, cache_g = loss_and_grads(gparams, cupy.asarray(X), 25, method)
    # Same kept units: Z differs only by float32 summation order (~1e-6 relative), far below the
    # gap between neighbouring order statistics of 1000 Gaussian-like values.
    np.testing.assert_array_equal(np.sort(cache_g.idx_nk.get(), axis=1), np.sort(cache_c.idx_nk, axis=1))
    # Tolerance: every quantity is a float32 sum of at most N*D = 1e5 products computed in a
    # different order by cuBLAS and the CPU BLAS; the rounding error of such sums is about
    # sqrt(terms) * 2^-24 * scale ~ 2e-5 of the largest magnitude, so 1e-4 of each array's
    # largest magnitude bounds it with margin, while any logic error is O(1) off.
    assert loss_g == pytest.approx(loss_c, rel=1e-5)
    for name in grads_c:
        g_cpu, g_gpu = grads_c[name], grads_g[name].get()
        scale = float(np.abs(g_cpu).max())
        np.testing.assert_allclose(g_gpu, g_cpu, rtol=0, atol=1e-4 * scale, err_msg=name)
    opt_c, opt_g = MomentumSGD(params, 0.9, np), MomentumSGD(gparams, 0.9, cupy)
    opt_c.step(params, grads_c, 0.01)
    opt_g.step(gparams, grads_g, 0.01)
    for name in params:
        scale = float(np.abs(params[name]).max()) or 1.0
        np.testing.assert_allclose(gparams[name].get(), params[name], rtol=0, atol=1e-5 * scale, err_msg=name)


def test_ten_step_loss_trajectory_matches_numpy():
    from ksae_cupy.model import loss_and_grads
    from ksae_cupy.momentum_sgd import MomentumSGD

    params, X = trajectory_setup()  # standardised data, lr 0.003: the NumPy loss falls at every step
    gparams = {name: cupy.asarray(value) for name, value in params.items()}
    Xg = cupy.asarray(X)
    opt_c = MomentumSGD(params, TRAJECTORY_MOMENTUM, np)
    opt_g = MomentumSGD(gparams, TRAJECTORY_MOMENTUM, cupy)
    losses_c, losses_g = [], []
    for _ in range(TRAJECTORY_STEPS):
        loss_c, grads_c, _ = loss_and_grads(params, X, TRAJECTORY_K, "threshold")
        loss_g, grads_g, _ = loss_and_grads(gparams, Xg, TRAJECTORY_K, "sort")
        opt_c.step(params, grads_c, TRAJECTORY_LR)
        opt_g.step(gparams, grads_g, TRAJECTORY_LR)
        losses_c.append(loss_c)
        losses_g.append(loss_g)
    # Per-step rounding differences (~1e-6 relative) compound through 10 momentum updates; 1e-4
    # relative still separates a correct trajectory from one with a wrong kept set or gradient.
    np.testing.assert_allclose(losses_g, losses_c, rtol=1e-4)
    assert np.all(np.diff(losses_c) < 0) and losses_c[-1] < losses_c[0]

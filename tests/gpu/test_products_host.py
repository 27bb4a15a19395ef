"""The product and sum-of-squares kernels of kernels/step_products.cu, run on the CPU against NumPy.

As tests/gpu/test_kernels_host.py: the unmodified source compiled for the host emulator
(tests/gpu/cuda_host), and the launchers' own plans (ksae_cupy.gpu.products.plan_matmul,
plan_sum_squares) made on NumPy arrays, under every schedule of the emulator (block and thread
orders, warps running ahead between barriers). Checked: every instantiation (float32 and float64,
each operand as stored or transposed) on shapes below, at and above the 64 x 64 tile and the
16-deep K step, the step's own shapes; and that a missing barrier or a wrong bound is caught.
Not checked (a GPU only): speed, real scheduling.
"""
from __future__ import annotations

import numpy as np
import pytest

from ksae_cupy.errors import KsaeError
from ksae_cupy.gpu import cuda_kernels, products

import emulated_kernels
from emulated_kernels import harness

pytestmark = emulated_kernels.needs_compiler

# (M, K, N): one element, short K, ragged edges around the tile (64) and the K step (16), several
# tiles each way; (20, 96, 48)-like shapes are the graph tests' own.
SHAPES = [(1, 1, 1), (3, 5, 2), (16, 48, 20), (20, 32, 48), (65, 17, 63), (64, 16, 64), (130, 33, 70), (7, 0, 5)]


driver = emulated_kernels.driver_fixture(products)


def operand(rng, rows, cols, dtype, transposed):
    """A ``rows x cols`` operand, stored as it is or as the transpose of a C-contiguous array."""
    if transposed:
        return np.ascontiguousarray(rng.standard_normal((cols, rows)).astype(dtype)).T
    return rng.standard_normal((rows, cols)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (False, True), (True, False), (True, True)])
def test_the_product_equals_numpy_under_every_schedule(driver, dtype, trans_a, trans_b):
    rng = np.random.default_rng(7)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for i, (M, K, N) in enumerate(SHAPES):
        a, b = operand(rng, M, K, dtype, trans_a), operand(rng, K, N, dtype, trans_b)
        out = np.full((M, N), np.nan, dtype=dtype)  # every output must be written
        (plan,) = products.plan_matmul(a, b, out)
        if min(a.shape) > 1 and min(b.shape) > 1:  # a vector is both C- and F-contiguous: read as stored
            assert plan.name == products._gemm_name(cuda_kernels.CTYPES[np.dtype(dtype)], trans_a, trans_b)
        schedule = harness.SCHEDULES[i % len(harness.SCHEDULES)]
        driver.run(plan, schedule=schedule, label=f"{M}x{K}x{N}")
        expected = a.astype(np.float64) @ b.astype(np.float64)
        np.testing.assert_allclose(out, expected, rtol=tol, atol=tol * max(1, K), err_msg=f"{(M, K, N)} {schedule}")


def test_the_step_shapes_under_all_nine_schedules(driver):
    """``X W``, ``Zs W^T``, ``R W`` and ``[X; R]^T [dZ; Zs]`` at one small step's shapes (B 16, D 20, H 48)."""
    rng = np.random.default_rng(3)
    B, D, H = 16, 20, 48
    W = rng.standard_normal((D, H)).astype(np.float32)
    X = rng.standard_normal((B, D)).astype(np.float32)
    Zs = rng.standard_normal((B, H)).astype(np.float32)
    XR = rng.standard_normal((2 * B, D)).astype(np.float32)
    DZ = rng.standard_normal((2 * B, H)).astype(np.float32)
    cases = [(X, W, (B, H)), (Zs, W.T, (B, D)), (X, W, (B, H)), (XR.T, DZ, (D, H))]
    for schedule in harness.SCHEDULES:
        for a, b, shape in cases:
            out = np.empty(shape, dtype=np.float32)
            for plan in products.plan_matmul(a, b, out):
                driver.run(plan, schedule=schedule)
            np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("M, K, N, splits", [(16, 300, 20, 2), (16, 300, 20, 5), (70, 257, 65, 3), (5, 33, 7, 8),
                                             (3, 16, 4, 4), (9, 0, 6, 3)])
def test_a_product_split_along_k_equals_numpy(driver, dtype, M, K, N, splits):
    """K cut in slabs (whole 16-deep steps each; fewer slabs when K is short), each into the workspace,
    then summed in order: every storage order, every schedule."""
    rng = np.random.default_rng(M + K + splits)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for i, (ta, tb) in enumerate([(False, False), (False, True), (True, False), (True, True)]):
        a, b = operand(rng, M, K, dtype, ta), operand(rng, K, N, dtype, tb)
        out = np.full((M, N), np.nan, dtype=dtype)
        workspace = np.full(splits * M * N + 3, np.nan, dtype=dtype)
        plans = products.plan_matmul(a, b, out, splits, workspace)
        k_split = int(plans[0].args[-1])
        assert k_split % 16 == 0 and len(plans) == (1 if -(-K // k_split) <= 1 else 2)
        for plan in plans:
            driver.run(plan, schedule=harness.SCHEDULES[(i + splits) % len(harness.SCHEDULES)])
        np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=tol, atol=tol * max(1, K))


def test_splits_fill_the_device_where_the_tiles_do_not():
    h100 = cuda_kernels.DeviceLimits(sm_count=132, shared_optin=227 * 1024)
    assert products.gemm_splits(128, 1000, 784, h100) == 5  # MNIST's encoder: 32 tiles, K 784
    assert products.gemm_splits(784, 1000, 256, h100) == 1  # its weight gradient: 208 tiles
    assert products.gemm_splits(128, 1000, 200, h100) == 1  # K too short to split
    with pytest.raises(KsaeError, match="workspace of 640000 values"):
        products.plan_matmul(np.zeros((128, 784), np.float32), np.zeros((784, 1000), np.float32),
                             np.zeros((128, 1000), np.float32), 5, np.zeros(10, np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_sum_of_squares_adds_in_float64_and_honours_its_gate(driver, dtype):
    rng = np.random.default_rng(11)
    for i, n in enumerate((0, 1, 255, 256, 257, 3000)):
        x = rng.standard_normal(n).astype(dtype)
        acc = np.array(2.5)
        driver.run(products.plan_sum_squares(x, 0.125, acc), schedule=harness.SCHEDULES[i % 9])
        squares = (x * x).astype(np.float64)  # each square in the data's type, as the step computes it
        assert acc == pytest.approx(2.5 + 0.125 * squares.sum(), rel=1e-13)
    x = rng.standard_normal((4, 6)).astype(dtype)
    closed, opened = np.zeros(300, dtype=dtype), np.zeros(300, dtype=dtype)
    opened[299] = 1  # the last gate value, read by the last thread's second pass
    for gate, expected in ((closed, 1.0), (opened, 1.0 + float((x.astype(np.float64) ** 2).sum()))):
        for schedule in harness.SCHEDULES:
            acc = np.array(1.0)
            driver.run(products.plan_sum_squares(x, 1.0, acc, gate), schedule=schedule)
            assert acc == pytest.approx(expected, rel=1e-6)


def test_plans_refuse_what_the_kernels_cannot_read():
    f32 = np.zeros((4, 3), dtype=np.float32)
    with pytest.raises(KsaeError, match=r"shapes \(4, 3\) and \(4, 3\)"):
        products.plan_matmul(f32, f32, np.zeros((4, 3), dtype=np.float32))
    with pytest.raises(KsaeError, match="float64"):
        products.plan_matmul(f32, np.zeros((3, 2)), np.zeros((4, 2), dtype=np.float32))
    with pytest.raises(KsaeError, match="neither C-contiguous nor the transpose"):
        products.plan_matmul(np.zeros((8, 3), dtype=np.float32)[::2], np.zeros((3, 2), dtype=np.float32),
                             np.zeros((4, 2), dtype=np.float32))
    with pytest.raises(KsaeError, match="0-d float64"):
        products.plan_sum_squares(f32, 1.0, np.zeros(1))


PLANTED = [
    ("the barrier after the tile loads removed", "__syncthreads();  // the tiles are loaded", ""),
    ("the barrier before the next load removed", "__syncthreads();  // every thread is done with the tiles before the next load", ""),
    ("the K bound of A's load dropped", "if (gm < M && gk < k_end)\n                v = TRANS_A", "if (gm < M)\n                v = TRANS_A"),
    ("the sum's tree barrier removed", "__syncthreads();  // this level's sums are written (and, the first time, every gate read)", ""),
    ("the decoder reads a column outside [0, H)", "if (c >= 0 && c < H) acc +=", "if (c >= 0) acc +="),
    ("the kept dot's lane sum starts at 8", "for (int offset = 16; offset > 0", "for (int offset = 8; offset > 0"),
    ("every split of K writes the same slab", "C += static_cast<long long>(split) * M * ldc;", ""),
    ("the sum of the splits drops the first", "T acc = parts[i];", "T acc = T(0);"),
]


def runs_wrong(exe) -> bool:
    """Whether the kernels built in ``exe`` give a wrong answer or a fault on any schedule."""
    rng = np.random.default_rng(5)

    def answers_right(d, schedule) -> bool:
        a, b = rng.standard_normal((70, 100)).astype(np.float32), rng.standard_normal((100, 65)).astype(np.float32)
        out = np.empty((70, 65), dtype=np.float32)
        workspace = np.empty(2 * 70 * 65, dtype=np.float32)
        for plan in products.plan_matmul(a, b, out, 2, workspace):  # K 100 in 2 splits: 4 steps and 3
            d.run(plan, schedule=schedule)
        x, acc = rng.standard_normal(1000).astype(np.float32), np.array(0.0)
        d.run(products.plan_sum_squares(x, 1.0, acc), schedule=schedule)
        Zs, idx, WT, Zs_dense = sparse_case(rng, 6, 40, 50, 4, np.float32, invalid=True)
        R, dZ = np.empty((6, 50), dtype=np.float32), np.empty((6, 40), dtype=np.float32)
        d.run(products.plan_sparse_decode(Zs, idx, WT, R, H100), schedule=schedule)
        d.run(products.plan_kept_dot(R, idx, WT, dZ, H100), schedule=schedule)
        dZ_expected = np.where(Zs_dense != 0, R.astype(np.float64) @ WT.T, 0)
        return (np.allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)
                and acc == pytest.approx(float((x.astype(np.float64) ** 2).sum()), rel=1e-6)
                and np.allclose(R, Zs_dense.astype(np.float64) @ WT, rtol=1e-5, atol=1e-4)
                and np.allclose(dZ, dZ_expected, rtol=1e-5, atol=1e-4))

    return emulated_kernels.runs_wrong(exe, answers_right)


def test_the_unmodified_kernels_pass_the_planted_bugs_check(tmp_path):
    assert not runs_wrong(emulated_kernels.build(tmp_path, products))


@pytest.mark.parametrize("what, old, new", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_bugs_are_caught(tmp_path, what, old, new):
    assert runs_wrong(emulated_kernels.build(tmp_path, products, planted=(old, new))), f"{what}: not caught"

SMALL_GPU = cuda_kernels.DeviceLimits(sm_count=1, shared_optin=227 * 1024)  # few blocks: the grid-stride loops loop
H100 = cuda_kernels.DeviceLimits(sm_count=132, shared_optin=227 * 1024)


def sparse_case(rng, N, H, D, k, dtype, invalid=False):
    """``(Zs_nh, idx_nk, WT_hd, Zs_dense)``: k distinct kept columns per row (some outside [0, H) when
    ``invalid``: skipped by the kernels), their values in Zs_nh, and the dense code a product would see."""
    idx = np.stack([rng.choice(H, size=k, replace=False) for _ in range(N)]).astype(np.int32)
    Zs = np.zeros((N, H), dtype=dtype)
    np.put_along_axis(Zs, idx.astype(np.int64), rng.standard_normal((N, k)).astype(dtype), axis=1)
    if invalid:
        idx[0, 0], idx[-1, -1] = -1, H  # those entries count as not kept
    Zs_dense = np.zeros_like(Zs)  # what the kernels use: the values at the valid kept columns only
    for n in range(N):
        valid = idx[n][(idx[n] >= 0) & (idx[n] < H)]
        Zs_dense[n, valid] = Zs[n, valid]
    WT = rng.standard_normal((H, D)).astype(dtype)
    return Zs, idx, WT, Zs_dense


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("N, H, D, k, invalid, limits", [(1, 1, 1, 1, False, H100), (5, 48, 20, 5, False, H100),
                                                         (13, 33, 70, 7, True, SMALL_GPU), (9, 100, 300, 1, False, SMALL_GPU),
                                                         (16, 48, 20, 48, False, H100)])
def test_the_sparse_products_equal_the_dense_ones(driver, dtype, N, H, D, k, invalid, limits):
    """``Zs W^T`` from the kept units, and ``R W`` at the kept units (zeros elsewhere), as NumPy's dense
    products give them; columns outside [0, H) are skipped; every schedule."""
    rng = np.random.default_rng(N * H + k)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for i, schedule in enumerate(harness.SCHEDULES):
        Zs, idx, WT, Zs_dense = sparse_case(rng, N, H, D, k, dtype, invalid)
        R = np.full((N, D), np.nan, dtype=dtype)
        driver.run(products.plan_sparse_decode(Zs, idx, WT, R, limits), schedule=schedule)
        np.testing.assert_allclose(R, Zs_dense.astype(np.float64) @ WT, rtol=tol, atol=tol * k, err_msg=str(schedule))
        R = rng.standard_normal((N, D)).astype(dtype)
        out = np.full((N, H), np.nan, dtype=dtype)
        driver.run(products.plan_kept_dot(R, idx, WT, out, limits), schedule=schedule)
        expected = np.zeros((N, H))
        for n in range(N):
            for c in idx[n]:
                if 0 <= c < H:
                    expected[n, c] = R[n].astype(np.float64) @ WT[c]
        np.testing.assert_allclose(out, expected, rtol=tol, atol=tol * D, err_msg=str(schedule))


def test_sparse_plans_refuse_mismatched_operands():
    f32 = np.float32
    with pytest.raises(KsaeError, match="idx_nk must be a C-contiguous 2-D int32"):
        products.plan_sparse_decode(np.zeros((2, 4), f32), np.zeros((2, 1), np.int64), np.zeros((4, 3), f32),
                                    np.zeros((2, 3), f32), H100)
    with pytest.raises(KsaeError, match=r"out has shape \(2, 4\); expected \(2, 3\)"):
        products.plan_sparse_decode(np.zeros((2, 4), f32), np.zeros((2, 1), np.int32), np.zeros((4, 3), f32),
                                    np.zeros((2, 4), f32), H100)
    with pytest.raises(KsaeError, match="R_nd has 5 columns and WT_hd 3"):
        products.plan_kept_dot(np.zeros((2, 5), f32), np.zeros((2, 1), np.int32), np.zeros((4, 3), f32),
                               np.zeros((2, 4), f32), H100)

"""The product and sum-of-squares kernels of kernels/products.cu, run on the CPU against NumPy.

As tests/gpu/test_kernels_host.py: the unmodified source compiled for the host emulator
(tests/gpu/cuda_host), and the launchers' own plans (ksae_cupy.gpu.products.plan_matmul,
plan_sum_squares) made on NumPy arrays, under every schedule of the emulator (block and thread
orders, warps running ahead between barriers). Checked: every instantiation (float32 and float64,
each operand as stored or transposed) on shapes below, at and above the 64 x 64 tile and the
16-deep K step, the step's own shapes; and that a missing barrier or a wrong bound is caught.
Not checked (a GPU only): speed, real scheduling.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from ksae_cupy.errors import KsaeError
from ksae_cupy.gpu import cuda_kernels, products

sys.path.insert(0, str(Path(__file__).parent / "cuda_host"))
import harness  # noqa: E402

pytestmark = pytest.mark.skipif(harness.compiler() is None, reason="no C++ compiler (g++ or clang++) to build the harness")

# (M, K, N): one element, short K, ragged edges around the tile (64) and the K step (16), several
# tiles each way; (20, 96, 48)-like shapes are the graph tests' own.
SHAPES = [(1, 1, 1), (3, 5, 2), (16, 48, 20), (20, 32, 48), (65, 17, 63), (64, 16, 64), (130, 33, 70), (7, 0, 5)]


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    exe = harness.build(tmp_path_factory.mktemp("products"), cuda_kernels.kernel_source_path(products.SOURCE_NAME),
                        products.KERNEL_NAMES)
    d = harness.Driver(exe)
    yield d
    d.close()


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
        plan = products.plan_matmul(a, b, out)
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
            driver.run(products.plan_matmul(a, b, out), schedule=schedule)
            np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


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
    ("the K bound of A's load dropped", "if (gm < M && gk < K)\n                v = TRANS_A", "if (gm < M)\n                v = TRANS_A"),
    ("the sum's tree barrier removed", "__syncthreads();  // this level's sums are written (and, the first time, every gate read)", ""),
]


@pytest.mark.parametrize("what, old, new", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_bugs_are_caught(tmp_path, what, old, new):
    source = cuda_kernels.kernel_source(products.SOURCE_NAME)
    assert old in source, what
    bad = tmp_path / "bad.cu"
    bad.write_text(source.replace(old, new, 1))
    d = harness.Driver(harness.build(tmp_path, bad, products.KERNEL_NAMES))
    rng = np.random.default_rng(5)
    caught = False
    try:
        for schedule in harness.SCHEDULES:
            a, b = rng.standard_normal((70, 33)).astype(np.float32), rng.standard_normal((33, 65)).astype(np.float32)
            out = np.empty((70, 65), dtype=np.float32)
            d.run(products.plan_matmul(a, b, out), schedule=schedule)
            x, acc = rng.standard_normal(1000).astype(np.float32), np.array(0.0)
            d.run(products.plan_sum_squares(x, 1.0, acc), schedule=schedule)
            if not (np.allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)
                    and acc == pytest.approx(float((x.astype(np.float64) ** 2).sum()), rel=1e-6)):
                caught = True
                break
    except harness.HarnessError:
        caught = True
    finally:
        d.close()
    assert caught, f"{what}: not caught"

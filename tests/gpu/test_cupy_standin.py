"""The CuPy stand-in (tests/cupy_standin) refuses what CuPy and the CUDA driver refuse, so the GPU
tests that pass under it cannot hide those mistakes. Runs only where the stand-in is what the GPU
tests get (no GPU here); on a GPU these are CuPy's own rules."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import REAL_GPU_REASON
from ksae_cupy.gpu import cuda_kernels as kernels

pytestmark = pytest.mark.skipif(REAL_GPU_REASON is None, reason="a real GPU answers: the GPU tests use CuPy itself")


@pytest.fixture
def cupy(gpu_cupy):
    return gpu_cupy


def test_arrays_refuse_implicit_conversion_and_mixing(cupy):
    a = cupy.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert type(a).__module__ == "cupy" and isinstance(a.sum(), cupy.ndarray) and a.sum().ndim == 0
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(a)
    for mixed in (lambda: a + np.ones(3, np.float32), lambda: np.ones(3, np.float32) * a,
                  lambda: cupy.concatenate([a, np.ones((1, 3), np.float32)]), lambda: cupy.maximum(a, np.ones(3))):
        with pytest.raises(TypeError, match="Unsupported type"):
            mixed()
    assert float(a.sum()) == 15.0 and a[1, 2].item() == 5.0 and int(a.max()) == 5
    np.testing.assert_array_equal(cupy.asnumpy(a * 2), a.get() * 2)
    assert (a + np.float32(1)).dtype == np.float32 and isinstance(np.sum(a), cupy.ndarray)


def test_kernel_launches_are_checked_as_on_an_h100(cupy):
    Z = cupy.asarray(np.random.default_rng(0).standard_normal((5, 100)).astype(np.float32))
    outs = (cupy.empty((5, 3), np.int32), cupy.empty((5, 3), np.float32))
    plan = kernels.plan_topk(Z, 3, "threshold", outs, kernels.device_limits(cupy))
    kernel = kernels._function(cupy, plan.name)
    as_python = tuple(int(a) if isinstance(a, np.int32) else a for a in plan.args)
    with pytest.raises(TypeError, match="Python int"):  # CuPy would pass a 64-bit value for an int parameter
        kernels._launch(cupy, dataclasses.replace(plan, args=as_python), kernel)
    as_int64 = tuple(np.int64(a) if isinstance(a, np.int32) else a for a in plan.args)
    with pytest.raises(TypeError, match="the kernel takes int32"):
        kernels._launch(cupy, dataclasses.replace(plan, args=as_int64), kernel)
    with pytest.raises(TypeError, match="Unsupported type"):  # a host array where a device one belongs
        kernels._launch(cupy, dataclasses.replace(plan, args=(Z.get(),) + plan.args[1:]), kernel)
    with pytest.raises(cupy.cuda.driver.CUDADriverError, match="1 to 1024 threads"):
        kernels._launch(cupy, dataclasses.replace(plan, block=2048), kernel)
    # More than 48 KiB of shared memory in all needs the opt-in attribute, which the device caps.
    with pytest.raises(cupy.cuda.driver.CUDADriverError, match="max_dynamic_shared_size_bytes"):
        kernel((1,), (256,), plan.args, shared_mem=48 * 1024)
    with pytest.raises(cupy.cuda.driver.CUDADriverError, match="exceeds the device's"):
        kernel.max_dynamic_shared_size_bytes = 227 * 1024
    kernels._launch(cupy, plan, kernel)  # the launcher's own plan runs
    np.testing.assert_array_equal(outs[0].get(), kernels.topk_gpu(Z, 3, "threshold")[0].get())


def test_a_kernel_fault_is_a_driver_error_naming_the_kernel(cupy):
    src = cupy.zeros((2, 8), np.float32)
    idx = cupy.zeros((2, 3), np.int32)
    out = cupy.zeros((2, 3), np.float32)
    plan = kernels.plan_rows("gather", src, idx, out, kernels.device_limits(cupy))
    bad = dataclasses.replace(plan, args=plan.args[:2] + (np.int32(2), np.int32(8), np.int32(300), out))  # k too big
    with pytest.raises(cupy.cuda.driver.CUDADriverError, match="(?s)gather_rows_kernel.*out-of-bounds access"):
        kernels._launch(cupy, bad)


def test_sparse_follows_cusparse_rules(cupy):
    import cupyx.scipy.sparse as sparse

    vals = cupy.asarray(np.ones(4, np.float32))
    cols = cupy.asarray(np.array([0, 2, 1, 3], np.int32))
    ptr = cupy.asarray(np.array([0, 2, 4], np.int32))
    m = sparse.csr_matrix((vals, cols, ptr), shape=(2, 4))
    dense = cupy.asarray(np.arange(8, dtype=np.float32).reshape(4, 2))
    product = m @ dense
    assert isinstance(product, cupy.ndarray)
    np.testing.assert_array_equal(product.get(), m.get() @ dense.get())
    with pytest.raises(ValueError, match="cupy.ndarray"):
        sparse.csr_matrix((vals.get(), cols, ptr), shape=(2, 4))
    with pytest.raises(ValueError, match="float32, float64"):
        sparse.csr_matrix((cupy.asarray(np.ones(4, np.int64)), cols, ptr), shape=(2, 4))
    with pytest.raises(TypeError, match="Unsupported type"):
        m @ dense.get()


def test_the_runtime_reports_an_h100(cupy):
    runtime = cupy.cuda.runtime
    assert runtime.getDeviceCount() == 1
    assert kernels.device_limits(cupy) == kernels.DeviceLimits(sm_count=132, shared_optin=227 * 1024)
    assert b"H100" in runtime.getDeviceProperties(0)["name"]
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorInvalidDevice"):
        with cupy.cuda.Device(1):
            pass

"""ksae_cupy.gpu.cuda_kernels on a machine without cupy: it imports, the launchers fail with a KsaeError,
and their launch plans and cupy calls are what a GPU needs (checked against a stand-in for cupy)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from ksae_cupy.gpu import cuda_kernels as cuda
from ksae_cupy.errors import KsaeError


def test_importing_cuda_does_not_import_cupy():
    code = "import sys, ksae_cupy.gpu.cuda_kernels, ksae_cupy.topk; print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_kernel_source_is_found_and_lists_every_name():
    text = cuda.kernel_source()
    for name in cuda.KERNEL_NAMES:
        template = name.split("::")[1].split("<")[0]
        assert f"{template}(" in text


def test_shared_memory_limits():
    # float32 rows of 16,384 fit both kernels within an H100's 227 KB opt-in limit.
    h100 = 227 * 1024
    assert cuda.topk_shared_bytes("threshold", 16384, np.float32) == 65536
    assert cuda.topk_shared_bytes("sort", 16384, np.float32) == 131072
    assert cuda.topk_shared_bytes("sort", 1000, np.float32) == 1024 * 8
    assert cuda.topk_max_H("threshold", np.float32, h100, 1168) == (h100 - 1168) // 4
    assert cuda.topk_max_H("sort", np.float32, h100) == 16384
    assert cuda.topk_max_H("sort", np.float64, 163 * 1024) == 8192  # A100: float64 sort stops at 8192


def test_launchers_need_cupy():
    try:
        import cupy  # noqa: F401
    except Exception:
        pass
    else:
        pytest.skip("cupy imports here")
    with pytest.raises(KsaeError, match="cupy"):
        cuda.topk_gpu(np.zeros((2, 5), np.float32), 2, "sort")


# ------------------------------------------------------------------------------------------------
# The launch plans, made on NumPy arrays (no GPU needed): what topk_gpu and the row launchers pass
# to cupy. The CPU harness (test_kernels_host.py) runs these same plans through the kernels.

H100 = cuda.DeviceLimits(sm_count=132, shared_optin=227 * 1024)


def _topk_plan(N, H, k, method, dtype=np.float32, dense=False, limits=H100, **kw):
    Z = np.zeros((N, H), dtype=dtype)
    outs = (np.empty((N, k), np.int32), np.empty((N, k), dtype)) + ((np.empty((N, H), dtype),) if dense else ())
    return cuda.plan_topk(Z, k, method, outs, limits, **kw)


@pytest.mark.parametrize("dtype, H_fits, static", [(np.float32, 11996, 1168), (np.float64, 5998, 1168)])
def test_threshold_plan_opts_in_when_static_plus_dynamic_exceed_48k(dtype, H_fits, static):
    # 11,996 float32 keys + 1,168 static bytes = 48 KiB exactly: no opt-in. One more key needs it,
    # although the dynamic part alone (47,988 bytes) is still below 48 KiB.
    assert _topk_plan(2, H_fits, 3, "threshold", dtype).shared_optin == 0
    plan = _topk_plan(2, H_fits + 1, 3, "threshold", dtype)
    assert plan.static_shared == static and plan.shared_mem < 48 * 1024 < plan.shared_mem + static
    assert plan.shared_optin == plan.shared_mem
    assert _topk_plan(2, 12288, 3, "threshold", np.float32).shared_optin == 12288 * 4


def test_topk_plan_arguments_and_grid():
    plan = _topk_plan(1_000_000, 3, 2, "sort", dense=True)
    assert plan.name == "ksae::topk_sort_kernel<float, 256>" and plan.block == 256
    assert plan.grid == 132 * (2048 // 256)  # 1-D, strided over the rows: far below 2^31 - 1
    scalars = [a for a in plan.args if not isinstance(a, np.ndarray)]
    assert all(type(a) is np.int32 for a in scalars)  # N, H, P, k, write_dense: never a 64-bit value
    assert [int(a) for a in scalars] == [1_000_000, 3, 4, 2, 1]
    assert plan.outputs == (5, 6, 7) and plan.zeroed == ()
    plan = _topk_plan(5, 3000, 7, "threshold")
    assert plan.name == "ksae::topk_threshold_kernel<float, 512>" and plan.grid == 5
    assert [int(a) for a in plan.args if not isinstance(a, np.ndarray)] == [5, 3000, 7, 0]
    assert plan.outputs == (4, 5) and plan.args[6] is plan.args[5]  # dense pointer unused without dense
    assert _topk_plan(0, 10, 1, "threshold").grid == 0


def test_topk_plan_caps():
    with pytest.raises(KsaeError, match=r"H=16385 is too large.*use H <= 16384 or topk threshold$"):
        _topk_plan(1, 16385, 1, "sort")
    a100 = cuda.DeviceLimits(sm_count=108, shared_optin=163 * 1024)
    with pytest.raises(KsaeError, match=r"use H <= 8192"):
        _topk_plan(1, 8193, 1, "sort", np.float64, limits=a100)
    with pytest.raises(KsaeError, match="k=4 is not allowed for H=3"):
        _topk_plan(1, 3, 4, "threshold")
    with pytest.raises(KsaeError, match="out idx_nk has shape"):
        cuda.plan_topk(np.zeros((2, 5), np.float32), 2, "sort", (np.empty((2, 3), np.int32), np.empty((2, 2), np.float32)), H100)


def test_row_plans_share_one_form():
    src = np.zeros((7, 50), np.float32)
    idx = np.zeros((7, 4), np.int32)
    gather = cuda.plan_rows("gather", src, idx, np.empty((7, 4), np.float32), H100)
    scatter = cuda.plan_rows("scatter", np.zeros((7, 4), np.float64), idx, np.empty((7, 50), np.float64), H100)
    mask = cuda.plan_rows("mask", src, idx, np.empty((7, 50), np.float32), H100)
    assert (gather.name, scatter.name, mask.name) == ("ksae::gather_rows_kernel<float>",
                                                      "ksae::scatter_rows_kernel<double>", "ksae::mask_rows_kernel<float>")
    for plan, H in ((gather, 50), (scatter, 50), (mask, 50)):
        assert [int(a) for a in plan.args[2:5]] == [7, H, 4] and all(type(a) is np.int32 for a in plan.args[2:5])
        assert plan.grid == 1 and plan.block == 256 and plan.outputs == (5,)
    assert gather.zeroed == () and scatter.zeroed == (5,) and mask.zeroed == (5,)
    big = cuda.plan_rows("mask", np.zeros((1_000_000, 2), np.float32), np.zeros((1_000_000, 1), np.int32),
                         np.empty((1_000_000, 2), np.float32), H100)
    assert big.grid == 3907  # ceil(10^6 / 256) blocks, under the 132 * 32 cap
    with pytest.raises(KsaeError, match="idx_nk has dtype int64"):
        cuda.plan_rows("gather", src, idx.astype(np.int64), np.empty((7, 4), np.float32), H100)
    with pytest.raises(KsaeError, match="out has shape"):
        cuda.plan_rows("mask", src, idx, np.empty((7, 4), np.float32), H100)


# ------------------------------------------------------------------------------------------------
# The cupy side, against a stand-in for cupy that records what the launchers do with it.

class _FakeKernel:
    shared_size_bytes = 1168

    def __init__(self):
        self.max_dynamic_shared_size_bytes = 0
        self.calls = []

    def __call__(self, grid, block, args, shared_mem=0):
        self.calls.append((grid, block, shared_mem))


def _fake_cupy(attribute):
    import types

    modules = []

    class RawModule:
        def __init__(self, code, options, name_expressions):
            modules.append((options, tuple(name_expressions)))
            self.functions = {}

        def get_function(self, name):
            return self.functions.setdefault(name, _FakeKernel())

    runtime = types.SimpleNamespace(cudaDevAttrMultiProcessorCount=16, cudaDevAttrMaxSharedMemoryPerBlockOptin=97,
                                    deviceGetAttribute=attribute)
    cuda_ns = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=7), runtime=runtime)
    return types.SimpleNamespace(RawModule=RawModule, cuda=cuda_ns), modules


def test_module_is_compiled_once_per_device(monkeypatch):
    monkeypatch.setattr(cuda, "_MODULES", {})
    monkeypatch.setattr(cuda, "_FUNCTIONS", {})
    fake, modules = _fake_cupy(lambda attr, dev: 0)
    names = cuda.KERNEL_NAMES[:3]
    kernels_seen = [cuda._function(fake, n) for n in names + names]
    assert len(modules) == 1 and modules[0] == (cuda.NVRTC_OPTIONS, cuda.KERNEL_NAMES)
    assert kernels_seen[:3] == kernels_seen[3:]


def test_device_limits_are_asked_directly_and_errors_surface(monkeypatch):
    monkeypatch.setattr(cuda, "_LIMITS", {})
    fake, _ = _fake_cupy(lambda attr, dev: {16: 132, 97: 232448}[attr] if dev == 7 else None)
    assert cuda.device_limits(fake) == cuda.DeviceLimits(sm_count=132, shared_optin=232448)
    monkeypatch.setattr(cuda, "_LIMITS", {})

    def broken(attr, dev):
        raise RuntimeError("cudaErrorInvalidDevice")

    fake, _ = _fake_cupy(broken)
    with pytest.raises(RuntimeError, match="cudaErrorInvalidDevice"):  # not a silent 48 KiB / 80 SM guess
        cuda.device_limits(fake)


def test_launch_opts_in_zeroes_and_skips_empty_grids():
    kernel = _FakeKernel()
    plan = _topk_plan(3, 12000, 5, "threshold")
    cuda._launch(None, plan, kernel)
    assert kernel.max_dynamic_shared_size_bytes == 48000 and kernel.calls == [((3,), (512,), 48000)]
    out = np.full((2, 9), 5.0, np.float32)
    plan = cuda.plan_rows("mask", np.ones((2, 9), np.float32), np.zeros((2, 0), np.int32), out, H100)
    kernel = _FakeKernel()
    cuda._launch(None, plan, kernel)
    assert plan.grid == 0 and kernel.calls == [] and not out.any()  # zeroed, nothing launched


def test_gpu_trajectory_falls_at_every_step_on_numpy():
    """The ten-step trajectory tests/gpu/test_cuda_topk.py compares with the GPU decreases on NumPy."""
    from training_setup import (TRAJECTORY_K, TRAJECTORY_LR, TRAJECTORY_MOMENTUM, TRAJECTORY_STEPS,
                                trajectory_setup)

    from ksae_cupy.model import loss_and_grads
    from ksae_cupy.momentum_sgd import MomentumSGD

    params, X = trajectory_setup()
    opt = MomentumSGD(params, TRAJECTORY_MOMENTUM, np)
    losses = []
    for _ in range(TRAJECTORY_STEPS):
        loss, grads, _ = loss_and_grads(params, X, TRAJECTORY_K, "threshold")
        opt.step(params, grads, TRAJECTORY_LR)
        losses.append(loss)
    assert np.all(np.diff(losses) < 0), losses
    assert losses[-1] < 0.9 * losses[0]

"""ksae_cupy.gpu.kernels on a machine without cupy: it imports, and the launchers fail with a KsaeError."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from ksae_cupy.gpu import kernels as cuda
from ksae_cupy.errors import KsaeError


def test_importing_cuda_does_not_import_cupy():
    code = "import sys, ksae_cupy.gpu.kernels, ksae_cupy.topk; print('cupy' in sys.modules)"
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

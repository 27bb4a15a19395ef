import os
import sys
from pathlib import Path

# Let tests import their small shared helpers (gradcheck.py, ...) by module name.
sys.path.insert(0, str(Path(__file__).parent))


import pytest  # noqa: E402

# The strict CuPy stand-in (tests/cupy_standin/README.md): what the GPU tests run against where no
# GPU answers. KSAE_CUPY_STANDIN=1 chooses it even where one does.
CUPY_STANDIN = Path(__file__).parent / "cupy_standin"
CUDA_HOST = Path(__file__).parent / "gpu" / "cuda_host"  # the emulator the stand-in runs kernels in


def _real_gpu_reason() -> str | None:
    """None when the real CuPy imports and a device answers; else why not."""
    if os.environ.get("KSAE_CUPY_STANDIN") == "1":
        return "KSAE_CUPY_STANDIN=1"
    try:
        import cupy
    except Exception as exc:
        return f"cupy does not import ({type(exc).__name__})"
    try:
        if getattr(cupy, "STANDIN", False) or cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as exc:
        return f"no CUDA device ({type(exc).__name__})"
    return None


REAL_GPU_REASON = _real_gpu_reason()


def pytest_report_header(config):
    if REAL_GPU_REASON is None:
        return "GPU tests: the real CuPy on a GPU"
    return f"GPU tests: the CuPy stand-in over the CUDA emulator (tests/cupy_standin; {REAL_GPU_REASON})"


def _forget_cupy() -> None:
    raw = sys.modules.get("cupy._raw")
    if raw is not None and hasattr(raw, "shutdown"):
        raw.shutdown()
    for name in [n for n in sys.modules if n == "cupy" or n.startswith(("cupy.", "cupyx"))]:
        del sys.modules[name]


@pytest.fixture
def gpu_cupy(monkeypatch):
    """The ``cupy`` module the GPU tests run against: the real one where a GPU answers, else the
    strict stand-in, importable as ``cupy`` in this process and (through PYTHONPATH) in the
    subprocesses the test starts, for the test's duration only."""
    if REAL_GPU_REASON is None:
        import cupy

        yield cupy
        return
    if str(CUDA_HOST) not in sys.path:
        sys.path.insert(0, str(CUDA_HOST))
    import harness

    if harness.compiler() is None:
        pytest.skip("no GPU, and no C++ compiler (g++ or clang++) for the CuPy stand-in's CUDA emulator")
    from ksae_cupy.gpu import cuda_kernels as kernels

    for cache in ("_MODULES", "_FUNCTIONS", "_LIMITS"):  # compiled for another cupy
        monkeypatch.setattr(kernels, cache, {})
    _forget_cupy()
    monkeypatch.syspath_prepend(str(CUPY_STANDIN))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(CUPY_STANDIN), os.environ.get("PYTHONPATH"))
                                                      if p))
    import cupy

    assert cupy.STANDIN
    yield cupy
    _forget_cupy()


@pytest.fixture(params=["numba", "scipy"])
def cpu_path(request, monkeypatch):
    """Run a test once with the Numba CPU kernels and once with the NumPy/SciPy path.

    The ``numba`` case skips, with the reason shown, where the ``fast`` extra is missing.
    """
    from ksae_cupy.cpu import numba_kernels as kernels

    if request.param == "numba" and not kernels.available():
        pytest.skip("Numba is not installed (pip install '.[fast]'): the CPU kernels cannot run")
    monkeypatch.setenv("KSAE_CPU_KERNELS", "1" if request.param == "numba" else "0")
    assert kernels.enabled() == (request.param == "numba")
    return request.param


@pytest.fixture(scope="module")
def labelled_rows_file(tmp_path_factory):
    """A user's data file (``rows.npz``: ``X``, 700 x 16, and labels ``y``): rows in [0, 1] (an RBM's visible
    probabilities) near a 3-dimensional subspace, each labelled by its largest code."""
    import numpy as np

    rng = np.random.default_rng(0)
    codes = rng.random((700, 3))
    X = np.clip(codes @ rng.random((3, 16)) / 3 + 0.02 * rng.standard_normal((700, 16)), 0, 1).astype(np.float32)
    path = tmp_path_factory.mktemp("data") / "rows.npz"
    np.savez(path, X=X, y=codes.argmax(axis=1))
    return path

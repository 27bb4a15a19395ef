import sys
from pathlib import Path

# Let tests import their small shared helpers (gradcheck.py, ...) by module name.
sys.path.insert(0, str(Path(__file__).parent))


import pytest  # noqa: E402


@pytest.fixture(params=["numba", "scipy"])
def cpu_path(request, monkeypatch):
    """Run a test once with the Numba CPU kernels and once with the NumPy/SciPy path.

    The ``numba`` case skips, with the reason shown, where the ``fast`` extra is missing.
    """
    from ksae_cupy.cpu import kernels

    if request.param == "numba" and not kernels.available():
        pytest.skip("Numba is not installed (pip install '.[fast]'): the CPU kernels cannot run")
    monkeypatch.setenv("KSAE_CPU_KERNELS", "1" if request.param == "numba" else "0")
    assert kernels.enabled() == (request.param == "numba")
    return request.param

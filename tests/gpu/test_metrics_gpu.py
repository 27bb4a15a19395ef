"""FVE, L0 and dead units on a GPU backend (the real CuPy, or the stand-in where none answers) equal the CPU's,
and the provenance record names the GPU."""
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_cupy")]


def test_reconstruction_metrics_on_the_gpu_equal_the_cpus():
    from ksae_cupy import metrics, model
    from ksae_cupy.backend import CPU, resolve_device

    rng = np.random.default_rng(0)
    params = model.init_params(16, 24, 0.3, rng)
    params["b_h"][:3] = -1e3  # three dead units
    X = rng.random((150, 16)).astype(np.float32)
    cpu = metrics.reconstruction_metrics(params, X, 4, 2.0, backend=CPU, chunk=64)
    gpu = metrics.reconstruction_metrics(params, X, 4, 2.0, backend=resolve_device("gpu"), chunk=64)
    assert gpu == pytest.approx(cpu, rel=1e-5) and gpu["dead_fraction"] == cpu["dead_fraction"] >= 3 / 24
    assert (gpu["l0"], gpu["l0_alpha_k"]) == (4, 8)


def test_the_provenance_record_names_the_gpu():
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.made_with import gpu_name, provenance

    backend = resolve_device("gpu")
    name = gpu_name(backend.name)
    assert isinstance(name, str) and name and name in backend.description
    assert provenance(backend.name)["gpu"] == name and provenance("cpu")["gpu"] is None

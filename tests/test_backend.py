"""``resolve_device`` names its parameter as Python does (``device``); a command prints its flag."""
import pytest

from ksae_cupy.backend import resolve_device
from ksae_cupy.errors import OptionError


@pytest.mark.parametrize("spec", ["tpu", "{tpu}", "gpu:{0}", "}"])
def test_a_bad_device_names_the_parameter_and_the_value_as_typed(spec):
    with pytest.raises(OptionError) as refused:
        resolve_device(spec)
    assert refused.value.field == "device"
    assert str(refused.value) == f"device {spec!r} is not allowed; use auto, cpu, gpu or gpu:N"
    assert refused.value.spelled("--device") == f"--device {spec!r} is not allowed; use auto, cpu, gpu or gpu:N"


def _without_cupy(monkeypatch):
    """Import as on a CPU install: ``import cupy`` raises ModuleNotFoundError for cupy itself."""
    import builtins

    real_import = builtins.__import__

    def importing(name, *args, **kwargs):
        if name == "cupy" or name.startswith("cupy."):
            raise ModuleNotFoundError("No module named 'cupy'", name="cupy")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", importing)


def test_auto_on_a_cpu_install_says_cpu_without_an_exception_name(monkeypatch):
    # Issue 55: every command on a CPU machine began with "ModuleNotFoundError: No module named 'cupy'".
    _without_cupy(monkeypatch)
    backend = resolve_device("auto")
    assert backend.name == "cpu"
    assert backend.description == "device: cpu (numpy)"


def test_asking_for_a_gpu_on_a_cpu_install_says_cupy_is_not_installed_in_plain_words(monkeypatch):
    _without_cupy(monkeypatch)
    with pytest.raises(OptionError) as refused:
        resolve_device("gpu")
    message = refused.value.spelled("--device")
    assert "CuPy is not installed" in message and "cuda12" in message
    assert "ModuleNotFoundError" not in message

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

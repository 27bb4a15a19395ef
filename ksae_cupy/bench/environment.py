"""The device a GPU session was lent, checked before anything is timed: its properties, torch's CUDA, and
every kernel instantiation of ``kernels/*.cu`` (the top-k kernels, the epoch graph's products and order)
compiled by NVRTC (``bin/gpu-campaign``'s env stage).

CuPy is imported inside :func:`device_check`, so this module imports on a machine without it.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from ksae_cupy.bench.metadata import import_torch


def device_check(device: str, smi_log: Path) -> dict:
    """What the device is and which kernels NVRTC compiles (``nvrtc_failed``: name -> first error line);
    ``nvidia-smi``'s output goes to ``smi_log``. ``device == "cpu"`` (a dry run) compiles nothing."""
    from ksae_cupy.gpu import cuda_kernels as kernels
    from ksae_cupy.gpu import products, shuffle

    sources = {name: kernels.kernel_source(name) for name in (kernels.SOURCE_NAME, products.SOURCE_NAME,
                                                                shuffle.SOURCE_NAME)}
    names = {kernels.SOURCE_NAME: kernels.KERNEL_NAMES, products.SOURCE_NAME: products.KERNEL_NAMES,
             shuffle.SOURCE_NAME: shuffle.KERNEL_NAMES}
    info = {"kernels": sum(len(n) for n in names.values()),
            "kernel_source_bytes": sum(len(text) for text in sources.values())}
    if device == "cpu":
        info["nvrtc"] = "not run: no GPU in a dry run"
        return info
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    info.update(sm_count=props.get("multiProcessorCount"), memory_bytes=props.get("totalGlobalMem"),
                l2_bytes=props.get("l2CacheSize"), compute_capability=f"{props.get('major')}.{props.get('minor')}",
                torch_cuda=import_torch(cuda=True)[0] is not None)
    compiled, failed = [], {}
    t0 = time.perf_counter()
    for source_name, source in sources.items():
        try:
            module = cupy.RawModule(code=source, options=kernels.NVRTC_OPTIONS, name_expressions=list(names[source_name]))
            for name in names[source_name]:
                try:
                    module.get_function(name)
                    compiled.append(name)
                except Exception as exc:  # noqa: BLE001 -- recorded, the campaign goes on
                    failed[name] = str(exc).splitlines()[0]
        except Exception as exc:  # noqa: BLE001
            failed[f"<module {source_name}>"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    info.update(nvrtc_compiled=len(compiled), nvrtc_failed=failed, nvrtc_seconds=time.perf_counter() - t0)
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
        smi_log.write_text(smi)
    except (OSError, subprocess.SubprocessError):
        pass
    return info

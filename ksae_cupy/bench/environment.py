"""The device a GPU session was lent, checked before anything is timed: its properties, torch's CUDA, and
every kernel instantiation of ``kernels/topk.cu`` compiled by NVRTC (``bin/gpu-campaign``'s env stage).

CuPy is imported inside :func:`device_check`, so this module imports on a machine without it.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from ksae_cupy.bench.kernel_grid import torch_cuda


def device_check(device: str, smi_log: Path) -> dict:
    """What the device is and which kernels NVRTC compiles (``nvrtc_failed``: name -> first error line);
    ``nvidia-smi``'s output goes to ``smi_log``. ``device == "cpu"`` (a dry run) compiles nothing."""
    from ksae_cupy.gpu import cuda_kernels as kernels

    source = kernels.kernel_source()
    info = {"kernels": len(kernels.KERNEL_NAMES), "kernel_source_bytes": len(source)}
    if device == "cpu":
        info["nvrtc"] = "not run: no GPU in a dry run"
        return info
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    info.update(sm_count=props.get("multiProcessorCount"), memory_bytes=props.get("totalGlobalMem"),
                l2_bytes=props.get("l2CacheSize"), compute_capability=f"{props.get('major')}.{props.get('minor')}",
                torch_cuda=torch_cuda())
    compiled, failed = [], {}
    t0 = time.perf_counter()
    try:
        module = cupy.RawModule(code=source, options=("-std=c++17",), name_expressions=list(kernels.KERNEL_NAMES))
        for name in kernels.KERNEL_NAMES:
            try:
                module.get_function(name)
                compiled.append(name)
            except Exception as exc:  # noqa: BLE001 -- recorded, the campaign goes on
                failed[name] = str(exc).splitlines()[0]
    except Exception as exc:  # noqa: BLE001
        failed["<module>"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    info.update(nvrtc_compiled=len(compiled), nvrtc_failed=failed, nvrtc_seconds=time.perf_counter() - t0)
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
        smi_log.write_text(smi)
    except (OSError, subprocess.SubprocessError):
        pass
    return info

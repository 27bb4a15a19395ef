"""Choosing where arrays live: NumPy on the CPU, or CuPy on one GPU.

Model, optimiser and training loop are written once against an array module ``xp``.
:func:`resolve_device` turns ``--device auto|cpu|gpu[:N]`` into a :class:`Backend` that
carries that module and moves arrays to and from it. Importing this module never imports
cupy; only resolving a GPU device does.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from ksae_cupy.errors import OptionError, literal

DEVICE_PATTERN = re.compile(r"^(auto|cpu|gpu(:\d+)?)$")
DEVICES = "auto, cpu, gpu or gpu:N"  # DEVICE_PATTERN in words: what --device and device= allow


@dataclass(frozen=True)
class Backend:
    """Where the arrays of one run live.

    ``name`` is ``"cpu"`` or ``"gpu:N"``; ``xp`` is ``numpy`` or ``cupy``;
    ``description`` is the one line printed when a device is chosen.
    """

    name: str
    xp: ModuleType
    description: str
    gpu_index: int | None = None

    @property
    def is_gpu(self) -> bool:
        return self.gpu_index is not None

    def asarray(self, a, dtype=None):
        """Copy (or view) a host or device array onto this backend."""
        if self.is_gpu:
            with self.xp.cuda.Device(self.gpu_index):
                return self.xp.asarray(a, dtype=dtype)
        return np.asarray(to_host(a), dtype=dtype)

    def synchronize(self) -> None:
        """Wait for queued GPU work (so timings and progress lines are honest)."""
        if self.is_gpu:
            self.xp.cuda.Device(self.gpu_index).synchronize()

    def use(self):
        """Context manager that makes this backend's GPU current (no-op on the CPU)."""
        if self.is_gpu:
            return self.xp.cuda.Device(self.gpu_index)
        import contextlib

        return contextlib.nullcontext()


CPU = Backend(name="cpu", xp=np, description="device: cpu (numpy)")


def to_host(a) -> np.ndarray:
    """Return a NumPy array for a NumPy or CuPy array (or anything array-like)."""
    if hasattr(a, "get") and type(a).__module__.startswith("cupy"):
        return a.get()
    return np.asarray(a)


def array_module(a) -> ModuleType:
    """``cupy`` for a CuPy array, ``numpy`` for anything else (without importing cupy)."""
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


# Why there is no GPU on a machine without CuPy: said only when a GPU is asked for.
CUPY_NOT_INSTALLED = "CuPy is not installed (the extra cuda12 or cuda13 installs it)"


def _probe_gpu(index: int) -> tuple[ModuleType | None, str]:
    """Return (cupy, description) when GPU ``index`` answers, else (None, why not)."""
    try:
        import cupy
    except ModuleNotFoundError as exc:
        if exc.name != "cupy":  # cupy is there but one of its own imports is missing: say which
            return None, f"cupy does not import (it needs {exc.name})"
        # The usual case on a CPU machine: a plain note, not a Python exception name.
        return None, CUPY_NOT_INSTALLED
    except Exception as exc:  # a broken CUDA install raising on import
        return None, f"cupy does not import ({type(exc).__name__}: {exc})".splitlines()[0]
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device: cupy raises CUDARuntimeError
        return None, f"no CUDA device answers ({exc})".splitlines()[0]
    if index >= count:
        return None, f"gpu:{index} asked for but only {count} CUDA device(s) present"
    try:
        with cupy.cuda.Device(index):
            cupy.zeros(1, dtype=cupy.float32).sum().item()
            props = cupy.cuda.runtime.getDeviceProperties(index)
    except Exception as exc:
        return None, f"gpu:{index} does not run a kernel ({exc})".splitlines()[0]
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return cupy, f"device: gpu:{index} ({name}, cupy {cupy.__version__})"


def resolve_device(spec: str = "auto") -> Backend:
    """Turn ``auto``, ``cpu``, ``gpu`` or ``gpu:N`` into a :class:`Backend`.

    ``auto`` takes GPU 0 when cupy imports and a device answers, else the CPU (also when
    cupy is installed on a machine without a usable GPU). Asking for a GPU explicitly when
    none is usable raises :class:`KsaeError` instead of falling back. Errors name the
    parameter ``device`` (:class:`~ksae_cupy.errors.OptionError`; a command prints ``--device``).
    """
    spec = spec.strip().lower()
    if not DEVICE_PATTERN.match(spec):
        raise OptionError("device", f"{{name}} {literal(repr(spec))} is not allowed; use {DEVICES}")
    if spec == "cpu":
        return CPU
    index = int(spec.split(":")[1]) if ":" in spec else 0
    cupy, description = _probe_gpu(index)
    if cupy is None:
        if spec == "auto" and description == CUPY_NOT_INSTALLED:  # a CPU install: nothing to explain
            return CPU
        if spec == "auto":
            return Backend(name="cpu", xp=np, description=f"device: cpu (numpy; no GPU: {description})")
        raise OptionError("device", f"{{name}} {spec}: no usable GPU ({literal(description)}); use {{name}} cpu or auto")
    return Backend(name=f"gpu:{index}", xp=cupy, description=description, gpu_index=index)


def free_memory_bytes(backend: Backend) -> int | None:
    """Bytes the device can still give: the GPU's free memory, or the host's MemAvailable
    (None where the system does not say)."""
    if backend.is_gpu:
        with backend.xp.cuda.Device(backend.gpu_index):
            return int(backend.xp.cuda.runtime.memGetInfo()[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None

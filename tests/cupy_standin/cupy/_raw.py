"""``cupy.RawModule`` and ``cupy.RawKernel`` of the stand-in: CUDA source run by the host emulator.

Compiling builds ``tests/gpu/cuda_host/driver.cpp`` around the source (g++, the source unmodified)
with one entry per name expression, cached on disk by content (``$KSAE_CUPY_STANDIN_CACHE``, else
a folder in the temporary directory). Where NVRTC's library can be loaded (the ``cuda13`` extra's
``nvidia-cuda-nvrtc``, or a CUDA toolkit), the source is also compiled by NVRTC itself with the
same options and name expressions (:mod:`cupy._nvrtc`). A launch is checked as an H100's driver
checks it, then runs in the emulator, whose schedule rotates over block, thread and warp orders.
On a capturing stream the checked launch is recorded instead, and runs at each launch of the graph
(arrays by reference, scalars by value, as CUDA captures a kernel's arguments).
"""
from __future__ import annotations

import hashlib
import itertools
import os
import re
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

from cupy._array import ndarray
from cupy.cuda import driver as _driver
from cupy.cuda import graph as _graph
from cupy.cuda import runtime as _runtime

HARNESS_DIR = Path(__file__).resolve().parents[2] / "gpu" / "cuda_host"
if str(HARNESS_DIR) not in sys.path:
    sys.path.insert(0, str(HARNESS_DIR))
import harness  # noqa: E402

# Options NVRTC takes that the stand-in understands; anything else is refused as NVRTC would.
NVRTC_OPTION = re.compile(r"^(-std=c\+\+(11|14|17|20)|--std=c\+\+(11|14|17|20)|-arch=\w+|--gpu-architecture=\w+|"
                          r"-D\w+(=\S*)?|--use_fast_math|-use_fast_math|-lineinfo|--generate-line-info|"
                          r"-default-device|--device-as-default-execution-space)$")
C_SIZES = {"char": 1, "unsigned char": 1, "signed char": 1, "short": 2, "unsigned short": 2, "int": 4,
           "unsigned int": 4, "unsigned": 4, "float": 4, "long long": 8, "unsigned long long": 8, "double": 8}


class CompileException(Exception):
    """As cupy.cuda.compiler.CompileException: the source does not compile."""


_lock = threading.Lock()
_drivers: dict[str, harness.Driver] = {}
_schedule = itertools.count()


def cache_dir() -> Path:
    path = os.environ.get("KSAE_CUPY_STANDIN_CACHE") or os.path.join(tempfile.gettempdir(),
                                                                       f"ksae-cupy-standin-{os.getuid()}")
    return Path(path)


def _build(code: str, names: tuple[str, ...], options: tuple[str, ...]) -> Path:
    """The emulator's driver for ``code`` and ``names``, built once per content and kept on disk;
    before the first build, NVRTC's own compile where its library loads (once per content too)."""
    key = hashlib.sha256()
    for part in (code, "\n".join(names), "\n".join(options),
                 *(p.read_text() for p in sorted(HARNESS_DIR.glob("*.[ch]*")))):
        key.update(part.encode())
        key.update(b"\0")
    final = cache_dir() / key.hexdigest()[:24]
    exe = final / "driver"
    from cupy import _nvrtc

    if _nvrtc.available() and not (final / "nvrtc.ok").is_file():
        _nvrtc.check_compiles(code, options, names)
        if exe.is_file():
            (final / "nvrtc.ok").write_text(_nvrtc.version() + "\n")
    if exe.is_file():
        return exe
    cache_dir().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=cache_dir()))
    source = work / "kernels.cu"
    source.write_text(code)
    try:
        harness.build(work, source, names)
    except harness.HarnessError as exc:
        raise CompileException(str(exc)) from None
    if _nvrtc.available():
        (work / "nvrtc.ok").write_text(_nvrtc.version() + "\n")
    try:
        os.replace(work, final)  # atomic: another process may have built it meanwhile
    except OSError:
        pass
    return exe


def _driver_for(exe: Path) -> harness.Driver:
    d = _drivers.get(str(exe))
    if d is None or d.proc.poll() is not None:
        d = _drivers[str(exe)] = harness.Driver(exe)
    return d


def _static_shared(code: str, name: str) -> int:
    """Static shared memory of kernel ``name`` (``ns::tmpl<...>``): its non-extern ``__shared__``
    declarations, each aligned to its size, the total to 16 bytes (what ptxas reported for ours)."""
    template = name.split("<")[0].split("::")[-1]
    m = re.search(r"__global__[^;{]*?\b" + re.escape(template) + r"\s*\(", code)
    if not m:
        raise CompileException(f"kernel {name!r} is not defined in the source")
    start = code.index("{", m.end())
    depth, i = 0, start
    while True:
        depth += {"{": 1, "}": -1}.get(code[i], 0)
        i += 1
        if depth == 0:
            break
    total = 0
    for decl in re.finditer(r"(?<!extern )__shared__\s+([^;]+);", code[start:i]):
        text = " ".join(re.sub(r"__align__\(\d+\)", "", decl.group(1)).split())
        ctype = next((t for t in sorted(C_SIZES, key=len, reverse=True) if text.startswith(t + " ")), None)
        if ctype is None:
            raise CompileException(f"the stand-in cannot size the __shared__ declaration {text!r} in {name}")
        size = C_SIZES[ctype]
        for declarator in text[len(ctype):].split(","):
            count = 1
            for dim in re.findall(r"\[(\d+)\]", declarator):
                count *= int(dim)
            total = -(-total // size) * size + size * count
    return -(-total // 16) * 16


class RawModule:
    """``cupy.RawModule(code=..., options=..., name_expressions=...)``, compiled at construction."""

    def __init__(self, code=None, path=None, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, name_expressions=None, jitify=False):
        if code is None:
            code = Path(path).read_text()
        if backend != "nvrtc":
            raise CompileException(f"backend {backend!r}: the stand-in compiles like NVRTC only")
        for option in options:
            if not NVRTC_OPTION.match(option):
                raise CompileException(f"nvrtc: error: unrecognized option {option!r}")
        if "extern __shared__" in code and "smem_raw" not in code:
            raise CompileException("the emulator binds dynamic shared memory named smem_raw only (cuda_host.h)")
        self.code = code
        self.options = tuple(options)
        self.name_expressions = tuple(name_expressions or ())
        self._exe = _build(code, self.name_expressions, self.options)

    def get_function(self, name: str) -> "RawKernel":
        if name not in self.name_expressions:
            raise _driver.CUDADriverError(f"CUDA_ERROR_NOT_FOUND: named symbol not found: {name!r} is not among the "
                                          f"name expressions")
        kernel = RawKernel.__new__(RawKernel)
        kernel._init(self, name)
        return kernel


class RawKernel:
    """A kernel of a :class:`RawModule`; ``RawKernel(code, name)`` compiles its own."""

    def __init__(self, code, name, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, jitify=False):
        self._init(RawModule(code=code, options=options, name_expressions=[name]), name)

    def _init(self, module: RawModule, name: str) -> None:
        self.module, self.name = module, name
        self.shared_size_bytes = _static_shared(module.code, name)
        self._max_dynamic = 0
        self.num_regs = 32
        self.max_threads_per_block = 1024

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self._max_dynamic

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value) -> None:
        value = int(value)
        if value < 0 or value + self.shared_size_bytes > _runtime.SHARED_OPTIN:
            raise _driver.CUDADriverError(
                f"CUDA_ERROR_INVALID_VALUE: max_dynamic_shared_size_bytes {value} + {self.shared_size_bytes} static "
                f"exceeds the device's {_runtime.SHARED_OPTIN}")
        self._max_dynamic = value

    @property
    def attributes(self) -> dict:
        return {"max_dynamic_shared_size_bytes": self._max_dynamic, "shared_size_bytes": self.shared_size_bytes,
                "num_regs": self.num_regs, "max_threads_per_block": self.max_threads_per_block}

    def __call__(self, grid, block, args, *, shared_mem=0, stream=None, enable_cooperative_groups=False):
        if not isinstance(grid, tuple) or not isinstance(block, tuple):
            raise TypeError(f"grid and block must be tuples; got {type(grid).__name__} and {type(block).__name__}")
        grid3 = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        block3 = tuple(int(b) for b in block) + (1,) * (3 - len(block))
        if len(grid3) != 3 or len(block3) != 3:
            raise ValueError(f"grid {grid} and block {block} have at most 3 dimensions")
        _check_launch(self, grid3, block3, int(shared_mem))
        host_args, outputs = [], []
        for i, a in enumerate(args):
            if isinstance(a, ndarray):
                if not a._a.flags.c_contiguous:
                    raise ValueError(f"argument {i} of {self.name} is not C-contiguous: the kernel would read its "
                                     f"memory as if it were (strides {a.strides})")
                host_args.append(a._a)
                outputs.append(i)
            elif isinstance(a, np.ndarray):
                raise TypeError(f"Unsupported type {type(a)}")
            elif isinstance(a, np.generic):
                host_args.append(a)
            elif isinstance(a, (bool, int, float, complex)):
                raise TypeError(f"argument {i} of {self.name} is a Python {type(a).__name__} ({a!r}): CuPy picks its "
                                f"C size itself, not the kernel's; pass a NumPy scalar of the parameter's type")
            else:
                raise TypeError(f"Unsupported type {type(a)}")
        shared = (int(shared_mem), self._max_dynamic, self.shared_size_bytes)
        capture = _graph.recording(stream)
        if capture is not None:
            _graph.record(capture, lambda: self._run(grid3, block3, host_args, outputs, shared), self.name)
            return
        self._run(grid3, block3, host_args, outputs, shared)

    def _run(self, grid3, block3, host_args, outputs, shared) -> None:
        """The launch, in the emulator, under the next schedule."""
        schedule = harness.SCHEDULES[next(_schedule) % len(harness.SCHEDULES)]
        with _lock:
            try:
                _driver_for(self.module._exe).launch(
                    self.name, grid3, block3, host_args, outputs, schedule=schedule, label="cupy stand-in",
                    shared=shared, only_changed=True)
            except harness.HarnessError as exc:
                if "the kernel takes" in str(exc):  # an argument of the wrong C type or count
                    raise TypeError(f"{self.name}: {exc}") from None
                raise _driver.CUDADriverError(f"CUDA_ERROR_ILLEGAL_ADDRESS or launch failure in {self.name}: {exc}") \
                    from None


def _check_launch(kernel: RawKernel, grid, block, shared_mem: int) -> None:
    """An H100's launch limits, as the CUDA driver enforces them."""
    threads = block[0] * block[1] * block[2]
    if min(block) < 1 or threads > 1024 or block[0] > 1024 or block[1] > 1024 or block[2] > 64:
        raise _driver.CUDADriverError(f"CUDA_ERROR_INVALID_VALUE: block {block}: 1 to 1024 threads, z up to 64")
    if min(grid) < 1 or grid[0] > 2**31 - 1 or grid[1] > 65535 or grid[2] > 65535:
        raise _driver.CUDADriverError(f"CUDA_ERROR_INVALID_VALUE: grid {grid}: x up to 2^31-1, y and z up to 65535")
    allowed = kernel.max_dynamic_shared_size_bytes or _runtime.SHARED_DEFAULT - kernel.shared_size_bytes
    if shared_mem > allowed:
        raise _driver.CUDADriverError(
            f"CUDA_ERROR_INVALID_VALUE: {shared_mem} bytes of dynamic shared memory; the kernel is allowed {allowed} "
            f"({kernel.shared_size_bytes} static; raise max_dynamic_shared_size_bytes for more than 48 KiB in all)")


def shutdown() -> None:
    """Ends the emulator processes this process started (the tests' fixture calls it on teardown)."""
    with _lock:
        for d in _drivers.values():
            d.close()
        _drivers.clear()

"""The real NVRTC, where its library loads (no GPU needed): the stand-in's RawModule also compiles
the source with it, with CuPy's options and name expressions, so a source NVRTC rejects fails here
too. Without the library (no ``nvidia-cuda-nvrtc`` wheel, no CUDA toolkit's libnvrtc) this is a no-op
and only the host emulator's g++ build and the nvcc compile test check the source."""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os


def _library():
    candidates = []
    try:
        import nvidia  # the nvidia-cuda-nvrtc wheel (the cuda12/cuda13 extras' [ctk]): nvidia/<cu13|cuda_nvrtc>/lib

        for root in nvidia.__path__:
            candidates += sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    found = ctypes.util.find_library("nvrtc")
    if found:
        candidates.append(found)
    candidates += sorted(glob.glob("/usr/local/cuda*/lib*/libnvrtc.so*"))
    for path in candidates:
        if "builtins" in os.path.basename(path) or "alt" in os.path.basename(path):
            continue
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


_LIB = None
_LOADED = False


def library():
    global _LIB, _LOADED
    if not _LOADED:
        _LIB, _LOADED = _library(), True
    return _LIB


def available() -> bool:
    return library() is not None


def version() -> str:
    lib = library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"NVRTC {major.value}.{minor.value}"


def check_compiles(code: str, options: tuple, names: tuple) -> None:
    """Compile with NVRTC as CuPy would (plus -arch=compute_90); raise CompileException with its log."""
    lib = library()
    if lib is None:
        return
    from cupy._raw import CompileException

    prog = ctypes.c_void_p()
    status = lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), b"kernels.cu", 0, None, None)
    if status != 0:
        raise CompileException(f"nvrtcCreateProgram failed ({status})")
    try:
        for name in names:
            if lib.nvrtcAddNameExpression(prog, name.encode()) != 0:
                raise CompileException(f"nvrtcAddNameExpression({name!r}) failed")
        opts = [o.encode() for o in options] + [b"-arch=compute_90"]
        array = (ctypes.c_char_p * len(opts))(*opts)
        status = lib.nvrtcCompileProgram(prog, len(opts), array)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value or 1)
        lib.nvrtcGetProgramLog(prog, log)
        if status != 0:
            raise CompileException(f"NVRTC failed ({status}):\n{log.value.decode(errors='replace')}")
        for name in names:
            lowered = ctypes.c_char_p()
            if lib.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(lowered)) != 0:
                raise CompileException(f"NVRTC has no lowered name for {name!r}")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))

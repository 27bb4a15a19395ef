"""CUDA launchers for the kernels in ``kernels/topk.cu``: top-k (sort and threshold), gathers, scatters.

Nothing here imports cupy at module level, so the package imports on machines without it. The
kernels are compiled on first use with ``cupy.RawModule`` (NVRTC, ``-std=c++17``), once per
(device, source text), and cached in :data:`_MODULES`.

Every launcher checks its inputs (dtype, shape, C-contiguity, k range) and raises
:class:`~ksae_cupy.errors.KsaeError` with a one-line message; scalars are passed to the kernels as
explicit ``numpy.int32`` (CuPy does not check kernel argument types and would pass a Python int
as a 64-bit value).

Limits: one block handles one row, with the row's keys in shared memory. The threshold kernel
needs ``H * 4`` bytes per block for float32 (``H * 8`` for float64), the sort kernel
``P * 8`` bytes (``P * 12`` for float64), ``P`` the next power of two >= H. With the opt-in limit
of current GPUs (227 KB on H100/H200, 163 KB on A100) both handle H = 16,384 in float32; beyond
the device's limit the launcher raises a KsaeError naming the largest H it can take.
"""
from __future__ import annotations

import hashlib
import numbers
from pathlib import Path

import numpy as np

from ksae_cupy.errors import KsaeError

SOURCE_NAME = "topk.cu"
CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
KEY_BYTES = {np.dtype(np.float32): 4, np.dtype(np.float64): 8}
TOPK_BLOCKS = (256, 512)  # threads per block of the per-row top-k kernels
FLAT_BLOCK = 256  # threads per block of the gather/scatter kernels
BIG_ROW = 2048  # rows (padded rows, for sort) at least this long use the larger block


def _topk_name(method: str, ctype: str, block: int) -> str:
    return f"ksae::topk_{method}_kernel<{ctype}, {block}>"


def _flat_name(kind: str, ctype: str) -> str:
    return f"ksae::{kind}_rows_kernel<{ctype}>"


# The one list of template instantiations: passed to RawModule(name_expressions=...) and
# instantiated by tests/test_kernels_compile.py for the nvcc compile check.
KERNEL_NAMES: tuple[str, ...] = tuple(
    [_topk_name(m, c, b) for m in ("threshold", "sort") for c in CTYPES.values() for b in TOPK_BLOCKS]
    + [_flat_name(kind, c) for kind in ("gather", "scatter", "mask") for c in CTYPES.values()]
)

_SOURCE_CACHE: dict[str, str] = {}
_MODULES: dict[tuple[int, str], object] = {}  # (device id, source sha256) -> cupy.RawModule
_FUNCTIONS: dict[tuple[int, str, str], object] = {}  # (device id, sha, name) -> cupy.RawKernel


def kernel_source_path(name: str = SOURCE_NAME) -> Path:
    """Path of a ``.cu`` file: from the installed package ``ksae_cupy.kernels``, else the source tree."""
    try:
        from importlib.resources import files

        path = Path(str(files("ksae_cupy.kernels") / name))
        if path.is_file():
            return path
    except (ImportError, ModuleNotFoundError, TypeError):
        pass
    path = Path(__file__).resolve().parents[2] / "kernels" / name  # the source tree: <repo>/kernels
    if not path.is_file():
        raise KsaeError(f"CUDA source {name} not found (looked in ksae_cupy.kernels and {path.parent}); reinstall ksae-cupy")
    return path


def kernel_source(name: str = SOURCE_NAME) -> str:
    """Text of a ``.cu`` file (read once)."""
    if name not in _SOURCE_CACHE:
        _SOURCE_CACHE[name] = kernel_source_path(name).read_text()
    return _SOURCE_CACHE[name]


def instantiation_source(include_path: str | Path) -> str:
    """A ``.cu`` translation unit that includes the kernels and instantiates every :data:`KERNEL_NAMES` entry.

    Taking each template kernel's address in a host function makes nvcc instantiate and compile
    it, without restating the parameter lists here.
    """
    lines = [f'#include "{Path(include_path).as_posix()}"', "", "void ksae_instantiate_all_kernels(void** out) {"]
    for i, name in enumerate(KERNEL_NAMES):
        lines.append(f"    out[{i}] = reinterpret_cast<void*>(&{name});")
    lines.append("}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------
# Compilation and launch helpers (cupy imported inside).

def _cupy():
    try:
        import cupy
    except Exception as exc:  # ImportError or a broken CUDA install
        raise KsaeError(f"the CUDA kernels need cupy, which does not import ({type(exc).__name__}: {exc})".splitlines()[0])
    return cupy


def _module(cupy):
    device = cupy.cuda.Device().id
    source = kernel_source()
    sha = hashlib.sha256(source.encode()).hexdigest()
    key = (device, sha)
    if key not in _MODULES:
        _MODULES[key] = cupy.RawModule(code=source, options=("-std=c++17",), name_expressions=list(KERNEL_NAMES))
    return _MODULES[key], device, sha


def _function(cupy, name: str):
    module, device, sha = _module(cupy)
    key = (device, sha, name)
    if key not in _FUNCTIONS:
        _FUNCTIONS[key] = module.get_function(name)
    return _FUNCTIONS[key]


def _device_attribute(cupy, name: str, default: int) -> int:
    try:
        return int(cupy.cuda.Device().attributes[name])
    except Exception:
        return default


def _shared_limit(cupy) -> int:
    """Largest dynamic + static shared memory one block may opt in to on the current device."""
    return _device_attribute(cupy, "MaxSharedMemoryPerBlockOptin", 48 * 1024)


def _grid(cupy, work_items: int, per_sm: int) -> int:
    sms = _device_attribute(cupy, "MultiProcessorCount", 80)
    return max(1, min(int(work_items), sms * per_sm))


def _is_cupy_array(a) -> bool:
    return type(a).__module__.startswith("cupy") and hasattr(a, "data")


def _check_array(a, what: str, ndim: int, dtypes) -> None:
    if not _is_cupy_array(a):
        raise KsaeError(f"{what} must be a cupy array on the GPU; got {type(a).__name__}")
    if a.ndim != ndim:
        raise KsaeError(f"{what} must be {ndim}-D; got shape {tuple(a.shape)}")
    if np.dtype(a.dtype) not in dtypes:
        allowed = ", ".join(str(np.dtype(d)) for d in dtypes)
        raise KsaeError(f"{what} has dtype {a.dtype}; allowed: {allowed}")
    if not a.flags.c_contiguous:
        raise KsaeError(f"{what} must be C-contiguous (use cupy.ascontiguousarray); got strides {a.strides}")


def _check_k(k, H: int) -> int:
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral):
        raise KsaeError(f"k={k!r} must be an integer with 1 <= k <= {H}")
    k = int(k)
    if not 1 <= k <= H:
        raise KsaeError(f"k={k} is not allowed for H={H} hidden units; use 1 <= k <= {H}")
    return k


def _check_out(out, what: str, shape: tuple, dtype) -> None:
    _check_array(out, what, len(shape), (np.dtype(dtype),))
    if tuple(out.shape) != tuple(shape):
        raise KsaeError(f"{what} has shape {tuple(out.shape)}; expected {tuple(shape)}")


def _check_int32_range(N: int, H: int) -> None:
    if N > np.iinfo(np.int32).max or H > np.iinfo(np.int32).max:
        raise KsaeError(f"shape ({N}, {H}) is too large; the kernels take N, H <= {np.iinfo(np.int32).max}")


# ------------------------------------------------------------------------------------------------
# Top-k.

TOPK_GPU_METHODS = ("sort", "threshold")


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def topk_shared_bytes(method: str, H: int, dtype) -> int:
    """Dynamic shared memory one block of the top-k kernel needs for rows of length H."""
    key = KEY_BYTES[np.dtype(dtype)]
    if method == "threshold":
        return H * key
    return next_pow2(H) * (key + 4)


def topk_max_H(method: str, dtype, shared_limit: int, static_bytes: int = 0) -> int:
    """Largest H whose row fits in ``shared_limit`` bytes for this method and dtype."""
    budget = shared_limit - static_bytes
    key = KEY_BYTES[np.dtype(dtype)]
    if method == "threshold":
        return max(0, budget // key)
    p = 1
    while 2 * p * (key + 4) <= budget:
        p *= 2
    return p if p * (key + 4) <= budget else 0


def topk_block(method: str, H: int) -> int:
    length = H if method == "threshold" else next_pow2(H)
    return TOPK_BLOCKS[1] if length >= BIG_ROW else TOPK_BLOCKS[0]


def topk_gpu(Z_nh, k: int, method: str = "sort", *, dense: bool = False, out=None, max_blocks: int | None = None):
    """Top-k of every row of the cupy array ``Z_nh`` with the CUDA kernels.

    Returns ``(idx_nk int32, val_nk)``, or ``(idx_nk, val_nk, Zs_nh)`` with ``dense=True``
    (``Zs_nh``: the kept values in place, zeros elsewhere). ``method="sort"`` gives rows in
    descending order (ties by ascending column), ``"threshold"`` in ascending column order; the
    kept sets are those of :func:`ksae_cupy.topk.topk_sort` / ``topk_threshold``, bit for bit.

    ``out``: optional preallocated outputs ``(idx_nk, val_nk)`` (plus ``Zs_nh`` with ``dense``),
    written completely. ``max_blocks`` caps the grid (tests use it to force several row passes).
    """
    cupy = _cupy()
    if method not in TOPK_GPU_METHODS:
        raise KsaeError(f"top-k method {method!r} is not allowed; use one of {', '.join(TOPK_GPU_METHODS)}")
    _check_array(Z_nh, "Z_nh", 2, tuple(CTYPES))
    N, H = (int(s) for s in Z_nh.shape)
    if H < 1:
        raise KsaeError(f"Z_nh has H={H} columns; top-k needs H >= 1")
    k = _check_k(k, H)
    _check_int32_range(N, H)
    dtype = np.dtype(Z_nh.dtype)
    with cupy.cuda.Device(Z_nh.device.id):
        if out is None:
            idx_nk = cupy.empty((N, k), dtype=np.int32)
            val_nk = cupy.empty((N, k), dtype=dtype)
            Zs_nh = cupy.empty((N, H), dtype=dtype) if dense else None
        else:
            expected = 3 if dense else 2
            if len(out) != expected:
                raise KsaeError(f"out must hold {expected} arrays (idx_nk, val_nk{', Zs_nh' if dense else ''}); got {len(out)}")
            idx_nk, val_nk = out[0], out[1]
            _check_out(idx_nk, "out idx_nk", (N, k), np.int32)
            _check_out(val_nk, "out val_nk", (N, k), dtype)
            Zs_nh = None
            if dense:
                Zs_nh = out[2]
                _check_out(Zs_nh, "out Zs_nh", (N, H), dtype)
        result = (idx_nk, val_nk, Zs_nh) if dense else (idx_nk, val_nk)
        if N == 0:
            return result

        block = topk_block(method, H)
        kernel = _function(cupy, _topk_name(method, CTYPES[dtype], block))
        smem = topk_shared_bytes(method, H, dtype)
        static = int(getattr(kernel, "shared_size_bytes", 0) or 0)
        limit = _shared_limit(cupy)
        if smem + static > limit:
            max_H = topk_max_H(method, dtype, limit, static)
            other = " or --topk threshold" if method == "sort" else ""
            raise KsaeError(
                f"H={H} is too large for the {method} top-k kernel in {dtype}: a row needs {smem + static} bytes "
                f"of shared memory and this GPU allows {limit} per block; use H <= {max_H}{other}")
        if smem > 48 * 1024 and int(kernel.max_dynamic_shared_size_bytes) < smem:
            kernel.max_dynamic_shared_size_bytes = smem
        grid = _grid(cupy, N, 2048 // block)
        if max_blocks is not None:
            grid = max(1, min(grid, int(max_blocks)))
        dense_arg = Zs_nh if dense else val_nk  # never written when write_dense is 0
        args = [Z_nh, np.int32(N), np.int32(H)]
        if method == "sort":
            args.append(np.int32(next_pow2(H)))
        args += [np.int32(k), idx_nk, val_nk, dense_arg, np.int32(1 if dense else 0)]
        kernel((grid,), (block,), tuple(args), shared_mem=smem)
    return result


# ------------------------------------------------------------------------------------------------
# Gathers and scatters of the sparse backward pass.

def _check_idx(idx_nk, N: int | None = None):
    _check_array(idx_nk, "idx_nk", 2, (np.dtype(np.int32),))
    if N is not None and int(idx_nk.shape[0]) != N:
        raise KsaeError(f"idx_nk has {idx_nk.shape[0]} rows; expected {N}")


def _launch_flat(cupy, kind: str, dtype, args, N: int, k: int) -> None:
    if N * k == 0:
        return
    kernel = _function(cupy, _flat_name(kind, CTYPES[np.dtype(dtype)]))
    blocks = _grid(cupy, -(-N * k // FLAT_BLOCK), 2048 // FLAT_BLOCK * 4)
    kernel((blocks,), (FLAT_BLOCK,), tuple(args))


def gather_rows_gpu(src_nh, idx_nk, out=None):
    """``out_nk[n, j] = src_nh[n, idx_nk[n, j]]`` (e.g. dZ_nk from dZs_nh = R W)."""
    cupy = _cupy()
    _check_array(src_nh, "src_nh", 2, tuple(CTYPES))
    N, H = (int(s) for s in src_nh.shape)
    _check_idx(idx_nk, N)
    k = int(idx_nk.shape[1])
    _check_int32_range(N, max(H, k))
    with cupy.cuda.Device(src_nh.device.id):
        if out is None:
            out = cupy.empty((N, k), dtype=src_nh.dtype)
        else:
            _check_out(out, "out", (N, k), src_nh.dtype)
        _launch_flat(cupy, "gather", src_nh.dtype, (src_nh, idx_nk, np.int32(N), np.int32(H), np.int32(k), out), N, k)
    return out


def scatter_rows_gpu(idx_nk, val_nk, H: int, out=None):
    """Dense ``(N, H)`` array with ``val_nk`` at ``idx_nk`` and zeros elsewhere.

    ``out``, when given, is zeroed first and then written.
    """
    cupy = _cupy()
    _check_array(val_nk, "val_nk", 2, tuple(CTYPES))
    N, k = (int(s) for s in val_nk.shape)
    _check_idx(idx_nk, N)
    if tuple(idx_nk.shape) != (N, k):
        raise KsaeError(f"idx_nk has shape {tuple(idx_nk.shape)}; expected {(N, k)} like val_nk")
    if isinstance(H, (bool, np.bool_)) or not isinstance(H, numbers.Integral) or int(H) < k:
        raise KsaeError(f"H={H!r} must be an integer >= k={k}")
    H = int(H)
    _check_int32_range(N, H)
    with cupy.cuda.Device(val_nk.device.id):
        if out is None:
            out = cupy.zeros((N, H), dtype=val_nk.dtype)
        else:
            _check_out(out, "out", (N, H), val_nk.dtype)
            out.fill(0)
        _launch_flat(cupy, "scatter", val_nk.dtype, (val_nk, idx_nk, np.int32(N), np.int32(H), np.int32(k), out), N, k)
    return out


def mask_rows_gpu(src_nh, idx_nk, out=None):
    """``src_nh`` kept at ``idx_nk`` and zero elsewhere: the fused gather + scatter of dZ_nh."""
    cupy = _cupy()
    _check_array(src_nh, "src_nh", 2, tuple(CTYPES))
    N, H = (int(s) for s in src_nh.shape)
    _check_idx(idx_nk, N)
    k = int(idx_nk.shape[1])
    _check_int32_range(N, max(H, k))
    with cupy.cuda.Device(src_nh.device.id):
        if out is None:
            out = cupy.zeros((N, H), dtype=src_nh.dtype)
        else:
            _check_out(out, "out", (N, H), src_nh.dtype)
            out.fill(0)
        _launch_flat(cupy, "mask", src_nh.dtype, (src_nh, idx_nk, np.int32(N), np.int32(H), np.int32(k), out), N, k)
    return out


def csr_from_topk(idx_nk, val_nk, H: int):
    """The sparse code as a ``cupyx.scipy.sparse.csr_matrix`` (N, H) sharing ``idx_nk``/``val_nk``.

    The alternative to dense masked products: ``csr @ W.T`` (decoder) and ``X.T @ csr`` (dW)
    touch only the N*k kept entries. A GPU session can time it against the dense products.
    """
    cupy = _cupy()
    import cupyx.scipy.sparse as sparse

    _check_array(val_nk, "val_nk", 2, (np.dtype(np.float32), np.dtype(np.float64)))
    N, k = (int(s) for s in val_nk.shape)
    _check_idx(idx_nk, N)
    indptr = cupy.arange(0, N * k + 1, k, dtype=np.int32)
    return sparse.csr_matrix((val_nk.ravel(), idx_nk.ravel(), indptr), shape=(N, int(H)))

"""CUDA launchers for the kernels in ``kernels/select_topk.cu``: top-k (sort and threshold), gathers, scatters.

Each launcher is two steps. A *plan* (:func:`plan_topk`, :func:`plan_rows`) checks the inputs and
decides everything about the launch (kernel name, grid, block, shared memory, the argument tuple
with every scalar as an explicit NumPy type) without importing cupy: it works on NumPy arrays too,
which is how ``tests/gpu/test_kernels_host.py`` runs the very launches the launchers make through
the CPU emulation of the kernels. Then :func:`_launch` hands the plan to ``cupy.RawKernel``.

Nothing here imports cupy at module level, so the package imports on machines without it. The
kernels are compiled on first use with ``cupy.RawModule`` (NVRTC, ``-std=c++17``; the source
includes no headers, so no include path is needed, wheel install or not), once per device, and
cached with their functions.

Every launcher checks its inputs (dtype, shape, C-contiguity, k range, H range) and raises
:class:`~ksae_cupy.errors.KsaeError` with a one-line message. Scalars are ``numpy.int32``: CuPy
does not check kernel argument types and would pass a Python int as a 64-bit value.

Limits: one block handles one row, with the row's keys in shared memory. The threshold kernel
needs ``H * 4`` bytes per block for float32 (``H * 8`` for float64) plus 1,168 bytes of static
shared memory, the sort kernel ``P * 8`` bytes (``P * 12`` for float64), ``P`` the next power of
two >= H. Above 48 KiB in all the launcher opts in (``max_dynamic_shared_size_bytes``); with the
opt-in limit of current GPUs (227 KiB on H100/H200, 163 KiB on A100) both handle H = 16,384 in
float32; beyond the device's limit the launcher raises a KsaeError naming the largest H it can take.
Rows are strided over a 1-D grid of at most a few thousand blocks, so any N up to 2^31 - 1 works.

``variant="radix"`` picks the other kernels (``topk_radix_kernel``): one warp per row, up to 8 rows
per block, 8,192 bytes of static shared memory (per-warp histograms) plus, per warp, the row's keys
when they fit (else later digits re-read the row, so any H works) and, for sort, the k kept pairs
(``next_pow2(k) * 8`` bytes in float32): :func:`radix_layout`. Same sets, order and bits as "block".

Over 400 lines: every launch plan is here beside its launcher, so that the host emulator's tests run the
very plans the GPU gets (grid, block, shared memory, argument types), one per kernel of kernels/*.cu.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ksae_cupy.errors import KsaeError, OptionError

SOURCE_NAME = "select_topk.cu"
NVRTC_OPTIONS = ("-std=c++17",)
CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
KEY_BYTES = {np.dtype(np.float32): 4, np.dtype(np.float64): 8}
TOPK_BLOCKS = (256, 512)  # threads per block of the per-row top-k kernels
FLAT_BLOCK = 256  # threads per block of the gather/scatter/mask kernels
BIG_ROW = 2048  # rows (padded rows, for sort) at least this long use the larger block
DEFAULT_SHARED = 48 * 1024  # shared memory per block (static + dynamic) without the opt-in
# Static shared memory of the top-k kernels, as ptxas reports it for sm_80 and sm_90
# (tests/gpu/test_kernels_compile.py checks it). On a GPU the launcher uses the compiled kernel's own
# figure; plans made without a GPU (the CPU harness) use these.
STATIC_SHARED_BYTES = {"threshold": 1168, "sort": 0, "radix": 8192}
# Kernel variants of the top-k methods: "block" (one block per row, the first kernels) and "radix"
# (one warp per row, several rows per block, sort over the k kept entries only). Both keep the same
# sets, in the same order, bit for bit; "block" stays the default until a GPU session has timed both.
TOPK_VARIANTS = ("block", "radix")
DEFAULT_TOPK_VARIANT = "block"
RADIX_MAX_WARPS = 8  # as in select_topk.cu
ROW_KINDS = ("gather", "scatter", "mask")
INT32_MAX = int(np.iinfo(np.int32).max)


def _topk_name(method: str, ctype: str, block: int) -> str:
    return f"ksae::topk_{method}_kernel<{ctype}, {block}>"


def _radix_name(method: str, ctype: str) -> str:
    return f"ksae::topk_radix_kernel<{ctype}, {'true' if method == 'sort' else 'false'}>"


def _flat_name(kind: str, ctype: str) -> str:
    return f"ksae::{kind}_rows_kernel<{ctype}>"


# The one list of template instantiations: passed to RawModule(name_expressions=...), instantiated
# by tests/gpu/test_kernels_compile.py for the nvcc compile check and by the CPU harness.
KERNEL_NAMES: tuple[str, ...] = tuple(
    [_topk_name(m, c, b) for m in ("threshold", "sort") for c in CTYPES.values() for b in TOPK_BLOCKS]
    + [_radix_name(m, c) for m in ("threshold", "sort") for c in CTYPES.values()]
    + [_flat_name(kind, c) for kind in ROW_KINDS for c in CTYPES.values()]
)

_SOURCE_CACHE: dict[str, str] = {}
_MODULES: dict[tuple, object] = {}  # (device id, source name) -> cupy.RawModule (the source is read once per process)
_FUNCTIONS: dict[tuple[int, str], object] = {}  # (device id, name) -> cupy.RawKernel
_LIMITS: dict[int, "DeviceLimits"] = {}  # device id -> its limits


def kernel_source_path(name: str = SOURCE_NAME) -> Path:
    """Path of a ``.cu`` file: from the source tree this module sits in, else the installed package ``ksae_cupy.kernels``.

    The source tree first: with a checkout on PYTHONPATH and another one installed (editable), the
    kernels must be the checkout's, the ones this module's launch plans describe.
    """
    tree = Path(__file__).resolve().parents[2] / "kernels" / name  # the source tree: <repo>/kernels
    if tree.is_file():
        return tree
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


# ------------------------------------------------------------------------------------------------
# Launch plans (no cupy).

@dataclass(frozen=True)
class DeviceLimits:
    """What a plan needs to know about the GPU."""

    sm_count: int
    shared_optin: int  # cudaDevAttrMaxSharedMemoryPerBlockOptin: static + dynamic bytes per block


@dataclass(frozen=True)
class KernelLaunch:
    """Everything about one launch: ``RawKernel(name)((grid,), (block,), args, shared_mem=...)``."""

    name: str  # an entry of KERNEL_NAMES
    grid: int  # blocks (1-D); 0: nothing to run (the outputs in `zeroed` are still zeroed)
    block: int  # threads per block
    args: tuple  # arrays and NumPy scalars, in the kernel's parameter order
    outputs: tuple  # positions in args of the arrays the kernel writes
    zeroed: tuple = ()  # positions in args the launcher zeroes first (the kernel writes only some entries)
    shared_mem: int = 0  # dynamic shared memory per block, bytes
    shared_optin: int = 0  # value for max_dynamic_shared_size_bytes; 0: the default 48 KiB suffices
    static_shared: int = 0  # the kernel's static shared memory this plan counted


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


TOPK_GPU_METHODS = ("sort", "threshold")


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


def topk_kernel_name(method: str, dtype, H: int, variant: str = DEFAULT_TOPK_VARIANT) -> str:
    """The instantiation the launcher runs for this method, dtype, row length and variant."""
    if variant == "radix":
        return _radix_name(method, CTYPES[np.dtype(dtype)])
    return _topk_name(method, CTYPES[np.dtype(dtype)], topk_block(method, H))


@dataclass(frozen=True)
class RadixLayout:
    """How the radix kernel spends shared memory: rows (warps) per block, per-warp region, key cache."""

    warps: int
    region_bytes: int  # per warp, a multiple of 16
    cache_keys: bool  # the row's keys stay in shared memory (else later digits re-read the row)
    P: int  # padded length of the k kept entries sorted by the sort variant (1 for threshold)


def radix_layout(method: str, H: int, k: int, dtype, shared_limit: int, N: int | None = None) -> RadixLayout:
    """Largest useful packing: up to 8 rows per block, the keys cached when they fit.

    Rows are cached when one warp's region fits; fewer rows per block when the region is large (and
    for small N, so the grid still spreads over the SMs). Raises KsaeError when the sort variant's k
    kept pairs do not fit even for one warp.
    """
    key = KEY_BYTES[np.dtype(dtype)]
    budget = shared_limit - STATIC_SHARED_BYTES["radix"]
    P = next_pow2(k) if method == "sort" else 1
    pairs = P * (key + 4) if method == "sort" else 0

    def region(cache: bool) -> int:
        return -(-max(H * key if cache else 0, pairs) // 16) * 16

    cache = region(True) <= budget
    r = region(cache)
    if r > budget:
        max_k = topk_max_H("sort", dtype, shared_limit, STATIC_SHARED_BYTES["radix"])
        raise KsaeError(f"k={k} is too large for the radix sort top-k kernel in {np.dtype(dtype)}: its kept entries "
                        f"need {r} bytes of shared memory and this GPU allows {budget}; use k <= {max_k}")
    warps = RADIX_MAX_WARPS if r == 0 else max(1, min(RADIX_MAX_WARPS, budget // r))
    if N is not None:
        warps = max(1, min(warps, -(-int(N) // 256)))  # small N: spread the rows over more blocks
        warps = 1 << (warps.bit_length() - 1)
    return RadixLayout(warps=warps, region_bytes=r, cache_keys=cache, P=P)


def _grid(limits: DeviceLimits, work_items: int, per_sm: int) -> int:
    return max(1, min(int(work_items), limits.sm_count * per_sm))


def _check_array(a, what: str, ndim: int, dtypes) -> None:
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


def _check_int32_range(*sizes: int) -> None:
    if max(sizes) > INT32_MAX:
        raise KsaeError(f"sizes {sizes} are too large; the kernels take N, H, k <= {INT32_MAX}")


def check_topk_inputs(Z_nh, k, method: str, variant: str = DEFAULT_TOPK_VARIANT) -> tuple[int, int, int]:
    """``(N, H, k)`` after checking method, variant, array and k; raises KsaeError otherwise."""
    if variant not in TOPK_VARIANTS:
        raise KsaeError(f"top-k kernel variant {variant!r} is not allowed; use one of {', '.join(TOPK_VARIANTS)}")
    if method not in TOPK_GPU_METHODS:
        raise KsaeError(f"top-k method {method!r} is not allowed; use one of {', '.join(TOPK_GPU_METHODS)}")
    _check_array(Z_nh, "Z_nh", 2, tuple(CTYPES))
    N, H = (int(s) for s in Z_nh.shape)
    if H < 1:
        raise KsaeError(f"Z_nh has H={H} columns; top-k needs H >= 1")
    k = _check_k(k, H)
    _check_int32_range(N, H)
    return N, H, k


def plan_topk(Z_nh, k, method: str, outs: tuple, limits: DeviceLimits, *, static_shared: int | None = None,
              max_blocks: int | None = None, variant: str = DEFAULT_TOPK_VARIANT) -> KernelLaunch:
    """The launch of the top-k kernel for ``Z_nh`` into ``outs`` = ``(idx_nk, val_nk)`` or ``(idx_nk, val_nk, Zs_nh)``.

    ``static_shared``: the kernel's static shared memory (on a GPU, its ``shared_size_bytes``);
    default :data:`STATIC_SHARED_BYTES`. Raises KsaeError when a row does not fit in the device's
    shared memory, naming the largest H that does.
    """
    N, H, k = check_topk_inputs(Z_nh, k, method, variant)
    dtype = np.dtype(Z_nh.dtype)
    dense = len(outs) == 3
    if len(outs) not in (2, 3):
        raise KsaeError(f"out must hold 2 or 3 arrays (idx_nk, val_nk[, Zs_nh]); got {len(outs)}")
    _check_out(outs[0], "out idx_nk", (N, k), np.int32)
    _check_out(outs[1], "out val_nk", (N, k), dtype)
    if dense:
        _check_out(outs[2], "out Zs_nh", (N, H), dtype)
    if variant == "radix":
        return _plan_radix(Z_nh, N, H, k, method, outs, limits, static_shared, max_blocks)
    static = STATIC_SHARED_BYTES[method] if static_shared is None else int(static_shared)
    smem = topk_shared_bytes(method, H, dtype)
    if smem + static > limits.shared_optin:
        max_H = topk_max_H(method, dtype, limits.shared_optin, static)
        message = (f"H={H} is too large for the {method} top-k kernel in {dtype}: a row needs {smem + static} bytes "
                   f"of shared memory and this GPU allows {limits.shared_optin} per block; use H <= {max_H}")
        if method == "sort":  # the other method needs half the memory: name it as the caller's user spells topk
            raise OptionError("topk", message + " or {name} threshold")
        raise KsaeError(message)
    # Static and dynamic shared memory together count against the 48 KiB default; above it the
    # kernel must be allowed its dynamic part explicitly.
    optin = smem if smem + static > DEFAULT_SHARED else 0
    block = topk_block(method, H)
    grid = _grid(limits, N, 2048 // block)
    if max_blocks is not None:
        grid = max(1, min(grid, int(max_blocks)))
    dense_arg = outs[2] if dense else outs[1]  # never written when write_dense is 0
    args = [Z_nh, np.int32(N), np.int32(H)]
    if method == "sort":
        args.append(np.int32(next_pow2(H)))
    args += [np.int32(k), outs[0], outs[1], dense_arg, np.int32(1 if dense else 0)]
    n = len(args)
    outputs = (n - 4, n - 3, n - 2) if dense else (n - 4, n - 3)
    return KernelLaunch(name=_topk_name(method, CTYPES[dtype], block), grid=grid if N else 0, block=block,
                        args=tuple(args), outputs=outputs, shared_mem=smem, shared_optin=optin, static_shared=static)


def _plan_radix(Z_nh, N: int, H: int, k: int, method: str, outs: tuple, limits: DeviceLimits,
                static_shared: int | None, max_blocks: int | None) -> KernelLaunch:
    """The radix kernel's launch: rows per block and shared memory from :func:`radix_layout`."""
    dtype = np.dtype(Z_nh.dtype)
    dense = len(outs) == 3
    static = STATIC_SHARED_BYTES["radix"] if static_shared is None else int(static_shared)
    layout = radix_layout(method, H, k, dtype, limits.shared_optin - (static - STATIC_SHARED_BYTES["radix"]), N)
    smem = layout.warps * layout.region_bytes
    optin = smem if smem + static > DEFAULT_SHARED else 0
    block = 32 * layout.warps
    grid = _grid(limits, -(-N // layout.warps), 2048 // block)
    if max_blocks is not None:
        grid = max(1, min(grid, int(max_blocks)))
    dense_arg = outs[2] if dense else outs[1]  # never written when write_dense is 0
    args = (Z_nh, np.int32(N), np.int32(H), np.int32(k), np.int32(1 if layout.cache_keys else 0),
            np.int32(layout.region_bytes), np.int32(layout.P), outs[0], outs[1], dense_arg, np.int32(1 if dense else 0))
    outputs = (7, 8, 9) if dense else (7, 8)
    return KernelLaunch(name=_radix_name(method, CTYPES[dtype]), grid=grid if N else 0, block=block, args=args,
                        outputs=outputs, shared_mem=smem, shared_optin=optin, static_shared=static)


def plan_rows(kind: str, src, idx_nk, out, limits: DeviceLimits) -> KernelLaunch:
    """The launch of a gather, scatter or mask kernel (one plan for the three: same loop, same arguments).

    * ``gather``: ``out (N, k) = src (N, H)`` at ``idx_nk``;
    * ``scatter``: ``out (N, H)`` = ``src (N, k)`` placed at ``idx_nk``, zeros elsewhere;
    * ``mask``: ``out (N, H)`` = ``src (N, H)`` at ``idx_nk``, zeros elsewhere.

    A column repeated within a row of ``idx_nk`` gets one of its values in a scatter, which one is
    unspecified (top-k indices never repeat). Columns outside [0, H) are skipped.
    """
    if kind not in ROW_KINDS:
        raise KsaeError(f"row kernel {kind!r} is unknown; use one of {', '.join(ROW_KINDS)}")
    _check_array(src, "val_nk" if kind == "scatter" else "src_nh", 2, tuple(CTYPES))
    _check_array(idx_nk, "idx_nk", 2, (np.dtype(np.int32),))
    N, k = (int(s) for s in idx_nk.shape)
    if int(src.shape[0]) != N:
        raise KsaeError(f"idx_nk has {N} rows; expected {src.shape[0]}")
    if kind == "scatter":
        if tuple(src.shape) != (N, k):
            raise KsaeError(f"idx_nk has shape {tuple(idx_nk.shape)}; expected {tuple(src.shape)} like val_nk")
        H = int(out.shape[1]) if out.ndim == 2 else -1
        out_shape = (N, H)
    else:
        H = int(src.shape[1])
        out_shape = (N, k) if kind == "gather" else (N, H)
    _check_out(out, "out", out_shape, src.dtype)
    _check_int32_range(N, H, k)
    blocks = -(-N * k // FLAT_BLOCK)
    grid = _grid(limits, blocks, 2048 // FLAT_BLOCK * 4) if N * k else 0
    return KernelLaunch(name=_flat_name(kind, CTYPES[np.dtype(src.dtype)]), grid=grid, block=FLAT_BLOCK,
                        args=(src, idx_nk, np.int32(N), np.int32(H), np.int32(k), out), outputs=(5,),
                        zeroed=() if kind == "gather" else (5,))


# ------------------------------------------------------------------------------------------------
# Compilation and launch (cupy imported inside).

def _cupy():
    try:
        import cupy
    except Exception as exc:  # ImportError or a broken CUDA install
        raise KsaeError(f"the CUDA kernels need cupy, which does not import ({type(exc).__name__}: {exc})".splitlines()[0])
    return cupy


def _function(cupy, name: str, source: str = SOURCE_NAME, names: tuple = KERNEL_NAMES):
    """The compiled kernel ``name`` on the current device: one of ``names``, the instantiations of the
    ``.cu`` file ``source`` (each source is compiled once per device, with all its names)."""
    device = cupy.cuda.Device().id
    key = (device, name)
    if key not in _FUNCTIONS:
        if (device, source) not in _MODULES:
            _MODULES[(device, source)] = cupy.RawModule(code=kernel_source(source), options=NVRTC_OPTIONS,
                                                        name_expressions=list(names))
        _FUNCTIONS[key] = _MODULES[(device, source)].get_function(name)
    return _FUNCTIONS[key]


def device_limits(cupy) -> DeviceLimits:
    """The current device's SM count and opt-in shared memory limit, queried once per device.

    Asked of the runtime directly: a failure is a real error and surfaces, rather than a guess
    that would turn into a wrong "H too large" later.
    """
    device = cupy.cuda.Device().id
    if device not in _LIMITS:
        runtime = cupy.cuda.runtime
        _LIMITS[device] = DeviceLimits(
            sm_count=int(runtime.deviceGetAttribute(runtime.cudaDevAttrMultiProcessorCount, device)),
            shared_optin=int(runtime.deviceGetAttribute(runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin, device)))
    return _LIMITS[device]


def _launch(cupy, plan: KernelLaunch, kernel=None) -> None:
    for i in plan.zeroed:
        plan.args[i].fill(0)
    if plan.grid == 0:
        return
    kernel = kernel if kernel is not None else _function(cupy, plan.name)
    if plan.shared_optin and int(kernel.max_dynamic_shared_size_bytes) < plan.shared_optin:
        kernel.max_dynamic_shared_size_bytes = plan.shared_optin
    kernel((plan.grid,), (plan.block,), plan.args, shared_mem=plan.shared_mem)


def _is_cupy_array(a) -> bool:
    return type(a).__module__.startswith("cupy") and hasattr(a, "data")


def _require_gpu_array(a, what: str) -> None:
    if not _is_cupy_array(a):
        raise KsaeError(f"{what} must be a cupy array on the GPU; got {type(a).__name__}")


# ------------------------------------------------------------------------------------------------
# Top-k.

def topk_gpu(Z_nh, k: int, method: str = "sort", *, dense: bool = False, out=None, max_blocks: int | None = None,
             variant: str = DEFAULT_TOPK_VARIANT):
    """Top-k of every row of the cupy array ``Z_nh`` with the CUDA kernels.

    Returns ``(idx_nk int32, val_nk)``, or ``(idx_nk, val_nk, Zs_nh)`` with ``dense=True``
    (``Zs_nh``: the kept values in place, zeros elsewhere). ``method="sort"`` gives rows in
    descending order (ties by ascending column), ``"threshold"`` in ascending column order; the
    kept sets are those of :func:`ksae_cupy.topk.topk_sort` / ``topk_threshold``, bit for bit.

    ``out``: optional preallocated outputs ``(idx_nk, val_nk)`` (plus ``Zs_nh`` with ``dense``),
    written completely. ``max_blocks`` caps the grid (tests use it to force several row passes).
    ``variant``: which kernels, ``"block"`` (one block per row) or ``"radix"`` (one warp per row).
    """
    cupy = _cupy()
    _require_gpu_array(Z_nh, "Z_nh")
    N, H, k = check_topk_inputs(Z_nh, k, method, variant)
    dtype = np.dtype(Z_nh.dtype)
    with cupy.cuda.Device(Z_nh.device.id):
        if out is None:
            outs = (cupy.empty((N, k), dtype=np.int32), cupy.empty((N, k), dtype=dtype))
            if dense:
                outs += (cupy.empty((N, H), dtype=dtype),)
        else:
            expected = 3 if dense else 2
            if len(out) != expected:
                raise KsaeError(f"out must hold {expected} arrays (idx_nk, val_nk{', Zs_nh' if dense else ''}); got {len(out)}")
            outs = tuple(out)
            for o, what in zip(outs, ("out idx_nk", "out val_nk", "out Zs_nh")):
                _require_gpu_array(o, what)
        kernel = _function(cupy, topk_kernel_name(method, dtype, H, variant))
        plan = plan_topk(Z_nh, k, method, outs, device_limits(cupy), static_shared=int(kernel.shared_size_bytes),
                         max_blocks=max_blocks, variant=variant)
        _launch(cupy, plan, kernel)
    return outs


# ------------------------------------------------------------------------------------------------
# Gathers and scatters of the sparse backward pass: one launcher for the three kernels.

def _rows_gpu(kind: str, src, idx_nk, out_shape: tuple, out):
    cupy = _cupy()
    _require_gpu_array(src, "val_nk" if kind == "scatter" else "src_nh")
    _require_gpu_array(idx_nk, "idx_nk")
    with cupy.cuda.Device(src.device.id):
        if out is None:
            out = cupy.empty(out_shape, dtype=src.dtype)
        else:
            _require_gpu_array(out, "out")
        _launch(cupy, plan_rows(kind, src, idx_nk, out, device_limits(cupy)))
    return out


def gather_rows_gpu(src_nh, idx_nk, out=None):
    """``out_nk[n, j] = src_nh[n, idx_nk[n, j]]`` (e.g. dZ_nk from dZs_nh = R W)."""
    return _rows_gpu("gather", src_nh, idx_nk, (int(idx_nk.shape[0]), int(idx_nk.shape[-1])), out)


def scatter_rows_gpu(idx_nk, val_nk, H: int, out=None):
    """Dense ``(N, H)`` array with ``val_nk`` at ``idx_nk`` and zeros elsewhere.

    ``out``, when given, is zeroed first and then written. For a column repeated within a row,
    which of its values lands is unspecified (top-k indices never repeat).
    """
    k = int(val_nk.shape[-1])
    if isinstance(H, (bool, np.bool_)) or not isinstance(H, numbers.Integral) or int(H) < k:
        raise KsaeError(f"H={H!r} must be an integer >= k={k}")
    return _rows_gpu("scatter", val_nk, idx_nk, (int(val_nk.shape[0]), int(H)), out)


def mask_rows_gpu(src_nh, idx_nk, out=None):
    """``src_nh`` kept at ``idx_nk`` and zero elsewhere: the fused gather + scatter of dZ_nh."""
    return _rows_gpu("mask", src_nh, idx_nk, tuple(int(s) for s in src_nh.shape), out)

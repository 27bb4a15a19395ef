"""The training step's matrix products and its losses' sums as our own kernels (``kernels/step_products.cu``).

Why kernels of ours and not cuBLAS: the whole epoch on a GPU is one CUDA graph
(:mod:`ksae_cupy.gpu.graph_epoch`), and a graph can hold only what a stream capture records.

* **CuPy refuses cuBLAS during capture.** In CuPy 13 and 14 every cuBLAS call goes through
  ``cupy_backends.cuda.libs.cublas.setStream``, which raises ``NotImplementedError("calling cuBLAS
  API during stream capture is currently unsupported")`` whenever the stream it is given captures
  (a deliberate guard, with a TODO to lift it: cuBLAS itself has supported capture since CUDA 11.5
  when its workspace is set with ``cublasSetWorkspace``). That guard sits in the binding every
  cuBLAS entry point of CuPy calls first (``_setStream``), so neither ``cupy.matmul`` nor the
  low-level ``cupy.cuda.cublas.sgemm`` with a handle of our own can be captured; making the handle's
  stream a non-capturing one would run the product at once instead of recording it.
* **cuBLAS through ``ctypes``** (our own handle from ``libcublas``, ``cublasSetStream_v2``,
  ``cublasSetWorkspace_v2`` on a buffer of ours, ``cublasSgemm_v2``) would be captured by CUDA as
  any library does, as PyTorch does. It was not built: nothing here could test it (no GPU this
  session; the CuPy stand-in of the tests has no cuBLAS to bind), it ties the package to the
  library file's name and ABI of each CUDA major version, and an untested path on a device lent for
  minutes is a risk the campaign cannot afford. It stays the way to try when these kernels, timed on
  a GPU, turn out to be the epoch's bottleneck.
* **The two products with the sparse code** (the decoder ``Zs W^T`` and ``R W`` at the kept units)
  run from its k kept units per row only (:func:`plan_sparse_decode`, :func:`plan_kept_dot`): a dense
  product multiplies H - k zeros per row (at MNIST's k = 25 of 1000, 40 times the work), and at a batch
  of 128 rows a dense product's 64 x 64 tiles fill only 26 to 32 blocks. They read W transposed (one
  copy per step), so that each kept unit's weights are one contiguous row; the sums run in a fixed
  order (no atomics: the same bits at every launch). The encoder ``X W`` and the weight gradient
  ``[X; R]^T [dZ; Zs]`` stay dense GEMMs; one whose tiles do not fill the GPU is split along K
  (:func:`gemm_splits`: the encoder at a batch of 128, 32 tiles, in 5 on an H100), its slabs summed in
  order into the output.
* **Kernels of ours** run under the host emulator unmodified, so the whole graph is proven on the
  CPU (``tests/gpu/test_products_host.py``, ``tests/gpu/test_graph_epoch.py``). A dense product of
  ours is presumably slower than cuBLAS's (a plain 64 x 64 register-blocked SGEMM, no tensor cores);
  what they buy is an epoch with no host work per step. Only a GPU can tell the balance.

The loss's sum is ours too: CuPy's full reductions (``cupy.sum`` of a whole array, through CUB)
allocate temporary storage, which a capture must not (on an H100 the captured step's loss part was
left uncaptured for it).

As :mod:`ksae_cupy.gpu.cuda_kernels`: a *plan* per launch (:func:`plan_matmul`, :func:`plan_sum_squares`)
made without cupy, which the CPU harness runs, and a launcher that hands it to ``cupy.RawKernel``.
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.errors import KsaeError
from ksae_cupy.gpu.cuda_kernels import CTYPES, DeviceLimits, KernelLaunch, _check_int32_range, _cupy, _function, \
    _launch, _require_gpu_array, device_limits

SOURCE_NAME = "step_products.cu"
GEMM_TILE = 64  # outputs per side of one block's tile (as in step_products.cu)
GEMM_STEP = 16  # K per shared-memory step
GEMM_THREADS = 256
SUM_THREADS = 256
SPARSE_THREADS = 256  # the two sparse products' blocks


def _gemm_name(ctype: str, trans_a: bool, trans_b: bool) -> str:
    return f"ksae::gemm_kernel<{ctype}, {str(trans_a).lower()}, {str(trans_b).lower()}>"


def _splits_name(ctype: str) -> str:
    return f"ksae::sum_splits_kernel<{ctype}>"


def _sum_name(ctype: str) -> str:
    return f"ksae::add_sum_squares_kernel<{ctype}>"


def _sparse_name(kind: str, ctype: str) -> str:
    return f"ksae::{kind}_kernel<{ctype}>"


# Every instantiation of step_products.cu: for RawModule(name_expressions=...), nvcc's compile test and the harness.
KERNEL_NAMES: tuple[str, ...] = tuple(
    [_gemm_name(c, ta, tb) for c in CTYPES.values() for ta in (False, True) for tb in (False, True)]
    + [_sum_name(c) for c in CTYPES.values()]
    + [_splits_name(c) for c in CTYPES.values()]
    + [_sparse_name(kind, c) for kind in ("sparse_decode", "kept_dot") for c in CTYPES.values()])


def gemm_shared_bytes(dtype) -> int:
    """Dynamic shared memory of one GEMM block: two tiles of GEMM_STEP x GEMM_TILE values."""
    return 2 * GEMM_STEP * GEMM_TILE * np.dtype(dtype).itemsize


def stored(a) -> tuple:
    """``(array, transposed, leading dimension)``: how the kernel reads the 2-D operand ``a``: a
    C-contiguous array as it is, else its transpose when that is C-contiguous (``W.T``, ``XR.T``)."""
    if a.ndim != 2:
        raise KsaeError(f"a matrix product's operand must be 2-D; got shape {tuple(a.shape)}")
    if a.flags.c_contiguous:
        return a, False, max(1, int(a.shape[1]))
    if a.T.flags.c_contiguous:
        return a.T, True, max(1, int(a.shape[0]))
    raise KsaeError(f"a matrix product's operand of shape {tuple(a.shape)} with strides {tuple(a.strides)} is "
                    f"neither C-contiguous nor the transpose of a C-contiguous array")


MAX_SPLITS = 8
MIN_SPLIT_K = 128  # a split of K is at least this long


def gemm_splits(M: int, N: int, K: int, limits: DeviceLimits) -> int:
    """How many splits of K an ``M x K`` by ``K x N`` product takes: 1 when its 64 x 64 tiles fill the
    device's SMs, else enough to (up to 8, each at least 128 of K): at a batch of 128 rows the encoder's
    ``X W`` has 32 tiles for 132 SMs on an H100."""
    tiles = -(-M // GEMM_TILE) * -(-N // GEMM_TILE)
    if tiles >= limits.sm_count or K < 2 * MIN_SPLIT_K:
        return 1
    return max(1, min(MAX_SPLITS, -(-limits.sm_count // tiles), K // MIN_SPLIT_K))


def plan_matmul(a, b, out, splits: int = 1, workspace=None) -> tuple:
    """The launches of ``out = a @ b`` (``out`` C-contiguous; ``a`` and ``b`` C-contiguous or transposes
    of such): the GEMM, and with ``splits`` > 1 (K cut in that many slabs, each written to ``workspace``,
    a C-contiguous array of at least ``splits * M * N`` values) the sum of the slabs into ``out``."""
    dtype = np.dtype(out.dtype)
    if dtype not in CTYPES or np.dtype(a.dtype) != dtype or np.dtype(b.dtype) != dtype:
        raise KsaeError(f"matrix product of {a.dtype} and {b.dtype} into {out.dtype}: all must be one of "
                        f"{', '.join(str(d) for d in CTYPES)}")
    (M, K), (K2, N) = a.shape, b.shape
    if K2 != K or tuple(out.shape) != (M, N):
        raise KsaeError(f"matrix product of shapes {tuple(a.shape)} and {tuple(b.shape)} into {tuple(out.shape)}: "
                        f"expected ({M}, {K}) @ ({K}, n) into ({M}, n)")
    if not out.flags.c_contiguous:
        raise KsaeError(f"the product's output must be C-contiguous; got strides {tuple(out.strides)}")
    A, trans_a, lda = stored(a)
    B, trans_b, ldb = stored(b)
    _check_int32_range(M, N, 2 * K, M * N, M * K, K * N)
    k_split = -(-max(1, -(-K // max(1, int(splits)))) // GEMM_STEP) * GEMM_STEP  # whole K steps per split
    S = max(1, -(-K // k_split))
    C = out
    if S > 1:
        if workspace is None or np.dtype(workspace.dtype) != dtype or not workspace.flags.c_contiguous \
                or workspace.size < S * M * N:
            raise KsaeError(f"a product split {S} ways along K needs a C-contiguous {dtype} workspace of "
                            f"{S * M * N} values")
        C = workspace.reshape(-1)[:S * M * N]
    _check_int32_range(S * M * N)
    tiles = -(-M // GEMM_TILE) * -(-N // GEMM_TILE)
    gemm = KernelLaunch(name=_gemm_name(CTYPES[dtype], trans_a, trans_b), grid=tiles * S if M and N else 0,
                        block=GEMM_THREADS,
                        args=(A, B, C, np.int32(M), np.int32(N), np.int32(K), np.int32(lda), np.int32(ldb),
                              np.int32(max(1, N)), np.int32(k_split)),
                        outputs=(2,), shared_mem=gemm_shared_bytes(dtype))
    if S == 1:
        return (gemm,)
    total = M * N
    reduce = KernelLaunch(name=_splits_name(CTYPES[dtype]), grid=max(1, min(-(-total // SUM_THREADS), 4096)),
                          block=SUM_THREADS, args=(C, np.int32(S), np.int64(total), out), outputs=(3,))
    return gemm, reduce


def plan_sum_squares(x, scale: float, acc, gate=None) -> KernelLaunch:
    """The launch of ``acc += scale * sum(x ** 2)`` (``acc`` a 0-d float64 array; squares in x's float
    type, the sum in float64); with ``gate``, nothing is added unless some ``gate`` value is non-zero."""
    dtype = np.dtype(x.dtype)
    if dtype not in CTYPES or (gate is not None and np.dtype(gate.dtype) != dtype):
        raise KsaeError(f"sum of squares of {x.dtype} (gate {None if gate is None else gate.dtype}): both must be one "
                        f"of {', '.join(str(d) for d in CTYPES)}")
    if np.dtype(acc.dtype) != np.float64 or acc.shape != ():
        raise KsaeError(f"the sum of squares adds into a 0-d float64 array; got {acc.dtype} of shape {tuple(acc.shape)}")
    for what, array in (("x", x), ("gate", gate)):
        if array is not None and not array.flags.c_contiguous:
            raise KsaeError(f"the sum of squares' {what} must be C-contiguous; got strides {tuple(array.strides)}")
    n_gate = 0 if gate is None else int(gate.size)
    _check_int32_range(n_gate)
    return KernelLaunch(name=_sum_name(CTYPES[dtype]), grid=1, block=SUM_THREADS,
                        args=(x, np.int64(x.size), np.float64(scale), x if gate is None else gate, np.int32(n_gate),
                              acc), outputs=(5,))


def _check_sparse(Zs_or_R, what: str, idx_nk, WT_hd, out, out_shape: tuple, dtype) -> tuple:
    """``(N, H, D, k)`` of a sparse product's operands, each checked."""
    for name, array, shape, dt in ((what, Zs_or_R, None, dtype), ("idx_nk", idx_nk, None, np.dtype(np.int32)),
                                   ("WT_hd", WT_hd, None, dtype), ("out", out, out_shape, dtype)):
        if np.dtype(array.dtype) != dt or array.ndim != 2 or not array.flags.c_contiguous:
            raise KsaeError(f"{name} must be a C-contiguous 2-D {dt} array; got {array.dtype} of shape "
                            f"{tuple(array.shape)}")
        if shape is not None and tuple(array.shape) != shape:
            raise KsaeError(f"{name} has shape {tuple(array.shape)}; expected {shape}")
    (N, k), (H, D) = idx_nk.shape, WT_hd.shape
    if int(Zs_or_R.shape[0]) != N:
        raise KsaeError(f"{what} has {Zs_or_R.shape[0]} rows and idx_nk {N}; they must match")
    _check_int32_range(N, H, D, k)
    return int(N), int(H), int(D), int(k)


def plan_sparse_decode(Zs_nh, idx_nk, WT_hd, R_nd, limits: DeviceLimits) -> KernelLaunch:
    """The launch of ``R_nd = Zs_nh W^T`` from the kept units ``idx_nk`` of each row of ``Zs_nh`` only
    (``WT_hd``: W transposed, C-contiguous; Zs's other entries are taken as zeros)."""
    dtype = np.dtype(Zs_nh.dtype)
    if dtype not in CTYPES:
        raise KsaeError(f"Zs_nh is {dtype}; the sparse products take {', '.join(str(d) for d in CTYPES)}")
    N, H, D, k = _check_sparse(Zs_nh, "Zs_nh", idx_nk, WT_hd, R_nd, (int(Zs_nh.shape[0]), int(WT_hd.shape[1])), dtype)
    if int(Zs_nh.shape[1]) != H:
        raise KsaeError(f"Zs_nh has {Zs_nh.shape[1]} columns and WT_hd {H} rows; they must match")
    grid = max(1, min(N, limits.sm_count * 8)) if N else 0
    return KernelLaunch(name=_sparse_name("sparse_decode", CTYPES[dtype]), grid=grid, block=SPARSE_THREADS,
                        args=(Zs_nh, idx_nk, WT_hd, np.int32(N), np.int32(H), np.int32(D), np.int32(k), R_nd),
                        outputs=(7,))


def plan_kept_dot(R_nd, idx_nk, WT_hd, out_nh, limits: DeviceLimits) -> KernelLaunch:
    """The launch of ``out_nh = R_nd W`` at the kept units ``idx_nk`` of each row, zeros elsewhere."""
    dtype = np.dtype(R_nd.dtype)
    if dtype not in CTYPES:
        raise KsaeError(f"R_nd is {dtype}; the sparse products take {', '.join(str(d) for d in CTYPES)}")
    N, H, D, k = _check_sparse(R_nd, "R_nd", idx_nk, WT_hd, out_nh, (int(R_nd.shape[0]), int(WT_hd.shape[0])), dtype)
    if int(R_nd.shape[1]) != D:
        raise KsaeError(f"R_nd has {R_nd.shape[1]} columns and WT_hd {D}; they must match")
    warps_per_block = SPARSE_THREADS // 32
    grid = max(1, min(-(-N * k // warps_per_block), limits.sm_count * 16)) if N * k else 0
    return KernelLaunch(name=_sparse_name("kept_dot", CTYPES[dtype]), grid=grid, block=SPARSE_THREADS,
                        args=(R_nd, idx_nk, WT_hd, np.int32(N), np.int32(H), np.int32(D), np.int32(k), out_nh),
                        outputs=(7,), zeroed=(7,))


def sparse_decode_gpu(Zs_nh, idx_nk, WT_hd, out) -> None:
    """``out = Zs_nh W^T`` from the kept units only, on cupy arrays (capturable)."""
    for what, array in (("Zs_nh", Zs_nh), ("idx_nk", idx_nk), ("WT_hd", WT_hd), ("out", out)):
        _require_gpu_array(array, what)
    _run(plan_sparse_decode(Zs_nh, idx_nk, WT_hd, out, device_limits(_cupy())))


def kept_dot_gpu(R_nd, idx_nk, WT_hd, out) -> None:
    """``out = R_nd W`` at the kept units, zeros elsewhere, on cupy arrays (capturable)."""
    for what, array in (("R_nd", R_nd), ("idx_nk", idx_nk), ("WT_hd", WT_hd), ("out", out)):
        _require_gpu_array(array, what)
    _run(plan_kept_dot(R_nd, idx_nk, WT_hd, out, device_limits(_cupy())))


def split_workspace(cupy, M: int, N: int, K: int, dtype):
    """A workspace for ``M x K`` by ``K x N`` products split along K (:func:`gemm_splits`), or None
    where they take no split (allocate it before any capture)."""
    splits = gemm_splits(M, N, K, device_limits(cupy))
    return cupy.empty(splits * M * N, dtype=dtype) if splits > 1 else None


def matmul_gpu(a, b, out, workspace=None) -> None:
    """``out = a @ b`` on cupy arrays with :data:`KERNEL_NAMES`' GEMM (capturable: no cuBLAS, no allocation);
    with ``workspace`` (:func:`split_workspace`), split along K as far as it holds."""
    for what, array in (("a", a), ("b", b), ("out", out)):
        _require_gpu_array(array, what)
    splits = 1
    if workspace is not None:
        (M, K), N = a.shape, b.shape[1]
        splits = min(gemm_splits(M, N, K, device_limits(_cupy())), workspace.size // max(1, M * N))
    for plan in plan_matmul(a, b, out, splits, workspace):
        _run(plan)


def add_sum_squares_gpu(x, scale: float, acc, gate=None) -> None:
    """``acc += scale * sum(x ** 2)`` on cupy arrays, with ``gate`` as :func:`plan_sum_squares` (capturable)."""
    for what, array in (("x", x), ("acc", acc)) + ((("gate", gate),) if gate is not None else ()):
        _require_gpu_array(array, what)
    _run(plan_sum_squares(x, scale, acc, gate))


def _run(plan: KernelLaunch) -> None:
    cupy = _cupy()
    _launch(cupy, plan, _function(cupy, plan.name, SOURCE_NAME, KERNEL_NAMES))

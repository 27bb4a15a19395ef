"""An epoch's order drawn on the GPU, as NumPy's generator draws it (``kernels/draw_order.cu``).

The trainer draws each epoch's order with ``rng.permutation(N)`` of its NumPy ``Generator``
(PCG64), so a CPU and a GPU run of one seed see the same batches and a checkpoint holds the
generator's state. :mod:`ksae_cupy.gpu.graph_epoch` draws it inside the epoch's graph instead: the
kernel runs NumPy's own algorithm (Fisher-Yates over PCG64 with NumPy's masked rejection) and
writes back the generator's state after it, so the order and the state are NumPy's, bit for bit
(``tests/gpu/test_shuffle_host.py``), and the host sets its generator from the device's words.

The shuffle is sequential by nature: one GPU thread runs it, in shared memory when the order fits
as 16-bit values (N <= 65,536, MNIST's 60,000 included), else in global memory. What that costs
an epoch only a GPU can tell (``ksae-bench gpu train`` times both orders).

``state words``: six int64 values, the bit patterns of the state's high and low halves, the
increment's, ``has_uint32`` and ``uinteger``.
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.errors import KsaeError
from ksae_cupy.gpu.cuda_kernels import DEFAULT_SHARED, DeviceLimits, KernelLaunch, _cupy, _function, _launch, \
    _require_gpu_array, device_limits

SOURCE_NAME = "draw_order.cu"
KERNEL_NAMES: tuple[str, ...] = ("ksae::permutation_kernel",)
THREADS = 256
SHARED_MAX_N = 1 << 16  # the order fits in shared memory as 16-bit values up to here
_MASK64 = (1 << 64) - 1


def state_words(state: dict) -> np.ndarray:
    """The six int64 words of a PCG64 ``bit_generator.state`` (what the kernel reads and writes)."""
    if state.get("bit_generator") != "PCG64":
        raise KsaeError(f"the GPU draws epochs' orders as NumPy's PCG64 does; this generator is "
                        f"{state.get('bit_generator')!r}")
    s, inc = int(state["state"]["state"]), int(state["state"]["inc"])
    words = [s >> 64, s & _MASK64, inc >> 64, inc & _MASK64, int(state["has_uint32"]), int(state["uinteger"])]
    return np.array(words, dtype=np.uint64).view(np.int64)


def state_from_words(words) -> dict:
    """The ``bit_generator.state`` the six words describe (host words, as :func:`state_words` gives)."""
    w = [int(x) for x in np.asarray(words, dtype=np.int64).view(np.uint64)]
    return {"bit_generator": "PCG64", "state": {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]},
            "has_uint32": int(w[4]), "uinteger": int(w[5])}


def plan_permutation(order_n, words, limits: DeviceLimits) -> KernelLaunch:
    """The launch that writes ``rng.permutation(N)`` into ``order_n`` (int64, N) and advances ``words``."""
    if np.dtype(order_n.dtype) != np.int64 or order_n.ndim != 1 or not order_n.flags.c_contiguous:
        raise KsaeError(f"the epoch's order must be a C-contiguous 1-D int64 array; got {order_n.dtype} of shape "
                        f"{tuple(order_n.shape)}")
    if np.dtype(words.dtype) != np.int64 or tuple(words.shape) != (6,):
        raise KsaeError(f"the generator's state must be 6 int64 words; got {words.dtype} of shape {tuple(words.shape)}")
    N = int(order_n.shape[0])
    if N > np.iinfo(np.int32).max:
        raise KsaeError(f"N={N} rows are too many for the GPU's shuffle; it takes N <= {np.iinfo(np.int32).max}")
    shared = 2 * N if N <= SHARED_MAX_N and 2 * N <= limits.shared_optin else 0
    return KernelLaunch(name=KERNEL_NAMES[0], grid=1, block=THREADS,
                        args=(order_n, np.int32(N), words, np.int32(1 if shared else 0)), outputs=(0, 2),
                        shared_mem=shared, shared_optin=shared if shared > DEFAULT_SHARED else 0)


def permutation_gpu(order_n, words) -> None:
    """Queue the epoch's draw: ``order_n`` (a device int64 array of N) gets the permutation, ``words`` (6
    device int64) the generator's state after it (capturable: no allocation, no read-back)."""
    _require_gpu_array(order_n, "order_n")
    _require_gpu_array(words, "words")
    cupy = _cupy()
    plan = plan_permutation(order_n, words, device_limits(cupy))
    _launch(cupy, plan, _function(cupy, plan.name, SOURCE_NAME, KERNEL_NAMES))

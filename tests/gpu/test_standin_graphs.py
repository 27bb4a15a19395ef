"""CUDA graphs by stream capture, as CuPy 14 has them: on a GPU against CuPy, elsewhere against
the strict stand-in (tests/cupy_standin), so a step captured into a graph can be tested in CI.

What both must show: between ``begin_capture`` and ``end_capture`` work on the stream is recorded,
not run; every ``Graph.launch`` runs it once, on the buffers as they are at that launch; and what
CuPy or CUDA refuse during capture is refused. Where the stand-in is stricter than CuPy (it refuses
any allocation during capture), the test says so and asserts CuPy's behaviour on a GPU.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

# A kernel of this test's own: x[i] += v for i < n.
KERNEL_SOURCE = r"""
namespace ksae_graph_test {
__global__ void add_scalar(float* x, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += v;
}
}  // namespace ksae_graph_test
"""
KERNEL_NAME = "ksae_graph_test::add_scalar"


@pytest.fixture
def cupy(gpu_cupy):
    return gpu_cupy


@pytest.fixture
def stream(cupy):
    """A non-blocking stream, the kind CuPy captures on; a capture a failed test left open is ended."""
    s = cupy.cuda.Stream(non_blocking=True)
    yield s
    try:
        s.end_capture()
    except RuntimeError:  # not capturing (the usual case), or a capture that was invalidated
        pass


def standin(cupy) -> bool:
    return getattr(cupy, "STANDIN", False)


def test_captured_work_runs_only_at_launch_and_once_per_launch(cupy, stream):
    with stream:
        count = cupy.zeros((), np.float32)
        x = cupy.arange(4, dtype=np.float32)
        y = cupy.zeros(4, np.float32)
        count += 1  # the kernels compile before capture
        cupy.multiply(x, 2, out=y)
        count.fill(0)
        y.fill(0)
        stream.begin_capture()
        assert stream.is_capturing()
        returned = count.__iadd__(1)  # count += 1
        assert returned is count
        assert cupy.multiply(x, 2, out=y) is y
        graph = stream.end_capture()
        assert not stream.is_capturing()
        assert isinstance(graph, cupy.cuda.Graph) and isinstance(graph, cupy.cuda.graph.Graph)
        stream.synchronize()
        assert float(count) == 0 and y.get().tolist() == [0, 0, 0, 0]  # recorded, not run
        for launches in (1, 2, 3):
            graph.launch(stream)
            stream.synchronize()
            assert float(count) == launches
        assert y.get().tolist() == [0, 2, 4, 6]
    with pytest.raises(NotImplementedError):
        cupy.cuda.Graph()  # made by end_capture only


def test_a_replay_reads_the_buffers_as_they_are_at_its_launch(cupy, stream):
    X_np = np.arange(12, dtype=np.float32).reshape(4, 3)
    with stream:
        X = cupy.asarray(X_np)
        rows = cupy.zeros(2, np.int64)
        scale = cupy.ones((), np.float32)  # a device scalar: the graph holds its address, not its value
        out = cupy.zeros((2, 3), np.float32)
        cupy.take(X, rows, axis=0, out=out)
        cupy.multiply(out, scale, out=out)
        stream.begin_capture()
        cupy.take(X, rows, axis=0, out=out)
        cupy.multiply(out, scale, out=out)
        graph = stream.end_capture()
        for chosen, factor in (([3, 1], 1.0), ([0, 2], 2.0), ([2, 2], -0.5)):
            rows[...] = cupy.asarray(np.array(chosen, np.int64))  # outside capture: runs now, on the stream
            scale.fill(factor)
            graph.launch(stream)
            stream.synchronize()
            np.testing.assert_array_equal(out.get(), X_np[chosen] * np.float32(factor))


def test_reductions_gathers_and_assignments_into_buffers_are_captured(cupy, stream):
    A_np = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    with stream:
        A = cupy.asarray(A_np)
        rows = cupy.asarray(np.array([4, 0], np.int64))
        col_sum, row_sum, total = cupy.empty(4, np.float32), cupy.empty(5, np.float32), cupy.empty((), np.float64)
        picked, head, is_zero = cupy.empty((2, 4), np.float32), cupy.empty((2, 4), np.float32), cupy.empty((5, 4), bool)

        def step():
            cupy.sum(A, axis=0, out=col_sum)
            A.sum(axis=1, out=row_sum)
            cupy.sum(A, dtype=np.float64, out=total)
            cupy.take(A, rows, axis=0, out=picked)
            head[...] = A[:2]  # a view of A, copied at each replay
            head[1, :2] = 0
            cupy.equal(A, 0, out=is_zero)

        step()  # kernels compiled before capture
        for buffer in (col_sum, row_sum, total, picked, head):
            buffer.fill(-1)
        is_zero.fill(True)
        stream.begin_capture()
        step()
        graph = stream.end_capture()
        stream.synchronize()
        assert (picked.get() == -1).all() and float(total) == -1 and is_zero.get().all()  # not run
        A[...] = cupy.asarray(A_np * 2)  # changed between capture and launch
        A[2, 3] = 0
        graph.launch(stream)
        stream.synchronize()
    B = A_np * 2
    B[2, 3] = 0
    np.testing.assert_allclose(col_sum.get(), B.sum(axis=0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(row_sum.get(), B.sum(axis=1), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(float(total), B.astype(np.float64).sum(), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(picked.get(), B[[4, 0]])
    expected_head = B[:2].copy()
    expected_head[1, :2] = 0
    np.testing.assert_array_equal(head.get(), expected_head)
    np.testing.assert_array_equal(is_zero.get(), B == 0)


def test_views_taken_during_capture_write_to_the_buffers_memory(cupy, stream):
    with stream:
        buf = cupy.zeros((2, 3), np.float32)
        src = cupy.asarray(np.arange(6, dtype=np.float32))
        copy = cupy.zeros(6, np.float32)
        cupy.add(buf[1], 1, out=buf[1])
        buf.fill(0)
        stream.begin_capture()
        cupy.add(buf[1], 1, out=buf[1])  # a row
        cupy.add(buf.T[0], 10, out=buf.T[0])  # a column, through the transpose
        flat = buf.reshape(6)  # contiguous: a view, no copy
        cupy.multiply(flat[::2], 2, out=flat[::2])
        copy.data.copy_from_device_async(src.data, src.nbytes, stream)  # a device-to-device copy
        graph = stream.end_capture()
        stream.synchronize()
        assert (buf.get() == 0).all() and (copy.get() == 0).all()
        graph.launch(stream)
        stream.synchronize()
        np.testing.assert_array_equal(buf.get(), [[20, 0, 0], [11, 2, 1]])
        np.testing.assert_array_equal(copy.get(), np.arange(6))


def test_raw_kernel_launches_are_captured(cupy, stream):
    kernel = cupy.RawModule(code=KERNEL_SOURCE, options=("-std=c++17",),
                            name_expressions=[KERNEL_NAME]).get_function(KERNEL_NAME)
    n = 70  # two blocks of 64 threads, the last partly idle
    with stream:
        x = cupy.zeros(n, np.float32)
        kernel((2,), (64,), (x, np.float32(1.5), np.int32(n)))
        np.testing.assert_array_equal(x.get(), np.full(n, 1.5, np.float32))  # it runs at once outside capture
        x.fill(0)
        stream.begin_capture()
        kernel((2,), (64,), (x, np.float32(1.5), np.int32(n)))
        cupy.multiply(x, 2, out=x)
        graph = stream.end_capture()
        stream.synchronize()
        assert (x.get() == 0).all()
        for expected in (3.0, 9.0):  # (x + 1.5) * 2, replayed
            graph.launch(stream)
            stream.synchronize()
            np.testing.assert_array_equal(x.get(), np.full(n, expected, np.float32))


def test_capture_is_refused_on_the_legacy_stream_twice_on_a_stream_and_ended_only_when_begun(cupy, stream):
    runtime = cupy.cuda.runtime
    with pytest.raises(RuntimeError, match="cannot capture on the default"):
        cupy.cuda.Stream.null.begin_capture()
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorIllegalState"):
        stream.end_capture()  # never began
    with stream:
        stream.begin_capture()
        with pytest.raises(runtime.CUDARuntimeError):
            stream.begin_capture()
        try:  # whether CUDA invalidated the first capture here is its business: not asserted
            stream.end_capture()
        except runtime.CUDARuntimeError:
            pass
    assert not stream.is_capturing()


def test_the_legacy_stream_refuses_to_be_queried_while_a_blocking_stream_captures(cupy):
    blocking = cupy.cuda.Stream()  # not non_blocking: the legacy stream would wait on it
    with blocking:
        x = cupy.zeros(3, np.float32)
        x += 1
        blocking.begin_capture()
        x += 1
        with pytest.raises(cupy.cuda.runtime.CUDARuntimeError, match="cudaErrorStreamCaptureImplicit"):
            cupy.cuda.Stream.null.is_capturing()
        graph = blocking.end_capture()  # the query did not invalidate the capture
        graph.launch(blocking)
        blocking.synchronize()
        assert x.get().tolist() == [2, 2, 2]


def test_synchronizing_the_capturing_stream_invalidates_the_capture(cupy, stream):
    runtime = cupy.cuda.runtime
    with stream:
        x = cupy.zeros(3, np.float32)
        x += 1
        stream.begin_capture()
        x += 1
        with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorStreamCaptureUnsupported"):
            stream.synchronize()
        with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorStreamCaptureInvalidated"):
            stream.end_capture()
        assert not stream.is_capturing()
        stream.synchronize()
        x += 1  # the capture is over: work runs at once again; the captured x += 1 never ran
        assert x.get().tolist() == [2, 2, 2]


def test_reading_a_value_back_during_capture_is_refused_and_leaves_the_capture_valid(cupy, stream):
    with stream:
        a = cupy.arange(4, dtype=np.float32)
        out = cupy.zeros(4, np.float32)
        cupy.add(a, 1, out=out)
        out.fill(0)
        stream.begin_capture()
        cupy.add(a, 1, out=out)
        # CuPy checks before it asks CUDA for the copy, so the capture is not invalidated.
        for read_back in (lambda: float(out[0]), lambda: bool(out[1]), lambda: out.get(), lambda: out[2].item()):
            with pytest.raises(RuntimeError, match="is capturing"):
                read_back()
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        assert out.get().tolist() == [1, 2, 3, 4] and float(out[3]) == 4  # and read-backs work again


def test_cublas_products_are_refused_during_capture(cupy, stream):
    """CuPy disables cuBLAS while a stream captures (cupy/cupy#6290): a captured step cannot hold
    ``cupy.matmul``, even with ``out=`` and a warmed-up handle."""
    with stream:
        A = cupy.ones((3, 4), np.float32)
        B = cupy.ones((4, 2), np.float32)
        C = cupy.zeros((3, 2), np.float32)
        cupy.matmul(A, B, out=C)  # cuBLAS's handle made before capture
        C.fill(0)
        stream.begin_capture()
        with pytest.raises(NotImplementedError, match="cuBLAS"):
            cupy.matmul(A, B, out=C)
        graph = stream.end_capture()  # refused by CuPy before CUDA saw it: the capture stays valid
        graph.launch(stream)
        stream.synchronize()
        assert (C.get() == 0).all()  # nothing of the product was captured


ALLOCATING = {
    "a + a": lambda cp, a, rows: a + a,
    "ufunc without out": lambda cp, a, rows: cp.multiply(a, 3),
    "a.copy()": lambda cp, a, rows: a.copy(),
    "a reduction to a new array": lambda cp, a, rows: a.sum(axis=0),
    "fancy indexing": lambda cp, a, rows: a[rows],
    "cupy.zeros": lambda cp, a, rows: cp.zeros(3, np.float32),
    "a reshape that copies": lambda cp, a, rows: a.T.reshape(6),
}


@pytest.mark.parametrize("operation", sorted(ALLOCATING))
def test_an_allocation_during_capture(cupy, stream, operation):
    """Stricter than CuPy on purpose: CuPy's pool may hand the capture a cached block, which the graph
    then shares with whatever reuses the block later; the stand-in refuses any allocation during capture,
    so a captured step tested under it allocates nothing. On a GPU the same operation is captured."""
    compute = ALLOCATING[operation]
    a_np = np.arange(6, dtype=np.float32).reshape(3, 2)
    with stream:
        a = cupy.asarray(a_np)
        rows = cupy.asarray(np.array([2, 0], np.int64))
        expected = compute(cupy, a, rows).get()  # eagerly, outside capture (kernels compiled too)
        stream.begin_capture()
        if standin(cupy):
            with pytest.raises(cupy.cuda.runtime.CUDARuntimeError, match="allocation during stream capture.*out="):
                compute(cupy, a, rows)
            with pytest.raises(cupy.cuda.runtime.CUDARuntimeError, match="cudaErrorStreamCaptureInvalidated"):
                stream.end_capture()
            assert (compute(cupy, a, rows).get() == expected).all()  # capture over: it runs at once again
        else:
            result = compute(cupy, a, rows)
            graph = stream.end_capture()
            graph.launch(stream)
            stream.synchronize()
            np.testing.assert_array_equal(result.get(), expected)


def test_the_standin_refuses_host_copies_and_device_syncs_during_capture(cupy, stream):
    """Stand-in rules beyond CuPy's (CuPy stages a host copy through pinned blocks the graph would then
    share; a device-wide synchronisation waits on the capturing stream). On a GPU, what CuPy does
    with them is not asserted; what both share is that the capture ends and work runs again after."""
    with stream:
        x = cupy.zeros(2, np.float32)
        x += 0  # the kernel compiled before capture
        if standin(cupy):
            runtime = cupy.cuda.runtime
            for refused, match in ((lambda: cupy.asarray(np.ones(2, np.float32)), "copies host memory"),
                                   (lambda: x.__setitem__(slice(None), np.ones(2, np.float32)), "host values"),
                                   (lambda: cupy.cuda.Device().synchronize(), "waits for the device")):
                stream.begin_capture()
                with pytest.raises(runtime.CUDARuntimeError, match=match):
                    refused()
                with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorStreamCaptureInvalidated"):
                    stream.end_capture()
        stream.begin_capture()
        x += 1
        stream.end_capture()  # the graph is dropped unlaunched: its x += 1 never runs
        stream.synchronize()
        assert x.get().tolist() == [0, 0] and not stream.is_capturing()
        x[...] = cupy.asarray(np.full(2, 5, np.float32))
        assert x.get().tolist() == [5, 5]

"""``cupy.cuda.graph`` of the stand-in: stream capture and the ``Graph`` it returns.

As CUDA does it: between ``stream.begin_capture()`` and ``stream.end_capture()`` the device work
queued on that stream is recorded, not run, and ``Graph.launch`` replays it, in order, on the
memory as it is at each launch. Here a capture is a list of thunks on the arrays' NumPy memory
(scalars captured by value, as a kernel's arguments are); the array, function and kernel code of the
stand-in asks :func:`recording` whether to record (see :mod:`cupy._capture`).

One capture per host thread at a time. What CUDA refuses during capture is refused with CuPy's
error (``CUDARuntimeError``, CUDA's status and name) and invalidates the capture, as CUDA does: the
stream stays capturing, its next operations fail with ``cudaErrorStreamCaptureInvalidated`` and so
does ``end_capture``, which ends it. (What CuPy itself refuses before calling CUDA, read-backs and
the libraries it disables, leaves the capture valid: :mod:`cupy._capture`.)
"""
from __future__ import annotations

import threading

from cupy.cuda import runtime

ILLEGAL_STATE = 401  # cudaErrorIllegalState
CAPTURE_UNSUPPORTED = 900  # cudaErrorStreamCaptureUnsupported
CAPTURE_INVALIDATED = 901  # cudaErrorStreamCaptureInvalidated
CAPTURE_IMPLICIT = 906  # cudaErrorStreamCaptureImplicit
CAPTURED_EVENT = 907  # cudaErrorCapturedEvent
_NAMES = {ILLEGAL_STATE: ("cudaErrorIllegalState", "the operation cannot be performed in the present state"),
          CAPTURE_UNSUPPORTED: ("cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"),
          CAPTURE_INVALIDATED: ("cudaErrorStreamCaptureInvalidated",
                                "operation failed due to a previous error during capture"),
          CAPTURE_IMPLICIT: ("cudaErrorStreamCaptureImplicit",
                             "operation would make the legacy stream depend on a capturing blocking stream"),
          CAPTURED_EVENT: ("cudaErrorCapturedEvent", "operation not permitted on an event last recorded in a "
                                                     "capturing stream")}


def cuda_error(status: int, detail: str) -> runtime.CUDARuntimeError:
    """CuPy's error for CUDA status ``status`` ("name: CUDA's text"), with the stand-in's ``detail``."""
    name, text = _NAMES[status]
    return runtime.CUDARuntimeError(status, f"{name}: {text} ({detail})")


class Graph:
    """A captured graph: ``launch`` replays its work. Made only by ``Stream.end_capture``, as in CuPy."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError("currently this class cannot be initiated by the user and must be created via "
                                  "stream capture")

    @classmethod
    def _of(cls, nodes: list) -> "Graph":
        graph = cls.__new__(cls)
        graph._nodes = tuple(nodes)
        return graph

    def launch(self, stream=None):
        """Replays the captured work, in order, on the memory as it is now. Launched into a capturing
        stream, the graph becomes part of that capture (a child graph), as in CUDA."""
        capture = recording(stream)
        if capture is not None:
            record(capture, self._replay, "Graph.launch")
            return
        self._replay()

    def upload(self, stream=None):
        recording(stream)  # nothing to upload; fails as CUDA would on an invalidated capture

    def _replay(self) -> None:
        for node in self._nodes:
            node()


class _Capture:
    """The capture of ``stream`` in this thread: its recorded work and, once refused, why."""

    def __init__(self, stream):
        self.stream = stream
        self.nodes: list = []
        self.error: str | None = None


_local = threading.local()


def _capture() -> _Capture | None:
    return getattr(_local, "capture", None)


def _ptr(stream) -> int:
    """A stream's handle (NCCL and CuPy's lower layers pass ``stream.ptr`` itself)."""
    return stream if isinstance(stream, int) else stream.ptr


def _same(a, b) -> bool:
    return a is b or _ptr(a) == _ptr(b)


def begin(stream, mode=None) -> None:
    """``stream.begin_capture(mode)``: CuPy refuses the legacy stream itself; CUDA refuses a stream
    already capturing (and that invalidates its capture)."""
    if stream.ptr in (0, 1):
        raise RuntimeError("cannot capture on the default (legacy) stream")
    if mode is not None and mode not in (runtime.streamCaptureModeGlobal, runtime.streamCaptureModeThreadLocal,
                                         runtime.streamCaptureModeRelaxed):
        raise runtime.CUDARuntimeError(1, f"cudaErrorInvalidValue: stream capture mode {mode!r}")
    current = _capture()
    if current is not None:
        if _same(current.stream, stream):
            refuse(ILLEGAL_STATE, "begin_capture on a stream that is already capturing", current)
        raise NotImplementedError("the CuPy stand-in captures one stream per host thread at a time; another stream "
                                  "of this thread is capturing")
    _local.capture = _Capture(stream)


def end(stream) -> Graph:
    """``stream.end_capture()``: the graph, or CUDA's error if the stream was not capturing or an
    error invalidated the capture (the capture ends either way)."""
    capture = _capture()
    if capture is None or not _same(capture.stream, stream):
        raise cuda_error(ILLEGAL_STATE, "end_capture on a stream that is not capturing")
    _local.capture = None
    if capture.error is not None:
        raise cuda_error(CAPTURE_INVALIDATED, f"end_capture: the capture was invalidated by: {capture.error}")
    return Graph._of(capture.nodes)


def is_capturing(stream) -> bool:
    capture = _capture()
    if capture is None:
        return False
    if not _same(capture.stream, stream):
        if _ptr(stream) == 0 and not getattr(capture.stream, "non_blocking", False):  # CuPy's own test asserts it
            raise cuda_error(CAPTURE_IMPLICIT, "is_capturing() of the legacy stream while a blocking stream captures")
        return False
    if capture.error is not None:  # CuPy's runtime.streamIsCapturing on cudaStreamCaptureStatusInvalidated
        raise RuntimeError("the stream was capturing, but an error has invalidated the capture sequence")
    return True


def recording(stream=None) -> _Capture | None:
    """The capture that device work queued on ``stream`` (a Stream or its ``ptr``; default: the
    current stream) goes into, or
    None: then the work runs now. Work on the legacy stream while a blocking stream captures is
    refused, as CUDA refuses it (the legacy stream would wait on the capturing one)."""
    capture = _capture()
    if capture is None:
        return None
    if stream is None:
        from cupy import cuda

        stream = cuda.get_current_stream()
    if _same(stream, capture.stream):
        return capture
    if _ptr(stream) == 0 and not getattr(capture.stream, "non_blocking", False):
        refuse(CAPTURE_IMPLICIT, "work on the legacy default stream while a blocking stream (Stream() without "
                                 "non_blocking=True) is capturing", capture)
    return None


def record(capture: _Capture, thunk, what: str) -> None:
    """Adds ``thunk`` (device work on memory that exists) to the capture; fails on an invalidated one."""
    if capture.error is not None:
        raise cuda_error(CAPTURE_INVALIDATED, f"{what} after the capture was invalidated by: {capture.error}")
    capture.nodes.append(thunk)


def refuse(status: int, detail: str, capture: _Capture | None = None):
    """Raises CUDA's error ``status`` and invalidates the capture, as CUDA does after any error in it."""
    capture = capture or _capture()
    error = cuda_error(status, detail)
    if capture is not None and capture.error is None:
        capture.error = str(error)
    raise error


def refuse_synchronize(what: str) -> None:
    """A device-wide synchronisation (``Device().synchronize()``, ``runtime.deviceSynchronize()``):
    refused while any stream of this thread captures."""
    if _capture() is not None:
        refuse(CAPTURE_UNSUPPORTED, f"{what} waits for the device while a stream is capturing")

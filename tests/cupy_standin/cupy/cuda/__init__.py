"""``cupy.cuda`` of the stand-in: one device (0), an H100's properties, streams and events on the host clock,
stream capture into CUDA graphs (:mod:`cupy.cuda.graph`)."""
from __future__ import annotations

import threading
import time

from cupy.cuda import driver, graph, runtime  # noqa: F401
from cupy.cuda.graph import Graph  # noqa: F401


class Device:
    """CUDA device ``device`` (default: the current one). Only device 0 exists; using another fails
    as CUDA does (``cudaErrorInvalidDevice``)."""

    _local = threading.local()

    def __init__(self, device=None):
        self.id = _current() if device is None else int(device)

    def use(self):
        runtime._check_device(self.id)
        Device._local.current = self.id

    def __enter__(self):
        runtime._check_device(self.id)
        stack = getattr(Device._local, "stack", [])
        stack.append(_current())
        Device._local.stack = stack
        Device._local.current = self.id
        return self

    def __exit__(self, *exc):
        Device._local.current = Device._local.stack.pop()

    def synchronize(self):
        runtime._check_device(self.id)
        graph.refuse_synchronize("Device.synchronize()")

    @property
    def compute_capability(self):
        runtime._check_device(self.id)
        return "90"

    @property
    def attributes(self):
        runtime._check_device(self.id)
        return dict(runtime.ATTRIBUTE_NAMES)

    @property
    def mem_info(self):
        return runtime.memGetInfo()

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


def _current() -> int:
    return getattr(Device._local, "current", 0)


class Stream:
    """A stream: work runs at once here, so synchronising never waits; between ``begin_capture``
    and ``end_capture`` its work is recorded into a graph instead (:mod:`cupy.cuda.graph`)."""

    null = None

    def __init__(self, null=False, non_blocking=False, ptr=None):
        self.ptr = 0 if null else id(self)
        self.non_blocking = bool(non_blocking)
        self.device_id = 0

    def synchronize(self):
        if graph.recording(self) is not None:
            graph.refuse(graph.CAPTURE_UNSUPPORTED, "Stream.synchronize() on the capturing stream")

    @property
    def done(self):
        """Whether the stream's work is done (always, here). Queried on the capturing stream, CUDA
        answers with an error that CuPy does not raise, but the capture is invalidated."""
        capture = graph.recording(self)
        if capture is not None:
            if capture.error is None:
                capture.error = "Stream.done (cudaStreamQuery) on the capturing stream"
            return False
        return True

    def begin_capture(self, mode=None):
        graph.begin(self, mode)

    def end_capture(self):
        return graph.end(self)

    def is_capturing(self):
        return graph.is_capturing(self)

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def use(self):
        _streams.current = self
        return self

    def __enter__(self):  # a stack per thread, as CuPy's: ``with s:`` may nest, also in the same stream
        if not hasattr(_streams, "stack"):
            _streams.stack = []
        _streams.stack.append(get_current_stream())
        _streams.current = self
        return self

    def __exit__(self, *exc):
        _streams.current = _streams.stack.pop()


Stream.null = Stream(null=True)
_streams = threading.local()


def get_current_stream(device_id=None):
    return getattr(_streams, "current", Stream.null)


class Event:
    """An event records the host clock (the stand-in's kernels run synchronously)."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.time = None
        self.captured = False  # last recorded in a capturing stream: CUDA refuses to wait on it or time it

    def record(self, stream=None):
        self.captured = graph.recording(stream) is not None
        self.time = None if self.captured else time.perf_counter()

    def synchronize(self):
        if self.captured:
            raise graph.cuda_error(graph.CAPTURED_EVENT, "Event.synchronize()")

    @property
    def done(self):
        return True


def get_elapsed_time(start_event: Event, end_event: Event) -> float:
    """Milliseconds between two recorded events (CuPy raises when either was not recorded)."""
    if start_event.captured or end_event.captured:
        raise graph.cuda_error(graph.CAPTURED_EVENT, "get_elapsed_time")
    if start_event.time is None or end_event.time is None:
        raise driver.CUDADriverError("CUDA_ERROR_INVALID_HANDLE: an event was not recorded")
    return (end_event.time - start_event.time) * 1e3


def is_available() -> bool:
    return True

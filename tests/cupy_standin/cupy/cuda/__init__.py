"""``cupy.cuda`` of the stand-in: one device (0), an H100's properties, streams and events on the host clock."""
from __future__ import annotations

import threading
import time

from cupy.cuda import driver, runtime  # noqa: F401


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
    """A stream: work runs at once here, so synchronising never waits."""

    null = None

    def __init__(self, null=False, non_blocking=False, ptr=None):
        self.ptr = 0 if null else id(self)

    def synchronize(self):
        pass

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def use(self):
        _streams.current = self
        return self

    def __enter__(self):
        self._previous = get_current_stream()
        _streams.current = self
        return self

    def __exit__(self, *exc):
        _streams.current = self._previous


Stream.null = Stream(null=True)
_streams = threading.local()


def get_current_stream(device_id=None):
    return getattr(_streams, "current", Stream.null)


class Event:
    """An event records the host clock (the stand-in's kernels run synchronously)."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.time = None

    def record(self, stream=None):
        self.time = time.perf_counter()

    def synchronize(self):
        pass

    @property
    def done(self):
        return True


def get_elapsed_time(start_event: Event, end_event: Event) -> float:
    """Milliseconds between two recorded events (CuPy raises when either was not recorded)."""
    if start_event.time is None or end_event.time is None:
        raise driver.CUDADriverError("CUDA_ERROR_INVALID_HANDLE: an event was not recorded")
    return (end_event.time - start_event.time) * 1e3


def is_available() -> bool:
    return True

"""``cupy.cuda.runtime`` of the stand-in: one NVIDIA H100 80GB HBM3 (sm_90), as CUDA reports it."""
from __future__ import annotations


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


cudaDevAttrMaxThreadsPerBlock = 1
cudaDevAttrMaxBlockDimX = 2
cudaDevAttrMaxGridDimX = 5
cudaDevAttrMaxSharedMemoryPerBlock = 8
cudaDevAttrWarpSize = 10
cudaDevAttrMultiProcessorCount = 16
cudaDevAttrL2CacheSize = 38
cudaDevAttrComputeCapabilityMajor = 75
cudaDevAttrComputeCapabilityMinor = 76
cudaDevAttrMaxSharedMemoryPerBlockOptin = 97

streamCaptureModeGlobal, streamCaptureModeThreadLocal, streamCaptureModeRelaxed = 0, 1, 2
streamCaptureStatusNone, streamCaptureStatusActive, streamCaptureStatusInvalidated = 0, 1, 2

TOTAL_MEMORY = 80 * 1024**3
SHARED_DEFAULT = 48 * 1024  # static + dynamic shared memory per block without the opt-in
SHARED_OPTIN = 232448  # 227 KiB: cudaDevAttrMaxSharedMemoryPerBlockOptin of an H100
ATTRIBUTES = {cudaDevAttrMaxThreadsPerBlock: 1024, cudaDevAttrMaxBlockDimX: 1024, cudaDevAttrMaxGridDimX: 2**31 - 1,
              cudaDevAttrMaxSharedMemoryPerBlock: SHARED_DEFAULT, cudaDevAttrWarpSize: 32,
              cudaDevAttrMultiProcessorCount: 132, cudaDevAttrL2CacheSize: 50 * 1024**2,
              cudaDevAttrComputeCapabilityMajor: 9, cudaDevAttrComputeCapabilityMinor: 0,
              cudaDevAttrMaxSharedMemoryPerBlockOptin: SHARED_OPTIN}
ATTRIBUTE_NAMES = {"MaxThreadsPerBlock": 1024, "MaxBlockDimX": 1024, "MaxGridDimX": 2**31 - 1,
                   "MaxSharedMemoryPerBlock": SHARED_DEFAULT, "WarpSize": 32, "MultiProcessorCount": 132,
                   "L2CacheSize": 50 * 1024**2, "ComputeCapabilityMajor": 9, "ComputeCapabilityMinor": 0,
                   "MaxSharedMemoryPerBlockOptin": SHARED_OPTIN}


def _check_device(device: int) -> None:
    if device != 0:
        raise CUDARuntimeError(101, "cudaErrorInvalidDevice: invalid device ordinal")


def getDeviceCount() -> int:
    return 1


def getDevice() -> int:
    from cupy.cuda import Device

    return Device().id


def deviceGetAttribute(attrib: int, device: int) -> int:
    _check_device(device)
    if attrib not in ATTRIBUTES:
        raise CUDARuntimeError(1, f"cudaErrorInvalidValue: the stand-in does not know attribute {attrib}")
    return ATTRIBUTES[attrib]


def getDeviceProperties(device: int) -> dict:
    _check_device(device)
    return {"name": b"NVIDIA H100 80GB HBM3 (ksae-cupy CuPy stand-in)", "totalGlobalMem": TOTAL_MEMORY,
            "multiProcessorCount": 132, "major": 9, "minor": 0, "sharedMemPerBlock": SHARED_DEFAULT,
            "sharedMemPerBlockOptin": SHARED_OPTIN, "maxThreadsPerBlock": 1024, "warpSize": 32,
            "l2CacheSize": 50 * 1024**2, "clockRate": 1980000, "memoryClockRate": 2619000,
            "memoryBusWidth": 5120}


def memGetInfo() -> tuple[int, int]:
    return TOTAL_MEMORY - 1024**3, TOTAL_MEMORY


def runtimeGetVersion() -> int:
    return 13000


def driverGetVersion() -> int:
    return 13000


def deviceSynchronize() -> None:
    from cupy.cuda import graph

    graph.refuse_synchronize("runtime.deviceSynchronize()")

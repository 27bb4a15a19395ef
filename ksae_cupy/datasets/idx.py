"""Reader (and, for tests, writer) of the IDX format of the MNIST files.

An IDX file starts with two zero bytes, a type code (0x08 = unsigned byte), the number of
dimensions, then each dimension as a big-endian int32, then the data in C order.
Plain or gzip-compressed files are read alike.
"""
from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np

from ksae_cupy.errors import KsaeError

_UBYTE = 0x08


def read_idx(path: Path) -> np.ndarray:
    """The uint8 array stored in an IDX file, with its shape from the header."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as exc:  # zlib.error: damaged gzip data
        raise KsaeError(f"{path}: cannot read IDX file ({exc})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != _UBYTE or not 1 <= raw[3] <= 4:
        raise KsaeError(f"{path}: not an unsigned-byte IDX file (magic {raw[:4].hex() or 'empty'}; "
                        f"expected 000008 followed by 1-4 dimensions)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise KsaeError(f"{path}: IDX header truncated ({len(raw)} bytes)")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    if min(shape) < 0:
        raise KsaeError(f"{path}: IDX header gives negative sizes {shape}")
    expected = math.prod(shape)  # exact (NumPy's int64 product could wrap around to the file's length)
    if len(raw) - header != expected:
        raise KsaeError(f"{path}: IDX data holds {len(raw) - header} bytes, header {shape} needs {expected}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array as an IDX file (used by tests to build format-faithful files)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, _UBYTE, array.ndim]) + np.asarray(array.shape, dtype=">i4").tobytes()
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + array.tobytes())

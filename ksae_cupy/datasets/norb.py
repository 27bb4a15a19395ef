"""Small NORB, normalized-uniform: 24,300 training and 24,300 test stereo pairs, 5 classes.

Paper section 4.1: the inner 64 x 64 pixels of each 96 x 96 channel are resized by
bicubic interpolation to 32 x 32, the two channels form a 2,048-dimensional vector, every
dimension is standardised with the mean and standard deviation of the whole (24,300)
training set, and the training set is split 20,000 / 4,300 into training and validation.

The files are the official binary matrices (see :func:`read_norb_matrix`), fetched as
``<name>.gz`` and kept decompressed. They are checked by their MD5 (the values published
with widely used loaders), their exact size and their header.
"""
from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path

import numpy as np

from ksae_cupy.errors import KsaeError
from ksae_cupy.datasets.fetch import FileSpec, HttpSource, ensure_files

MAGIC_BYTE = 0x1E3D4C55  # matrix of uint8
MAGIC_INT = 0x1E3D4C54   # matrix of little-endian int32
_DTYPES = {MAGIC_BYTE: np.dtype(np.uint8), MAGIC_INT: np.dtype("<i4")}
_MAX_NDIM = 8

N_EXAMPLES = 24_300          # in each of the training and test files
N_VALID = 4_300
N_CLASSES = 5                # animal, human, airplane, truck, car
SPLIT_SEED = 0
CROP = (16, 80)              # rows/columns [16, 80) = the inner 64 x 64 of 96 x 96
SIDE = 32                    # resized side
IMAGE_SHAPE = (SIDE, 2 * SIDE)  # the two channels side by side, for drawing filters

TRAIN_DAT = "smallnorb-5x46789x9x18x6x2x96x96-training-dat.mat"
TRAIN_CAT = "smallnorb-5x46789x9x18x6x2x96x96-training-cat.mat"
TEST_DAT = "smallnorb-5x01235x9x18x6x2x96x96-testing-dat.mat"
TEST_CAT = "smallnorb-5x01235x9x18x6x2x96x96-testing-cat.mat"


def _header_bytes(ndim: int) -> int:
    return 8 + 4 * max(3, ndim)


def parse_header(head: bytes, what) -> tuple[np.dtype, tuple[int, ...], int]:
    """``(dtype, shape, header_length)`` from the first bytes of a NORB matrix file.

    Layout (all little-endian int32): magic number, number of dimensions, then
    ``max(3, ndim)`` sizes of which the first ``ndim`` count (the rest are padding, 1).
    """
    if len(head) < 8:
        raise KsaeError(f"{what}: NORB header truncated ({len(head)} bytes)")
    magic, ndim = struct.unpack("<ii", head[:8])
    if magic not in _DTYPES:
        raise KsaeError(f"{what}: wrong magic number 0x{magic & 0xFFFFFFFF:08X}; expected 0x{MAGIC_BYTE:08X} "
                        f"(byte matrix) or 0x{MAGIC_INT:08X} (int matrix)")
    if not 1 <= ndim <= _MAX_NDIM:
        raise KsaeError(f"{what}: NORB header gives {ndim} dimensions; expected 1 to {_MAX_NDIM}")
    length = _header_bytes(ndim)
    if len(head) < length:
        raise KsaeError(f"{what}: NORB header truncated ({len(head)} of {length} bytes)")
    shape = struct.unpack(f"<{ndim}i", head[8:8 + 4 * ndim])
    if any(d < 0 for d in shape):
        raise KsaeError(f"{what}: NORB header gives negative sizes {shape}")
    return _DTYPES[magic], tuple(shape), length


def read_norb_matrix(path: Path, opener=None) -> np.ndarray:
    """The array stored in a NORB binary matrix file (plain, or gzip when the name ends in .gz)."""
    path = Path(path)
    if opener is None:
        import gzip
        opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as exc:  # zlib.error: damaged gzip data
        raise KsaeError(f"{path}: cannot read NORB file ({exc})") from None
    dtype, shape, start = parse_header(raw[:_header_bytes(_MAX_NDIM)], path)
    expected = math.prod(shape) * dtype.itemsize  # exact: an int64 product could wrap around
    if len(raw) - start != expected:
        raise KsaeError(f"{path}: NORB data holds {len(raw) - start} bytes, header {shape} needs {expected}")
    return np.frombuffer(raw, dtype=dtype, offset=start).reshape(shape)


def write_norb_matrix(path: Path, array: np.ndarray) -> None:
    """Write a uint8 or int32 array as a NORB matrix file (tests build format-faithful files)."""
    array = np.asarray(array)
    magic = MAGIC_BYTE if array.dtype == np.uint8 else MAGIC_INT
    array = np.ascontiguousarray(array, dtype=_DTYPES[magic])
    dims = list(array.shape) + [1] * (3 - array.ndim)
    header = struct.pack(f"<ii{len(dims)}i", magic, array.ndim, *dims)
    import gzip
    with (gzip.open if str(path).endswith(".gz") else open)(path, "wb") as f:
        f.write(header + array.tobytes())


def header_check(expected_dtype, expected_shape):
    """A FileSpec ``check``: the header must announce ``expected_dtype`` and ``expected_shape``."""
    def check(path, opener):
        with opener(path, "rb") as f:
            dtype, shape, _ = parse_header(f.read(_header_bytes(_MAX_NDIM)), Path(path).name)
        if dtype != np.dtype(expected_dtype) or shape != tuple(expected_shape):
            raise KsaeError(f"header announces {dtype} {shape}; expected {np.dtype(expected_dtype)} {expected_shape}")
    return check


def _spec(name: str, md5: str, dtype, shape) -> FileSpec:
    size = _header_bytes(len(shape)) + int(np.prod(shape)) * np.dtype(dtype).itemsize
    return FileSpec(name, md5=md5, size=size, check=header_check(dtype, shape))


_DAT_SHAPE, _CAT_SHAPE = (N_EXAMPLES, 2, 96, 96), (N_EXAMPLES,)
# MD5s of the decompressed files as published with public loaders (no SHA-256 is published).
FILES = [
    _spec(TRAIN_DAT, "8138a0902307b32dfa0025a36dfa45ec", np.uint8, _DAT_SHAPE),
    _spec(TRAIN_CAT, "fd5120d3f770ad57ebe620eb61a0b633", np.int32, _CAT_SHAPE),
    _spec(TEST_DAT, "e9920b7f7b2869a8f1a12e945b2c166c", np.uint8, _DAT_SHAPE),
    _spec(TEST_CAT, "fd5120d3f770ad57ebe620eb61a0b633", np.int32, _CAT_SHAPE),  # same label order as training
]
SOURCES = [
    HttpSource("https://cs.nyu.edu/~ylclab/data/norb-v1.0-small/"),
    HttpSource("http://www.cs.nyu.edu/~ylclab/data/norb-v1.0-small/"),
]


def fetch(folder: Path, log=print, files=None) -> dict[str, Path]:
    """Make the four small NORB files present and verified in ``folder``."""
    return ensure_files(folder, FILES if files is None else files, SOURCES, "norb", log=log)


def check_pair(dat: np.ndarray, cat: np.ndarray, what: str, n_expected: int | None = N_EXAMPLES) -> None:
    """Shapes ``(N, 2, 96, 96)`` uint8 and ``(N,)`` with labels in 0..4."""
    if dat.ndim != 4 or dat.shape[1:] != (2, 96, 96) or dat.dtype != np.uint8:
        raise KsaeError(f"NORB {what} images have shape {dat.shape} ({dat.dtype}); expected (N, 2, 96, 96) uint8")
    if cat.shape != (dat.shape[0],):
        raise KsaeError(f"NORB {what} labels have shape {cat.shape}; expected ({dat.shape[0]},) to match the images")
    if n_expected is not None and dat.shape[0] != n_expected:
        raise KsaeError(f"NORB {what} file holds {dat.shape[0]} examples; expected {n_expected}")
    if len(cat) and (cat.min() < 0 or cat.max() >= N_CLASSES):
        raise KsaeError(f"NORB {what} labels span {cat.min()}..{cat.max()}; expected {N_CLASSES} classes, 0..{N_CLASSES - 1}")


def resize_matrix(n_in: int, n_out: int) -> np.ndarray:
    """``R`` (n_out x n_in) such that ``R @ x`` resizes ``x`` by bicubic interpolation.

    Keys' cubic convolution kernel (a = -0.5), widened by ``n_in / n_out`` when shrinking
    (anti-aliasing), pixel centres aligned, weights normalised to sum 1, borders mirrored:
    the definition of MATLAB's ``imresize(..., 'bicubic')``, whose kernel and
    anti-aliasing PIL's BICUBIC also uses. Halving 64 -> 32 is an 8-tap filter.
    """
    scale = n_out / n_in
    stretch = min(scale, 1.0)  # anti-aliasing only when shrinking
    width = 4.0 / stretch
    u = (np.arange(n_out) + 0.5) / scale - 0.5          # output centres in input coordinates
    left = np.floor(u - width / 2).astype(int)
    taps = left[:, None] + np.arange(int(np.ceil(width)) + 2)[None, :]
    w = stretch * _keys_cubic(stretch * (u[:, None] - taps))
    w /= w.sum(axis=1, keepdims=True)
    mirror = np.concatenate([np.arange(n_in), np.arange(n_in)[::-1]])  # half-sample symmetric
    R = np.zeros((n_out, n_in))
    np.add.at(R, (np.repeat(np.arange(n_out), taps.shape[1]), mirror[taps.ravel() % (2 * n_in)]), w.ravel())
    return R


def _keys_cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def crop_resize(dat_n2hw: np.ndarray, chunk: int = 2048) -> np.ndarray:
    """``X_nd`` (N x 2048, float32 in 0..255 units): each channel's inner 64 x 64 resized to
    32 x 32, the two placed side by side (so a row reshapes to :data:`IMAGE_SHAPE`)."""
    lo, hi = CROP
    R = resize_matrix(hi - lo, SIDE).astype(np.float32)
    n = dat_n2hw.shape[0]
    X_nd = np.empty((n, 2 * SIDE * SIDE), dtype=np.float32)
    for start in range(0, n, chunk):  # chunks keep the float copy of 448 MB of pixels small
        crop = dat_n2hw[start:start + chunk, :, lo:hi, lo:hi].astype(np.float32)
        small = R @ crop @ R.T                                   # (n, 2, 32, 32)
        X_nd[start:start + chunk] = np.concatenate([small[:, 0], small[:, 1]], axis=2).reshape(len(crop), -1)
    return X_nd


def standardise_stats(X_nd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and standard deviation (float32; a constant dimension gets std 1)."""
    mean_d = X_nd.mean(axis=0, dtype=np.float64)
    std_d = X_nd.std(axis=0, dtype=np.float64)
    std_d[std_d < 1e-8] = 1.0  # a constant pixel would otherwise divide by zero
    return mean_d.astype(np.float32), std_d.astype(np.float32)


def make_dataset(dat_train, y_train, dat_test, y_test, n_valid: int = N_VALID, seed: int = SPLIT_SEED):
    """The :class:`Dataset` from raw training and test arrays (see the module docstring)."""
    from ksae_cupy.datasets.dataset import Dataset
    from ksae_cupy.datasets.mnist import train_valid_split

    X_all = crop_resize(dat_train)
    mean_d, std_d = standardise_stats(X_all)  # statistics of the whole training file, as in the paper
    X_all -= mean_d
    X_all /= std_d
    X_test = (crop_resize(dat_test) - mean_d) / std_d
    train, valid = train_valid_split(len(X_all), n_valid, seed)
    y_train, y_test = np.asarray(y_train, dtype=np.int64), np.asarray(y_test, dtype=np.int64)
    return Dataset(name="norb", X_train=X_all[train], y_train=y_train[train], X_valid=X_all[valid],
                   y_valid=y_train[valid], X_test=X_test, y_test=y_test, n_classes=N_CLASSES,
                   image_shape=IMAGE_SHAPE, preprocess={"mean": mean_d, "std": std_d})


def load(root: Path, log=print, files=None, n_expected: int | None = N_EXAMPLES, n_valid: int = N_VALID):
    """Fetch (if needed), read, check and preprocess small NORB from ``root / 'norb'``."""
    paths = fetch(Path(root) / "norb", log=log, files=files)
    dat_train, cat_train = read_norb_matrix(paths[TRAIN_DAT]), read_norb_matrix(paths[TRAIN_CAT])
    dat_test, cat_test = read_norb_matrix(paths[TEST_DAT]), read_norb_matrix(paths[TEST_CAT])
    check_pair(dat_train, cat_train, "training", n_expected)
    check_pair(dat_test, cat_test, "test", n_expected)
    log("preprocessing NORB: crop 64x64, bicubic resize to 32x32, standardise")
    return make_dataset(dat_train, cat_train, dat_test, cat_test, n_valid=n_valid)

"""CIFAR-10 patches: random 8 x 8 x 3 patches of the 50,000 training images, LCN + ZCA.

Paper section 4.1: 1,000,000 random 8 x 8 patches of the 50,000 32 x 32 CIFAR-10 training
images, each "locally contrast-normalized and ZCA whitened" as in Coates, Ng & Lee (2011)
(see :mod:`.preprocess`). The source is the python version of CIFAR-10, one archive
``cifar-10-python.tar.gz`` whose ``data_batch_1`` .. ``data_batch_5`` are pickled dicts with
``b'data'`` (10000 x 3072 uint8: the red, green, blue 32 x 32 planes of each image) and
``b'labels'`` (10000 ints in 0..9). The archive is checked by its published MD5 and size.

The preprocessed patches are cached as HDF5 in the dataset folder (one file per patch
count and seed, with the mean and ZCA matrix), written to a temporary name and renamed.
"""
from __future__ import annotations

import io
import os
import pickle
import tarfile
import zlib
from pathlib import Path

import numpy as np

from ksae_cupy.errors import KsaeError
from ksae_cupy.datasets.fetch import FileSpec, HttpSource, ensure_files
from ksae_cupy.datasets.preprocess import LCN_EPSILON, ZCA_EPSILON, lcn_zca_patches, split_rows

ARCHIVE = "cifar-10-python.tar.gz"
MEMBER_DIR = "cifar-10-batches-py/"
TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]
N_IMAGES = 50_000
N_CLASSES = 10
N_PATCHES = 1_000_000
PATCH = 8
PATCH_SEED = 0
VALID_FRACTION = 0.05
IMAGE_SHAPE = (PATCH, PATCH, 3)  # patches are flattened row, column, channel
CACHE_VERSION = 1


def archive_check(path, opener) -> None:
    """A FileSpec ``check``: a tar archive holding the five training batches."""
    with opener(path, "rb") as raw, tarfile.open(fileobj=raw, mode="r:*") as archive:
        names = set(archive.getnames())
    lacking = [b for b in TRAIN_BATCHES if MEMBER_DIR + b not in names]
    if lacking:
        raise KsaeError(f"archive lacks {', '.join(MEMBER_DIR + b for b in lacking)}")


# The MD5 and size published for the official archive (no SHA-256 is published).
FILES = [FileSpec(ARCHIVE, md5="c58f30108f718f92721af3b95e74349a", size=170_498_071, check=archive_check)]
SOURCES = [
    HttpSource("https://www.cs.toronto.edu/~kriz/", gzipped=False),
    HttpSource("http://www.cs.toronto.edu/~kriz/", gzipped=False),
]


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, bytes and NumPy arrays only: a pickle can run arbitrary code,
    so nothing else is let in (the batches hold nothing else)."""

    _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy", "ndarray"), ("numpy", "dtype"),
                ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
                ("_codecs", "encode")}  # Python 3's protocol-2 pickles spell bytes this way

    def find_class(self, module, name):
        if (module, name) == ("numpy", "dtype"):
            return _plain_dtype
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch")


def _plain_dtype(*args):
    """``numpy.dtype`` for the unpickler, refusing object dtypes (their arrays hold arbitrary objects)."""
    dtype = np.dtype(*args)
    if dtype.hasobject:
        raise pickle.UnpicklingError(f"refusing an array of Python objects ({dtype}) in a CIFAR batch")
    return dtype


def read_batch(raw: bytes, what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(X_n3072 uint8, y_n int64)`` from the bytes of one pickled CIFAR-10 batch."""
    try:
        batch = _ArrayUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except Exception as exc:  # noqa: BLE001 -- only allowed types get built; any failure means a damaged batch
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise KsaeError(f"{what}: not a readable CIFAR-10 batch ({type(exc).__name__}: {first})") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = sorted(map(repr, batch)) if isinstance(batch, dict) else type(batch).__name__
        raise KsaeError(f"{what}: CIFAR-10 batch holds {keys}; expected b'data' and b'labels'")
    try:
        X, y = np.asarray(batch[b"data"]), np.asarray(batch[b"labels"])
    except ValueError as exc:  # ragged lists
        raise KsaeError(f"{what}: b'data' or b'labels' is not an array ({exc})".splitlines()[0]) from None
    if X.ndim != 2 or X.shape[1] != 3072 or X.dtype != np.uint8:
        raise KsaeError(f"{what}: b'data' has shape {X.shape} ({X.dtype}); expected N x 3072 uint8")
    if y.shape != (len(X),) or not np.issubdtype(y.dtype, np.integer):
        raise KsaeError(f"{what}: b'labels' has shape {y.shape} ({y.dtype}); expected {len(X)} integers")
    if len(y) and (y.min() < 0 or y.max() >= N_CLASSES):
        raise KsaeError(f"{what}: labels span {y.min()}..{y.max()}; expected {N_CLASSES} classes, 0..{N_CLASSES - 1}")
    return X, y.astype(np.int64)


def read_archive(path: Path, n_expected: int | None = N_IMAGES) -> tuple[np.ndarray, np.ndarray]:
    """``(images_nhwc uint8, y_n)``: the training batches of ``cifar-10-python.tar.gz``."""
    Xs, ys = [], []
    try:
        with tarfile.open(path, "r:*") as archive:
            for name in TRAIN_BATCHES:
                try:
                    member = archive.extractfile(MEMBER_DIR + name)
                except KeyError:
                    member = None
                if member is None:
                    raise KsaeError(f"{path} holds no {MEMBER_DIR}{name}; not the python version of CIFAR-10")
                X, y = read_batch(member.read(), f"{path}:{name}")
                Xs.append(X)
                ys.append(y)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise KsaeError(f"{path}: not a readable tar archive ({type(exc).__name__}: {first})") from None
    X_n3072, y_n = np.concatenate(Xs), np.concatenate(ys)
    if n_expected is not None and len(X_n3072) != n_expected:
        raise KsaeError(f"{path}: training batches hold {len(X_n3072)} images; expected {n_expected}")
    # Each row is three 32 x 32 planes (R, G, B): to N x 32 x 32 x 3.
    return X_n3072.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), y_n


def write_archive(path: Path, batches: list[tuple[np.ndarray, list]]) -> None:
    """Write a ``cifar-10-python.tar.gz`` lookalike (tests): one ``(data, labels)`` per batch."""
    with tarfile.open(path, "w:gz") as archive:
        for i, (data, labels) in enumerate(batches, start=1):
            raw = pickle.dumps({b"batch_label": f"training batch {i} of 5".encode(), b"labels": list(labels),
                                b"data": np.asarray(data, dtype=np.uint8),
                                b"filenames": [b"x.png"] * len(labels)}, protocol=2)
            info = tarfile.TarInfo(MEMBER_DIR + f"data_batch_{i}")
            info.size = len(raw)
            archive.addfile(info, io.BytesIO(raw))


def cache_path(folder: Path, n_patches: int, seed: int) -> Path:
    return folder / f"patches-{PATCH}x{PATCH}x3-n{n_patches}-seed{seed}.h5"


def write_cache(path: Path, X_nd: np.ndarray, mean_d: np.ndarray, P_dd: np.ndarray, seed: int) -> None:
    """The preprocessed patches with their statistics, to ``<path>.tmp`` then renamed."""
    import h5py

    tmp = path.with_name(path.name + ".tmp")
    with h5py.File(tmp, "w") as f:
        f.attrs.update(version=CACHE_VERSION, seed=seed, patch=PATCH, lcn_epsilon=LCN_EPSILON,
                       zca_epsilon=ZCA_EPSILON, complete=True)
        f.create_dataset("X", data=X_nd)
        f.create_dataset("mean", data=mean_d)
        f.create_dataset("zca", data=P_dd)
    os.replace(tmp, path)


def read_cache(path: Path, n_patches: int):
    """``(X_nd, mean_d, P_dd)`` from a cache file, or None when it is absent, stale or unreadable."""
    import h5py

    if not path.is_file():
        return None
    try:
        with h5py.File(path, "r") as f:
            d = PATCH * PATCH * 3
            if (f.attrs.get("version") != CACHE_VERSION or not f.attrs.get("complete")
                    or f.attrs.get("lcn_epsilon") != LCN_EPSILON or f.attrs.get("zca_epsilon") != ZCA_EPSILON
                    or f["X"].shape != (n_patches, d) or f["zca"].shape != (d, d)):
                return None
            return f["X"][()], f["mean"][()], f["zca"][()]
    except (OSError, KeyError, ValueError):
        return None


def load(root: Path, log=print, n_patches: int = N_PATCHES, seed: int = PATCH_SEED,
         valid_fraction: float = VALID_FRACTION, files=None, n_expected: int | None = N_IMAGES):
    """The cached patches if present, else fetch CIFAR-10, extract, preprocess and cache them."""
    from ksae_cupy.datasets.dataset import Dataset

    if n_patches < 2:
        raise KsaeError(f"cifar-patches needs at least 2 patches, got {n_patches}")
    folder = Path(root) / "cifar"
    cache = cache_path(folder, n_patches, seed)
    cached = read_cache(cache, n_patches)
    if cached is None:
        paths = ensure_files(folder, FILES if files is None else files, SOURCES, "cifar-patches", log=log)
        images_nhwc, _ = read_archive(paths[ARCHIVE], n_expected)
        log(f"extracting {n_patches} random {PATCH}x{PATCH}x3 patches, LCN and ZCA (cached in {cache})")
        cached = lcn_zca_patches(images_nhwc, n_patches, PATCH, seed)
        write_cache(cache, *cached, seed=seed)
    X_nd, mean_d, P_dd = cached
    train, valid = split_rows(len(X_nd), valid_fraction, seed)
    return Dataset(name="cifar-patches", X_train=X_nd[train], X_valid=X_nd[valid], image_shape=IMAGE_SHAPE,
                   preprocess={"mean": mean_d, "zca": P_dd, "lcn_epsilon": np.float32(LCN_EPSILON),
                               "zca_epsilon": np.float32(ZCA_EPSILON)})

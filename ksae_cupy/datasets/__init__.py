"""Datasets by name: fetched, verified, parsed and preprocessed into float32 ``X_nd`` arrays.

``load_dataset(name)`` takes a built-in name (see :data:`LOADERS`) or a path to the
user's own data (an ``.npy`` file, or ``file.h5`` / ``file.h5:dataset`` holding an N x D
array). The data root is ``$KSAE_DATA_DIR``, else ``./data``; each dataset has a folder
of its own there.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ksae_cupy.datasets.dataset import Dataset, check_finite, check_magnitude
from ksae_cupy.errors import KsaeError



def data_root() -> Path:
    """``$KSAE_DATA_DIR`` if set, else ``./data``."""
    return Path(os.environ.get("KSAE_DATA_DIR") or "data")


def load_mnist(root: Path, log=print) -> Dataset:
    from ksae_cupy.datasets import mnist

    return _mnist_shaped("mnist", mnist.load_arrays(root / "mnist", log=log))


def load_fashion_mnist(root: Path, log=print) -> Dataset:
    from ksae_cupy.datasets import fashion_mnist

    return _mnist_shaped("fashion-mnist", fashion_mnist.load_arrays(root / "fashion-mnist", log=log))


def _mnist_shaped(name: str, arrays) -> Dataset:
    """MNIST's splits (50,000 / 10,000 by a seeded permutation, then the 10,000 test images)
    and scaling (pixels / 255) of ``(X_train_nd, y_train_n, X_test_nd, y_test_n)``."""
    from ksae_cupy.datasets import mnist

    X_all, y_all, X_test, y_test = arrays
    train, valid = mnist.train_valid_split(len(X_all), mnist.N_VALID)
    scale = np.float32(1.0 / 255.0)
    return Dataset(
        name=name,
        X_train=X_all[train].astype(np.float32) * scale, y_train=y_all[train],
        X_valid=X_all[valid].astype(np.float32) * scale, y_valid=y_all[valid],
        X_test=X_test.astype(np.float32) * scale, y_test=y_test,
        n_classes=10, image_shape=(28, 28),
    )


def load_synthetic(root: Path, log=print) -> Dataset:
    from ksae_cupy.datasets.synthetic import make_sparse_signals

    X, y, _ = make_sparse_signals(12_000)
    return Dataset(name="synthetic", X_train=X[:10_000], y_train=y[:10_000], X_valid=X[10_000:11_000],
                   y_valid=y[10_000:11_000], X_test=X[11_000:], y_test=y[11_000:], n_classes=4, image_shape=(8, 8))


def load_norb(root: Path, log=print) -> Dataset:
    from ksae_cupy.datasets import norb

    return norb.load(root, log=log)


def load_cifar_patches(root: Path, log=print) -> Dataset:
    from ksae_cupy.datasets import cifar

    return cifar.load(root, log=log)


def load_patches(root: Path, log=print) -> Dataset:
    from ksae_cupy.datasets import patches

    return patches.load(root, log=log)


# Built-in datasets by name. Each loader takes the data root and a log function.
LOADERS = {"mnist": load_mnist, "fashion-mnist": load_fashion_mnist, "synthetic": load_synthetic, "norb": load_norb,
           "cifar-patches": load_cifar_patches, "patches": load_patches}


def load_user_file(spec: str, valid_fraction: float = 0.1, seed: int = 0) -> Dataset:
    """An N x D array from ``file.npy``, ``file.h5`` (its only dataset) or ``file.h5:name``.

    A seeded random ``valid_fraction`` of the rows becomes the validation set; there is no
    test set and there are no labels.
    """
    path_text, member = spec, ""
    if ".h5:" in spec or ".hdf5:" in spec:
        path_text, member = spec.rsplit(":", 1)
    path = Path(path_text)
    if not path.is_file():
        raise KsaeError(f"data file {path} does not exist")
    if path.suffix == ".npy":
        X = _read_npy(path)
    elif path.suffix in (".h5", ".hdf5"):
        X = _read_h5_array(path, member)
    else:
        raise KsaeError(f"data file {path} has suffix {path.suffix!r}; use .npy, .h5 or .hdf5")
    if X.ndim != 2 or X.shape[0] < 2 or X.shape[1] < 1:
        raise KsaeError(f"{spec}: array of shape {X.shape}; expected N x D with N >= 2")
    if not np.issubdtype(X.dtype, np.number) or np.iscomplexobj(X):
        raise KsaeError(f"{spec}: array of dtype {X.dtype}; expected real numbers")
    X = X.astype(np.float32)
    check_finite(X, spec)
    check_magnitude(X, spec)
    order = np.random.default_rng(seed).permutation(len(X))
    n_valid = max(1, int(round(valid_fraction * len(X))))
    return Dataset(name=str(spec), X_train=X[np.sort(order[n_valid:])], X_valid=X[np.sort(order[:n_valid])])


# Deflate, the strongest compression HDF5 files commonly use, shrinks data at most ~1032:1;
# a dataset that claims more than that per byte of file is refused before it is read.
MAX_COMPRESSION = 1032


def _read_npy(path: Path) -> np.ndarray:
    """The array of an ``.npy`` file, once its header's shape fits in the file's length
    (a damaged header must not make us allocate what the file does not hold)."""
    shape, dtype, data_bytes = _npy_header(path)
    if dtype.hasobject:
        raise KsaeError(f"{path}: not a readable .npy file (it holds Python objects)")
    needed = math.prod(shape) * dtype.itemsize
    if needed > data_bytes:
        raise KsaeError(f"{path}: not a readable .npy file (header says {shape} {dtype}, which needs {needed} "
                        f"bytes; the file holds {data_bytes})")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise KsaeError(f"{path}: not a readable .npy file ({exc})".splitlines()[0]) from None


def _npy_header(path: Path):
    """``(shape, dtype, bytes after the header)`` of an ``.npy`` file, or a KsaeError."""
    import warnings

    fmt = np.lib.format
    try:
        with open(path, "rb") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NumPy's note on Python 2 headers
            version = fmt.read_magic(f)
            if version not in ((1, 0), (2, 0), (3, 0)):
                raise ValueError(f"unknown .npy version {version}")
            read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = read_header(f)
            return shape, dtype, path.stat().st_size - f.tell()
    except Exception as exc:  # noqa: BLE001 -- NumPy parses the header as Python source: any error means damage
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise KsaeError(f"{path}: not a readable .npy file ({type(exc).__name__}: {first})") from None


def _read_h5_array(path: Path, member: str) -> np.ndarray:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            if not member:
                names = [n for n, obj in f.items() if isinstance(obj, h5py.Dataset)]
                if len(names) != 1:
                    raise KsaeError(f"{path} holds datasets {names}; name one as {path}:NAME")
                member = names[0]
            if member not in f or not isinstance(f[member], h5py.Dataset):
                raise KsaeError(f"{path} has no dataset {member!r}")
            dset = f[member]
            if dset.ndim != 2 or not np.issubdtype(dset.dtype, np.number) or np.issubdtype(dset.dtype, np.complexfloating):
                raise KsaeError(f"{path}:{member}: array of shape {dset.shape} {dset.dtype}; expected N x D real numbers")
            limit = path.stat().st_size * (MAX_COMPRESSION if dset.compression else 1)
            if dset.size * dset.dtype.itemsize > limit:
                raise KsaeError(f"{path}:{member}: shape {dset.shape} {dset.dtype} needs "
                                f"{dset.size * dset.dtype.itemsize} bytes, more than the file can hold")
            return dset[()]
    except KsaeError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError, OverflowError) as exc:  # h5py's errors on damage
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise KsaeError(f"{path}: not a readable HDF5 file ({type(exc).__name__}: {first})") from None


def is_user_file(name: str) -> bool:
    return name.endswith((".npy", ".h5", ".hdf5")) or ".h5:" in name or ".hdf5:" in name


def load_dataset(name: str, root: Path | None = None, log=print) -> Dataset:
    """Load a built-in dataset by name, or the user's own file (see :func:`load_user_file`)."""
    if is_user_file(name):
        return load_user_file(name)
    if name not in LOADERS:
        raise KsaeError(f"unknown dataset {name!r}; use one of {', '.join(sorted(LOADERS))}, or a path to an .npy / .h5 file")
    dataset = LOADERS[name](Path(root) if root is not None else data_root(), log=log)
    for split in ("X_train", "X_valid", "X_test"):
        if getattr(dataset, split) is not None:
            check_finite(getattr(dataset, split), f"{name} {split}")
            check_magnitude(getattr(dataset, split), f"{name} {split}")
    return dataset

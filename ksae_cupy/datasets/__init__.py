"""Datasets by name: fetched, verified, parsed and preprocessed into float32 ``X_nd`` arrays.

``load_dataset(name)`` takes a built-in name (see :data:`LOADERS`) or a path to the
user's own data (``.npz`` with X and y, ``.npy``, ``file.h5[:dataset]``; labels and splits as
:mod:`ksae_cupy.datasets.user_files` describes). The data root is ``$KSAE_DATA_DIR``, else ``./data``; each dataset has a folder
of its own there.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ksae_cupy.datasets.dataset import Dataset, check_finite, check_magnitude
from ksae_cupy.datasets.user_files import DataSpec, is_user_file, load_user_data  # noqa: F401 (is_user_file: re-exported)
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
    """An N x D array from ``file.npy``, ``file.npz``, ``file.h5`` (its only dataset) or
    ``file.h5:name``, split as :class:`DataSpec` says (see :mod:`ksae_cupy.datasets.user_files`)."""
    return load_user_data(DataSpec(spec, valid_fraction=valid_fraction, split_seed=seed).validate())


def load_dataset(name, root: Path | None = None, log=print, *, labels: str | None = None, test: str | None = None,
                 test_labels: str | None = None, valid_fraction: float = 0.1, test_fraction: float = 0.0,
                 split_seed: int = 0) -> Dataset:
    """A built-in dataset by name, or the user's own file with its labels and splits.

    ``name`` is a built-in name (``mnist``, ``fashion-mnist``, ...: see :data:`LOADERS`), a
    user file (``data.npz``, ``data.npy``, ``data.h5[:name]``; see
    :mod:`ksae_cupy.datasets.user_files`), or a :class:`DataSpec` (then the other arguments
    are ignored). For a user file: ``labels`` names its labels when the file has none of its
    own, ``test`` (and ``test_labels``) a separate test set, ``test_fraction`` a seeded share
    of the rows held out for testing instead, ``valid_fraction`` the share held out for
    validation, ``split_seed`` the seed of both draws. Bad values raise a one-line
    :class:`~ksae_cupy.errors.KsaeError` naming the argument.
    """
    if isinstance(name, DataSpec):
        spec = name
    else:
        spec = DataSpec(str(name), labels=labels, test=test, test_labels=test_labels, valid_fraction=valid_fraction,
                        test_fraction=test_fraction, split_seed=split_seed).validate()
    if spec.is_user_file:
        return load_user_data(spec)
    name = spec.data
    if name not in LOADERS:
        raise KsaeError(f"unknown dataset {name!r}; use one of {', '.join(sorted(LOADERS))}, or a path to an "
                        f".npy / .npz / .h5 file")
    dataset = LOADERS[name](Path(root) if root is not None else data_root(), log=log)
    for split in ("X_train", "X_valid", "X_test"):
        if getattr(dataset, split) is not None:
            check_finite(getattr(dataset, split), f"{name} {split}")
            check_magnitude(getattr(dataset, split), f"{name} {split}")
    return dataset

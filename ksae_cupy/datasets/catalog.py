"""What ``ksae-data list / fetch / verify`` need: every dataset's files and sources by name.

Plain functions; the click commands call them and print the rows.
"""
from __future__ import annotations

from pathlib import Path

from ksae_cupy.errors import KsaeError
from ksae_cupy.datasets.fetch import ensure_files, present_copy, verify_file


def _dataset_files() -> dict:
    from ksae_cupy.datasets import cifar, fashion_mnist, mnist, norb

    # name -> (folder under the data root, file specs, sources)
    return {
        "mnist": ("mnist", mnist.FILES, mnist.SOURCES),
        "fashion-mnist": ("fashion-mnist", fashion_mnist.FILES, fashion_mnist.SOURCES),
        "norb": ("norb", norb.FILES, norb.SOURCES),
        "cifar-patches": ("cifar", cifar.FILES, cifar.SOURCES),
    }


DATASET_FILES = _dataset_files()


def _search_folders() -> dict:
    from ksae_cupy.datasets import fashion_mnist

    # name -> folders outside the data root where a system package may have put the files
    return {"fashion-mnist": fashion_mnist.SEARCH}


SEARCH_FOLDERS = _search_folders()

# Built-in datasets without files to fetch, and why.
NO_FILES = {
    "synthetic": "generated on the fly",
    "patches": "photographs bundled with scikit-image (pip install 'ksae-cupy[patches]')",
}

# How one example is drawn as an image: (height, width) or (height, width, channels),
# values flattened row, column, channel. Lets `ksae-plot filters` draw a run without options.
IMAGE_SHAPES = {
    "mnist": (28, 28),
    "fashion-mnist": (28, 28),
    "norb": (32, 64),  # the two 32x32 channels side by side
    "cifar-patches": (8, 8, 3),
    "patches": (8, 8, 3),
    "synthetic": (8, 8),
}

DESCRIPTIONS = {
    "mnist": "MNIST digits, 28x28, 50k/10k/10k, 10 classes",
    "fashion-mnist": "Fashion-MNIST clothing, 28x28, 50k/10k/10k, 10 classes",
    "norb": "small NORB normalized-uniform, 2x32x32 = 2048 dims standardised, 20k/4.3k/24.3k, 5 classes",
    "cifar-patches": "1M random 8x8x3 CIFAR-10 patches, LCN + ZCA, 95%/5% train/valid",
    "patches": "random 8x8x3 patches of scikit-image photographs, LCN + ZCA, 95%/5% train/valid",
    "synthetic": "sparse combinations of 8x8 atoms, 10k/1k/1k",
}


def list_datasets(root: Path) -> list[tuple[str, str, str]]:
    """``(name, description, files)`` per built-in dataset; ``files`` says where the files will be
    read from (e.g. '4/4 files present in data/mnist'; a system package's copy, used in place,
    by its folder) or why there is nothing to fetch."""
    rows = []
    for name in sorted(set(DATASET_FILES) | set(NO_FILES)):
        if name in DATASET_FILES:
            folder, specs, _ = DATASET_FILES[name]
            files = _where_read(Path(root) / folder, specs, SEARCH_FOLDERS.get(name, ()))
        else:
            files = NO_FILES[name]
        rows.append((name, DESCRIPTIONS.get(name, ""), files))
    return rows


def _where_read(own: Path, specs, search) -> str:
    """'N/M files present in FOLDER[ and OTHER]': each file where loading takes it, the data root's
    folder first, then the system folders (as :func:`~ksae_cupy.datasets.fetch.ensure_files` looks)."""
    order = (own, *map(Path, search))
    found = [next((place for place in order if present_copy(place, spec)), None) for spec in specs]
    places = [place for place in order if place in found] or [own]
    words = f"{len(specs) - found.count(None)}/{len(specs)} files present in {' and '.join(map(str, places))}"
    if any(place != own for place in places):
        words += " (a system copy, read in place)"
    return words


def verify_all(root: Path, names=None) -> list[tuple[str, str, str, str]]:
    """``(dataset, file, status, detail)`` for every file of every dataset (or of ``names``).

    ``status`` is ``ok``, ``missing`` or ``bad``; ``detail`` is the path checked and, for a
    bad file, what failed. Files are checked in full (digests, size, format), never changed.
    """
    rows = []
    for name in names or sorted(DATASET_FILES):
        folder, specs, _ = _lookup(name)
        for spec in specs:
            status, path, problem = verify_file(Path(root) / folder, spec)
            for other in SEARCH_FOLDERS.get(name, ()) if status == "missing" else ():
                status, path, problem = verify_file(Path(other), spec)
                if status != "missing":
                    break
            if status == "missing":
                detail = f"not in {Path(root) / folder}"
            else:
                detail = str(path) + (f": {problem}" if problem else f" ({spec.describe()})")
            rows.append((name, spec.name, status, detail))
    return rows


def fetch_dataset(name: str, root: Path, log=print) -> dict[str, Path]:
    """Make every file of dataset ``name`` present and verified; return file name -> path."""
    if name in NO_FILES:
        log(f"{name}: nothing to fetch ({NO_FILES[name]})")
        return {}
    folder, specs, sources = _lookup(name)
    return ensure_files(Path(root) / folder, specs, sources, name, log=log, search=SEARCH_FOLDERS.get(name, ()))


def _lookup(name: str):
    if name not in DATASET_FILES:
        known = sorted(set(DATASET_FILES) | set(NO_FILES))
        raise KsaeError(f"unknown dataset {name!r}; use one of {', '.join(known)}")
    return DATASET_FILES[name]

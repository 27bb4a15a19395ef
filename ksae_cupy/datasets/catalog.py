"""What ``ksae-data list / fetch / verify`` need: every dataset's files and sources by name.

Plain functions over :data:`~ksae_cupy.datasets.registry.DATASETS`; the click commands call them and print the rows.
"""
from __future__ import annotations

from pathlib import Path

from ksae_cupy.datasets.fetch import ensure_files, present_copy, verify_file
from ksae_cupy.datasets.registry import DATASETS, lookup
from ksae_cupy.errors import KsaeError


def checked_root(data_dir) -> Path:
    """The data root (--data-dir, else $KSAE_DATA_DIR or ./data). One that is a file would read as
    "no files present": say what it is instead."""
    from ksae_cupy.datasets import data_root

    root = data_dir or data_root()
    if Path(root).exists() and not Path(root).is_dir():
        raise KsaeError(f"--data-dir {root} is a file, not a folder; give the folder that holds the datasets")
    return root


def list_datasets(root: Path) -> list[tuple[str, str, str]]:
    """``(name, description, files)`` per built-in dataset; ``files`` says where the files will be
    read from (e.g. '4/4 files present in data/mnist'; a system package's copy, used in place,
    by its folder) or why there is nothing to fetch."""
    rows = []
    for name in sorted(DATASETS):
        entry = DATASETS[name]
        files = _where_read(Path(root) / entry.folder, entry.files, entry.search) if entry.folder else entry.no_files
        rows.append((name, entry.description, files))
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
    A root that does not exist is refused: every file "missing" would pass a mistyped root as verified.
    """
    if not Path(root).exists():
        raise KsaeError(f"data root {root} does not exist: nothing to verify; give the folder that holds the "
                        f"datasets (--data-dir or $KSAE_DATA_DIR), or fetch one there with ksae-data fetch NAME")
    rows = []
    for name in names or sorted(name for name, entry in DATASETS.items() if entry.folder):
        entry = lookup(name)
        folder = Path(root) / (entry.folder or name)
        for spec in entry.files:
            status, path, problem = verify_file(folder, spec)
            for other in entry.search if status == "missing" else ():
                status, path, problem = verify_file(Path(other), spec)
                if status != "missing":
                    break
            if status == "missing":
                detail = f"not in {folder}"
            else:
                detail = str(path) + (f": {problem}" if problem else f" ({spec.describe()})")
            rows.append((name, spec.name, status, detail))
    return rows


def fetch_dataset(name: str, root: Path, log=print) -> dict[str, Path]:
    """Make every file of dataset ``name`` present and verified; return file name -> path."""
    entry = lookup(name)
    if not entry.folder:
        log(f"{name}: nothing to fetch ({entry.no_files})")
        return {}
    return ensure_files(Path(root) / entry.folder, list(entry.files), list(entry.sources), name, log=log,
                        search=entry.search)

"""The datasets that have files to fetch: what they are, where from, and their state on disk."""
from __future__ import annotations

from pathlib import Path

from ..errors import KsaeError
from . import LOADERS, mnist
from .fetch import ensure_files, verify_file

# name -> (files, sources); the folder of each is <data root>/<name>.
DATASET_FILES = {"mnist": (mnist.FILES, mnist.SOURCES)}


def fetch_dataset(name: str, root: Path, log=print) -> list[Path]:
    """Fetch and verify every file of dataset ``name``; return their paths."""
    if name not in DATASET_FILES:
        fetchable = ", ".join(sorted(DATASET_FILES))
        raise KsaeError(f"unknown dataset {name!r} for fetch; use one of {fetchable}")
    specs, sources = DATASET_FILES[name]
    return list(ensure_files(Path(root) / name, specs, sources, name, log=log).values())


def verify_all(root: Path) -> list[tuple[str, str, str, str]]:
    """``(dataset, file, status, detail)`` for every known file; status ok, missing or bad."""
    rows = []
    for name, (specs, _) in sorted(DATASET_FILES.items()):
        for spec in specs:
            status, path, found = verify_file(Path(root) / name, spec)
            detail = f"expected sha256 {spec.sha256}, found {found}" if status == "bad" else ""
            rows.append((name, path.name if path else spec.name, status, detail))
    return rows


def list_datasets(root: Path) -> list[tuple[str, str]]:
    """Every built-in dataset with a one-word state: generated, present, partial or missing."""
    rows = verify_all(root)
    states = []
    for name in sorted(LOADERS):
        mine = [status for dataset, _, status, _ in rows if dataset == name]
        if not mine:
            states.append((name, "generated (no files)"))
        elif all(status == "ok" for status in mine):
            states.append((name, "present"))
        else:
            states.append((name, "missing" if all(s == "missing" for s in mine) else "partial or bad"))
    return states

"""The build step that writes the checkout's commit into the package it builds (everything else: setup.cfg).

``pip install .`` copies the package without its git folder, so the installed copy could not name the
commit it was built from. The build step (setuptools' ``build_py``) writes ``ksae_cupy/_build_commit.py``
into the built package, holding ``COMMIT`` and ``CLEAN`` of this checkout at build time, read by
``ksae_cupy.made_with.code_commit`` (so ``--version`` and config.json name it). Nothing is written when
this folder is not a git checkout of its own (a source archive, a copy inside another repository):
provenance is ours or none. The file is git-ignored; an editable install reads the checkout's git instead.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
BUILD_COMMIT_FILE = Path("ksae_cupy") / "_build_commit.py"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def build_commit_source(root: Path = ROOT) -> str | None:
    """The text of ``_build_commit.py`` for the checkout at ``root``, or None when ``root`` is not the top of a
    git checkout (the commit would be another repository's) or git does not answer."""
    top = _git("-C", str(root), "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != Path(root).resolve():
        return None
    commit = _git("-C", str(root), "rev-parse", "HEAD")
    if commit is None or len(commit) != 40:
        return None
    changes = _git("-C", str(root), "status", "--porcelain", "--untracked-files=no")
    clean = None if changes is None else changes == ""
    return (f'"""Written by setup.py\'s build step: the commit this package was built from."""\n'
            f"COMMIT = {commit!r}\nCLEAN = {clean!r}\n")


def write_build_commit(build_lib: Path, root: Path = ROOT) -> Path | None:
    """Write ``_build_commit.py`` into the package built under ``build_lib``; returns its path (None: no commit)."""
    source = build_commit_source(root)
    if source is None:
        return None
    target = Path(build_lib) / BUILD_COMMIT_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(source)
    return target


class BuildWithCommit(build_py):
    """setuptools' ``build_py``, then the commit written into the built package."""

    def run(self):
        super().run()
        if not self.editable_mode:
            write_build_commit(Path(self.build_lib))


if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildWithCommit})

"""What code made a result: the package version, the commit, the libraries and the device.

    package_version()   "0.1.0": setup.cfg's ``version`` (the one place it is typed)
    code_commit()       (commit, clean) of the package's own checkout, else the one written at build time
                        (``pip install .``), else (None, None)
    provenance(device)  all of it as one JSON-ready dict, recorded in every run folder's config.json
                        and in every checkpoint (:mod:`ksae_cupy.training.checkpoint`)

The version comes from the source tree's setup.cfg when the package runs from one (a checkout,
or an editable install, whose installed metadata may predate the last change to setup.cfg), else
from the installed distribution's metadata. The commit comes from ``git`` run beside the package,
with a timeout, when the checkout is the package's own (a setup.cfg that names ksae-cupy beside it);
else from ``_build_commit.py``, which setup.py's build step writes into the package it builds; no git,
or a package that is not the checkout's own and was not built from one, gives None, never an error.
``clean`` says whether the tracked files match the commit (untracked files are not counted).

Library versions come from the imported module when it is loaded, else from the installed
metadata, so that recording them never imports CuPy (whose import may fail without a GPU) nor Numba.
"""
from __future__ import annotations

import configparser
import functools
import platform
import subprocess
import sys
from pathlib import Path

DISTRIBUTION = "ksae-cupy"
PACKAGE_DIR = Path(__file__).resolve().parent
GIT_TIMEOUT_S = 5
# module -> the distributions that install it (CuPy ships under one name per CUDA major version)
LIBRARIES = {
    "numpy": ("numpy",),
    "scipy": ("scipy",),
    "h5py": ("h5py",),
    "numba": ("numba",),
    "cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"),
}


@functools.lru_cache(maxsize=None)
def package_version() -> str:
    """The package's version: setup.cfg's when it runs from a source tree, else the installed metadata's."""
    setup_cfg = PACKAGE_DIR.parent / "setup.cfg"
    if setup_cfg.is_file() and names_this_package(setup_cfg):
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(setup_cfg)
            return parser.get("metadata", "version")
        except (configparser.Error, OSError, UnicodeDecodeError):
            pass
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def _git(*args: str) -> str | None:
    """``git args`` run in the package's folder: its stdout stripped, or None when it fails or is absent."""
    try:
        done = subprocess.run(["git", *args], cwd=PACKAGE_DIR, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


BUILD_COMMIT_MODULE = "_build_commit"  # ksae_cupy/_build_commit.py: written by setup.py's build step, git-ignored


def names_this_package(setup_cfg: Path) -> bool:
    """Whether ``setup_cfg`` is this package's own (its ``[metadata] name`` is ksae-cupy)."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(setup_cfg)
        return parser.get("metadata", "name", fallback=None) == DISTRIBUTION
    except (configparser.Error, OSError, UnicodeDecodeError):
        return False


def checkout_commit() -> tuple[str | None, bool | None]:
    """``(commit, clean)`` of the git checkout the package runs from, when that checkout is this package's
    own: its top folder holds this package and a setup.cfg that names ksae-cupy. An installed copy inside
    some other repository (a virtualenv in a project), or the package copied to the root of another
    repository, is not that repository's commit: ``(None, None)``."""
    top = _git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != PACKAGE_DIR.parent or not names_this_package(Path(top) / "setup.cfg"):
        return None, None
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return None, None
    changes = _git("status", "--porcelain", "--untracked-files=no")
    return commit, (None if changes is None else changes == "")


def built_commit() -> tuple[str | None, bool | None]:
    """``(commit, clean)`` written into the package when it was built from its checkout (``pip install .``:
    setup.py's build step writes ``ksae_cupy/_build_commit.py``), or ``(None, None)``."""
    import importlib

    try:
        built = importlib.import_module(f"{__package__}.{BUILD_COMMIT_MODULE}")
    except ImportError:
        return None, None
    commit, clean = getattr(built, "COMMIT", None), getattr(built, "CLEAN", None)
    if not (isinstance(commit, str) and len(commit) == 40 and all(c in "0123456789abcdef" for c in commit)):
        return None, None
    return commit, clean if isinstance(clean, bool) else None


@functools.lru_cache(maxsize=None)
def code_commit() -> tuple[str | None, bool | None]:
    """``(commit, clean)`` of the code that runs: the package's own checkout's (:func:`checkout_commit`), else
    the one written at build time (:func:`built_commit`), else ``(None, None)``: ours or none, never another
    repository's."""
    commit = checkout_commit()
    return commit if commit[0] is not None else built_commit()


def package_code_clean() -> bool | None:
    """Whether the package's own files (this folder and setup.cfg) match the commit of :func:`code_commit`;
    None outside the package's checkout. Unlike ``clean``, results written into the tree since do not count."""
    if code_commit()[0] is None:
        return None
    changes = _git("status", "--porcelain", "--untracked-files=no", "--", ".", "../setup.cfg")
    return None if changes is None else changes == ""


def library_version(module: str) -> str | None:
    """The version of ``module`` (a key of :data:`LIBRARIES`): the loaded module's, else the installed one's,
    else None."""
    loaded = sys.modules.get(module)
    version = getattr(loaded, "__version__", None)
    if isinstance(version, str):
        return version
    from importlib import metadata

    for distribution in LIBRARIES.get(module, (module,)):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


@functools.lru_cache(maxsize=None)
def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def gpu_name(device: str | None) -> str | None:
    """The name of the GPU of ``device``: ``gpu:N``'s; None for ``cpu``; for None (a writer that does
    not know the run's device, as a checkpoint's), CuPy's current device. CuPy is read only when it
    is already loaded (a GPU run loaded it); any failure there is None."""
    if device is not None and not str(device).startswith("gpu"):
        return None
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    try:
        index = int(str(device).partition(":")[2] or 0) if device is not None else cupy.cuda.runtime.getDevice()
        name = cupy.cuda.runtime.getDeviceProperties(index)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # a stand-in, a lost device: the name is a record, not a requirement
        return None


def version_line() -> str:
    """What ``--version`` prints: ``ksae-cupy 0.1.0`` and, from a checkout, its commit."""
    commit, clean = code_commit()
    line = f"{DISTRIBUTION} {package_version()}"
    if commit is not None:
        state = {True: "clean", False: "uncommitted changes", None: "state unknown"}[clean]
        line += f" (commit {commit[:12]}, {state})"
    return line


def provenance(device: str | None = None) -> dict:
    """The package version, commit (None outside a checkout) and whether its tree was clean, the Python and
    library versions (None: not installed), the CPU model and the GPU's name (:func:`gpu_name`; None on the CPU)."""
    commit, clean = code_commit()
    return {
        "package": DISTRIBUTION,
        "version": package_version(),
        "commit": commit,
        "clean": clean,
        "python": platform.python_version(),
        **{name: library_version(name) for name in LIBRARIES},
        "cpu": cpu_model(),
        "gpu": gpu_name(device),
    }

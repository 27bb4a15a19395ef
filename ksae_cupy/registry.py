"""A registry: the entries of one kind (datasets, optimizers, baseline models), by name.

:data:`~ksae_cupy.datasets.registry.DATASETS`, :data:`~ksae_cupy.optimizers.OPTIMIZERS` and
:data:`~ksae_cupy.supervised.baselines.BASELINES` are each one; an entry is any object with a ``name``.
A registry is a dict (name -> entry, in registration order), so the commands read it as one and a test
can add an entry for itself with ``monkeypatch.setitem``.
"""
from __future__ import annotations

from typing import TypeVar

from ksae_cupy.errors import KsaeError

Entry = TypeVar("Entry")


class Registry(dict):
    """Entries of one ``kind`` (``"dataset"``: how its errors name them), by their ``name``."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, entry: Entry) -> Entry:
        """Add ``entry`` under its name (a name already there is refused in one line)."""
        if entry.name in self:
            raise KsaeError(f"{self.kind} {entry.name!r} is already registered; choose another name")
        self[entry.name] = entry
        return entry

    def lookup(self, name: str):
        """The entry of ``name``, or a one-line error naming it and the names there are."""
        if name not in self:
            raise KsaeError(f"unknown {self.kind} {name!r}; use one of {', '.join(sorted(self))}")
        return self[name]

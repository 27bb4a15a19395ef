"""Files written whole or not at all: write a temporary file beside the target, check it, rename.

A process killed while writing leaves the previous file intact (and a ``NAME.tmp`` beside it),
never half a file: ``os.replace`` is atomic on one file system. Used by every report and result
the package and the scripts under ``bin/`` write (checkpoints have their own writer, which
also checks their sums).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable


def write_text_atomic(path: Path, text: str, check: Callable[[str], object] | None = None) -> Path:
    """Write ``text`` to ``path`` through ``path.tmp``; ``check`` (e.g. ``json.loads``) reads the
    temporary file back first and may raise, which leaves ``path`` as it was. Returns ``path``."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    if check is not None:
        check(tmp.read_text())
    os.replace(tmp, path)
    return path


def write_json_atomic(path: Path, payload, *, sort_keys: bool = True, indent: int = 2, default=None) -> Path:
    """``payload`` as indented JSON (one trailing newline), read back as JSON before the rename."""
    text = json.dumps(payload, indent=indent, sort_keys=sort_keys, default=default) + "\n"
    return write_text_atomic(path, text, check=json.loads)

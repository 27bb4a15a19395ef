"""``GivenPath``: a ``click.Path`` under which an empty path stays recognisable, so that a command
refuses ``--run-dir ''`` by name instead of writing into the current folder."""
from __future__ import annotations

import click


class EmptyPath(str):
    """What :class:`GivenPath` makes of an empty path: ``Path("")`` would be the current folder
    (``--run-dir ''`` would write a run there), so the command refuses it by name instead."""


class GivenPath(click.Path):
    """``click.Path`` that keeps an empty value recognisable (:class:`EmptyPath`) for :func:`refuse_empty`."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            return EmptyPath(value)
        return super().convert(value, param, ctx)

"""``--resume`` on the command line: which options were typed, and ksae-train's policy by name.

What each option does on --resume is declared with it (:mod:`ksae_cupy.session.fields`; the
table of every command: ``ksae_cupy.cli.options.resume_table()``) and carried out by
:mod:`ksae_cupy.session.resuming`. For ksae-train: applied (safe to change mid-run) ``--epochs``
(extend: the k schedule keeps the epochs it was planned over; shorten, to no fewer than the epochs
done: the schedule shrinks with it), ``--topk`` (both algorithms keep the same set), ``--step`` (the
same math), ``--device``, ``--checkpoint-every``, ``--checkpoint-minutes``, ``--threads``,
``--data-dir``, ``--progress-seconds``; refused when they differ from the run: the options that
shape the model or the sequence of batches, and a ``--run-dir``, DATASET or data option other than
the run's own. Options not given keep the run's values, never the defaults. ``--quiet`` is the one
option of a session only.
"""
from __future__ import annotations

import click

from ksae_cupy.session import fields
from ksae_cupy.session.resuming import apply
from ksae_cupy.session.train_run import IN_CHECKPOINT

DATA = fields.DATA[1:]  # the data options: they choose the rows a run trains on
SESSION = fields.named(fields.TRAIN, fields.SESSION)
APPLIED = fields.named(fields.TRAIN, fields.APPLIED) + SESSION
REFUSED = fields.named(fields.TRAIN, fields.REFUSED)
RUN_LEVEL = fields.RUN_LEVEL


def given(ctx) -> set:
    """The options the user typed on this command line."""
    return {name for name in ctx.params if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE}


def apply_options(ctx, typed: set, trainer) -> list[str]:
    """Apply --epochs, --topk and --step to the resumed run's configuration; return what changed."""
    return apply(IN_CHECKPOINT, typed, ctx.params, trainer)

"""What every command shares: the one-line error wrapper, exit statuses, the flag of a library field,
and the parsing of comma-separated option values (with the names of cli/data_options.py,
cli/run_options.py and session/stopping.py, for the commands).

A user mistake is one line ``error: ...`` on stderr and exit status 2; a run whose loss
diverges exits with status 1; Ctrl-C, SIGTERM and SIGHUP save a checkpoint and exit with
128 + the signal's number (130, 143, 129).
"""
from __future__ import annotations

import functools
import sys
import warnings

import click

from ksae_cupy.cli.given_path import EmptyPath, GivenPath  # noqa: F401 (the commands' path options)
from ksae_cupy.errors import KsaeError, KsaeNote, OptionError, TrainingDiverged, one_line

EXIT_USAGE, EXIT_DIVERGED, EXIT_INTERRUPTED = 2, 1, 130


def report_errors(func):
    """Turn :class:`KsaeError` into ``error: <one line>`` and the right exit status, and
    :class:`~ksae_cupy.errors.KsaeNote` warnings into ``note: <one line>`` on stderr."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            refuse_empty(kwargs)
            with warnings.catch_warnings():
                warnings.showwarning = _show_note
                return func(*args, **kwargs)
        except TrainingDiverged as exc:
            click.echo(f"error: {_one_line(exc)}", err=True)
            sys.exit(EXIT_DIVERGED)
        except KsaeError as exc:
            click.echo(f"error: {_one_line(exc)}", err=True)
            sys.exit(EXIT_USAGE)
        except OSError as exc:  # the paths are checked up front; this catches what changes under us
            where = f"{exc.filename}: " if exc.filename else ""
            click.echo(f"error: {where}{one_line(exc.strerror or exc) or type(exc).__name__}", err=True)
            sys.exit(EXIT_USAGE)

    return wrapper


def refuse_empty(values: dict) -> None:
    """One line naming the first path given empty: a path of '' would be the current folder
    (``--run-dir ''`` would write the run there). DATASET and the data options are paths given as
    text; other texts are checked by their own parsers."""
    for name, value in values.items():
        items = value if isinstance(value, tuple) else (value,)
        path_like = name in ("dataset", *DATA_PATH_OPTIONS)
        if any(isinstance(item, EmptyPath) or (path_like and isinstance(item, str) and not item.strip())
               for item in items):
            raise KsaeError(f"{_flag(name)} {str(items[0])!r} is not allowed: an empty path; name a file or folder "
                            f"(. is the current folder)")


def _flag(name: str) -> str:
    """How the command line spells parameter ``name``: its longest option, or an argument's metavar."""
    ctx = click.get_current_context(silent=True)
    for param in (ctx.command.params if ctx is not None else ()):
        if param.name == name:
            if isinstance(param, click.Argument):  # by its name: a metavar may say more ([DATASET] [RUN]...)
                return param.name.upper()
            return max(param.opts, key=len)
    return "--" + name.replace("_", "-")


def _show_note(message, category, filename, lineno, file=None, line=None):
    if issubclass(category, KsaeNote):
        click.echo(f"note: {one_line(message)}", err=True)
    else:  # other libraries' warnings keep Python's own format
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


# The library names parameters as Python does (OptionError.field); where a command's option is
# called otherwise than the field, the flag is here. Every other field is the option of the same
# name on the running command (``batch_size`` -> ``--batch-size``).
FIELD_FLAGS = {"n_hidden": "--hidden", "n_threads": "--threads", "l2_grid": "--l2", "image_shape": "--shape"}


def flag_of(field: str) -> str:
    """How the running command spells the library's parameter ``field``."""
    return FIELD_FLAGS.get(field) or _flag(field)


def _one_line(exc: Exception) -> str:
    if isinstance(exc, OptionError):
        return one_line(exc.spelled(flag_of(exc.field), flag_of))
    if isinstance(exc, TrainingDiverged):
        return one_line(exc.spelled(flag_of))
    return one_line(exc) or type(exc).__name__


# How a long command stops on a signal (no click there); the options of the commands that read a
# run folder; DATASET's options: each in its own module, named here too for the commands.
from ksae_cupy.cli.data_options import (DATA_OPTION_NAMES, DATA_PATH_OPTIONS, data_options,  # noqa: E402,F401
                                        data_overrides, data_spec, run_data_options)
from ksae_cupy.cli.run_options import (CONTEXT, DATA_DIR, DEVICE, PATH, QUIET, RUN_DIR,  # noqa: E402,F401
                                       check_run_outputs, progress_printer, write_json)
from ksae_cupy.session.stopping import STOP_SIGNALS, StopOnSignals, signals_interrupt  # noqa: E402,F401


def positive_ints(text: str, flag: str):
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise KsaeError(f"{flag} {text!r} is not allowed; use comma-separated positive integers") from None
    if not values or min(values) <= 0:
        raise KsaeError(f"{flag} {text!r} is not allowed; use comma-separated positive integers")
    return values


from ksae_cupy.session.fields import parse_lr  # noqa: E402,F401 (--lr: a number or auto)



"""What every command shares: the one-line error wrapper, exit statuses, the stop-signal handler,
and the parsing of comma-separated option values.

A user mistake is one line ``error: ...`` on stderr and exit status 2; a run whose loss
diverges exits with status 1; Ctrl-C, SIGTERM and SIGHUP save a checkpoint and exit with
128 + the signal's number (130, 143, 129).
"""
from __future__ import annotations

import contextlib
import functools
import json
import signal
import sys
import warnings
from pathlib import Path

import click

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


class EmptyPath(str):
    """What :class:`GivenPath` makes of an empty path: ``Path("")`` would be the current folder
    (``--run-dir ''`` would write a run there), so the command refuses it by name instead."""


class GivenPath(click.Path):
    """``click.Path`` that keeps an empty value recognisable (:class:`EmptyPath`) for :func:`refuse_empty`."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            return EmptyPath(value)
        return super().convert(value, param, ctx)


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
            if isinstance(param, click.Argument):
                return param.human_readable_name
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
    return one_line(exc) or type(exc).__name__


# The stop-signal handler of the training commands lives with the run's lifecycle (no click there).
from ksae_cupy.training.lifecycle import STOP_SIGNALS, StopOnSignals  # noqa: E402,F401


@contextlib.contextmanager
def signals_interrupt(names, on_signal=None):
    """While the block runs, the signals ``names`` (e.g. ``("SIGTERM", "SIGHUP")``) stop it as Ctrl-C
    does: ``on_signal(signum)``, then a ``KeyboardInterrupt`` in the main thread. The previous
    handlers come back after it. Off the main thread (a test runner's worker) nothing is installed."""
    def interrupt(signum, frame):
        if on_signal is not None:
            on_signal(signum)
        raise KeyboardInterrupt

    previous = {}
    for name in names:
        number = getattr(signal, name, None)
        if number is not None:
            try:
                previous[number] = signal.signal(number, interrupt)
            except ValueError:  # not the main thread
                break
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def positive_ints(text: str, flag: str):
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise KsaeError(f"{flag} {text!r} is not allowed; use comma-separated positive integers") from None
    if not values or min(values) <= 0:
        raise KsaeError(f"{flag} {text!r} is not allowed; use comma-separated positive integers")
    return values


# -- options and helpers of the commands that read a run folder (eval, plot, analyze) --------

CONTEXT = {"help_option_names": ["-h", "--help"], "show_default": True}


def progress_printer(quiet: bool):
    """Progress lines go to stderr so stdout stays the result."""
    return (lambda *a, **k: None) if quiet else (lambda msg: click.echo(msg, err=True))


PATH = GivenPath(path_type=Path)
RUN_DIR = PATH  # existence is checked by open_run, with a one-line error
DEVICE = click.option("--device", default="auto", help="auto (a GPU when one answers, else the CPU), cpu, gpu or gpu:N.")
DATA_DIR = click.option("--data-dir", type=PATH, default=None,
                        help="Data root. [default: $KSAE_DATA_DIR or ./data]")
QUIET = click.option("--quiet", is_flag=True, help="No progress lines on stderr.")


def check_run_outputs(run_dir: Path, *names: str) -> None:
    """Before minutes of work: the files a command will write into ``run_dir`` can be written
    (a missing folder is left to the command's own one-line error)."""
    from ksae_cupy.paths import check_output_file

    if Path(run_dir).is_dir():
        for name in names:
            check_output_file(Path(run_dir) / name, "RUN_DIR output")


def write_json(path: Path, payload: dict) -> None:
    import os

    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def dataset_split(dataset, split: str):
    """``(X, y)`` of one split of a loaded dataset, or a one-line error when it has none."""
    X, y = getattr(dataset, f"X_{split}"), getattr(dataset, f"y_{split}")
    if X is None:
        raise KsaeError(f"dataset {dataset.name} has no {split} split; use --split valid")
    return X, y


from ksae_cupy.training.fields import parse_lr  # noqa: E402,F401 (--lr: a number or auto)


# -- DATASET and the options that go with the user's own data ------------------------------

DATA_PATH_OPTIONS = ("labels", "test", "test_labels")
DATA_OPTION_NAMES = ("labels", "test", "test_labels", "valid_fraction", "test_fraction", "split_seed")


def data_options(func):
    """``--labels``, ``--test``, ``--test-labels``, ``--valid-fraction``, ``--test-fraction`` and
    ``--split-seed``: labels and splits of a user's DATASET (see ksae_cupy/datasets/user_files.py)."""
    options = [
        click.option("--labels", default=None,
                     help="Labels of DATASET's rows, one integer class per row: labels.npy, file.h5:y or file.npz:y. "
                          "[default: y in DATASET's .npz]"),
        click.option("--test", default=None,
                     help="Test examples, a file as DATASET is (an .npz brings its y). [default: X_test in DATASET's "
                          ".npz, else --test-fraction]"),
        click.option("--test-labels", default=None, help="Labels of --test's rows. [default: y in --test's .npz]"),
        click.option("--valid-fraction", type=float, default=None,
                     help="Share of DATASET's rows held out for validation, drawn with --split-seed. [default: 0.1]"),
        click.option("--test-fraction", type=float, default=None,
                     help="Share of DATASET's rows held out as the test set, when there is no other. [default: 0]"),
        click.option("--split-seed", type=int, default=None, help="Seed of the validation and test draws. [default: 0]"),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def run_data_options(func):
    """``--labels``, ``--test`` and ``--test-labels`` only: the options of the commands that read a
    trained run, whose splits are the run's (another split would test on rows it trained on), so
    ``--valid-fraction``, ``--test-fraction`` and ``--split-seed`` are not offered there."""
    func = click.option("--test-labels", default=None, help="Labels of --test's rows. [default: y in --test's .npz]")(func)
    func = click.option("--test", default=None,
                        help="Test examples, a file as the run's data is (an .npz brings its y). [default: the "
                             "run's test set]")(func)
    return click.option("--labels", default=None,
                        help="Labels of the run's rows, one integer class per row: labels.npy, file.h5:y or "
                             "file.npz:y. [default: the run's labels]")(func)


def data_spec(dataset: str, options: dict):
    """The :class:`~ksae_cupy.datasets.user_files.DataSpec` of a new run: DATASET and the data
    options given (None: the default), checked, with absolute paths."""
    from ksae_cupy.datasets.user_files import DataSpec

    given = {key: value for key, value in options.items() if key in DATA_OPTION_NAMES and value is not None}
    return DataSpec(dataset, **given).validate().resolved()


def data_overrides(options: dict) -> dict:
    """The data options a command on an existing run was given (the others keep the run's)."""
    return {key: options[key] for key in DATA_OPTION_NAMES if options.get(key) is not None}

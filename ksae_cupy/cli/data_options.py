"""DATASET and the options that go with the user's own data: labels and splits
(see ksae_cupy/datasets/user_files.py)."""
from __future__ import annotations

import click

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


def data_spec(dataset: str, options):
    """The :class:`~ksae_cupy.datasets.user_files.DataSpec` of a new run: DATASET and the data
    options given (``options``, the command's options object; None: the default), checked, with absolute paths."""
    from ksae_cupy.datasets.user_files import DataSpec

    given = {key: getattr(options, key) for key in DATA_OPTION_NAMES if getattr(options, key) is not None}
    return DataSpec(dataset, **given).validate().resolved()


def data_overrides(options: dict) -> dict:
    """The data options a command on an existing run was given (the others keep the run's)."""
    return {key: options[key] for key in DATA_OPTION_NAMES if options.get(key) is not None}

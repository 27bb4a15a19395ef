"""Checks shared by every training configuration (autoencoder, baselines, fine-tuning).

Each raises :class:`KsaeError` with one line: ``<flag> <value> is not allowed; use <what is>``.
``flag`` is how the caller's user names the option (``--batch-size`` on a command line,
``batch_size`` in the Python API).
"""
from __future__ import annotations

import math

from ksae_cupy.errors import KsaeError

DTYPES = ("float32", "float64")


def check_positive_count(flag: str, value: int, unit: str) -> None:
    if value <= 0:
        raise KsaeError(f"{flag} {value} is not allowed; use a positive number of {unit}")


def check_batch_size(flag: str, value: int, n_train: int | None) -> None:
    if value <= 0 or (n_train is not None and value > n_train):
        limit = f" and at most the {n_train} training examples" if n_train is not None else ""
        raise KsaeError(f"{flag} {value} is not allowed; use a positive size{limit}")


def check_positive_finite(flag: str, value: float, what: str) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise KsaeError(f"{flag} {value} is not allowed; use a positive {what}")


def check_momentum(flag: str, value: float) -> None:
    if not 0 <= value < 1:
        raise KsaeError(f"{flag} {value} is not allowed; use 0 <= momentum < 1")


def check_dtype(flag: str, value: str) -> None:
    if value not in DTYPES:
        raise KsaeError(f"{flag} {value!r} is not allowed; use float32 or float64")

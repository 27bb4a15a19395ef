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


def check_choice(flag: str, value: str, choices: tuple) -> None:
    if value not in choices:
        raise KsaeError(f"{flag} {value!r} is not allowed; use one of {', '.join(choices)}")


def check_dtype(flag: str, value: str) -> None:
    if value not in DTYPES:
        raise KsaeError(f"{flag} {value!r} is not allowed; use float32 or float64")


def check_in_dtype(dtype: str, **options) -> None:
    """Values legal as Python floats that lose their meaning once rounded to the model's ``dtype``
    (the arrays they multiply): a rate or ``sigma`` that becomes 0 (no step; all-zero weights, every
    unit alike) and a momentum that becomes 1 (a velocity that never decays).
    ``options``: ``{flag: (kind, value)}`` with kind ``"rate"``, ``"sigma"`` or ``"momentum"``."""
    import numpy as np

    if dtype not in DTYPES:
        return  # check_dtype names it
    info = np.finfo(dtype)
    for flag, (kind, value) in options.items():
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            continue  # their own checks name these
        rounded = float(np.asarray(value, dtype=dtype))
        if kind == "momentum" and rounded >= 1:
            below = float(np.nextafter(np.asarray(1, dtype), np.asarray(0, dtype)))
            raise KsaeError(f"{flag} {value} is not allowed in {dtype}: it rounds to 1 there (the velocity would "
                            f"never decay); use 0 <= momentum <= {below!r}")
        if kind == "sigma" and value * value > float(info.max):  # W W^T x, the first reconstruction, overflows
            raise KsaeError(f"{flag} {value} is not allowed in {dtype}: its square overflows there (the first "
                            f"reconstruction, W W^T x, would be infinite); use a standard deviation below "
                            f"{float(np.sqrt(info.max)):.3g} (the paper's is 0.01)")
        if kind in ("rate", "sigma") and 0 < value and rounded < info.tiny:
            what = "every step would be 0" if kind == "rate" else "the initial weights would all be 0, every unit alike"
            raise KsaeError(f"{flag} {value} is not allowed in {dtype}: it is below its smallest normal number, "
                            f"{float(info.tiny):.4g} ({what}); use a larger value")


MAX_SEED = 2**32 - 1


def check_seed(flag: str, value: int) -> None:
    if not 0 <= value <= MAX_SEED:
        raise KsaeError(f"{flag} {value} is not allowed; use an integer from 0 to {MAX_SEED}")


def training_bytes(D: int, H: int, batch_size: int, dtype: str) -> int:
    """Device memory one training step needs: the parameters, their gradients and momentum
    (three copies of W_dh, b_h, c_d) and one batch's inputs, codes and reconstructions
    (three N x D and three N x H arrays)."""
    itemsize = 4 if dtype == "float32" else 8
    return itemsize * (3 * (D * H + H + D) + 3 * batch_size * (D + H))


def check_training_memory(backend, D: int, H: int, batch_size: int, dtype: str, flag: str = "--hidden") -> None:
    """Refuse, before anything is allocated, a model the device cannot hold."""
    from ksae_cupy.backend import free_memory_bytes

    needed, free = training_bytes(D, H, batch_size, dtype), free_memory_bytes(backend)
    if free is not None and needed > free:
        raise KsaeError(f"{flag} {H} is not allowed here: training {D} x {H} {dtype} weights with batches of "
                        f"{batch_size} needs {needed / 2**30:,.1f} GiB, {backend.name} has {free / 2**30:,.1f} GiB "
                        f"free; use fewer hidden units or a smaller batch")


class DictConfig:
    """A dataclass configuration as config.json and checkpoints hold it: :meth:`to_dict`, and
    :meth:`from_dict`, which leaves out keys the class does not know (a file written by another
    version) so that the missing ones take their defaults."""

    def to_dict(self) -> dict:
        import dataclasses

        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict):
        import dataclasses

        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in names})


class ValidatedOnce:
    """A dataclass configuration validated once per command, however many layers receive it:
    :meth:`check` runs the class's ``validate`` unless it already passed on these very values (a field
    changed since, or a check for a number of training rows it was not made for, validates again).
    ``validate`` itself always checks; :meth:`changed_validly` is for a change every valid configuration
    allows (the one place that may keep the mark across a change)."""

    def _values(self) -> tuple:
        import dataclasses

        return tuple(getattr(self, field.name) for field in dataclasses.fields(self))

    def is_validated(self, n_train: int | None = None) -> bool:
        """Whether :meth:`check` passed on the current values (for ``n_train`` rows too, when given)."""
        passed = self.__dict__.get("_passed")
        return passed is not None and passed[0] == self._values() and n_train in (None, passed[1])

    def check(self, n_train: int | None = None, **how) -> None:
        """``validate(n_train, **how)`` unless :meth:`is_validated`; the values that passed are remembered."""
        if not self.is_validated(n_train):
            self.validate(n_train, **how)
            self.__dict__["_passed"] = (self._values(), n_train)

    def changed_validly(self, **fields) -> None:
        """Set ``fields`` to values that keep any valid configuration valid (the caller says why); a
        configuration validated before stays validated, for the same training rows."""
        passed = self.__dict__.get("_passed") if self.is_validated() else None
        for name, value in fields.items():
            setattr(self, name, value)
        if passed is not None:
            self.__dict__["_passed"] = (self._values(), passed[1])

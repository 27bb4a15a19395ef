"""``ksae-sweep``'s options read: each comma-separated grid parsed and checked by ksae-train's own declaration
of the option (:func:`~ksae_cupy.session.fields.parse_text`), and the launch's settings (packed or on a Dask
cluster, its workers and threads) checked against each other before any training."""
from __future__ import annotations

from ksae_cupy.errors import KsaeError
from ksae_cupy.parallel.sweep import grid


def check_launch(device: str, on_gpu: bool, pack: bool, scheduler, workers: int, workers_given: bool,
                 threads: int) -> None:
    """The launch's options against each other: packed on a GPU, Dask workers on the CPU; ``workers_given``:
    --workers was on the command line."""
    if not pack and on_gpu:
        raise KsaeError(f"--no-pack with --device {device} is not allowed: the Dask workers train on the CPU; "
                        f"give --pack (the default on a GPU) or --device cpu")
    if pack and scheduler is not None:
        raise KsaeError(f"--scheduler {scheduler} contradicts --pack, which trains the grid in this process; "
                        f"give one")
    if workers <= 0:
        raise KsaeError(f"--workers {workers} is not allowed; use a positive number")
    if scheduler is not None and workers_given:
        raise KsaeError(f"--workers {workers} has no effect with --scheduler {scheduler}: it sizes the LocalCluster "
                        f"started without one, and that cluster's own workers run the trainings; leave it out")
    if pack and workers_given:
        raise KsaeError(f"--workers {workers} has no effect with --pack, which trains the grid in this process "
                        f"(no Dask workers); leave it out")
    if threads <= 0:
        raise KsaeError(f"--threads {threads} is not allowed; use a positive number of threads per training")


def specs_of(ks: str, alphas: str | None, hiddens: str, seeds: str, epochs: str, batch_size: int, lr: str,
             threads: int, no_k_schedule: bool) -> list[dict]:
    """The grid's trainings (:func:`~ksae_cupy.parallel.sweep.grid`) from the options' texts."""
    base = {"batch_size": batch_size, "lr": _declared("lr", lr),
            "threads": threads, "k_start": None if no_k_schedule else "auto"}
    return grid(_values(ks, "k", "k"), None if alphas is None else _values(alphas, "alpha"),
                _values(hiddens, "hidden", "hidden"), _values(seeds, "seeds", "seed"),
                _values(epochs, "epochs", "epochs"), base)


def _declared(field: str, text: str):
    """One value of ksae-train's option ``field`` given as text, parsed and checked as ksae-train does."""
    from ksae_cupy.session.fields import TRAIN, parse_text

    return parse_text(next(option for option in TRAIN if option.name == field), text)


def _values(text: str, what: str, field: str | None = None) -> list:
    """A comma-separated list for ``--what``, each value parsed and checked by ksae-train's declaration of the
    option ``field`` (:func:`~ksae_cupy.session.fields.parse_text`; None: a positive number, as --alpha); a value
    given twice, or none, is a one-line error naming ``--what``."""
    from ksae_cupy.session.fields import TRAIN, parse_text

    parts = [part.strip() for part in text.split(",") if part.strip()]
    example, words = ("1,2,3", "numbers") if field is None else ("5,10", "integers")
    if not parts:
        raise KsaeError(f"--{what} {text!r} is not allowed; use comma-separated {words} such as {example}")
    values = []
    for part in parts:
        if field is None:  # an encoding multiple: its range (alpha*k within hidden) is check_specs's
            try:
                value = float(part)
            except ValueError:
                raise KsaeError(f"--{what} {text!r} is not allowed; use comma-separated {words} such as "
                                f"{example}") from None
        else:
            value = parse_text(next(option for option in TRAIN if option.name == field), part, f"--{what}")
        if value in values:
            raise KsaeError(f"--{what} {text!r} gives {part} twice; give each value once (each trains a model)")
        values.append(value)
    return values

"""A grid of independent training runs on a Dask cluster, one results table.

    ksae-sweep synthetic --k 5,10 --alpha 1,2 --hidden 128,256 --seeds 0,1 --epochs 20
    ksae-sweep data.npy --k 10 --scheduler tcp://head:8786 --out sweeps/s1

The grid is the product of ``k x hidden x seeds x epochs``; ``alpha`` (the encoding-time
multiple of k, section 2.2) does not change training, so each trained model is scored for
every alpha. Each configuration trains on one worker (a
:class:`~ksae_cupy.training.trainer.Trainer` on the CPU with ``--threads`` threads, one by default,
so workers do not fight over cores; ``--lr auto`` resolved there from the data), and reports its final validation loss with k and with alpha*k kept
units. Without ``--scheduler`` a :class:`distributed.LocalCluster` is started; with it
the runs go to that scheduler. Results: ``OUT/results.json`` and ``OUT/results.md``. The command is :mod:`ksae_cupy.cli.sweep`.

Packed (``--pack``, the default with ``--device gpu``): no cluster; the whole grid trains in this
process as one pack of runs (:mod:`ksae_cupy.training.packed`), on a GPU as one stacked model per
hidden size, each run in its folder ``OUT/runs/h<H>-k<k>-seed<s>-e<E>``; the same command again resumes
what stopped (:func:`run_packed`).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from ksae_cupy.errors import KsaeError, OptionError, literal, one_line
from ksae_cupy.session.stopping import STOP_SIGNALS, signals_interrupt

SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def grid(ks, alphas, hiddens, seeds, epochs, base: dict | None = None) -> list[dict]:
    """One dict of TrainConfig options per trained model (alpha is scored, not trained). ``alphas`` None: each
    model's by the package's one rule without an evaluation (:func:`~ksae_cupy.training.chosen_alpha.fallback_alpha`:
    3, or ``hidden / k`` on a layer too small for it)."""
    from ksae_cupy.training.chosen_alpha import fallback_alpha

    rows = []
    for k, hidden, seed, ep in itertools.product(ks, hiddens, seeds, epochs):
        row = dict(base or {})
        scored = [fallback_alpha(int(k), int(hidden))] if alphas is None else [float(a) for a in alphas]
        row.update(k=int(k), hidden=int(hidden), seed=int(seed), epochs=int(ep), alphas=scored)
        rows.append(row)
    return rows


def _config_of(spec: dict):
    """The :class:`TrainConfig` one grid point trains with (``k_start`` resolved)."""
    from ksae_cupy.schedules import resolve_k_start
    from ksae_cupy.training.trainer import TrainConfig

    options = {key: value for key, value in spec.items() if key != "alphas"}
    options["k_start"] = resolve_k_start(options.get("k_start", "auto"), options["k"], options["hidden"])
    return TrainConfig.from_dict(options)


def check_specs(specs: list[dict]) -> None:
    """Every grid point's options and alphas, checked before anything is submitted: one line
    naming the first bad one (the data's size is checked by :func:`check_data`, or on the
    worker that loads it)."""
    from ksae_cupy import model
    from ksae_cupy.training.options import check_seed

    for spec in specs:
        try:  # named as ksae-sweep's option: the library speaks of the field, the command prints --seeds
            check_seed("{name}", spec["seed"])
        except KsaeError as exc:
            raise OptionError("seeds", literal(str(exc)).replace("{{name}}", "{name}")) from None
        config = _config_of(spec)
        config.validate()
        for alpha in spec["alphas"]:
            model.alpha_k(config.k, alpha, config.hidden)


def check_data(specs: list[dict], dataset: str, data_dir: str | None = None) -> None:
    """Load the data here, as every worker will, and check every grid point's batch against its
    training set: a missing or unreadable file, integer or non-finite data, a batch larger than
    the training set are one line before a cluster starts, not a worker's logged traceback.
    For workers on this machine (the LocalCluster); a remote cluster may see other files."""
    from ksae_cupy.datasets import load_dataset

    data = load_dataset(dataset, root=data_dir, log=lambda msg: None)
    for spec in specs:
        _config_of(spec).validate(n_train=len(data.X_train))


def run_one(spec: dict, dataset: str, data_dir: str | None = None) -> list[dict]:
    """Train one configuration on the CPU and score it for each alpha: one result row per alpha.

    Runs on a Dask worker (or inline); deterministic for a given spec, so a sweep's row
    equals the same configuration run alone.
    """
    from ksae_cupy import model
    from ksae_cupy.backend import CPU
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.training.learning_rate import auto_learning_rate
    from ksae_cupy.threads import estimator_threads
    from ksae_cupy.training.trainer import Trainer

    threads = int(spec.get("threads", 1))
    for name in SINGLE_THREAD_ENV:  # for anything that starts threads later
        os.environ.setdefault(name, str(threads))
    data = load_dataset(dataset, root=data_dir, log=lambda msg: None)
    config = _config_of(spec)
    config.validate(n_train=len(data.X_train))
    if config.lr == "auto":  # derived from this worker's copy of the training rows, as ksae-train does
        config.lr, config.lr_auto = auto_learning_rate(data.X_train), True
    options = {**{key: value for key, value in spec.items() if key != "alphas"}, "k_start": config.k_start,
               "lr": config.lr}
    trainer = Trainer(config, CPU, D=data.dim)
    X_train = data.X_train.astype(config.dtype)
    X_valid = data.X_valid.astype(config.dtype)
    started = time.perf_counter()
    with estimator_threads(threads):  # BLAS and the CPU kernels of this training, for it only
        report = trainer.fit(X_train, X_valid)
    seconds = time.perf_counter() - started
    rows = []
    for alpha in spec["alphas"]:
        kept = model.alpha_k(config.k, alpha, config.hidden)
        rows.append({**{key: value for key, value in options.items()}, "alpha": alpha, "kept": kept,
                     "final_train_loss": report.train_loss, "final_valid_loss": report.valid_loss,
                     "valid_loss_alpha_k": trainer.evaluate_loss(X_valid, kept),
                     "dead_fraction": report.dead_fraction, "train_seconds": seconds})
    return rows


def run_folder_name(spec: dict) -> str:
    """The run folder of one grid point under ``OUT/runs`` (a packed sweep's): its grid coordinates."""
    return f"h{spec['hidden']}-k{spec['k']}-seed{spec['seed']}-e{spec['epochs']}"


def run_packed(specs: list[dict], dataset: str, out: Path, *, device: str = "auto", data_dir: str | None = None,
               log=print) -> list[dict]:
    """Train every spec in this process as one pack (:func:`ksae_cupy.session.packed_runs.train_packed`: on a
    GPU one stacked model per hidden size, on the CPU one run after another), each in its run folder
    ``out/runs/<grid point>`` (:func:`run_folder_name`), which ``ksae-train --resume`` and ``ksae-eval`` read
    as any run's; the same sweep again resumes them. Result rows as :func:`run_one` makes them, in grid order.
    A run that diverges gives rows with its ``diverged`` message and no losses."""
    from ksae_cupy import model
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.session.packed_runs import train_packed

    backend = resolve_device(device)
    data = load_dataset(dataset, root=data_dir, log=lambda msg: None)
    configs = [_config_of(spec) for spec in specs]
    for config in configs:
        config.validate(n_train=len(data.X_train))
    folders = [Path(out) / "runs" / run_folder_name(spec) for spec in specs]
    threads = int(specs[0].get("threads", 1)) if specs else 1
    log(f"sweep: {len(specs)} trainings packed in one process on {backend.description}")
    started = time.perf_counter()
    outcomes = train_packed(configs, data, backend, folders, dataset=dataset, restart_unstarted=True,
                            settings={"threads": threads, "device": device,
                                      "data_dir": None if data_dir is None else str(data_dir)}, log=log)
    seconds = time.perf_counter() - started
    rows = []
    for spec, outcome in zip(specs, outcomes):
        trainer = outcome.job.trainer()
        config = trainer.config
        last = _last_metrics(outcome.folder)
        options = {**{key: value for key, value in spec.items() if key != "alphas"}, "k_start": config.k_start,
                   "lr": config.lr, "run_dir": str(outcome.folder)}
        X_valid = None if outcome.diverged else outcome.job.on_device(outcome.job.X_valid_nd)
        for alpha in spec["alphas"]:
            kept = model.alpha_k(config.k, alpha, config.hidden)
            row = {**options, "alpha": alpha, "kept": kept, "train_seconds": seconds}
            if outcome.diverged:
                row["diverged"] = outcome.diverged
            else:
                with trainer.backend.use():
                    row.update(final_train_loss=last.get("train_loss"), final_valid_loss=last.get("valid_loss"),
                               valid_loss_alpha_k=trainer.evaluate_loss(X_valid, kept),
                               dead_fraction=last.get("dead_fraction"))
            rows.append(row)
    return rows


def _last_metrics(folder: Path) -> dict:
    """The last epoch's line of a run folder's metrics.jsonl ({} when it logged none)."""
    from ksae_cupy.session.runs import RunFolder

    return (RunFolder(folder).read_metrics() or [{}])[-1]


def run_sweep(specs: list[dict], dataset: str, *, scheduler: str | None = None, workers: int = 2,
              data_dir: str | None = None, log=print) -> list[dict]:
    """Submit every spec to Dask; return all result rows in grid order."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError as exc:
        raise KsaeError(f"ksae-sweep needs dask.distributed ({exc}); install it with: pip install 'ksae-cupy[sweep]'") from None
    cluster = None
    if scheduler is None:
        # Processes, one thread each: NumPy releases the GIL only partly, and BLAS must not
        # start a thread pool per worker on a shared machine.
        # silence_logs: a training that fails on a worker (e.g. diverges) comes back to the client, which
        # prints it as one line; the worker's own log of it (a formatted remote traceback) would come first.
        # The scheduler's HTTP routes (no dashboard) on a free port: on its default 8787 a second sweep on
        # the machine would print a three-line warning that the port is taken.
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                               scheduler_kwargs={"dashboard_address": ":0"}, env=dict(SINGLE_THREAD_ENV),
                               silence_logs=logging.CRITICAL)
        client = Client(cluster)
    else:
        client = _connect(Client, scheduler)
    try:
        log(f"sweep: {len(specs)} trainings on {client.scheduler_info().get('address', scheduler)}")
        futures = [client.submit(run_one, spec, dataset, data_dir, pure=False) for spec in specs]
        results = client.gather(futures)  # raises the first worker error here
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return [row for rows in results for row in rows]


def _connect(Client, scheduler: str, timeout_s: float = 10.0):
    """A client of the scheduler at ``scheduler``, or one line saying why there is none (a
    malformed address, nobody listening, or something else answering there)."""
    if "://" not in scheduler and ":" not in scheduler:
        raise OptionError("scheduler", f"{{name}} {literal(repr(scheduler))} is not allowed; use a Dask scheduler "
                                       f"address such as tcp://host:8786")
    try:
        return Client(scheduler, timeout=timeout_s)
    except MemoryError:  # Dask read the first bytes of another server's answer as a frame length (EiB)
        raise OptionError("scheduler", f"{{name}} {literal(scheduler)}: no Dask scheduler answers there (something "
                                       f"else does: its answer is not Dask's protocol); check the address and that "
                                       f"dask-scheduler runs") from None
    except Exception as exc:  # noqa: BLE001 - Dask raises OSError, TimeoutError, ValueError, CommClosedError...
        raise OptionError("scheduler", f"{{name}} {literal(scheduler)}: no Dask scheduler answers there (waited up "
                                       f"to {timeout_s:g} s; {type(exc).__name__}: {literal(one_line(exc)[:200])}); "
                                       f"check the address and that dask-scheduler runs") from None


def _ignore_unraisable(unraisable) -> None:
    """``sys.unraisablehook`` once a stop signal came: say nothing."""


@contextlib.contextmanager
def stopped_by_signals():
    """Ctrl-C, SIGTERM and SIGHUP stop the sweep alike: a ``KeyboardInterrupt`` in the main thread,
    so that the cluster is closed on the way out, with the logs of Dask's client and of asyncio
    silenced first (the client's cancelled waits would each print a traceback as the cluster
    closes). Yields a one-item list: the signal received."""
    received = [signal.SIGINT]

    def stop(signum):
        received[0] = signum
        for logger in ("asyncio", "distributed"):
            logging.getLogger(logger).setLevel(logging.CRITICAL)
        # The interrupt can land inside a constructor (a Dask Future half built by client.submit):
        # that object's __del__ then fails as the process ends, and Python prints "Exception ignored
        # in ..." and a traceback under our one line. The process is stopping: nothing there is news.
        sys.unraisablehook = _ignore_unraisable

    with signals_interrupt(STOP_SIGNALS, stop):
        yield received


COLUMNS = ("k", "hidden", "seed", "epochs", "alpha", "kept", "final_train_loss", "final_valid_loss",
           "valid_loss_alpha_k", "dead_fraction", "train_seconds")


def write_results(rows: list[dict], out: Path) -> tuple[Path, Path]:
    """``results.json`` (every field) and ``results.md`` (a table of the main columns)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "results.json", out / "results.md"
    json_path.write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(col)) for col in COLUMNS) + " |")
    md_path.write_text("\n".join(lines) + "\n")
    return json_path, md_path


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if np.isfinite(value) else str(value)
    return "" if value is None else str(value)

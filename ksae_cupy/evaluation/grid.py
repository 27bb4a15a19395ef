"""Running the (alpha, L2) grid of :mod:`ksae_cupy.evaluation.selection`: finished fits kept on
disk, fits run side by side, and a progress line per fit.

* :class:`FitStore` keeps every finished fit (its trial row and its weights) in
  ``RUN_DIR/eval-fits.npz``, rewritten atomically after each fit, so an evaluation stopped
  by Ctrl-C (or killed) is continued by running the same command again. The file names
  what the fits were made from (the checkpoint's bytes, every value of the data, the fit settings); fits
  made from anything else are ignored. A finished evaluation removes it.
* :func:`run_chains` runs one chain of fits per alpha (its L2 values strongest first, each
  fit warm-started from the last) on ``workers`` threads. The classifier's time goes to
  SciPy's sparse products and NumPy, which release the GIL, so threads run in parallel
  and share the features without copies.
* :class:`GridProgress` prints one line per fit with an estimate of the time left, the refit and
  the fits the walk may still make included.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import numpy as np

from ksae_cupy.errors import note
from ksae_cupy.evaluation.classifier import SoftmaxModel

FITS_FILE = "eval-fits.npz"
HEARTBEAT_S = 60.0  # a fit running longer than this says so, once a minute


class EvaluationInterrupted(Exception):
    """Ctrl-C (or SIGTERM) during the grid; says how many fits were kept and where."""

    def __init__(self, kept: int, path: Path | None):
        where = f"kept in {path}" if path is not None else "not kept (no run folder)"
        super().__init__(f"interrupted: {kept} finished classifier fit(s) {where}; run the same command again "
                         f"to continue from them")
        self.kept, self.path = kept, path


def interruption_words(exc: BaseException, run_dir) -> str:
    """What an evaluation stopped by ``exc`` (:class:`EvaluationInterrupted`, or a Ctrl-C outside the grid)
    left behind, and how to go on."""
    if isinstance(exc, EvaluationInterrupted):
        return str(exc)
    kept = Path(run_dir) / FITS_FILE
    return (f"interrupted: the finished classifier fits are kept in {kept}; run the same command again to continue "
            f"from them" if kept.is_file() else "interrupted before any classifier fit finished")


def fingerprint(checkpoint_path: Path, dataset, **settings) -> str:
    """What a stored fit depends on: the checkpoint's bytes, the training and validation data
    (every value: a row changed anywhere makes the fits again) and the fit settings."""
    digest = hashlib.sha256()
    with open(checkpoint_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    for array in (dataset.X_train, dataset.y_train, dataset.X_valid, dataset.y_valid):
        array = np.ascontiguousarray(array)
        digest.update(repr((array.shape, array.dtype.str)).encode())
        if array.dtype.hasobject:  # no buffer to read (an array of None)
            digest.update(repr(array.tolist()).encode())
        else:
            digest.update(memoryview(array.reshape(-1)).cast("B"))  # the buffer itself: no copy of the data
    digest.update(json.dumps({"data": dataset.summary(), **settings}, sort_keys=True).encode())
    return digest.hexdigest()


class FitStore:
    """Finished fits by key (``"sparse|alpha=2|l2=0.0001"``), persisted to ``path`` after each one."""

    def __init__(self, path: Path, fingerprint: str):
        self.path, self.fingerprint = Path(path), fingerprint
        self._fits: dict[str, tuple[dict, SoftmaxModel]] = {}
        self._lock = threading.Lock()
        self.loaded = 0
        if self.path.is_file():
            self._load()

    def _load(self) -> None:
        try:
            with np.load(self.path, allow_pickle=False) as stored:
                meta = json.loads(str(stored["meta"]))
                if meta.get("fingerprint") != self.fingerprint:
                    return  # fits of another checkpoint, data or setting: start afresh
                for i, entry in enumerate(meta["fits"]):
                    model = SoftmaxModel(W_hc=stored[f"W_{i}"], b_c=stored[f"b_{i}"], l2=entry["trial"]["l2"],
                                         n_iter=entry["n_iter"], converged=entry["converged"],
                                         loss=entry["loss"], message=entry["message"])
                    self._fits[entry["key"]] = (entry["trial"], model)
        except Exception as exc:  # noqa: BLE001 (a cut zip, a bad CRC, bad JSON: any damage) the fits are made again
            self._fits = {}
            self._set_aside(exc)
        self.loaded = len(self._fits)

    def _set_aside(self, exc: Exception) -> None:
        """Keep a damaged file out of the way (``eval-fits.npz.damaged``), said in one line: left in place,
        it would be read, and refused, by every later run."""
        aside = self.path.with_name(self.path.name + ".damaged")
        try:
            os.replace(self.path, aside)
            where = f"set aside as {aside}"
        except OSError as move_error:
            where = f"left in place ({move_error.strerror or move_error})"
        note(f"{self.path} could not be read ({type(exc).__name__}: {exc}); {where}; its classifier fits are "
             f"made again")

    def __len__(self) -> int:
        return len(self._fits)

    def get(self, key: str):
        """``(trial dict, SoftmaxModel)`` of a stored fit, or None."""
        with self._lock:
            return self._fits.get(key)

    def put(self, key: str, trial: dict, model: SoftmaxModel) -> None:
        with self._lock:
            self._fits[key] = (trial, model)
            self._write()

    def _write(self) -> None:
        arrays, fits = {}, []
        for i, (key, (trial, model)) in enumerate(self._fits.items()):
            arrays[f"W_{i}"], arrays[f"b_{i}"] = model.W_hc, model.b_c
            fits.append({"key": key, "trial": trial, "n_iter": model.n_iter, "converged": model.converged,
                         "loss": model.loss, "message": model.message})
        meta = json.dumps({"fingerprint": self.fingerprint, "fits": fits})
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:  # a file object: np.savez would append .npz to a name
            np.savez(f, meta=np.array(meta), **arrays)
        os.replace(tmp, self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


class GridProgress:
    """One line per fit, ``fit 5 of 9 (at most 11) ...; 40 s to 70 s left``.

    The fits still to come are those of the walk's current round, the refit, and at most
    ``later`` more (the steps the walk may still take, :func:`~ksae_cupy.evaluation.selection.select_and_test`).
    Each is estimated at the mean time of the fits made so far on the same alpha (the codes of a
    larger alpha cost more per pass), the refit at its alpha's mean scaled by its rows; a round's
    fits run ``workers`` side by side.
    """

    def __init__(self, workers: int, log, refit_scale: float = 1.0):
        self.workers, self.log, self.refit_scale = max(1, workers), log, refit_scale
        self.done = 0
        self.round_left: list = []  # alphas of the fits sure to come (this round's, and some of the next)
        self.later: dict = {}  # alpha -> fits it may still make after this round
        self.refit_alpha, self.refit_left = None, True
        self._seconds: dict = {}  # alpha -> seconds of its finished fits
        self._lock = threading.Lock()

    def start_round(self, alphas: list, later: dict, refit_alpha) -> None:
        with self._lock:
            self.round_left, self.later, self.refit_alpha = list(alphas), dict(later), refit_alpha

    def reused(self, alpha) -> None:
        with self._lock:
            self.done += 1
            self._finish(alpha)

    def fitted(self, alpha, line: str, seconds: float) -> None:
        with self._lock:
            self.done += 1
            self._seconds.setdefault(alpha, []).append(seconds)
            self._finish(alpha)
            self.log(f"  fit {self.done}{self._counts()} {line}{self._eta()}")

    def refitted(self, line: str, seconds: float) -> None:
        with self._lock:
            self.done += 1
            self.refit_left = False
            self.log(f"  fit {self.done} of {self.done} {line}")

    def _finish(self, alpha) -> None:
        if alpha in self.round_left:
            self.round_left.remove(alpha)

    def _counts(self) -> str:
        sure = self.done + len(self.round_left) + self.refit_left
        most = sure + sum(self.later.values())
        return f" of {sure}" + (f" (at most {most})" if most > sure else "")

    def _estimate(self, alpha) -> float | None:
        own = self._seconds.get(alpha)
        every = [s for seconds in self._seconds.values() for s in seconds]
        if not every:
            return None
        return sum(own) / len(own) if own else sum(every) / len(every)

    def _eta(self) -> str:
        if not self.round_left and not self.refit_left:
            return ""
        side_by_side = max(1, min(self.workers, len(self.round_left)))
        round_s = sum(self._estimate(alpha) or 0.0 for alpha in self.round_left) / side_by_side
        refit_s = (self._estimate(self.refit_alpha) or 0.0) * self.refit_scale if self.refit_left else 0.0
        later_s = sum((self._estimate(alpha) or 0.0) * n for alpha, n in self.later.items())
        low, high = round_s + refit_s, round_s + refit_s + later_s / max(1, min(self.workers, len(self.later)))
        if format_seconds(high) == format_seconds(low):
            return f"; about {format_seconds(low)} left"
        return f"; {format_seconds(low)} to {format_seconds(high)} left"  # the walk decides how far it goes

    def say(self, line: str) -> None:
        with self._lock:
            self.log(line)

    def watch(self, label: str, stop: threading.Event):
        """A fit's ``should_stop``: true once ``stop`` is set; meanwhile, a line every
        ``HEARTBEAT_S`` seconds, so a slow fit (minutes on a loaded machine) is seen to be working."""
        started = last = time.perf_counter()
        passes = 0

        def should_stop() -> bool:
            nonlocal last, passes
            now = time.perf_counter()
            if passes and now - last >= HEARTBEAT_S:
                last = now
                self.say(f"  ... {label}: still fitting, {passes} passes over the data in {format_seconds(now - started)}")
            passes += 1
            return stop.is_set()

        return should_stop


def format_seconds(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def run_chains(chain, keys: list, workers: int, stop: threading.Event) -> list:
    """``[chain(key) for key in keys]``, on up to ``workers`` threads; in the calling thread when
    ``workers`` is 1. On any exception (Ctrl-C included) ``stop`` is set, so the fits running
    elsewhere give up at their next pass, and the exception goes on once every thread is done."""
    if workers <= 1 or len(keys) <= 1:
        return [chain(key) for key in keys]
    from concurrent.futures import ThreadPoolExecutor

    try:
        from threadpoolctl import threadpool_limits
        one_blas_thread = threadpool_limits(limits=1, user_api="blas")  # the fit threads already fill the cores
    except ImportError:
        from contextlib import nullcontext
        one_blas_thread = nullcontext()
    with one_blas_thread:
        pool = ThreadPoolExecutor(max_workers=min(workers, len(keys)), thread_name_prefix="ksae-fit")
        try:
            futures = [pool.submit(chain, key) for key in keys]
            return [future.result() for future in futures]
        except BaseException:
            stop.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

"""Running the (alpha, L2) grid of :mod:`ksae_cupy.evaluation.features`: finished fits kept on
disk, fits run side by side, and a progress line per fit.

* :class:`FitStore` keeps every finished fit (its trial row and its weights) in
  ``RUN_DIR/eval-fits.npz``, rewritten atomically after each fit, so an evaluation stopped
  by Ctrl-C (or killed) is continued by running the same command again. The file names
  what the fits were made from (the checkpoint's bytes, the data, the fit settings); fits
  made from anything else are ignored. A finished evaluation removes it.
* :func:`run_chains` runs one chain of fits per alpha (its L2 values strongest first, each
  fit warm-started from the last) on ``workers`` threads. The classifier's time goes to
  SciPy's sparse products and NumPy, which release the GIL, so threads run in parallel
  and share the features without copies.
* :class:`GridProgress` prints one line per fit with an estimate of the time left.
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


def fingerprint(checkpoint_path: Path, dataset, **settings) -> str:
    """What a stored fit depends on: the checkpoint's bytes, the training and validation data
    (their labels whole, every thousandth row of their examples) and the fit settings."""
    digest = hashlib.sha256()
    with open(checkpoint_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    for array in (dataset.X_train, dataset.y_train, dataset.X_valid, dataset.y_valid):
        array = np.asarray(array)
        digest.update(repr((array.shape, array.dtype.str)).encode())
        sample = array[:: max(1, len(array) // 1000)] if array.ndim > 1 else array
        digest.update(np.ascontiguousarray(sample).tobytes())
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
    """One line per fit: ``fit 5/13 ...; about 40 s left`` (mean time of the fits made so far,
    times those left, divided by the fits running side by side)."""

    def __init__(self, total: int, workers: int, log):
        self.total, self.workers, self.log = total, max(1, workers), log
        self.done, self.made_seconds, self.made = 0, 0.0, 0
        self._lock = threading.Lock()

    def reused(self, n: int = 1) -> None:
        with self._lock:
            self.done += n

    def fitted(self, line: str, seconds: float) -> None:
        with self._lock:
            self.done += 1
            self.made += 1
            self.made_seconds += seconds
            left = self.total - self.done
            eta = ""
            if left > 0:
                eta = f"; about {format_seconds(self.made_seconds / self.made * left / min(self.workers, left))} left"
            self.log(f"  fit {self.done}/{self.total} {line}{eta}")

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

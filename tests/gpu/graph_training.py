"""The small training problem of the GPU graph tests (test_graph_step.py, test_graph_epoch.py).

Its data and configuration, a run of it on either device (stopped mid-epoch and resumed from its
checkpoint where asked, as ``--resume`` does), and the check that two runs trained alike.
"""
from __future__ import annotations

import numpy as np
import pytest

from ksae_cupy.backend import resolve_device, to_host
from ksae_cupy.training.trainer import TrainConfig, Trainer

N, D, H = 50, 16, 32  # batches of 8: six full ones and a last one of 2 rows (a second step size in the graphs)


class StepGraphTrainer(Trainer):
    """The path before the epoch graph: the parts between cuBLAS products captured, one call per step
    (the default on a GPU is one graph per epoch)."""

    gpu_epoch_graph = False


def data(seed=0, rows=N, cols=D):
    """``(X, V)``: Gaussian rows, and their first 12 as the validation rows."""
    X = np.random.default_rng(seed).standard_normal((rows, cols))
    return X, X[:12]


def config(**changes):
    values = dict(hidden=H, k=4, k_start=None, epochs=3, batch_size=8, lr=0.01, momentum=0.9, dtype="float64",
                  topk="threshold", seed=5, dead_window=20)
    values.update(changes)
    return TrainConfig(**values)


def device_data(device: str, cfg, shape=(N, D)):
    """``(backend, X, V)``: the data of ``shape`` on ``device``, in ``cfg``'s dtype."""
    backend = resolve_device(device)
    X_host, V_host = data(rows=shape[0], cols=shape[1])
    return backend, backend.asarray(X_host.astype(cfg.dtype)), backend.asarray(V_host.astype(cfg.dtype))


def stop_after(trainer, batches: int):
    """An ``on_batch`` callback that asks ``trainer`` to stop once ``batches`` batches ran."""
    count = [0]

    def on_batch(done, total):
        count[0] += 1
        trainer.stop_requested = count[0] >= batches

    return on_batch


def fit(cfg, device: str, cls=Trainer, stop_after_batches: int | None = None, resume_cls=None, resume_on=None,
        shape=(N, D)):
    """``(trainer, reports)`` of ``cfg`` trained on ``device`` by a ``cls``; with ``stop_after_batches``,
    stopped once that many batches ran, then resumed from its checkpoint by a new ``resume_cls``
    (default ``cls``) on ``resume_on`` (default ``device``)."""
    backend, X, V = device_data(device, cfg, shape)
    trainer = cls(cfg, backend, D=shape[1])
    reports = []
    if stop_after_batches is not None:
        trainer.fit(X, V, on_epoch=reports.append, on_batch=stop_after(trainer, stop_after_batches))
        assert trainer.batch_in_epoch, "the run must stop mid-epoch"
        batches_per_epoch = -(-shape[0] // cfg.batch_size)
        assert (trainer.epoch, trainer.batch_in_epoch) == divmod(stop_after_batches, batches_per_epoch)
        backend, X, V = device_data(resume_on or device, cfg, shape)
        trainer = (resume_cls or cls)(cfg, backend, D=shape[1], checkpoint=trainer.checkpoint())
    trainer.fit(X, V, on_epoch=reports.append)
    return trainer, reports


def host(trainer):
    return {name: to_host(value) for name, value in trainer.params.items()}


def assert_same_training(run, run_reports, ref, ref_reports, rtol=1e-9, atol=1e-12, loss_rtol=None):
    """Parameters, epoch reports and dead-unit counts agree (float64 against the CPU: to rounding); the
    losses to ``loss_rtol`` (default ``rtol``)."""
    loss_rtol = rtol if loss_rtol is None else loss_rtol
    for name, value in host(ref).items():
        np.testing.assert_allclose(host(run)[name], value, rtol=rtol, atol=atol, err_msg=name)
    for g, c in zip(run_reports, ref_reports, strict=True):
        assert (g.k, g.train_loss, g.valid_loss) == (c.k, pytest.approx(c.train_loss, rel=loss_rtol),
                                                     pytest.approx(c.valid_loss, rel=loss_rtol))
        assert (g.dead_fraction, g.dead_window_fraction) == (c.dead_fraction, c.dead_window_fraction)
        assert (g.fve, g.valid_fve) == (pytest.approx(c.fve, rel=rtol), pytest.approx(c.valid_fve, rel=rtol))
        if g.aux_loss is not None or c.aux_loss is not None:
            assert g.aux_loss == pytest.approx(c.aux_loss, rel=rtol)
    np.testing.assert_array_equal(to_host(run.since_kept_h), to_host(ref.since_kept_h))

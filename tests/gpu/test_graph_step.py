"""The trainer's GPU step captured as a CUDA graph (ksae_cupy/gpu/graph_step.py) against the CPU trainer.

On a GPU with CuPy these run the real capture and replay; elsewhere the CuPy stand-in, which records
captured work instead of running it, replays it on launch, and refuses any allocation or read-back
during capture (tests/cupy_standin/README.md). The reference is the CPU trainer of the same seed: the
same batches, initial weights and kept units, so in float64 the two runs agree to rounding.
"""
from __future__ import annotations

import numpy as np
import pytest

from ksae_cupy.backend import resolve_device, to_host
from ksae_cupy.training.trainer import TrainConfig, Trainer


class StepGraphTrainer(Trainer):
    """The trainer with the step graphs these tests are about (the default on a GPU is one graph per epoch,
    tests/gpu/test_graph_epoch.py)."""

    gpu_epoch_graph = False

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_cupy")]

N, D, H = 50, 16, 32  # batches of 8: six full ones and a last one of 2 rows (a second captured step)


def data(seed=0):
    X = np.random.default_rng(seed).standard_normal((N, D))
    return X, X[:12]


def config(**changes):
    values = dict(hidden=H, k=4, k_start=None, epochs=3, batch_size=8, lr=0.01, momentum=0.9, dtype="float64",
                  topk="threshold", seed=5, dead_window=20)
    values.update(changes)
    return TrainConfig(**values)


def fit(cfg, device: str, stop_after_batches: int | None = None):
    """``(trainer, reports)`` of ``cfg`` trained on ``device``; with ``stop_after_batches``, stopped once
    that many batches ran, then resumed from its checkpoint in a new trainer (as ``--resume`` does)."""
    backend = resolve_device(device)
    X_host, V_host = data()
    X, V = backend.asarray(X_host), backend.asarray(V_host)
    trainer = StepGraphTrainer(cfg, backend, D=D)
    reports = []
    if stop_after_batches is not None:
        def on_batch(done, total, count=[0]):
            count[0] += 1
            trainer.stop_requested = count[0] >= stop_after_batches

        trainer.fit(X, V, on_epoch=reports.append, on_batch=on_batch)
        trainer = StepGraphTrainer(cfg, backend, D=D, checkpoint=trainer.checkpoint())
    trainer.fit(X, V, on_epoch=reports.append)
    return trainer, reports


def host(trainer):
    return {name: to_host(value) for name, value in trainer.params.items()}


def assert_same_training(gpu, gpu_reports, cpu, cpu_reports):
    """The two trainers' parameters, epoch reports and dead-unit counts agree (float64: to rounding)."""
    for name, value in host(cpu).items():
        np.testing.assert_allclose(host(gpu)[name], value, rtol=1e-9, atol=1e-12, err_msg=name)
    for g, c in zip(gpu_reports, cpu_reports, strict=True):
        assert (g.k, g.train_loss, g.valid_loss) == (c.k, pytest.approx(c.train_loss, rel=1e-10),
                                                     pytest.approx(c.valid_loss, rel=1e-10))
        assert (g.dead_fraction, g.dead_window_fraction) == (c.dead_fraction, c.dead_window_fraction)
        assert (g.fve, g.valid_fve) == (pytest.approx(c.fve, rel=1e-9), pytest.approx(c.valid_fve, rel=1e-9))
        # The captured step counts no non-zero codes: linear units keep k; relu ones are not counted there.
        assert g.l0 == (c.l0 if gpu.config.activation == "linear" else None) and g.valid_l0 == c.valid_l0
    np.testing.assert_array_equal(to_host(gpu.since_kept_h), to_host(cpu.since_kept_h))


# ReLU at k = 20 of 32: some kept units are negative, so the clip acts (at k = 4 none is, in this data).
@pytest.mark.parametrize("topk, activation, k", [("threshold", "linear", 4), ("sort", "linear", 4),
                                                 ("threshold", "relu", 20)])
def test_captured_steps_equal_the_cpu_trainer(topk, activation, k):
    cfg = config(topk=topk, activation=activation, k=k)
    gpu, gpu_reports = fit(cfg, "gpu")
    cpu, cpu_reports = fit(cfg, "cpu")
    # The step was captured (one graph per batch size: 8 and the last batch's 2) and replayed.
    steps = gpu._captured._steps
    assert sorted(steps) == [2, 8]
    for step in steps.values():  # every part between the products, except any the pool allocated in (said on stderr)
        assert {f"GraphStep.{part}" for part in ("_select", "_residual", "_mask_to_kept", "_momentum_update")} \
            <= set(step.graphs)
    assert_same_training(gpu, gpu_reports, cpu, cpu_reports)
    assert gpu.step == cpu.step == 3 * 7


def test_a_run_stopped_mid_epoch_resumes_to_the_uninterrupted_run():
    cfg = config()
    whole, whole_reports = fit(cfg, "gpu")
    resumed, resumed_reports = fit(cfg, "gpu", stop_after_batches=10)  # epoch 2, batch 3
    for name, value in host(whole).items():
        np.testing.assert_allclose(host(resumed)[name], value, rtol=1e-12, atol=1e-14, err_msg=name)
    # The resumed epoch's report counts the batches before the stop too (the epoch's tally was checkpointed).
    assert [r.train_loss for r in resumed_reports] == pytest.approx([r.train_loss for r in whole_reports], rel=1e-12)
    assert [r.fve for r in resumed_reports] == pytest.approx([r.fve for r in whole_reports], rel=1e-12)
    assert [(r.dead_fraction, r.l0) for r in resumed_reports] == [(r.dead_fraction, r.l0) for r in whole_reports]


def test_the_sparsity_schedule_recaptures_at_each_new_k_and_matches_the_cpu():
    cfg = config(k_start=12, epochs=4, k_schedule_epochs=3)
    gpu, gpu_reports = fit(cfg, "gpu")
    cpu, cpu_reports = fit(cfg, "cpu")
    assert len(set(r.k for r in gpu_reports)) > 1
    assert gpu._captured._key[0] == gpu_reports[-1].k  # the graphs held now are the last k's
    assert_same_training(gpu, gpu_reports, cpu, cpu_reports)


def test_every_option_takes_the_captured_step_on_the_gpu_and_none_on_the_cpu():
    for cfg in (config(), config(activation="relu"), config(aux_k=8)):
        assert StepGraphTrainer(cfg, resolve_device("gpu"), D=D)._captured is not None
    assert StepGraphTrainer(config(), resolve_device("cpu"), D=D)._captured is None


@pytest.mark.parametrize("aux_k, activation", [(8, "linear"), (30, "linear"), (8, "relu")])  # 30: at times fewer dead
def test_captured_auxk_steps_equal_the_cpu_trainer(aux_k, activation):
    cfg = config(aux_k=aux_k, aux_coef=0.25, dead_window=12, epochs=4, activation=activation)
    gpu, gpu_reports = fit(cfg, "gpu")
    cpu, cpu_reports = fit(cfg, "cpu")
    assert gpu._captured._steps[8].auxk is not None
    assert "AuxKParts._select_dead" in gpu._captured._steps[8].graphs
    assert_same_training(gpu, gpu_reports, cpu, cpu_reports)
    assert [g.aux_loss for g in gpu_reports] == pytest.approx([c.aux_loss for c in cpu_reports], rel=1e-9)
    assert any(r.aux_loss > 0 for r in gpu_reports)  # units were dead: the auxiliary loss did act


def test_a_checkpoint_taken_mid_epoch_without_stopping_resumes_to_the_uninterrupted_run():
    # As ksae-train's checkpoint every few minutes does: taken from on_batch while the epoch goes on.
    cfg = config()
    whole, whole_reports = fit(cfg, "gpu")
    backend = resolve_device("gpu")
    X_host, V_host = data()
    X, V = backend.asarray(X_host), backend.asarray(V_host)
    trainer, taken = StepGraphTrainer(cfg, backend, D=D), []

    def on_batch(done, total):
        if trainer.epoch == 1 and done == 3 and not taken:
            taken.append(trainer.checkpoint())

    trainer.fit(X, V, on_batch=on_batch)
    resumed, reports = StepGraphTrainer(cfg, backend, D=D, checkpoint=taken[0]), []
    resumed.fit(X, V, on_epoch=reports.append)
    for name, value in host(whole).items():
        np.testing.assert_allclose(host(resumed)[name], value, rtol=1e-12, atol=1e-14, err_msg=name)
    # The resumed epoch's report counts the three batches before the checkpoint too.
    assert [r.train_loss for r in reports] == pytest.approx([r.train_loss for r in whole_reports[1:]], rel=1e-12)
    assert [r.fve for r in reports] == pytest.approx([r.fve for r in whole_reports[1:]], rel=1e-12)
    assert [(r.dead_fraction, r.l0) for r in reports] == [(r.dead_fraction, r.l0) for r in whole_reports[1:]]

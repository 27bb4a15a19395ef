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

import graph_training
from graph_training import D, StepGraphTrainer, config, device_data, host

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_cupy")]


def fit(cfg, device: str, stop_after_batches: int | None = None):
    """graph_training.fit by the trainer with the step graphs these tests are about (the default on a GPU
    is one graph per epoch, tests/gpu/test_graph_epoch.py)."""
    return graph_training.fit(cfg, device, cls=StepGraphTrainer, stop_after_batches=stop_after_batches)


def assert_same_training(gpu, gpu_reports, cpu, cpu_reports):
    """The two trainers trained alike (graph_training.assert_same_training, the losses to 1e-10), and
    the reports' counts of non-zero codes agree."""
    graph_training.assert_same_training(gpu, gpu_reports, cpu, cpu_reports, loss_rtol=1e-10)
    for g, c in zip(gpu_reports, cpu_reports, strict=True):
        # The captured step counts no non-zero codes: linear units keep k; relu ones are not counted there.
        assert g.l0 == (c.l0 if gpu.config.activation == "linear" else None) and g.valid_l0 == c.valid_l0


def assert_resumed_to(resumed, resumed_reports, whole, whole_reports):
    """The resumed run ends where the uninterrupted one ends, to rounding, and its epoch reports are
    ``whole_reports`` (the resumed epoch's counts the batches before the stop too: the epoch's tally
    was checkpointed)."""
    for name, value in host(whole).items():
        np.testing.assert_allclose(host(resumed)[name], value, rtol=1e-12, atol=1e-14, err_msg=name)
    assert [r.train_loss for r in resumed_reports] == pytest.approx([r.train_loss for r in whole_reports], rel=1e-12)
    assert [r.fve for r in resumed_reports] == pytest.approx([r.fve for r in whole_reports], rel=1e-12)
    assert [(r.dead_fraction, r.l0) for r in resumed_reports] == [(r.dead_fraction, r.l0) for r in whole_reports]


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
    assert_resumed_to(resumed, resumed_reports, whole, whole_reports)


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
    backend, X, V = device_data("gpu", cfg)
    trainer, taken = StepGraphTrainer(cfg, backend, D=D), []

    def on_batch(done, total):
        if trainer.epoch == 1 and done == 3 and not taken:
            taken.append(trainer.checkpoint())

    trainer.fit(X, V, on_batch=on_batch)
    resumed, reports = StepGraphTrainer(cfg, backend, D=D, checkpoint=taken[0]), []
    resumed.fit(X, V, on_epoch=reports.append)
    # The resumed epoch's report counts the three batches before the checkpoint too.
    assert_resumed_to(resumed, reports, whole, whole_reports[1:])


@pytest.mark.parametrize("cls", [graph_training.Trainer, graph_training.StepGraphTrainer])
def test_the_captured_update_flushes_planted_denormals_to_zero(cls):
    """Velocities planted at the smallest denormal (a dead unit's, decayed) hold no denormal after one more
    epoch of the GPU step (one graph per epoch, and step graphs), as on the CPU (tests/cpu/test_denormals...)."""
    cfg = config(dtype="float32", epochs=2, hidden=400)  # 50 rows keep at most 200 of the 400 units an epoch
    backend, X, V = device_data("gpu", cfg)
    trainer = cls(cfg, backend, D=D)
    trainer.run_epoch(X, V)
    smallest = np.nextafter(np.float32(0), np.float32(1))
    for velocity in trainer.optimizer.velocities.values():
        velocity[...] = backend.asarray(np.full(velocity.shape, smallest, dtype=np.float32))
    trainer.run_epoch(X, V)
    for group in (trainer.params, trainer.optimizer.velocities):
        for name, value in group.items():
            a = to_host(value)
            assert not np.any((a != 0) & (np.abs(a) < np.finfo(np.float32).tiny)), name

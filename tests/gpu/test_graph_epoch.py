"""The trainer's epoch on a GPU as one CUDA graph (ksae_cupy/gpu/graph_epoch.py).

On a GPU with CuPy these run the real capture and replay; elsewhere the CuPy stand-in, which records
captured work instead of running it, replays it at each launch, runs our kernels (products, top-k,
masks) in the host emulator, and refuses any allocation, read-back or cuBLAS call during capture
(tests/cupy_standin/README.md). References: the CPU trainer of the same seed (float64: the same
batches, weights and kept units, so the runs agree to rounding) and the step graphs of
ksae_cupy/gpu/graph_step.py, the path before this one (float32, as the GPU trains).
"""
from __future__ import annotations

import pytest

from ksae_cupy.gpu import graph_epoch, products
from ksae_cupy.gpu.graph_epoch import EpochGraph
from ksae_cupy.gpu.graph_step import GraphStep
from ksae_cupy.training.trainer import Trainer

from graph_training import D, StepGraphTrainer, assert_same_training, config, device_data, fit

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_cupy")]


class HostOrderTrainer(Trainer):
    """The epoch graph with each epoch's order drawn on the host and copied in."""

    gpu_order_on_device = False


# ReLU at k = 20 of 32: some kept units are negative, so the clip acts. AuxK at 30: at times fewer units
# are dead than it asks for.
CASES = {"linear-threshold": {}, "linear-sort": dict(topk="sort"), "relu": dict(activation="relu", k=20),
         "auxk": dict(aux_k=8, aux_coef=0.25, dead_window=12, epochs=4),
         "auxk-few-dead": dict(aux_k=30, aux_coef=0.25, dead_window=12, epochs=4),
         "auxk-relu": dict(aux_k=8, aux_coef=0.25, dead_window=12, epochs=4, activation="relu")}


@pytest.mark.parametrize("case", [*CASES, "host-order"])
def test_the_epoch_graph_equals_the_cpu_trainer(case):
    cfg = config(**CASES.get(case, {}))
    gpu, gpu_reports = fit(cfg, "gpu", cls=HostOrderTrainer if case == "host-order" else Trainer)
    cpu, cpu_reports = fit(cfg, "cpu")
    epoch_graph = gpu._captured
    assert isinstance(epoch_graph, EpochGraph)
    # The first epoch warms up (uncaptured); every later one is one launch of the one graph captured.
    assert (epoch_graph.captures, epoch_graph.launches) == (1, cfg.epochs - 1)
    assert sorted(epoch_graph._steps) == [2, 8]
    assert_same_training(gpu, gpu_reports, cpu, cpu_reports)
    assert gpu.step == cpu.step == cfg.epochs * 7
    if cfg.aux_k:
        assert any(r.aux_loss > 0 for r in gpu_reports)  # units were dead: the auxiliary loss did act


@pytest.mark.parametrize("case", ["linear", "relu", "auxk", "k-schedule", "split-encoder"])
def test_the_epoch_graph_equals_the_step_graphs_in_float32(case):
    """The brief's shapes (N 64, D 20, H 48, k 5; batches of 12, the last of 4), float32 as the GPU trains:
    the epoch graph (our products) against the step graphs (cuBLAS products) after four epochs. With
    D 300 the encoder's GEMM (one tile, K 300) is split along K in two."""
    changes = {"linear": {}, "relu": dict(activation="relu", k=30),
               "auxk": dict(aux_k=10, aux_coef=0.5, dead_window=24),
               "k-schedule": dict(k_start=20, k_schedule_epochs=4), "split-encoder": {}}[case]
    shape = (64, 300) if case == "split-encoder" else (64, 20)
    cfg = config(**{**dict(hidden=48, k=5, batch_size=12, epochs=4, dtype="float32", lr=0.003), **changes})
    new, new_reports = fit(cfg, "gpu", shape=shape)
    old, old_reports = fit(cfg, "gpu", cls=StepGraphTrainer, shape=shape)
    assert new._captured.launches >= 1
    assert (new._captured._steps[12].gemm_workspace is not None) == (case == "split-encoder")
    assert_same_training(new, new_reports, old, old_reports, rtol=2e-5, atol=1e-6)


def test_after_the_first_epoch_no_step_runs_outside_the_graph(monkeypatch):
    """Every product, sum and gather of epochs 2 and 3, and the draw of their orders, is recorded into the
    capture (none queued from the host per step), and each of those epochs is one graph launch."""
    calls = []
    run, gather, draw = products._run, GraphStep.gather_rows, graph_epoch.permutation_gpu

    def spy_run(plan):
        calls.append(("kernel", _capturing()))
        run(plan)

    def spy_gather(self, rows_b):
        calls.append(("gather", _capturing()))
        gather(self, rows_b)

    def spy_draw(order_n, words):
        calls.append(("order", _capturing()))
        draw(order_n, words)

    monkeypatch.setattr(products, "_run", spy_run)
    monkeypatch.setattr(GraphStep, "gather_rows", spy_gather)
    monkeypatch.setattr(graph_epoch, "permutation_gpu", spy_draw)
    cfg = config(epochs=3)
    backend, X, _ = device_data("gpu", cfg)
    trainer = Trainer(cfg, backend, D=D)
    seen = []
    trainer.fit(X, on_epoch=lambda report: seen.append((len(calls), trainer._captured.launches)))
    first, second, third = seen
    # Epoch 1: the order drawn, then 7 steps of 5 products and sums (2 GEMMs, 2 sparse products, the loss)
    # and a gather each,
    # queued one by one.
    per_epoch = 1 + 7 * 6
    assert first == (per_epoch, 0) and not any(capturing for _, capturing in calls[:first[0]])
    assert calls[0][0] == "order" and [kind for kind, _ in calls].count("order") == 2
    # Epoch 2: the same calls, every one recorded in the capture; then one launch.
    assert second == (2 * per_epoch, 1) and all(capturing for _, capturing in calls[first[0]:])
    # Epoch 3: no call at all from the host, the graph launched again.
    assert third == (2 * per_epoch, 2)


def _capturing() -> bool:
    import cupy

    return bool(cupy.cuda.get_current_stream().is_capturing())


def test_the_k_schedule_recaptures_at_each_new_k_and_matches_the_cpu():
    cfg = config(k_start=12, epochs=5, k_schedule_epochs=4)
    gpu, gpu_reports = fit(cfg, "gpu")
    cpu, cpu_reports = fit(cfg, "cpu")
    ks = [r.k for r in gpu_reports]
    assert len(set(ks)) > 2 and ks[-1] == ks[-2]
    # One capture per epoch after the first whose k is new; the last k's graph launched twice.
    assert gpu._captured.captures == 1 + sum(1 for i in range(2, len(ks)) if ks[i] != ks[i - 1])
    assert gpu._captured.launches == cfg.epochs - 1
    assert gpu._captured._key[0] == ks[-1]
    assert_same_training(gpu, gpu_reports, cpu, cpu_reports)


@pytest.mark.parametrize("stopped_on", ["cpu", "step graphs"])
def test_a_run_stopped_mid_epoch_resumes_on_the_epoch_graph(stopped_on):
    """A checkpoint taken mid-epoch (batch 3 of epoch 2) by the CPU trainer or the step graphs resumes
    on the epoch graph from batch 3 of that epoch's order, and the run ends where the uninterrupted
    CPU run ends; the resumed trainer's later epochs are captured."""
    cfg = config(epochs=4)
    whole, whole_reports = fit(cfg, "cpu")
    stopped_device, stopped_cls = ("cpu", Trainer) if stopped_on == "cpu" else ("gpu", StepGraphTrainer)
    # Stopped after 10 batches: at batch 3 of epoch 2 (7 batches an epoch).
    resumed, reports = fit(cfg, stopped_device, cls=stopped_cls, stop_after_batches=10, resume_cls=Trainer,
                           resume_on="gpu")
    assert isinstance(resumed._captured, EpochGraph)
    # The resumed epoch (its checkpointed order) and the next (the first order the device draws) run
    # uncaptured, the warm-up; the last as the one graph.
    assert (resumed._captured.captures, resumed._captured.launches) == (1, 1)
    assert_same_training(resumed, reports, whole, whole_reports)
    assert resumed.step == whole.step


def test_a_stop_request_takes_effect_at_the_end_of_the_epoch():
    cfg = config(epochs=3)
    backend, X, _ = device_data("gpu", cfg)
    trainer, progress = Trainer(cfg, backend, D=D), []

    def on_batch(done, total):
        progress.append((done, total))
        trainer.stop_requested = True

    trainer.fit(X, on_batch=on_batch)
    # The graph ran the whole epoch: the progress callback hears it once, the run stops after it.
    assert progress == [(7, 7)]
    assert (trainer.epoch, trainer.step, trainer.batch_in_epoch) == (1, 7, 0)

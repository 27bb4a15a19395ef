"""``ksae-bench train --device gpu`` (ksae_cupy/bench/train_gpu.py): the epochs of a fresh and of a trained model,
side by side, each contender checked before it is timed. On a GPU, and elsewhere against the CuPy stand-in
(tests/cupy_standin), where the timings mean nothing but what is trained, checked and recorded does."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy import paper
from ksae_cupy.bench import trained
from ksae_cupy.bench.train_gpu import Contender, Divergence, measure, model_loss, weights_digest

TINY = dict(D=16, H=32, k=4, batch=8, rows=64, epochs=1, topk_methods=("sort",), lr=0.05)
TRAINER_KINDS = ("trainer_epoch_graph_sort", "trainer_epoch_graph_host_order_sort", "trainer_graph_sort",
                 "trainer_generic_sort")


def tiny_rows(n: int = 64, D: int = 16) -> np.ndarray:
    """The rows the bench takes where D is not MNIST's: random, 19% non-zero (ksae_cupy.bench.train_cpu)."""
    from ksae_cupy.bench.train_cpu import mnist_inputs

    return mnist_inputs(D, n, max(1, n // 5))


@pytest.mark.gpu
def test_the_gpu_bench_times_a_trained_model_beside_the_fresh_one(tmp_path, gpu_cupy):
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.bench.train_gpu import bench_train_gpu
    from ksae_cupy.model import init_params

    out = bench_train_gpu(resolve_device("gpu"), trained_epochs=2, out_dir=tmp_path, log=lambda *_: None, **TINY)
    data = json.loads(open(out["path"]).read())
    assert data["meta"]["device"] != "cpu" and data["meta"]["commit"]
    starts, results = data["starts"], data["results"]
    assert set(starts) == set(results) == {"fresh", "trained"}
    # The fresh model is ksae-train's initial weights; the trained one, 2 epochs of ksae-train's training later.
    fresh_W = init_params(16, 32, paper.SIGMA, np.random.default_rng(0))["W_dh"]
    assert starts["fresh"]["epoch"] == 0 and starts["fresh"]["W_dh_sha256"] == weights_digest({"W_dh": fresh_W})
    assert starts["trained"]["epoch"] == 2 and starts["trained"]["W_dh_sha256"] != starts["fresh"]["W_dh_sha256"]
    assert starts["trained"]["made"].startswith("trained here: 2 epochs at lr 0.05")
    assert starts["trained"]["start_loss"] < starts["fresh"]["start_loss"] == data["config"]["untrained_loss"]
    for which, epoch in (("fresh", 0), ("trained", 2)):
        assert set(results[which]) >= set(TRAINER_KINDS)
        for name in TRAINER_KINDS:  # every GPU path of the trainer, from that start, checked then timed
            record = results[which][name]
            assert record["from_epoch"] == epoch, (which, name, record)
            assert "seconds_per_epoch" in record and "diverged" not in record, (which, name, record)
            # ksae-train's first epoch runs uncaptured, its second captures: both before the timed one
            assert record["warmup_epochs"] == (1 if name == "trainer_generic_sort" else 2), (name, record)
            assert len(record["epoch_losses"]) == record["warmup_epochs"] + 1
            assert all(np.isfinite(record["epoch_losses"]))
    assert results["trained"]["trainer_epoch_graph_sort"]["path"].startswith("Trainer.run_epoch (one CUDA graph per epoch")
    assert set(data["trained_over_fresh"]) == set(TRAINER_KINDS)
    if data["torch"] is None:  # no torch with CUDA beside the GPU: recorded absent, never timed
        assert data["absent"]["torch"] and not {"torch", "torch_cuda_graph"} & set(results["trained"])


@pytest.mark.gpu
def test_the_gpu_bench_times_the_given_runs_model(tmp_path, gpu_cupy):
    """--from-run: the trained contenders start from that checkpoint's weights (here one trained on the CPU)."""
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.bench.train_gpu import bench_train_gpu

    X_train, X_valid, _what = tiny_rows()
    start = trained.trained_here(resolve_device("cpu"), X_train, X_valid, 32, 4, 8, "sort", 3, 0.05, log=lambda *_: None)
    out = bench_train_gpu(resolve_device("gpu"), from_run=start, write=False, log=lambda *_: None, **TINY)
    said = out["starts"]["trained"]
    assert said["W_dh_sha256"] == weights_digest(start.checkpoint.params)
    assert (said["epoch"], said["made"], said["lr"]) == (3, start.made, 0.05)
    assert said["start_loss"] == pytest.approx(model_loss(start.checkpoint.params, X_train, 4))
    assert all(out["results"]["trained"][name]["from_epoch"] == 3 for name in TRAINER_KINDS)


@pytest.mark.gpu
def test_a_run_that_diverges_is_recorded_diverged_and_not_timed(gpu_cupy):
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.bench.train_gpu import bench_train_gpu

    out = bench_train_gpu(resolve_device("gpu"), trained_epochs=0, write=False, log=lambda *_: None,
                          **dict(TINY, lr=100.0))
    assert set(out["results"]) == {"fresh"}  # --trained-epochs 0: the fresh model only
    for name in TRAINER_KINDS:
        record = out["results"]["fresh"][name]
        assert "diverged" in record and "seconds_per_epoch" not in record, (name, record)
    assert out["trained_over_fresh"] == {}


def test_fewer_rows_than_a_batch_are_refused():
    from ksae_cupy.bench.train_gpu import bench_train_gpu
    from ksae_cupy.errors import KsaeError

    with pytest.raises(KsaeError, match=r"--rows 4 is not allowed; use at least --batch-size \(8\) rows"):
        bench_train_gpu(SimpleNamespace(is_gpu=True), **dict(TINY, rows=4))


def test_the_cli_takes_the_gpu_bench_with_its_trained_model(tmp_path, monkeypatch):
    """The GPU branch of ksae-bench train passes the trained model's options on (the bench itself is
    stubbed: its runs are the tests above)."""
    from ksae_cupy.bench import train_gpu
    from ksae_cupy.cli.bench import bench_command

    gpu = SimpleNamespace(is_gpu=True, description="a GPU", name="gpu:0", gpu_index=0)
    monkeypatch.setattr("ksae_cupy.backend.resolve_device", lambda name: gpu)
    monkeypatch.setattr("ksae_cupy.training.options.check_training_memory", lambda *a, **k: None)
    seen = {}

    def fake_bench(backend, **options):
        seen.update(options)
        return {"path": str(tmp_path / "x.json"), "meta": {}}

    monkeypatch.setattr(train_gpu, "bench_train_gpu", fake_bench)
    result = CliRunner().invoke(bench_command, ["train", "--device", "gpu", "--hidden", "32", "--dim", "16", "--k", "4",
                                                "--trained-epochs", "7", "--epoch-repeats", "2", "--rows", "64",
                                                "--no-torch", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (seen["trained_epochs"], seen["epochs"], seen["rows"], seen["include_torch"], seen["from_run"]) == \
        (7, 2, 64, False, None)


# ------------------------------------------------------------------------------------------------
# The check before the timing (no GPU needed).

def fake_contender(epoch_losses):
    """A contender whose epochs lose ``epoch_losses`` in turn (each epoch's mean, and its first step's)."""
    losses = iter(epoch_losses)
    return Contender(lambda: [next(losses)], "fake", 5, first_step=True)


def test_a_diverging_contender_gets_no_time():
    limits = Divergence(untrained=50.0, start=4.0)
    steady = measure(fake_contender([4.0, 3.9, 3.9, 3.8]), 3, limits)
    assert "seconds_per_epoch" in steady and steady["from_epoch"] == 5 and len(steady["epoch_times"]) == 3
    for losses, why in (([4.0, 9.0, 3.0, 3.0], "above 2 x the starting model's"),
                        ([4.0, 4.0, 60.0, 4.0], "above the untrained model's"),
                        ([4.0, float("nan"), 4.0, 4.0], "not finite")):
        record = measure(fake_contender(losses), 3, limits)
        assert why in record["diverged"] and "seconds_per_epoch" not in record, record
        assert record["epoch_losses"][1:] == pytest.approx(losses[1:], nan_ok=True)
    # A warm-up that diverged: no epoch is timed at all.
    record = measure(fake_contender([float("inf")]), 3, limits)
    assert "not finite" in record["diverged"] and len(record["epoch_losses"]) == 1


def test_a_contender_that_does_not_train_the_same_model_is_refused():
    record = measure(fake_contender([4.0, 4.0]), 1, Divergence(50.0, 4.0), first_loss=4.1)
    assert "NumPy float64" in record["refused"] and "seconds_per_epoch" not in record
    assert "seconds_per_epoch" in measure(fake_contender([4.0, 4.0]), 1, Divergence(50.0, 4.0), first_loss=4.0)


def test_the_pytorch_contender_starts_from_the_trained_weights_and_a_diverged_one_gets_no_time():
    """PyTorch's step (here eager on the CPU: on a GPU it runs on cuda:N) from a trained model's weights and
    velocities at its rate loses on its first step what NumPy float64 loses on those weights; at a rate where
    it diverges it is recorded diverged, without a time."""
    torch = pytest.importorskip("torch")
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.bench.train_gpu import torch_contender

    X_train, X_valid, _what = tiny_rows()
    start = trained.trained_here(resolve_device("cpu"), X_train, X_valid, 32, 4, 8, "sort", 3, 0.05, log=lambda *_: None)
    limits = Divergence(model_loss(trained.fresh(resolve_device("cpu"), 16, 32, 4, 8, "sort", 0.05).checkpoint.params,
                                   X_train, 4), model_loss(start.checkpoint.params, X_train, 4))
    first = model_loss(start.checkpoint.params, X_train[:8], 4)
    good = measure(torch_contender(torch, "cpu", start.host_state(), X_train, 4, 8, 0.05, paper.MOMENTUM, start.epoch,
                                   captured=False), 2, limits, first)
    assert good["first_step_rel_diff"] <= 1e-5 and "seconds_per_epoch" in good and good["from_epoch"] == 3
    bad = measure(torch_contender(torch, "cpu", start.host_state(), X_train, 4, 8, 100.0, paper.MOMENTUM, start.epoch,
                                  captured=False), 2, limits, first)
    assert bad["first_step_rel_diff"] <= 1e-5  # the same weights: it diverged by its rate
    assert "diverged" in bad and "seconds_per_epoch" not in bad, bad


def test_pytorch_is_left_out_where_the_model_is_not_the_papers():
    """PyTorch's step is the paper's model: beside a start with AuxK (e.g. a --from-run of such a run) it is
    recorded absent, with why, rather than timed on another model."""
    import dataclasses

    from ksae_cupy.backend import resolve_device
    from ksae_cupy.bench.train_gpu import contenders

    plain = trained.fresh(resolve_device("cpu"), 16, 32, 4, 8, "sort", 0.05)
    auxk = trained.TrainedStart(dataclasses.replace(plain.checkpoint, config={**plain.checkpoint.config, "aux_k": 8}),
                                "a run with AuxK")
    gpu = SimpleNamespace(gpu_index=0)
    builders, absent = contenders(gpu, plain, 16, 4, None, None, None, 8, ("sort",), 1, torch=object())
    assert {"torch", "torch_cuda_graph"} <= set(builders) and absent == {}
    builders, absent = contenders(gpu, auxk, 16, 4, None, None, None, 8, ("sort",), 1, torch=object())
    assert not {"torch", "torch_cuda_graph"} & set(builders) and set(builders) >= set(TRAINER_KINDS)
    assert "aux_k 8" in absent["torch"] and absent["torch_cuda_graph"] == absent["torch"]

"""The commands on the GPU, end to end: ksae-train, ksae-eval, ksae-finetune and the estimator with
``--device gpu``, on a GPU with CuPy and elsewhere against the CuPy stand-in (tests/cupy_standin),
whose kernels run in the CUDA host emulator. A GPU run must equal the CPU run of the same seed
within float32 rounding: same data order, same initial weights, same kept units.
"""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy.cli.evaluate import eval_command
from ksae_cupy.cli.finetune import finetune_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.registry import DATASETS
from ksae_cupy.training.checkpoint import load_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_cupy", "small_synthetic")]


@pytest.fixture
def small_synthetic(monkeypatch):
    """The built-in "synthetic" dataset cut to 1,000 / 200 / 200 signals (the same generator): the
    stand-in's emulated kernels run a few thousand rows a second, and these runs are about the
    device paths, not the data."""
    from ksae_cupy import datasets
    from ksae_cupy.datasets.synthetic import make_sparse_signals

    def load_small(root, log=print):
        X, y, _ = make_sparse_signals(1400)
        return datasets.Dataset(name="synthetic", X_train=X[:1000], y_train=y[:1000], X_valid=X[1000:1200],
                                y_valid=y[1000:1200], X_test=X[1200:], y_test=y[1200:], n_classes=4,
                                image_shape=(8, 8))

    monkeypatch.setitem(DATASETS, "synthetic", replace(DATASETS["synthetic"], load=load_small))


# 3 epochs of 1,000 synthetic signals (D = 64), 64 hidden units, k = 5, no k schedule.
TRAIN = ["synthetic", "--hidden", "64", "--k", "5", "--no-k-schedule", "--epochs", "3", "--batch-size", "100",
         "--lr", "0.01", "--seed", "3", "--quiet"]


def invoke(command, args):
    result = CliRunner().invoke(command, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def train(tmp_path, device: str, step: str, topk: str = "threshold"):
    run_dir = tmp_path / f"{device}-{step}-{topk}"
    result = invoke(train_command, [*TRAIN, "--device", device, "--step", step, "--topk", topk, "--run-dir", run_dir])
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, load_checkpoint(run_dir / "checkpoint.h5"), metrics, result.output


@pytest.mark.parametrize("step, topk", [("dense", "threshold"), ("sparse", "sort")])
def test_train_on_the_gpu_equals_the_cpu_run(tmp_path, step, topk):
    _, cpu, cpu_metrics, _ = train(tmp_path, "cpu", step, topk)
    _, gpu, gpu_metrics, _ = train(tmp_path, "gpu", step, topk)
    assert gpu.epoch == cpu.epoch == 3 and gpu.step == cpu.step == 30
    assert [m["epoch"] for m in gpu_metrics] == [1, 2, 3]
    # float32 sums in another order (BLAS vs the stand-in's NumPy or cuBLAS) for 30 momentum steps:
    # 1e-4 of each array's largest magnitude bounds the rounding, a wrong kept set or gradient is O(1).
    for name, value in cpu.params.items():
        scale = float(np.abs(value).max()) or 1.0
        np.testing.assert_allclose(gpu.params[name], value, rtol=0, atol=1e-4 * scale, err_msg=name)
        assert gpu.params[name].dtype == value.dtype == np.float32
    for g, c in zip(gpu_metrics, cpu_metrics):
        assert g["train_loss"] == pytest.approx(c["train_loss"], rel=1e-4)
        assert g["valid_loss"] == pytest.approx(c["valid_loss"], rel=1e-4)
        assert g["dead_fraction"] == c["dead_fraction"]


def test_eval_and_finetune_on_the_gpu_agree_with_the_cpu(tmp_path):
    run_dir, _, _, _ = train(tmp_path, "gpu", "dense")
    reports = {}
    for device in ("cpu", "gpu"):
        invoke(eval_command, [run_dir, "--alphas", "1,2", "--l2", "1e-3", "--max-iter", "50", "--device", device,
                              "--quiet"])
        reports[device] = json.loads((run_dir / "eval.json").read_text())
    assert reports["gpu"]["device"] == "gpu:0" and reports["cpu"]["device"] == "cpu"
    cpu, gpu = reports["cpu"]["features"], reports["gpu"]["features"]
    assert gpu["selected"] == cpu["selected"]
    # Same features; the classifier's float32 sums differ in order: at most 2 of the 200 test signals.
    assert abs(gpu["test_error"] - cpu["test_error"]) <= 0.01, (gpu["test_error"], cpu["test_error"])
    assert gpu["test_error"] < 0.75  # four classes: chance is 0.75
    finetuned = {}
    for device in ("cpu", "gpu"):
        out = tmp_path / f"ft-{device}"
        invoke(finetune_command, [run_dir, "--alpha", "2", "--run-dir", out, "--epochs", "2", "--batch-size", "100",
                                  "--lr-start", "0.1", "--lr-end", "0.01", "--device", device])
        finetuned[device] = json.loads((out / "finetune.json").read_text())
    assert finetuned["gpu"]["device"] == "gpu:0" and finetuned["gpu"]["kept"] == finetuned["cpu"]["kept"] == [10]
    for split in ("valid_error", "test_error"):
        assert abs(finetuned["gpu"][split] - finetuned["cpu"][split]) <= 0.01, (split, finetuned)


def test_layer_one_codes_written_on_the_gpu_are_the_bytes_the_cpu_writes(tmp_path):
    """Layer 2 checks its codes file's SHA-256 on --resume; a file written again on another device must hold the
    same bytes: write_codes computes in float64 and rounds once to float32."""
    from ksae_cupy.supervised.pretrain import write_codes

    run_dir, _, _, _ = train(tmp_path, "cpu", "dense")
    written = {}
    for device in ("cpu", "gpu"):
        info = write_codes(run_dir, tmp_path / f"codes-{device}.npy", alpha=2.0, device=device)
        written[device] = (tmp_path / f"codes-{device}.npy").read_bytes()
        assert info["shape"] == [1000, 64]
    assert written["gpu"] == written["cpu"]
    codes = np.load(tmp_path / "codes-gpu.npy")
    assert codes.dtype == np.float32 and ((codes != 0).sum(axis=1) <= 10).all()  # alpha*k = 10 kept


def test_finetune_baseline_pretrains_its_layers_on_the_gpu_as_on_the_cpu(tmp_path):
    """ksae-finetune --baseline on the GPU: each layer a ksae-baseline run folder trained on the device
    (the dropout masks drawn on the host, so the same as the CPU run's), equal to the CPU run's layers
    within float32 rounding, then fine-tuned to the same errors within 2 of the 200 signals."""
    from ksae_cupy.supervised.baseline_trainer import load_baseline_checkpoint

    layers, results = {}, {}
    for device in ("cpu", "gpu"):
        out = tmp_path / f"ft-{device}"
        invoke(finetune_command, ["synthetic", "--baseline", "dropout-denoising-ae", "--hidden", "32,16",
                                  "--pretrain-epochs", "2", "--epochs", "1", "--batch-size", "100", "--lr-start", "0.1",
                                  "--lr-end", "0.01", "--device", device, "--run-dir", out, "--quiet"])
        layers[device] = [load_baseline_checkpoint(out / f"pretrain-layer{l}" / "checkpoint.h5") for l in (1, 2)]
        results[device] = json.loads((out / "finetune.json").read_text())
    assert results["gpu"]["device"] == "gpu:0"
    for cpu, gpu in zip(layers["cpu"], layers["gpu"]):
        assert gpu.epoch == cpu.epoch == 2
        for name, value in cpu.params.items():
            np.testing.assert_allclose(gpu.params[name], value, rtol=1e-3, atol=1e-5, err_msg=name)
    for split in ("valid_error", "test_error"):
        assert abs(results["gpu"][split] - results["cpu"][split]) <= 0.01, (split, results)


def test_finetune_momentum_ramp_on_the_gpu_as_on_the_cpu(tmp_path):
    """--momentum-end on the GPU: each epoch's momentum on its ramp, as on the CPU, and the same weights
    within float32 rounding; without the ramp the GPU's weights differ (the ramp reaches the update)."""
    from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint

    run_dir, _, _, _ = train(tmp_path, "gpu", "dense")
    params, momenta = {}, {}
    for name, device, ramp in (("cpu", "cpu", True), ("gpu", "gpu", True), ("gpu-plain", "gpu", False)):
        out = tmp_path / f"ft-{name}"
        invoke(finetune_command, [run_dir, "--alpha", "2", "--run-dir", out, "--epochs", "3", "--batch-size", "100",
                                  "--lr-start", "0.1", "--lr-end", "0.01", "--device", device, "--quiet",
                                  *(["--momentum-end", "0.9"] if ramp else [])])
        params[name] = load_finetune_checkpoint(out / "checkpoint.h5")["params"]
        momenta[name] = [json.loads(line)["momentum"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert momenta["gpu"] == momenta["cpu"] == pytest.approx([0.25, 0.575, 0.9])
    assert momenta["gpu-plain"] == [0.25] * 3
    for name, value in params["cpu"].items():
        np.testing.assert_allclose(params["gpu"][name], value, rtol=1e-3, atol=1e-5, err_msg=name)
    assert not np.allclose(params["gpu-plain"]["W1_dh"], params["gpu"]["W1_dh"], rtol=1e-3, atol=1e-5)


def test_finetune_dropout_options_on_the_gpu_as_on_the_cpu(tmp_path):
    """--input-dropout / --hidden-dropout on the GPU: the masks (drawn on the host) drop the same units as on
    the CPU, so the weights agree within float32 rounding; without them the GPU's weights differ."""
    from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint

    run_dir, _, _, _ = train(tmp_path, "gpu", "dense")
    params = {}
    for name, device, dropout in (("cpu", "cpu", True), ("gpu", "gpu", True), ("gpu-plain", "gpu", False)):
        out = tmp_path / f"ft-{name}"
        invoke(finetune_command, [run_dir, "--alpha", "2", "--run-dir", out, "--epochs", "2", "--batch-size", "100",
                                  "--lr-start", "0.1", "--lr-end", "0.01", "--device", device, "--quiet",
                                  *(["--input-dropout", "0.2", "--hidden-dropout", "0.5"] if dropout else [])])
        params[name] = load_finetune_checkpoint(out / "checkpoint.h5")["params"]
    for name, value in params["cpu"].items():
        np.testing.assert_allclose(params["gpu"][name], value, rtol=1e-3, atol=1e-5, err_msg=name)
    assert not np.allclose(params["gpu-plain"]["W1_dh"], params["gpu"]["W1_dh"], rtol=1e-3, atol=1e-5)


def test_the_estimators_n_threads_on_the_gpu_is_named_as_having_no_effect():
    import warnings

    from ksae_cupy import KSparseAutoencoder
    from ksae_cupy.errors import KsaeNote

    X = np.random.default_rng(0).random((60, 8)).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = KSparseAutoencoder(n_hidden=8, k=2, k_start=None, epochs=1, batch_size=20, lr=0.01, n_threads=2,
                                   device="gpu").fit(X)
        model.partial_fit(X)
    notes = [str(w.message) for w in caught if issubclass(w.category, KsaeNote)]
    assert notes == ["n_threads=2 has no effect on the GPU: the training runs there, with no CPU threads to set"]

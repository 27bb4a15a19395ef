"""The AuxK step (beyond the paper, issue 35) on the GPU path: the sparse step's CuPy branch (cuSPARSE
products, the top-k kernels) and the dense reference on CuPy arrays, against the NumPy results; then
ksae-train --aux-k --device gpu against the CPU run. On a GPU with CuPy, elsewhere against the strict
CuPy stand-in (tests/cupy_standin), whose kernels run in the CUDA host emulator."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy import model
from ksae_cupy.auxk_step import loss_and_grads_sparse_auxk
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.registry import DATASETS
from ksae_cupy.sparse_step import sparse_layout
from ksae_cupy.training.checkpoint import load_checkpoint

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("activation", model.ACTIVATIONS)
@pytest.mark.parametrize("step", ["dense", "sparse"])
def test_auxk_step_on_cupy_equals_numpy(gpu_cupy, step, activation):
    cupy = gpu_cupy
    rng = np.random.default_rng(4)
    D, H, N, k = 24, 64, 16, 4  # small: the stand-in's kernels are emulated
    params = model.init_params(D, H, 0.1, rng)
    params["b_h"] = (rng.standard_normal(H) * 0.1).astype(np.float32)
    X_nd = rng.random((N, D), dtype=np.float32)
    dead_h = rng.random(H) < 0.3
    fn = model.loss_and_grads_auxk if step == "dense" else loss_and_grads_sparse_auxk
    host = {n: sparse_layout(v) if n == "W_dh" and step == "sparse" else v for n, v in params.items()}
    expected = fn(host, X_nd, k, dead_h, 8, 0.25, "threshold", activation)
    device = {n: sparse_layout(cupy.asarray(v)) if n == "W_dh" and step == "sparse" else cupy.asarray(v)
              for n, v in params.items()}
    got = fn(device, cupy.asarray(X_nd), k, cupy.asarray(dead_h), 8, 0.25, "threshold", activation)
    assert got[0] == pytest.approx(expected[0], rel=1e-5) and got[1] == pytest.approx(expected[1], rel=1e-5)
    assert got[1] > 0
    np.testing.assert_array_equal(cupy.asnumpy(got[3].idx_nk), expected[3].idx_nk)
    for name in model.PARAM_NAMES:
        assert isinstance(got[2][name], cupy.ndarray)
        scale = float(np.abs(expected[2][name]).max())
        np.testing.assert_allclose(cupy.asnumpy(got[2][name]), np.asarray(expected[2][name]), rtol=0,
                                   atol=1e-5 * scale, err_msg=name)


@pytest.fixture
def small_synthetic(monkeypatch):
    """The built-in "synthetic" dataset cut to 600 / 100 / 100 signals (the stand-in is slow)."""
    from ksae_cupy import datasets
    from ksae_cupy.datasets.synthetic import make_sparse_signals

    def load_small(root, log=print):
        X, y, _ = make_sparse_signals(800)
        return datasets.Dataset(name="synthetic", X_train=X[:600], y_train=y[:600], X_valid=X[600:700],
                                y_valid=y[600:700], X_test=X[700:], y_test=y[700:], n_classes=4, image_shape=(8, 8))

    monkeypatch.setitem(DATASETS, "synthetic", replace(DATASETS["synthetic"], load=load_small))


@pytest.mark.parametrize("step", ["dense", "sparse"])
def test_train_with_auxk_on_the_gpu_equals_the_cpu_run(gpu_cupy, small_synthetic, tmp_path, step):
    runs = {}
    for device in ("cpu", "gpu"):
        run_dir = tmp_path / device
        args = ["synthetic", "--hidden", "64", "--k", "3", "--no-k-schedule", "--epochs", "2", "--batch-size", "100",
                "--seed", "3", "--aux-k", "8", "--aux-coef", "0.5", "--dead-window", "200", "--center-input",
                "--step", step, "--topk", "threshold", "--device", device, "--run-dir", str(run_dir), "--quiet"]
        result = CliRunner().invoke(train_command, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        runs[device] = load_checkpoint(run_dir / "checkpoint.h5"), metrics
    (cpu, cpu_metrics), (gpu, gpu_metrics) = runs["cpu"], runs["gpu"]
    assert all(m["aux_loss"] > 0 for m in cpu_metrics)  # dead units were there and trained
    np.testing.assert_array_equal(gpu.units["since_kept_h"], cpu.units["since_kept_h"])
    np.testing.assert_array_equal(gpu.preprocess["input_mean"], cpu.preprocess["input_mean"])
    for name, value in cpu.params.items():
        scale = float(np.abs(value).max()) or 1.0
        np.testing.assert_allclose(gpu.params[name], value, rtol=0, atol=1e-4 * scale, err_msg=name)
    for g, c in zip(gpu_metrics, cpu_metrics):
        assert g["aux_loss"] == pytest.approx(c["aux_loss"], rel=1e-4)
        assert g["dead_window_fraction"] == c["dead_window_fraction"]

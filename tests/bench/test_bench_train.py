"""``ksae-bench train`` on tiny shapes: it validates, times every contender, and writes JSON."""
import json

import numpy as np

from click.testing import CliRunner

from clicheck import assert_one_line_error
from ksae_cupy.cli.bench import bench_command
from ksae_cupy.cpu import numba_kernels as cpu_kernels


def test_bench_train_times_dense_sparse_and_encoder_and_writes_json(tmp_path):
    result = CliRunner().invoke(bench_command, ["train", "--device", "cpu", "--hidden", "40", "--dim", "30",
                                                "--k", "4", "--batch-size", "16", "--repeats", "2", "--steps", "2",
                                                "--k-sweep", "2,40", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("train-cpu-*.json")
    data = json.loads(path.read_text())
    assert {"dense", "sparse", "encoder_XW"} <= set(data["ms"])
    # With the CPU kernels on, the sparse step is also timed (and validated) without them.
    assert ("sparse_scipy" in data["ms"]) == cpu_kernels.enabled()
    assert ("sparse_scipy" in data["validation_max_rel_error"]) == cpu_kernels.enabled()
    assert all(value > 0 for value in data["ms"].values())
    assert [r["k"] for r in data["k_sweep"]] == [2, 40]
    assert data["threads"] == 1
    assert data["meta"]["commit"] and data["meta"]["date"]
    assert max(data["validation_max_rel_error"].values()) < 1e-3
    # The step part by part, beside its floors; the CPU's model and SIMD flags recorded with them.
    if cpu_kernels.enabled():
        parts = data["step_parts"]
        assert set(parts["parts_ms"]) == {"encode_XW_plus_b", "select_decode_dZ", "update_W", "update_biases"}
        assert set(parts["floors_ms"]) == {"XW_alone_blas", "stream_W_and_V", "sparse_arithmetic_4NkD"}
        assert all(value > 0 for value in [*parts["parts_ms"].values(), *parts["floors_ms"].values()])
        assert parts["step_ms"] == sum(parts["parts_ms"].values())
        assert parts["step_over_XW"] == parts["step_ms"] / parts["floors_ms"]["XW_alone_blas"]
        assert parts["XW_from_nonzero_pixels_csr_ms"] > 0
    if "cpu_model" in data["meta"]:
        assert isinstance(data["meta"]["simd"], list)


def test_bench_train_rejects_k_above_hidden():
    result = CliRunner().invoke(bench_command, ["train", "--device", "cpu", "--hidden", "40", "--k-sweep", "10,50"])
    assert_one_line_error(result, "k 50 is not allowed")


def test_bench_train_times_a_whole_epoch_and_its_parts(tmp_path):
    result = CliRunner().invoke(bench_command, ["train", "--device", "cpu", "--hidden", "40", "--dim", "30",
                                                "--k", "4", "--batch-size", "64", "--repeats", "1", "--steps", "1",
                                                "--no-torch", "--epoch-k", "8,4", "--threads", "2",
                                                "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("train-cpu-*.json")
    data = json.loads(path.read_text())
    assert [e["k"] for e in data["epochs"]] == [8, 4]
    for epoch in data["epochs"]:
        assert epoch["n_train"] == 50_000
        assert set(epoch["parts_s"]) == {"shuffle", "batches", "steps", "updates", "validation", "metrics_line",
                                         "checkpoint"}
        assert 0 < epoch["steps_s"] <= epoch["epoch_s"]
    assert data["threads"] == 2
    if cpu_kernels.enabled():
        import numba
        assert data["cpu_kernel_threads"] == min(2, numba.config.NUMBA_NUM_THREADS)
    cpu_kernels.set_threads(None)


def test_bench_train_times_both_encoders_side_by_side(tmp_path):
    result = CliRunner().invoke(bench_command, ["train", "--device", "cpu", "--hidden", "40", "--dim", "30",
                                                "--k", "4", "--batch-size", "16", "--repeats", "2", "--steps", "2",
                                                "--no-torch", "--epoch-k", "4", "--epoch-repeats", "2",
                                                "--threads", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("train-cpu-*.json")
    data = json.loads(path.read_text())
    assert data["encoder"] == "both"
    if not cpu_kernels.enabled():
        assert data["encoder_comparison"] == {}
        return
    comparison = data["encoder_comparison"]
    assert comparison["inputs"].startswith("random")  # --dim 30: not MNIST
    assert comparison["sparse_encoder_runs"] == {"dense": False, "sparse": True}
    assert set(comparison["ms"]) == {"XW_alone_blas", "step_dense_encoder", "XW_dense_encoder",
                                     "step_sparse_encoder", "XW_sparse_encoder"}
    assert all(value > 0 for value in comparison["ms"].values())
    assert set(comparison["ratios"]) == {"step_dense_encoder_over_XW", "step_sparse_encoder_over_XW",
                                         "step_dense_over_step_sparse", "XW_dense_over_XW_sparse"}
    assert max(comparison["validation_max_rel_error"].values()) < 1e-3
    sweep = comparison["density_sweep"]
    assert [round(row["density"], 1) for row in sweep["rows"]] == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert all(row["blas_ms"] > 0 and row["sparse_ms"] > 0 for row in sweep["rows"])
    (epoch,) = data["epochs"]
    assert set(epoch["by_encoder"]) == {"dense", "sparse"}
    assert all(len(e["epochs_s"]) == 2 and e["epoch_s"] > 0 for e in epoch["by_encoder"].values())
    cpu_kernels.set_threads(None)


def test_mnist_inputs_come_from_the_mnist_loader(monkeypatch):
    """The bench's MNIST batches are MNIST's images as the dataset registry loads them (a stand-in here)."""
    from types import SimpleNamespace

    from ksae_cupy.bench.train_cpu import mnist_inputs
    from ksae_cupy.datasets import registry

    images = np.arange(6 * 784, dtype=np.float32).reshape(6, 784) / (6 * 784)
    monkeypatch.setattr(registry, "load_mnist", lambda root, log=print: SimpleNamespace(X_train=images[:4],
                                                                                          X_valid=images[4:]))
    X_train, X_valid, what = mnist_inputs(784, n_train=3, n_valid=2)
    np.testing.assert_array_equal(X_train, images[:3])
    np.testing.assert_array_equal(X_valid, images[4:6])
    assert what.startswith("MNIST (3 training, 2 validation")


def test_bench_train_times_a_trained_model_beside_the_fresh_one(tmp_path):
    """By default the epochs and the step's parts are timed on a fresh model and on one trained in the bench,
    side by side; the trained one's step runs at the run's rate from its trained parameters and velocities."""
    result = CliRunner().invoke(bench_command, ["train", "--device", "cpu", "--hidden", "40", "--dim", "30",
                                                "--k", "4", "--batch-size", "64", "--repeats", "1", "--steps", "1",
                                                "--no-torch", "--epoch-k", "4", "--epoch-repeats", "1",
                                                "--trained-epochs", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads(next(tmp_path.glob("train-cpu-*.json")).read_text())
    if not cpu_kernels.enabled():
        assert data["trained_model"] is None and data["trained_epochs"] == []
        return
    assert data["trained_model"] == {"made": data["trained_model"]["made"], "epoch": 2}
    assert data["trained_model"]["made"].startswith("trained here: 2 epochs at lr 0.001")  # random rows: 1e-3
    assert "k 40 down to 4 over the first half" in data["trained_model"]["made"]  # the schedule, as ksae-train
    (fresh,), (trained,) = data["epochs"], data["trained_epochs"]
    assert fresh["model"] == "fresh" and trained["model"] == data["trained_model"]["made"]
    assert trained["k"] == 4 and trained["epoch_s"] > 0 and trained["lr"] == 0.001
    parts = data["trained_step_parts"]
    assert parts["model"] == trained["model"] and parts["lr"] == 0.001 and parts["step_over_XW"] > 0
    assert "fresh against trained" in result.output


def test_bench_train_from_a_run_folder_times_its_checkpoint(tmp_path):
    from ksae_cupy.bench.trained import from_run
    from ksae_cupy.cli.train import train_command

    data = tmp_path / "x.npy"
    np.save(data, np.random.default_rng(0).random((200, 30)).astype(np.float32))
    made = CliRunner().invoke(train_command, [str(data), "--hidden", "40", "--k", "4", "--epochs", "2", "--lr", "0.001",
                                              "--device", "cpu", "--run-dir", str(tmp_path / "run")])
    assert made.exit_code == 0, made.output
    start = from_run(tmp_path / "run", 30, 40)
    assert start.epoch == 2 and start.made.endswith("at epoch 2")
    assert start.config(4, 3).epochs == 5 and start.config(4, 3).lr == 0.001
    result = CliRunner().invoke(bench_command, ["train", "--device", "cpu", "--hidden", "50", "--dim", "30",
                                                "--k", "4", "--from-run", str(tmp_path / "run"), "--no-torch",
                                                "--out", str(tmp_path)])
    assert_one_line_error(result, "its W is 30 x 40")
    result = CliRunner().invoke(bench_command, ["train", "--device", "cpu", "--hidden", "40", "--dim", "30",
                                                "--k", "4", "--from-run", str(tmp_path), "--no-torch",
                                                "--out", str(tmp_path)])
    assert_one_line_error(result, "holds no checkpoint.h5")


def test_bench_train_steps_the_trained_model_at_its_rate_and_keeps_denormals_unflushed_outside_torch(tmp_path):
    """The contenders' steps on the trained model run at the run's rate from its velocities; whatever torch
    did, this process's arithmetic still sees denormals afterwards (torch's flush is scoped to its timing)."""
    result = CliRunner().invoke(bench_command, ["train", "--device", "cpu", "--hidden", "40", "--dim", "30",
                                                "--k", "4", "--batch-size", "16", "--repeats", "1", "--steps", "2",
                                                "--trained-epochs", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads(next(tmp_path.glob("train-cpu-*.json")).read_text())
    smallest = np.nextafter(np.float32(0), np.float32(1))
    assert (np.array([smallest]) * np.float32(2))[0] > 0  # no DAZ/FTZ left on this thread: a denormal is not 0
    if not cpu_kernels.enabled():
        return
    steps = data["trained_steps"]
    assert steps["model"].startswith("trained here: 1 epochs") and steps["lr"] == 0.001
    assert {"dense", "sparse", "encoder_XW"} <= set(steps["ms"]) and max(steps["validation_max_rel_error"].values()) < 1e-3
    if steps["torch"] is not None:
        assert steps["torch"]["flush_denormal"] is True and steps["ratios"]["torch_over_sparse"] > 0

"""Tiny run folders for tests: a checkpoint in the lead's schema, config.json, metrics.jsonl."""
import json
from pathlib import Path

import numpy as np

from ksae_cupy.training.checkpoint import Checkpoint, save_checkpoint
from ksae_cupy.datasets import Dataset
from ksae_cupy.datasets.synthetic import make_sparse_signals


def make_run(run_dir, W_dh, k, dataset="synthetic", b_h=None, c_d=None, **config):
    """Write ``run_dir/checkpoint.h5`` (params W_dh, b_h, c_d; zero velocities) and config.json."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    W_dh = np.asarray(W_dh, dtype=np.float32)
    D, H = W_dh.shape
    params = {"W_dh": W_dh,
              "b_h": np.zeros(H, np.float32) if b_h is None else np.asarray(b_h, np.float32),
              "c_d": np.zeros(D, np.float32) if c_d is None else np.asarray(c_d, np.float32)}
    # As the trainer writes them: the checkpoint holds the training options, config.json
    # the dataset, the device and those options under "train".
    cfg = {"hidden": H, "k": k, "k_start": k, "topk": "sort", "lr": 0.01, "momentum": 0.9,
           "sigma": 0.01, "batch_size": 128, "epochs": 1, "seed": 0, "dtype": "float32", **config}
    save_checkpoint(run_dir / "checkpoint.h5", Checkpoint(
        params=params, velocities={n: np.zeros_like(v) for n, v in params.items()}, config=cfg, epoch=1, step=10))
    (run_dir / "config.json").write_text(json.dumps({"dataset": dataset, "device": "cpu", "train": cfg}))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "loss": 1.0}) + "\n")
    return run_dir


def sparse_signal_dataset(n_train=2000, n_valid=500, n_test=500, D=64, H=128, k=5, seed=0):
    """``(Dataset, W_dh)``: k-sparse signals of a known dictionary, labelled by their top atom."""
    n = n_train + n_valid + n_test
    X, y, W_dh = make_sparse_signals(n, D=D, H=H, k=k, n_classes=4, seed=seed)
    a, b = n_train, n_train + n_valid
    data = Dataset(name="synthetic", X_train=X[:a], y_train=y[:a], X_valid=X[a:b], y_valid=y[a:b],
                   X_test=X[b:], y_test=y[b:], n_classes=4, image_shape=(8, 8))
    return data, W_dh


def train_centred_synthetic_run(run_dir):
    """A real ksae-train run folder (synthetic data, 64 units, k 5, 2 epochs, centred inputs) at ``run_dir``."""
    from click.testing import CliRunner

    from ksae_cupy.cli.train import train_command

    result = CliRunner().invoke(train_command, ["synthetic", "--hidden", "64", "--k", "5", "--epochs", "2",
                                                "--center-input", "--device", "cpu", "--threads", "1",
                                                "--run-dir", str(run_dir)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return run_dir

"""Every bad input to ksae-train answers with one line, exit status 2, and writes nothing."""
import hashlib

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets import mnist
from ksae_cupy.datasets.fetch import HttpSource
from ksae_cupy.datasets.synthetic import make_sparse_signals
from clicheck import assert_one_line_error

QUICK = ["--hidden", "16", "--k", "2", "--epochs", "1", "--batch-size", "10", "--device", "cpu"]


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, make_sparse_signals(60, D=8, H=16, k=2, seed=0)[0])
    return path


def run(args, tmp_path, expect):
    result = CliRunner().invoke(train_command, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == expect, result.output
    return result


@pytest.mark.parametrize("override,fragments", [
    (["--k", "0"], ["--k 0", "1 <= k"]),
    (["--k", "17"], ["--k 17", "hidden (16)"]),
    (["--k", "5", "--k-start", "3"], ["--k-start 3", "k-start >= k"]),
    (["--hidden", "0"], ["--hidden 0"]),
    (["--epochs", "0"], ["--epochs 0"]),
    (["--batch-size", "0"], ["--batch-size 0"]),
    (["--batch-size", "5000"], ["--batch-size 5000", "training examples"]),
    (["--lr", "0"], ["--lr 0.0"]),
    (["--lr", "-1"], ["--lr -1.0"]),
    (["--momentum", "1"], ["--momentum 1.0", "0 <= momentum < 1"]),
    (["--momentum", "-0.5"], ["--momentum -0.5"]),
    (["--device", "tpu"], ["--device 'tpu'", "auto, cpu, gpu"]),
])
def test_bad_option_values(data_file, tmp_path, override, fragments):
    run_dir = tmp_path / "run"
    result = run([data_file, *QUICK, *override, "--run-dir", run_dir], tmp_path, expect=2)
    assert_one_line_error(result, *fragments)
    assert not run_dir.exists()


def test_unknown_dataset(tmp_path):
    result = run(["imagenet", *QUICK, "--run-dir", tmp_path / "run"], tmp_path, expect=2)
    assert_one_line_error(result, "'imagenet'", "mnist", "synthetic")


def test_gpu_requested_without_one(data_file, tmp_path, monkeypatch):
    import ksae_cupy.backend as backend

    monkeypatch.setattr(backend, "_probe_gpu", lambda index: (None, "cupy does not import"))
    result = run([data_file, *QUICK[:-2], "--device", "gpu", "--run-dir", tmp_path / "run"], tmp_path, expect=2)
    assert_one_line_error(result, "--device gpu", "no usable GPU")
    assert not (tmp_path / "run").exists()


def test_non_finite_data(tmp_path):
    X = np.ones((50, 4), dtype=np.float32)
    X[7, 2] = np.nan
    np.save(tmp_path / "bad.npy", X)
    result = run([tmp_path / "bad.npy", "--hidden", "4", "--k", "2", "--batch-size", "10", "--device", "cpu",
                  "--run-dir", tmp_path / "run"], tmp_path, expect=2)
    assert_one_line_error(result, "non-finite", "row 7", "column 2")
    assert not (tmp_path / "run" / "checkpoint.h5").exists()


def test_mnist_missing_and_no_source_reachable(tmp_path, monkeypatch):
    monkeypatch.setattr(mnist, "SOURCES", [HttpSource("http://127.0.0.1:9/mnist/")])
    result = run(["mnist", *QUICK, "--data-dir", tmp_path / "data", "--run-dir", tmp_path / "run"], tmp_path, expect=2)
    assert_one_line_error(result, "could not fetch train-images-idx3-ubyte", "127.0.0.1:9",
                          str(tmp_path / "data" / "mnist"), mnist.FILES[0].sha256)
    assert not (tmp_path / "run").exists()
    assert not list((tmp_path / "data" / "mnist").glob("*ubyte*"))


def test_file_failing_its_checksum(tmp_path):
    folder = tmp_path / "data" / "mnist"
    folder.mkdir(parents=True)
    content = b"\x00\x00\x08\x03 not really mnist"
    (folder / "train-images-idx3-ubyte").write_bytes(content)
    result = run(["mnist", *QUICK, "--data-dir", tmp_path / "data", "--run-dir", tmp_path / "run"], tmp_path, expect=2)
    found = hashlib.sha256(content).hexdigest()
    assert_one_line_error(result, "train-images-idx3-ubyte", "fails its check", f"sha256 {found}",
                          f"expected {mnist.FILES[0].sha256}")
    assert (folder / "train-images-idx3-ubyte").read_bytes() == content  # the user's file is left alone


def test_resume_with_contradicting_options(data_file, tmp_path):
    run([data_file, *QUICK, "--run-dir", tmp_path / "run", "--lr", "0.01"], tmp_path, expect=0)
    before = (tmp_path / "run" / "checkpoint.h5").read_bytes()
    result = run(["--resume", tmp_path / "run", "--k", "3", "--lr", "0.5", "--device", "cpu"], tmp_path, expect=2)
    assert_one_line_error(result, "contradict", "--k 3 (the run has 2)", "--lr 0.5 (the run has 0.01)")
    assert (tmp_path / "run" / "checkpoint.h5").read_bytes() == before


def test_resume_of_missing_folder(tmp_path):
    result = run(["--resume", tmp_path / "nowhere"], tmp_path, expect=2)
    assert_one_line_error(result, "nowhere", "no such run folder")


def test_existing_run_folder_is_not_overwritten(data_file, tmp_path):
    run([data_file, *QUICK, "--run-dir", tmp_path / "run"], tmp_path, expect=0)
    result = run([data_file, *QUICK, "--run-dir", tmp_path / "run"], tmp_path, expect=2)
    assert_one_line_error(result, "already holds a run", "--resume")


def test_diverging_loss_stops_and_keeps_last_good_checkpoint(data_file, tmp_path, monkeypatch):
    import ksae_cupy.training.trainer as train
    from ksae_cupy.training.checkpoint import load_checkpoint

    real = train.model.loss_and_grads
    calls = {"n": 0, "params": None}

    def diverging_after_two_epochs(params, X_nd, k, *options, **settings):
        # Count the run's own steps only: the ETA also times a few steps, on copies of the parameters.
        calls["params"] = calls["params"] or params
        calls["n"] += params is calls["params"]
        loss, grads, cache = real(params, X_nd, k, *options, **settings)
        return (float("nan") if calls["n"] > 2 * 6 else loss), grads, cache  # 54 rows / 10 = 6 batches

    monkeypatch.setattr(train.model, "loss_and_grads", diverging_after_two_epochs)
    result = run([data_file, *QUICK, "--epochs", "5", "--checkpoint-every", "1", "--run-dir", tmp_path / "run"],
                 tmp_path, expect=1)
    assert_one_line_error(result, "loss became nan", "epoch 3", "--lr")
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint.h5")
    assert ckpt.epoch == 2 and all(np.isfinite(v).all() for v in ckpt.params.values())


def test_successful_run_writes_its_folder(data_file, tmp_path):
    result = run([data_file, *QUICK, "--epochs", "2", "--run-dir", tmp_path / "run"], tmp_path, expect=0)
    assert "device: cpu" in result.output and "epoch 2/2" in result.output
    import json

    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["train"]["k"] == 2 and config["device"] == "cpu"


def test_relu_run_records_its_activation_and_resume_keeps_it(data_file, tmp_path):
    from ksae_cupy.training.estimator import KSparseAutoencoder

    run([data_file, *QUICK, "--activation", "relu", "--run-dir", tmp_path / "run"], tmp_path, expect=0)
    model = KSparseAutoencoder.load(tmp_path / "run" / "checkpoint.h5", device="cpu")
    assert model.trainer_.config.activation == "relu"
    assert (model.transform(np.load(data_file)) >= 0).all()  # ReLU codes carry no negative value
    result = run(["--resume", tmp_path / "run", "--activation", "linear", "--device", "cpu"], tmp_path, expect=2)
    assert_one_line_error(result, "--activation linear (the run has relu)")


def test_resume_of_a_finished_run_leaves_its_checkpoint_untouched(data_file, tmp_path):
    run([data_file, *QUICK, "--run-dir", tmp_path / "run"], tmp_path, expect=0)
    checkpoint = tmp_path / "run" / "checkpoint.h5"
    before = (checkpoint.read_bytes(), checkpoint.stat().st_mtime_ns)
    result = run(["--resume", tmp_path / "run", "--device", "cpu"], tmp_path, expect=0)
    # Once "done: 1 epochs in 0.0 s", as if it had trained them; now said plainly.
    assert result.output.splitlines()[-1] == "nothing to train: the run had already trained all its 1 epochs " \
                                             "(options given are recorded); to train longer, give --epochs N with N > 1"
    assert (checkpoint.read_bytes(), checkpoint.stat().st_mtime_ns) == before

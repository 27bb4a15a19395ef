"""A dataset, an optimizer and a baseline are each one registry entry: registered at run time (as
docs/design.md's worked examples do), the commands take them by name with nothing else changed."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy import model, optimizers, paper
from ksae_cupy.cli.baseline import baseline_command
from ksae_cupy.cli.data import data_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.dataset import Dataset
from ksae_cupy.datasets.registry import DATASETS, DatasetEntry
from ksae_cupy.errors import KsaeError
from ksae_cupy.supervised import baselines
from ksae_cupy.training.checkpoint import load_checkpoint

N, D = 120, 16


def load_toy(root, log=print) -> Dataset:
    """120 labelled rows in [0, 1], 16 dimensions: a dataset of the worked example."""
    rng = np.random.default_rng(5)
    X = rng.random((N + 40, D)).astype(np.float32)
    y = (X[:, 0] > 0.5).astype(np.int64)
    return Dataset(name="toy", X_train=X[:N], y_train=y[:N], X_valid=X[N:N + 20], y_valid=y[N:N + 20],
                   X_test=X[N + 20:], y_test=y[N + 20:], n_classes=2, image_shape=(4, 4))


@pytest.fixture
def toy(monkeypatch):
    """The toy dataset, registered for one test (the registry is left as it was)."""
    entry = DatasetEntry("toy", "random rows in [0, 1], 4x4, 120/20/20, 2 classes", load_toy, (4, 4),
                         no_files="made on the fly", auto_lr=True)
    monkeypatch.setitem(DATASETS, entry.name, entry)
    return entry


def train(tmp_path, *options):
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(train_command, ["toy", "--hidden", "8", "--k", "2", "--no-k-schedule", "--epochs", "1",
                                                "--batch-size", "40", "--device", "cpu", "--threads", "1",
                                                "--run-dir", str(run_dir), "--quiet", *options])
    assert result.exit_code == 0, result.output
    return run_dir


def test_a_registered_dataset_is_listed_and_trained_on(toy, tmp_path):
    listed = CliRunner().invoke(data_command, ["list", "--data-dir", str(tmp_path)])
    assert listed.exit_code == 0, listed.output
    assert any("toy" in line and toy.description in line and "made on the fly" in line
               for line in listed.output.splitlines()), listed.output
    run_dir = train(tmp_path)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["dataset"] == "toy"
    # auto_lr: its default rate is derived from the data, not the paper's MNIST rate
    trained = load_checkpoint(run_dir / "checkpoint.h5").config
    assert trained["lr_auto"] is True and trained["lr"] != paper.LR


class PlainSGD:
    """theta <- theta - lr grad: the toy optimizer. Its one state array per parameter (what a checkpoint's
    ``optim/`` keeps) stays zero: it has no velocity."""

    def __init__(self, params, xp):
        self.velocities = {name: xp.zeros_like(value) for name, value in params.items()}

    def step(self, params, grads, lr):
        for name, value in params.items():
            value -= value.dtype.type(lr) * grads[name]


def test_a_registered_optimizer_is_a_choice_and_takes_each_step(toy, monkeypatch, tmp_path):
    monkeypatch.setitem(optimizers.OPTIMIZERS, "sgd", optimizers.OptimizerEntry(
        "sgd", "plain SGD", lambda params, config, xp: PlainSGD(params, xp), PlainSGD.step))
    lr = 0.05
    run_dir = train(tmp_path, "--optimizer", "sgd", "--lr", str(lr), "--batch-size", str(N), "--seed", "3")
    checkpoint = load_checkpoint(run_dir / "checkpoint.h5")
    assert checkpoint.config["optimizer"] == "sgd"
    # One batch of every row: the weights are the initial ones minus lr times the gradient there.
    initial = model.init_params(D, 8, checkpoint.config["sigma"], np.random.default_rng(3), np.float32)
    _, grads, _ = model.loss_and_grads(initial, load_toy(None).X_train, 2)
    for name, value in initial.items():
        np.testing.assert_allclose(checkpoint.params[name], value - np.float32(lr) * grads[name], rtol=1e-4,
                                   atol=1e-7)
        assert not checkpoint.velocities[name].any()
    # the paper's optimizer, the same run otherwise: its first step is the same, and it keeps a velocity
    momentum = load_checkpoint(train(tmp_path / "momentum", "--lr", str(lr), "--batch-size", str(N), "--seed", "3")
                               / "checkpoint.h5")
    assert momentum.config["optimizer"] == "momentum" and momentum.velocities["W_dh"].any()


def test_an_unregistered_optimizer_is_refused_in_one_line(toy, tmp_path):
    result = CliRunner().invoke(train_command, ["toy", "--optimizer", "adam", "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 2 and "'--optimizer': 'adam' is not 'momentum'" in result.output, result.output
    with pytest.raises(KsaeError, match="optimizer 'adam' is not allowed; use one of momentum"):
        from ksae_cupy.training.config import TrainConfig

        TrainConfig(optimizer="adam").validate()


class ToyConfig(baselines.AutoencoderConfig):
    """A learner of a new kind: its own config class (here an autoencoder's options) and its own step."""


def toy_step(run, X_bd):
    """A clean autoencoder step (no dropout), counted so that the test sees the trainer call it."""
    toy_step.calls += 1
    return baselines.ae_loss_and_grads(run.params, X_bd, weight_decay=run.config.weight_decay)


def test_a_registered_baseline_of_a_new_kind_trains_through_ksae_baseline(toy, monkeypatch, tmp_path):
    toy_step.calls = 0
    monkeypatch.setitem(baselines.BASELINES, "toy-ae", baselines.Baseline(
        "toy-ae", "a clean tied autoencoder", "toy autoencoder", ToyConfig, step=toy_step, family="toy"))
    run_dir = tmp_path / "baseline"
    result = CliRunner().invoke(baseline_command, ["toy", "--model", "toy-ae", "--hidden", "6", "--epochs", "2",
                                                   "--batch-size", "40", "--device", "cpu", "--threads", "1",
                                                   "--run-dir", str(run_dir), "--quiet"])
    assert result.exit_code == 0, result.output
    assert toy_step.calls == 2 * 3  # 2 epochs of 120 rows in batches of 40
    assert json.loads((run_dir / "config.json").read_text())["model"] == "toy-ae"


@pytest.mark.parametrize("registry, kind, name", [(DATASETS, "dataset", "mnist"),
                                                  (optimizers.OPTIMIZERS, "optimizer", "momentum"),
                                                  (baselines.BASELINES, "baseline", "rbm")])
def test_a_name_registered_twice_or_not_at_all_is_refused_in_one_line_naming_its_kind(registry, kind, name):
    before = dict(registry)
    with pytest.raises(KsaeError, match=f"^{kind} '{name}' is already registered; choose another name$"):
        registry.register(registry[name])
    assert registry == before  # the first entry is kept
    assert registry.lookup(name) is registry[name]
    with pytest.raises(KsaeError, match=f"^unknown {kind} 'nosuch'; use one of {', '.join(sorted(registry))}$"):
        registry.lookup("nosuch")


def test_each_module_s_register_adds_to_its_registry():
    from dataclasses import replace

    from ksae_cupy.datasets import registry as datasets

    for module, registry in ((datasets, DATASETS), (optimizers, optimizers.OPTIMIZERS),
                             (baselines, baselines.BASELINES)):
        copy = replace(next(iter(registry.values())), name="copy")
        try:
            assert module.register(copy) is copy and list(registry)[-1] == "copy" and registry["copy"] is copy
        finally:
            registry.pop("copy", None)  # the registry is left as it was

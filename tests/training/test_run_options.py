"""The paper's defaults are typed once (TrainConfig): the estimator's parameters and the commands' options
agree with them; and each command validates its configuration a counted number of times (once)."""
from __future__ import annotations

import inspect

import pytest

from click.testing import CliRunner

from ksae_cupy.cli.baseline import baseline_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.errors import KsaeError
from ksae_cupy.schedules import resolve_k_start
from ksae_cupy.training.estimator import KSparseAutoencoder
from ksae_cupy.training.trainer import TrainConfig

PAPER = TrainConfig()


def test_the_estimators_defaults_are_train_configs():
    defaults = {name: p.default for name, p in inspect.signature(KSparseAutoencoder).parameters.items()}
    shared = set(defaults) & set(PAPER.to_dict())
    assert {"k", "epochs", "batch_size", "lr", "momentum", "sigma", "topk", "seed", "dtype", "step"} <= shared
    for name in shared - {"k_start", "lr"}:
        assert defaults[name] == getattr(PAPER, name), name
    assert defaults["n_hidden"] == PAPER.hidden
    assert defaults["lr"] == "auto"  # derived from the data: the paper's 0.01 on MNIST (learning_rate.py)
    # "auto": the schedule from 100 (or k if larger, at most the hidden units), TrainConfig's 100 at the defaults
    assert resolve_k_start(defaults["k_start"], defaults["k"], defaults["n_hidden"]) == PAPER.k_start


def test_the_commands_defaults_are_train_configs():
    baseline_names = ("hidden", "epochs", "batch_size", "momentum", "sigma", "seed", "dtype")
    for command, names in ((train_command, PAPER.to_dict()), (baseline_command, baseline_names)):
        shown = {p.name: p.default for p in command.params if not getattr(p, "is_flag", False)}
        for name in names:
            if name in shown and shown[name] is not None:
                assert shown[name] == getattr(PAPER, name), (command.name, name)


def counted_validations(monkeypatch, *classes):
    """The calls of ``validate`` (the checks themselves, whoever asks for them) on ``classes``, as they come."""
    calls = []
    for cls in classes:
        def counted(self, *args, _validate=cls.validate, **kwargs):
            calls.append((type(self).__name__, args, kwargs))
            return _validate(self, *args, **kwargs)

        monkeypatch.setattr(cls, "validate", counted)
    return calls


def test_ksae_train_validates_its_configuration_once_fresh_and_on_resume(tmp_path, monkeypatch):
    calls = counted_validations(monkeypatch, TrainConfig)
    run = str(tmp_path / "run")
    result = CliRunner().invoke(train_command, ["synthetic", "--hidden", "16", "--k", "4", "--epochs", "1",
                                                "--device", "cpu", "--run-dir", run])
    assert result.exit_code == 0, result.output
    # The command validates the options once, before any data is read; the trainer it prepares to check the
    # rate before the run folder is written, and the estimator's fit that trains that trainer, take the
    # configuration as validated (TrainConfig.check) instead of validating it again (issue 36 item 2).
    assert "training with k 4 from the start" in result.output  # the schedule dropped: a change that stays valid
    assert len(calls) == VALIDATIONS, calls
    calls.clear()
    # On resume the configuration is the checkpoint's, validated when the trainer is rebuilt from it; --epochs,
    # applied, is checked on its own (at least the epochs begun) and keeps it valid.
    result = CliRunner().invoke(train_command, ["--resume", run, "--epochs", "2"])
    assert result.exit_code == 0, result.output
    assert "applied: epochs 1 -> 2" in result.output
    assert len(calls) == VALIDATIONS, calls


VALIDATIONS = 1


def test_a_changed_configuration_is_validated_again(monkeypatch):
    """What makes the count honest: a configuration is taken as validated only with the values that passed."""
    calls = counted_validations(monkeypatch, TrainConfig)
    config = TrainConfig(hidden=16, k=4, k_start=None, epochs=1, batch_size=50)
    config.check()
    config.check()
    assert len(calls) == 1
    config.k = 17  # more than the hidden units: no longer valid, and found so
    with pytest.raises(KsaeError, match="k 17 is not allowed"):
        config.check()
    config.k = 4
    config.check(n_train=100)  # a check for a number of rows it was not made for validates again
    assert [call[1] for call in calls[1:]] == [(None,), (100,)]


def test_ksae_baseline_validates_its_configuration_once_fresh_and_on_resume(tmp_path, monkeypatch):
    from ksae_cupy.supervised.baselines import AutoencoderConfig, RBMConfig

    calls = counted_validations(monkeypatch, AutoencoderConfig, RBMConfig)
    run = str(tmp_path / "run")
    result = CliRunner().invoke(baseline_command, ["synthetic", "--model", "dropout-ae", "--hidden", "16", "--epochs",
                                                   "1", "--device", "cpu", "--run-dir", run])
    assert result.exit_code == 0, result.output
    assert len(calls) == 1, calls  # by the command, before the data is read; the trainer takes it as validated
    calls.clear()
    result = CliRunner().invoke(baseline_command, ["--resume", run, "--epochs", "2"])
    assert result.exit_code == 0, result.output
    assert "applied: epochs 1 -> 2" in result.output
    assert len(calls) == 1, calls  # the checkpoint's, when its trainer is rebuilt


def test_one_fresh_ksae_finetune_validates_its_configuration_once(tmp_path, monkeypatch):
    from ksae_cupy.cli.finetune import finetune_command
    from ksae_cupy.supervised.finetune import FinetuneConfig

    calls = []
    validate = FinetuneConfig.validate

    def counted(self, *args, **kwargs):
        calls.append(kwargs)
        return validate(self, *args, **kwargs)

    monkeypatch.setattr(FinetuneConfig, "validate", counted)
    result = CliRunner().invoke(finetune_command, ["synthetic", "--no-pretraining", "--hidden", "16", "--k", "4",
                                                   "--epochs", "1", "--device", "cpu", "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert len(calls) == 1, calls  # by the trainer, with the layers' sizes (the batch against the data: the command)

"""The paper's defaults are typed once (TrainConfig): the estimator's parameters and the commands' options
agree with them; and one fresh ksae-train validates its configuration a counted number of times."""
from __future__ import annotations

import inspect

from click.testing import CliRunner

from ksae_cupy.cli.baseline import baseline_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.schedules import resolve_k_start
from ksae_cupy.training.estimator import KSparseAutoencoder
from ksae_cupy.training.trainer import TrainConfig

PAPER = TrainConfig()


def test_the_estimators_defaults_are_train_configs():
    defaults = {name: p.default for name, p in inspect.signature(KSparseAutoencoder).parameters.items()}
    shared = set(defaults) & set(PAPER.to_dict())
    assert {"k", "epochs", "batch_size", "lr", "momentum", "sigma", "topk", "seed", "dtype", "step"} <= shared
    for name in shared - {"k_start"}:
        assert defaults[name] == getattr(PAPER, name), name
    assert defaults["n_hidden"] == PAPER.hidden
    # "auto": the schedule from 100 (or k if larger, at most the hidden units), TrainConfig's 100 at the defaults
    assert resolve_k_start(defaults["k_start"], defaults["k"], defaults["n_hidden"]) == PAPER.k_start


def test_the_commands_defaults_are_train_configs():
    baseline_names = ("hidden", "epochs", "batch_size", "momentum", "sigma", "seed", "dtype")
    for command, names in ((train_command, PAPER.to_dict()), (baseline_command, baseline_names)):
        shown = {p.name: p.default for p in command.params if not getattr(p, "is_flag", False)}
        for name in names:
            if name in shown and shown[name] is not None:
                assert shown[name] == getattr(PAPER, name), (command.name, name)


def test_one_fresh_ksae_train_validates_its_configuration_a_counted_number_of_times(tmp_path, monkeypatch):
    calls = []
    validate = TrainConfig.validate

    def counted(self, *args, **kwargs):
        calls.append(args or kwargs)
        return validate(self, *args, **kwargs)

    monkeypatch.setattr(TrainConfig, "validate", counted)
    result = CliRunner().invoke(train_command, ["synthetic", "--hidden", "16", "--k", "4", "--epochs", "1",
                                                "--device", "cpu", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    # The command validates the options once, before any data is read, and builds one Trainer (which
    # validates) to check before the run folder is written that the rate moves the weights; the other
    # three are the estimator's fit (its new trainer, that Trainer, and fit itself): issue 36 item 2
    # asks them to become one.
    assert len(calls) == VALIDATIONS, calls


VALIDATIONS = 5


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

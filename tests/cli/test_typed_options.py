"""A command's option values travel as one typed object, from the command line to the configuration.

Each training command has an options class made from its declarations (``session/fields.py: options_class``):
a frozen dataclass whose fields are exactly the declared options with their declared types, DATASET and the
data options, and ``given`` (the names typed, what --resume applies or refuses). The command gets its values as
that object, and ``TrainConfig`` is made from its attributes: ``--k`` is ``options.k`` is ``TrainConfig.k``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from ksae_cupy.cli.baseline import baseline_command
from ksae_cupy.cli.finetune import finetune_command
from ksae_cupy.cli.mpi_train import MPI_TRAIN, MpiTrainOptions, train as mpi_train_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.errors import KsaeError
from ksae_cupy.session import train_run
from ksae_cupy.session.fields import DATA, TRAIN, TrainOptions
from ksae_cupy.supervised.commands import BASELINE, FINETUNE, BaselineOptions, FinetuneOptions

COMMANDS = {  # command: (its options class, its declarations, its parameters that are no option of the class)
    "ksae-train": (train_command, TrainOptions, TRAIN, set()),
    "ksae-baseline": (baseline_command, BaselineOptions, BASELINE, set()),
    "ksae-finetune": (finetune_command, FinetuneOptions, FINETUNE, {"pretrained"}),
    "mpi_train train": (mpi_train_command, MpiTrainOptions, MPI_TRAIN, {"fail_at_step", "fail_rank", "fail_mode"}),
}
DATA_TYPES = {"dataset": str, "labels": str, "test": str, "test_labels": str, "valid_fraction": float,
              "test_fraction": float, "split_seed": int}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_commands_options_class_has_exactly_its_declarations_with_their_types(name):
    command, options_class, declarations, others = COMMANDS[name]
    fields = {field.name: field for field in dataclasses.fields(options_class)}
    declared = [option.name for option in declarations]
    assert list(fields) == [*(n for n in DATA if n not in declared), *declared, "given"]
    for option in declarations:  # the declared type, None where not given
        field = fields[option.name]
        kind = option.type if isinstance(option.type, type) else Path if option.type == "path" else str  # a choice
        assert field.type == (kind | None if option.default is None else kind), option.name
        assert field.default == option.default, option.name
    assert all(fields[n].type == DATA_TYPES[n] | None for n in DATA if n not in declared)
    # Every value the command line gives reaches the command in the object (bar its own few parameters).
    exposed = {param.name for param in command.params if param.expose_value}
    assert exposed - set(fields) == others and set(fields) - exposed == {"given"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        options_class().given = frozenset()


def test_the_types_a_reader_follows():
    types = {field.name: field.type for field in dataclasses.fields(TrainOptions)}
    assert (types["k"], types["hidden"], types["k_start"], types["momentum"]) == (int, int, int | None, float)
    assert (types["lr"], types["topk"], types["center_input"], types["run_dir"]) == (str | None, str, bool,
                                                                                      Path | None)
    assert (types["given"], TrainOptions().given) == (frozenset, frozenset())


def parsed(monkeypatch, command, args):
    """The options object and the configuration ``command`` made of ``args``: new_config is watched, and the
    command stopped there (before any data is read)."""
    made, new_config = [], train_run.new_config

    def watched(options, lr):
        made.append((options, new_config(options, lr)))
        raise KsaeError("stopped where the configuration is made")

    monkeypatch.setattr(train_run, "new_config", watched)
    result = CliRunner().invoke(command, args)
    assert result.output.strip() == "error: stopped where the configuration is made", result.output
    return made[0]


def test_k_travels_from_the_command_line_to_the_configuration_as_one_attribute(monkeypatch, tmp_path):
    options, config = parsed(monkeypatch, train_command, ["synthetic", "--k", "7", "--hidden", "32", "--aux-k", "3",
                                                          "--run-dir", str(tmp_path / "run")])
    assert type(options) is TrainOptions
    assert (options.k, options.hidden, options.aux_k, options.dataset) == (7, 32, 3, "synthetic")
    assert options.run_dir == tmp_path / "run" and options.resume is None
    assert options.given == {"dataset", "k", "hidden", "aux_k", "run_dir"}  # what --resume would judge
    assert (config.k, config.hidden, config.aux_k, config.k_start) == (7, 32, 3, 32)  # k-start auto: 100, within H
    assert not (tmp_path / "run").exists()


def test_train_config_is_made_from_the_objects_attributes():
    options = TrainOptions(hidden=40, k=5, k_start=9, epochs=3, batch_size=20, momentum=0.5, sigma=0.02,
                           topk="threshold", seed=4, dtype="float64", activation="relu", step="dense", aux_k=2,
                           aux_coef=0.25, dead_window=50, center_input=True, optimizer="momentum")
    config = train_run.new_config(options, 0.03)
    for name in ("hidden", "k", "k_start", "epochs", "batch_size", "momentum", "sigma", "topk", "seed", "dtype",
                 "activation", "step", "aux_k", "aux_coef", "dead_window", "center_input", "optimizer"):
        assert getattr(config, name) == getattr(options, name), name
    assert config.lr == 0.03
    assert train_run.new_config(dataclasses.replace(options, no_k_schedule=True, k_start=None), 0.03).k_start is None
    with pytest.raises(KsaeError, match="--k-start 9 contradicts --no-k-schedule"):
        train_run.new_config(dataclasses.replace(options, no_k_schedule=True), 0.03)


def test_the_mpi_trainers_options_make_ksae_trains_configuration_the_paper_beyond_its_options():
    shared = dict(hidden=40, k=5, epochs=3, batch_size=20, seed=4)
    mpi = train_run.new_config(MpiTrainOptions(**shared, lr=0.03), 0.03)
    assert mpi.to_dict() == train_run.new_config(TrainOptions(**shared), 0.03).to_dict()
    assert not hasattr(MpiTrainOptions(), "aux_k")  # not offered: TrainConfig's default, the paper's

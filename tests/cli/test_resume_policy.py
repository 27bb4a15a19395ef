"""--resume of ksae-train, ksae-baseline and ksae-finetune: what a resumed session runs with.

An option not given on --resume keeps the run's value (config.json), never the default: the device,
the data root and the checkpoint schedule included. The values a session runs with are read where
they are used (the device resolved, the data root the loader gets, the checkpoint policy made).
"""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from ksae_cupy.cli.baseline import baseline_command
from ksae_cupy.cli.finetune import finetune_command
from ksae_cupy.cli.train import train_command


@pytest.fixture()
def spies(monkeypatch):
    """What a session hands to resolve_device, load_dataset and CheckpointPolicy."""
    import ksae_cupy.backend as backend
    import ksae_cupy.datasets as datasets
    from ksae_cupy.session.checkpoint_policy import CheckpointPolicy

    seen = {"device": [], "root": [], "policy": []}
    resolve, load, init = backend.resolve_device, datasets.load_dataset, CheckpointPolicy.__init__

    def resolve_device(name, *args, **kwargs):
        seen["device"].append(name)
        return resolve(name, *args, **kwargs)

    def load_dataset(spec, root=None, **kwargs):
        seen["root"].append(None if root is None else str(root))
        return load(spec, root=root, **kwargs)

    def policy_init(self, every_epochs, minutes, *args, **kwargs):
        seen["policy"].append((every_epochs, minutes))
        init(self, every_epochs, minutes, *args, **kwargs)

    monkeypatch.setattr(backend, "resolve_device", resolve_device)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(CheckpointPolicy, "__init__", policy_init)
    return seen


def invoke(command, args):
    result = CliRunner().invoke(command, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


STARTS = {
    "ksae-train": (train_command, ["synthetic", "--hidden", "16", "--k", "4", "--epochs", "2"]),
    "ksae-baseline": (baseline_command, ["synthetic", "--model", "dropout-ae", "--hidden", "8", "--epochs", "1"]),
    "ksae-finetune": (finetune_command, ["--no-pretraining", "--dataset", "synthetic", "--hidden", "16", "--k", "4",
                                         "--epochs", "1"]),
}


@pytest.mark.parametrize("name", sorted(STARTS))
def test_a_bare_resume_keeps_the_runs_device_data_root_and_checkpoint_schedule(name, spies, tmp_path):
    command, start = STARTS[name]
    run, data_dir = tmp_path / "run", tmp_path / "data"
    data_dir.mkdir()
    invoke(command, [*start, "--device", "cpu", "--data-dir", data_dir, "--checkpoint-every", "3",
                     "--checkpoint-minutes", "2.5", "--threads", "1", "--run-dir", run])
    for seen in spies.values():
        seen.clear()
    invoke(command, ["--resume", run])
    assert spies["device"] and set(spies["device"]) == {"cpu"}, spies["device"]
    assert spies["root"] == [str(data_dir)], spies["root"]
    assert spies["policy"] == [(3, 2.5)], spies["policy"]


# -- the resume table: every option of every command, changed on --resume --------------------------

import json  # noqa: E402
import shutil  # noqa: E402

from ksae_cupy.cli.options import commands  # noqa: E402
from ksae_cupy.session.fields import (APPLIED, DATA, KEPT, REFUSED, RUN_LEVEL, SESSION, policies,  # noqa: E402
                                      resume_table)

COMMANDS = {"ksae-train": train_command, "ksae-baseline": baseline_command, "ksae-finetune": finetune_command}
SECTION = {"ksae-train": "train", "ksae-baseline": "baseline", "ksae-finetune": "finetune"}
# A value other than the run's for every option (the runs below start from these STARTS and FIXED).
CHANGED = {"hidden": "24", "k": "3", "k_start": "9", "no_k_schedule": None, "epochs": "3", "batch_size": "64",
           "lr": "0.02", "momentum": "0.5", "sigma": "0.02", "topk": "threshold", "seed": "7", "dtype": "float64",
           "activation": "relu", "step": "dense", "aux_k": "2", "aux_coef": "0.5", "dead_window": "500",
           "center_input": None, "optimizer": "sgd", "device": "auto", "run_dir": "elsewhere", "checkpoint_every": "4",
           "checkpoint_minutes": "1.5", "overwrite": None, "data_dir": "data2", "threads": "2",
           "progress_seconds": "9", "quiet": None, "model": "rbm", "weight_decay": "0.001", "alpha": "2",
           "phases": "all", "lr_start": "0.5", "lr_end": "0.0001", "softmax_lr_start": "0.05", "momentum_end": "0.9",
           "momentum_epochs": "2", "input_dropout": "0.2", "hidden_dropout": "0.5",
           "rising_lr": None, "train_on": "train+valid", "no_pretraining": None, "units": "relu",
           "baseline": "rbm", "pretrain_epochs": "3", "dataset": "mnist", "labels": "y.npy", "test": "t.npy",
           "test_labels": "ty.npy", "valid_fraction": "0.2", "test_fraction": "0.1", "split_seed": "3"}
FIXED = ["--device", "cpu", "--threads", "1", "--checkpoint-every", "3", "--checkpoint-minutes", "2.5"]
OWN = {"ksae-train": ["--step", "sparse", "--progress-seconds", "7"], "ksae-baseline": ["--progress-seconds", "7"],
       "ksae-finetune": ["--step", "auto"]}
CASES = [(command, name) for command, table in
         ((c, policies(options)) for c, options in commands().items()) for name in sorted(table) if name != "resume"]


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory):
    """One finished run of each command, to copy and resume."""
    root = tmp_path_factory.mktemp("runs")
    runs = {}
    for name, (command, start) in STARTS.items():
        invoke(command, [*start, *FIXED, *OWN[name], "--run-dir", root / name])
        runs[name] = root / name
    return runs


def test_every_option_of_every_command_has_a_policy_and_a_changed_value():
    for command, name in CASES:
        assert name in CHANGED, f"{command} {name}: no value to change it to on --resume in this test"
    table = resume_table(commands())
    from ksae_cupy.cli.options import resume_table as printed

    assert printed() == table
    assert table.splitlines()[0] == "| option | ksae-train | ksae-baseline | ksae-finetune |"
    assert "| --epochs | applied | applied | refused |" in table
    assert "| --quiet | session | session | session |" in table
    assert "| --progress-seconds | applied | applied | applied |" in table
    assert "| --k-start | refused |  |  |" in table  # a blank: the command has no such option


@pytest.mark.parametrize("command_name, name", CASES)
def test_an_option_changed_on_resume_is_kept_applied_or_refused_as_the_table_says(command_name, name, finished_runs,
                                                                                 tmp_path, spies, monkeypatch):
    policy = policies(commands()[command_name])[name]
    if name == "optimizer":  # a second optimizer to change to: one registered for this test
        from ksae_cupy import optimizers

        monkeypatch.setitem(optimizers.OPTIMIZERS, "sgd", optimizers.OptimizerEntry(
            "sgd", "plain SGD", optimizers.OPTIMIZERS["momentum"].make, optimizers.OPTIMIZERS["momentum"].step))
    run = tmp_path / "run"
    shutil.copytree(finished_runs[command_name], run)
    (tmp_path / "data2").mkdir()
    value = CHANGED[name]
    option = "DATASET" if name == "dataset" else "--" + name.replace("_", "-")
    if name == "run_dir":
        value = str(tmp_path / value)
    args = [value] if name == "dataset" else [option] + ([] if value is None else [str(tmp_path / value)
                                                           if name == "data_dir" else value])
    result = CliRunner().invoke(COMMANDS[command_name], ["--resume", str(run), *args])
    before = json.loads((finished_runs[command_name] / "config.json").read_text())
    after = json.loads((run / "config.json").read_text())
    if policy in (REFUSED, KEPT):
        assert result.exit_code == 2, result.output
        assert result.output.startswith("error: ") and len(result.output.strip().splitlines()) == 1, result.output
        assert option.split(" ")[0] in result.output or "DATASET" in result.output, result.output
        assert after == before  # nothing recorded
        return
    assert result.exit_code == 0, result.output
    if policy == SESSION:  # --quiet: the final line only, and nothing of it recorded
        assert len(result.output.strip().splitlines()) == 1 and "quiet" not in after, result.output
        return
    assert policy == APPLIED
    if name == "device":
        assert spies["device"] == ["auto"]  # the device asked for (on this machine, auto is the CPU too)
        return
    recorded = after[name] if name in RUN_LEVEL else after[SECTION[command_name]][name]
    expected = str(tmp_path / value) if name == "data_dir" else value
    assert str(recorded) == expected or recorded == type(recorded)(expected), (name, recorded)
    assert recorded != (before[name] if name in RUN_LEVEL else before[SECTION[command_name]][name])
    if name in DATA:  # pragma: no cover - data options are never applied
        raise AssertionError(name)


# -- ksae-dist train --resume: ksae-train's policy, and how the ranks share the work ---------------

def test_the_mpi_trainers_resume_refuses_and_applies_as_ksae_train_and_keeps_its_sharding():
    from types import SimpleNamespace

    from ksae_cupy.errors import KsaeError
    from ksae_cupy.parallel.resume import resumed
    from ksae_cupy.session.resuming import run_level_changes
    from ksae_cupy.training.config import TrainConfig

    ckpt = SimpleNamespace(config={**TrainConfig(hidden=16, k=4, k_start=8, epochs=4).to_dict(), "shard_hidden": False},
                           epoch=2, batch_in_epoch=0)
    from ksae_cupy.cli.mpi_train import MpiTrainOptions

    def params(*given):  # the MPI trainer's options, those named given
        return MpiTrainOptions(no_k_schedule=True, shard_hidden=True, hidden=16, epochs=6, topk="threshold",
                               topk_dist="gather", given=frozenset(given))

    with pytest.raises(KsaeError) as refused:
        resumed(params("no_k_schedule", "shard_hidden", "hidden"), ckpt)
    assert str(refused.value) == ("--resume: options contradict the checkpoint (they shape the model or the batches): "
                                  "--no-k-schedule (the run has k-start 8), --shard-hidden (the run shards its data, "
                                  "not its hidden units)")  # --hidden 16 is the run's own
    with pytest.raises(KsaeError, match="--topk-dist gather is not allowed: the run shards its data"):
        resumed(params("topk_dist"), ckpt)
    config, changes = resumed(params("epochs", "topk"), ckpt)
    assert (config.epochs, config.topk, config.hidden) == (6, "threshold", 16)
    assert changes == ["epochs 4 -> 6", "topk sort -> threshold"]
    # The session's settings (the lifecycle's, from config.json): what the options given changed, as the line says it.
    previous = {"device": "cpu", "comm": "mpi", "checkpoint_every": 2, "data_dir": None}
    settings = {"device": "cpu", "comm": "mpi", "checkpoint_every": 3, "data_dir": None, "shard_hidden": False}
    assert run_level_changes(settings, {"checkpoint_every", "device"}, previous) == ["checkpoint-every 2 -> 3"]


@pytest.mark.parametrize("name", sorted(STARTS))
def test_a_resume_drops_the_metrics_lines_logged_after_the_checkpoint(name, finished_runs, tmp_path):
    """As after a kill between an epoch's metrics line and its checkpoint: the line goes, so that the
    epoch the resumed run trains again is logged once (ksae-finetune did not drop it before)."""
    run = tmp_path / "run"
    shutil.copytree(finished_runs[name], run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"epoch": 99, "step": 10**9}) + "\n")
    result = invoke(COMMANDS[name], ["--resume", run])
    assert "metrics.jsonl: dropped 1 line(s): epoch 99, logged after the checkpoint" in result.output
    assert (run / "metrics.jsonl").read_text().splitlines() == lines


@pytest.mark.parametrize("name", sorted(STARTS))
def test_a_new_run_in_a_folder_holding_one_is_offered_resume_and_overwrite(name, finished_runs, tmp_path):
    from clicheck import assert_one_line_error

    command, start = STARTS[name]
    run = tmp_path / "run"
    shutil.copytree(finished_runs[name], run)
    refused = CliRunner().invoke(command, [*start, "--device", "cpu", "--run-dir", str(run)])
    assert_one_line_error(refused, "already holds a run", f"continue it with {name} --resume {run}",
                          "discard it with --overwrite", status=2)
    invoke(command, [*start, "--device", "cpu", "--run-dir", run, "--overwrite"])  # as the line says


def test_a_resume_given_the_options_that_made_a_run_whose_k_schedule_was_dropped_is_that_run(tmp_path):
    """One epoch with --k-start 16 never reaches k 4: the run is made without the schedule (k_start None).
    --resume with the same options is that run (nothing left to train; with --epochs 2, trained on, and after
    that too); another --k is still refused in one line, naming it."""
    from clicheck import assert_one_line_error

    run = tmp_path / "run"
    options = ["--hidden", "16", "--k", "4", "--k-start", "16", "--seed", "3", *FIXED]
    made = invoke(train_command, ["synthetic", *options, "--epochs", "1", "--run-dir", run])
    assert "never reach k 4" in made.output
    assert json.loads((run / "config.json").read_text())["train"]["k_start"] is None
    again = invoke(train_command, ["--resume", run, *options, "--epochs", "1"])
    assert "nothing to train: the run had already trained all its 1 epochs" in again.output
    refused = CliRunner().invoke(train_command, ["--resume", str(run), "--k", "3", "--k-start", "16"])
    assert_one_line_error(refused, "options contradict the checkpoint", "--k 3 (the run has 4)", status=2)
    assert "--k-start" not in refused.stderr
    longer = invoke(train_command, ["--resume", run, *options, "--epochs", "2"])
    assert "epochs 1 -> 2" in longer.output
    assert [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    again = invoke(train_command, ["--resume", run, *options, "--epochs", "2"])
    assert "nothing to train: the run had already trained all its 2 epochs" in again.output

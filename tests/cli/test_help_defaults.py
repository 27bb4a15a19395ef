"""Help that is true: every option of every command says what it does, an option whose default is
decided at run time says in words what that is, and the defaults the help shows are the values the
command then uses (read back from what it records: config.json, eval.json, its printed lines)."""
from __future__ import annotations

import configparser
import importlib
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from ksae_cupy.cli.evaluate import eval_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.evaluation.selection import parse_alphas, parse_l2
from runfolder import make_run

ROOT = Path(__file__).resolve().parents[2]
# None as a default that means "not given: off" (or a choice a new run must make): nothing to state in words.
OFF_WHEN_ABSENT = {("ksae-train", "resume"), ("ksae-finetune", "resume"), ("ksae-baseline", "resume"),
                   ("ksae-analyze theorem", "output"), ("ksae-finetune", "baseline"), ("ksae-baseline", "model"),
                   ("ksae-dist train", "resume"), ("ksae-dist train", "fail_at_step")}
NOT_CHECKED = ()  # every command is checked


def commands() -> dict[str, click.Command]:
    """Every command and sub-command of the console scripts, by how a user types it."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    found = {}
    for line in config["options.entry_points"]["console_scripts"].strip().splitlines():
        name, target = (part.strip() for part in line.split("="))
        module, attr = target.split(":")
        command = getattr(importlib.import_module(module), attr)
        if not isinstance(command, click.Command):  # ksae-sweep's main() wraps its click command
            command = importlib.import_module(module).sweep_command
        found[name] = command
        for sub_name, sub in getattr(command, "commands", {}).items():
            found[f"{name} {sub_name}"] = sub
    from ksae_cupy.cli.mpi_train import main as mpi_main  # not a console script: python -m ... under mpiexec

    found["ksae-dist train"] = mpi_main.commands["train"]
    return found


def options(command: click.Command):
    return [p for p in command.params if isinstance(p, click.Option) and p.name != "help"]


ALL_OPTIONS = [(name, option.name) for name, command in commands().items() for option in options(command)
               if name.split()[0] not in NOT_CHECKED]


@pytest.mark.parametrize("command_name, option_name", ALL_OPTIONS)
def test_every_option_has_help(command_name, option_name):
    option = next(o for o in options(commands()[command_name]) if o.name == option_name)
    assert option.help and option.help.strip(), f"{command_name} {option.opts[0]} has no help text"


@pytest.mark.parametrize("command_name, option_name", ALL_OPTIONS)
def test_a_default_decided_at_run_time_is_stated_in_words(command_name, option_name):
    option = next(o for o in options(commands()[command_name]) if o.name == option_name)
    if option.is_flag or option.default is not None or (command_name, option_name) in OFF_WHEN_ABSENT:
        return  # click shows the default itself (flags: off)
    assert "[default: " in option.help, f"{command_name} {option.opts[0]}: default None, and the help does not say what it means"


def test_run_reading_commands_do_not_offer_split_options():
    # The run's splits are the only ones its evaluation may use; an option that can only be refused is not offered.
    for name, command in commands().items():
        if name in ("ksae-eval", "ksae-analyze iti", "ksae-analyze variants", "ksae-analyze compare"):
            offered = {o.name for o in options(command)}
            assert not offered & {"valid_fraction", "test_fraction", "split_seed"}, name
            assert {"labels", "test", "test_labels"} <= offered, name


def shown_default(command: click.Command, name: str):
    return next(o for o in options(command) if o.name == name).default


def assert_saved_with_shown_defaults(config: dict, command: click.Command, section: str, names):
    """A run's config.json holds ``command``'s shown default for each of ``names`` (under ``section``) and
    for the checkpoint and progress options every training command has."""
    for name in names:
        assert config[section][name] == shown_default(command, name), name
    for name in ("checkpoint_every", "checkpoint_minutes", "progress_seconds"):
        assert config[name] == shown_default(command, name), name


@pytest.fixture
def no_thread_variables(monkeypatch):
    """None of the variables that set the BLAS threads: the commands take their own default."""
    from ksae_cupy.threads import THREAD_VARIABLES

    for variable in THREAD_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def test_ksae_train_uses_the_defaults_its_help_shows(tmp_path, no_thread_variables):
    run = tmp_path / "run"
    result = CliRunner().invoke(train_command, ["synthetic", "--epochs", "2", "--run-dir", str(run)])
    assert result.exit_code == 0, result.output
    config = json.loads((run / "config.json").read_text())
    assert_saved_with_shown_defaults(config, train_command, "train", ("hidden", "k", "batch_size", "momentum", "sigma",
                                                                      "topk", "seed", "dtype", "activation", "step"))
    help_of = {o.name: o.help for o in options(train_command)}
    # Stated in words: "[default: auto for fashion-mnist and for your own files; 0.01 (the paper's) for the other
    # built-in datasets]" (it read "auto for these and your files").
    assert "0.01 (the paper's) for the other built-in datasets]" in help_of["lr"] and config["train"]["lr"] == 0.01
    assert "auto for fashion-mnist and for your own files" in help_of["lr"] and "these" not in help_of["lr"]
    # "[default: 100, or k if larger, at most hidden]", at k 25 and 1000 hidden units.
    assert "[default: 100, or k if larger" in help_of["k_start"] and config["train"]["k_start"] == 100
    # "[default: OMP_NUM_THREADS or its kin when set, else one per free core ...]".
    assert "else one per free core" in help_of["threads"]
    threads_line = next(line for line in result.stdout.splitlines() if line.startswith("BLAS threads: "))
    assert "default: one per" in threads_line and "core" in threads_line, threads_line
    assert "[default: $KSAE_DATA_DIR or ./data]" in help_of["data_dir"] and config["data_dir"] is None
    assert f"[default: runs/<dataset>-h<H>-k<k>-<time>]" in help_of["run_dir"]


def test_ksae_train_default_run_dir_is_the_one_its_help_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(train_command, ["synthetic", "--hidden", "32", "--k", "4", "--epochs", "2"])
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "runs").iterdir()
    assert folder.name.startswith("synthetic-h32-k4-")


def test_ksae_eval_uses_the_defaults_its_help_shows(tmp_path, no_thread_variables):
    run = make_run(tmp_path / "run", make_sparse_signals(1)[2], k=5, dataset="synthetic")
    result = CliRunner().invoke(eval_command, [str(run), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    saved = json.loads((run / "eval.json").read_text())
    assert saved["alphas"] == parse_alphas(shown_default(eval_command, "alphas"))
    assert saved["l2_grid"] == sorted(parse_l2(shown_default(eval_command, "l2_text")), reverse=True)
    assert saved["features"]["refit"] == shown_default(eval_command, "refit")
    assert saved["max_iter"] == shown_default(eval_command, "max_iter")
    assert "raw_baseline" not in saved and "linear_svm" not in saved  # flags: off
    help_of = {o.name: o.help for o in options(eval_command)}
    assert "[default: one per free core" in help_of["threads"]
    assert "default: one per" in result.stderr.splitlines()[0], result.stderr


def test_the_data_root_default_is_the_one_the_help_names(tmp_path, monkeypatch):
    from ksae_cupy.cli.data import data_command

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KSAE_DATA_DIR", raising=False)
    listed = CliRunner().invoke(data_command, ["list"])
    assert listed.exit_code == 0 and "present in data/mnist" in listed.output, listed.output
    monkeypatch.setenv("KSAE_DATA_DIR", str(tmp_path / "elsewhere"))
    listed = CliRunner().invoke(data_command, ["list"])
    assert listed.exit_code == 0 and f"present in {tmp_path / 'elsewhere' / 'mnist'}" in listed.output, listed.output


def test_ksae_baseline_uses_the_defaults_its_help_shows(tmp_path):
    from ksae_cupy.cli.baseline import baseline_command

    run = tmp_path / "run"
    result = CliRunner().invoke(baseline_command, ["synthetic", "--model", "dropout-ae", "--hidden", "16",
                                                   "--epochs", "1", "--run-dir", str(run)])
    assert result.exit_code == 0, result.output
    config = json.loads((run / "config.json").read_text())
    assert_saved_with_shown_defaults(config, baseline_command, "baseline",
                                     ("batch_size", "momentum", "sigma", "seed", "dtype"))
    help_of = {o.name: o.help for o in options(baseline_command)}
    # "[default: 0.01]" (the grid's choice for every baseline) and "[default: 0.0002 (rbm), 0 (autoencoders)]".
    assert "[default: 0.01]" in help_of["lr"] and config["baseline"]["lr"] == 0.01
    assert "0 (autoencoders)" in help_of["weight_decay"] and config["baseline"]["weight_decay"] == 0
    assert "0.0002 (rbm)" in help_of["weight_decay"]  # the RBM's: its config class's, which the next test ties


def test_the_tables_commands_train_each_baseline_with_ksae_baselines_defaults():
    """bin/paper-tables spells out --lr and --weight-decay; they are the defaults (the grid's choice), so a
    reader's `ksae-baseline mnist --model M` is the tables' run."""
    from ksae_cupy.reports.paper_tables import BASELINE_SETTINGS
    from ksae_cupy.supervised.baselines import AutoencoderConfig, RBMConfig

    assert set(BASELINE_SETTINGS) == {"rbm", "dropout-ae", "denoising-ae", "dropout-denoising-ae"}
    for model, (lr, decay) in BASELINE_SETTINGS.items():
        config = RBMConfig() if model == "rbm" else AutoencoderConfig()
        assert (float(lr), float(decay)) == (config.lr, config.weight_decay), model


def test_ksae_finetune_uses_the_defaults_its_help_shows(tmp_path):
    from ksae_cupy.cli.finetune import finetune_command

    run = tmp_path / "run"
    result = CliRunner().invoke(finetune_command, ["--dataset", "synthetic", "--no-pretraining", "--hidden", "16",
                                                   "--k", "4", "--epochs", "1", "--run-dir", str(run)])
    assert result.exit_code == 0, result.output
    config = json.loads((run / "config.json").read_text())
    for name in ("batch_size", "momentum", "sigma", "seed", "dtype", "step", "lr_start", "lr_end"):
        assert config["finetune"][name] == shown_default(finetune_command, name), name
    for name in ("alpha", "checkpoint_every", "checkpoint_minutes"):
        assert config[name] == shown_default(finetune_command, name), name
    help_of = {o.name: o.help for o in options(finetune_command)}
    # "[default: all (shallow); softmax,top,all (deep)]": one layer here.
    assert "[default: all (shallow)" in help_of["phases"] and config["finetune"]["phases"] == ["all"]
    # The split options' words: "[default: 0.1]", "[default: 0]", "[default: 0]".
    assert (config["data"]["valid_fraction"], config["data"]["test_fraction"], config["data"]["split_seed"]) == (
        0.1, 0.0, 0)
    assert all(f"[default: {v}]" in help_of[n] for n, v in
               (("valid_fraction", "0.1"), ("test_fraction", "0"), ("split_seed", "0")))

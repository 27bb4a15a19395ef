"""Messages true to the cause: --version on every command and subcommand (the MPI trainer's too); a deleted
manifest, a data file given as a run, a divergence and a read-only HOME each say what is really wrong, and no
library warning comes before our own line."""
import configparser
import importlib
import os
import subprocess
import sys
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from clicheck import assert_one_line_error
from ksae_cupy.errors import KsaeError
from runfolder import make_run

REPO = Path(__file__).resolve().parents[2]


def commands():
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    found = {}
    for line in parser.get("options.entry_points", "console_scripts").strip().splitlines():
        name, _, target = (part.strip() for part in line.partition("="))
        module, _, attr = target.partition(":")
        command = getattr(importlib.import_module(module), attr)
        found[name] = command if isinstance(command, click.Command) else importlib.import_module(module).sweep_command
    found["ksae_cupy.cli.mpi_train"] = importlib.import_module("ksae_cupy.cli.mpi_train").main
    return found


def walk(command, path=()):
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from walk(sub, path + (name,))


def test_every_command_and_subcommand_answers_version():
    from ksae_cupy.made_with import version_line

    seen = 0
    for name, command in commands().items():
        for path in walk(command):
            result = CliRunner().invoke(command, [*path, "--version"], prog_name=name)
            assert result.exit_code == 0, (name, path, result.output)
            assert result.output == f"{name}: {version_line()}\n", (name, path)
            seen += 1
    assert seen > 20  # ksae-data export, ksae-plot filters, ksae-bench train, ... each asked


def test_a_deleted_manifest_is_not_one_that_lists_nothing(tmp_path):
    from ksae_cupy.reports.kept_checkpoints import select

    with pytest.raises(KsaeError) as caught:
        select(tmp_path, [], True)
    assert "does not exist" in str(caught.value) and "lists no checkpoint" not in str(caught.value)


def test_a_data_file_given_as_a_run_is_not_called_corrupt(tmp_path):
    from ksae_cupy.cli.data import data_command
    from ksae_cupy.cli.evaluate import eval_command

    np.save(tmp_path / "d.npy", np.zeros((4, 4), np.float32))
    result = CliRunner().invoke(data_command, ["export", str(tmp_path / "d.npy"), "--out", str(tmp_path / "m.npz")])
    assert_one_line_error(result, "is a NumPy .npy file, not a checkpoint", status=2)
    assert "corrupt" not in result.stderr
    result = CliRunner().invoke(eval_command, [str(tmp_path / "d.npy")])
    assert_one_line_error(result, "is a file, not a run folder", status=2)
    assert "does not exist" not in result.stderr


def test_a_damaged_checkpoint_is_still_called_corrupt(tmp_path):
    from ksae_cupy.training.checkpoint import load_checkpoint

    run = make_run(tmp_path / "run", np.ones((4, 3), np.float32), k=1)
    data = (run / "checkpoint.h5").read_bytes()
    (run / "checkpoint.h5").write_bytes(data[: len(data) // 3])
    with pytest.raises(KsaeError, match="corrupt or truncated"):
        load_checkpoint(run / "checkpoint.h5")


def test_no_numpy_warning_before_a_divergence(tmp_path):
    from ksae_cupy.cli.train import train_command

    np.save(tmp_path / "d.npy", np.random.default_rng(0).random((200, 16), dtype=np.float32))
    result = CliRunner().invoke(train_command, [str(tmp_path / "d.npy"), "--hidden", "8", "--k", "2", "--epochs",
                                                "30", "--lr", "2.5", "--run-dir", str(tmp_path / "r"), "--threads",
                                                "1"])
    assert_one_line_error(result, "became inf", status=1)
    assert "RuntimeWarning" not in result.stderr
    assert "at or below" not in result.stderr  # 2.5 is above the rate --lr auto gives


def test_a_read_only_home_gives_no_matplotlib_warning(tmp_path):
    pytest.importorskip("matplotlib")
    run = make_run(tmp_path / "run", np.ones((4, 3), np.float32), k=1)
    (run / "metrics.jsonl").write_text('{"epoch": 1, "step": 1, "k": 1, "lr": 0.1, "train_loss": 1.0, "valid_loss": 1.0}\n')
    blocked = tmp_path / "home-is-a-file"
    blocked.write_text("")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("MPL", "XDG_"))}
    env["HOME"] = str(blocked)
    done = subprocess.run([sys.executable, "-c", "from ksae_cupy.cli.plot import plot_command; plot_command()",
                           "curves", str(run), "-o", str(tmp_path / "c.png")], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr

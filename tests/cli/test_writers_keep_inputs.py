"""No command that writes a file the user names destroys an input (ksae_cupy/outputs.py's check_output).

Every command's file option (``OUT``, ``--out``, ``-o``) is walked through the same three cases: the path
names the run's checkpoint (through a symlink), the run's data file (by a relative path), or an unrelated
existing file without ``--overwrite``. Each is one ``error:`` line, and the file's bytes are unchanged.
The walk is complete: every option of every installed command that names an output is in WRITERS or
FOLDER_WRITERS (a test fails on a new one that is in neither).
"""
import configparser
import importlib
import os
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from clicheck import assert_one_line_error
from runfolder import make_run

ROOT = Path(__file__).resolve().parents[2]

# command path -> (the output's suffix, how the arguments are made from (run, out)); the run is a ksae-train run
WRITERS = {
    ("ksae-data", "codes"): (".npy", lambda run, out: ["codes", run, out]),
    ("ksae-data", "export"): (".npz", lambda run, out: ["export", run, "--out", out]),
    ("ksae-plot", "filters"): (".png", lambda run, out: ["filters", run, "-o", out]),
    ("ksae-plot", "hist"): (".png", lambda run, out: ["hist", run, "-o", out]),
    ("ksae-plot", "curves"): (".png", lambda run, out: ["curves", run, "-o", out]),
    ("ksae-plot", "firing"): (".png", lambda run, out: ["firing", run, "-o", out]),
    ("ksae-analyze", "theorem"): (".json", lambda run, out: ["theorem", run, "-o", out]),
}
# Options that name a folder the command writes its own fixed file names into (results.json, ...), never a file.
FOLDER_WRITERS = {("ksae-sweep",), ("ksae-bench", "train"), ("ksae-bench", "packed"), ("ksae-bench", "finetune"),
                  ("ksae-bench", "dist"), ("ksae-bench", "topk")}
OUTPUT_NAMES = ("out", "output")


def entry_points() -> dict:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    lines = parser.get("options.entry_points", "console_scripts").strip().splitlines()
    commands = {}
    for line in lines:
        name, _, target = (part.strip() for part in line.partition("="))
        module, _, attr = target.partition(":")
        command = getattr(importlib.import_module(module), attr)
        commands[name] = getattr(command, "__wrapped_command__", command)
    return commands


def walk(command, path):
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from walk(sub, path + (name,))


def command_of(path):
    """The installed command ``path[0]`` (the arguments name the subcommand)."""
    return entry_points()[path[0]]


def test_every_writer_is_walked():
    found = set()
    for name, command in entry_points().items():
        if not isinstance(command, click.Command):
            command = importlib.import_module("ksae_cupy.cli.sweep").sweep_command
        for path, sub in walk(command, (name,)):
            if any(param.name in OUTPUT_NAMES for param in sub.params):
                found.add(path)
    assert found == set(WRITERS) | FOLDER_WRITERS, found ^ (set(WRITERS) | FOLDER_WRITERS)


@pytest.fixture
def run(tmp_path):
    """A ksae-train run on a user's file (config.json records it, as ksae-train writes it)."""
    rng = np.random.default_rng(0)
    data = tmp_path / "data.npy"
    np.save(data, rng.random((40, 16), dtype=np.float32))
    run_dir = make_run(tmp_path / "run", rng.standard_normal((16, 8)).astype(np.float32), k=2, dataset=str(data))
    return run_dir, data


def invoke(path, args, cwd):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(command_of(path), [str(a) for a in args], catch_exceptions=False)
    finally:
        os.chdir(old)


@pytest.mark.parametrize("path", sorted(WRITERS))
def test_a_writer_refuses_the_runs_checkpoint_through_a_symlink(tmp_path, run, path):
    run_dir, _ = run
    suffix, args = WRITERS[path]
    alias = tmp_path / f"alias{suffix}"
    alias.symlink_to(run_dir / "checkpoint.h5")
    before = (run_dir / "checkpoint.h5").read_bytes()
    result = invoke(path, args(run_dir, alias), tmp_path)
    assert_one_line_error(result, str(alias), "checkpoint", "would destroy it", status=2)
    assert (run_dir / "checkpoint.h5").read_bytes() == before


@pytest.mark.parametrize("path", sorted(WRITERS))
def test_a_writer_refuses_the_runs_data_file_by_a_relative_path(tmp_path, run, path):
    run_dir, data = run
    suffix, args = WRITERS[path]
    target = data.with_suffix(suffix)
    if target != data:  # the writer's suffix: the run's data file is recorded under that name
        data.rename(target)
        import json
        config = json.loads((run_dir / "config.json").read_text())
        config["dataset"] = str(target)
        (run_dir / "config.json").write_text(json.dumps(config))
    before = target.read_bytes()
    (tmp_path / "sub").mkdir()
    result = invoke(path, args(run_dir, Path("..") / target.name), tmp_path / "sub")
    assert_one_line_error(result, "data file", "would destroy it", status=2)
    assert target.read_bytes() == before


@pytest.mark.parametrize("path", sorted(WRITERS))
def test_a_writer_replaces_an_existing_file_only_with_overwrite(tmp_path, run, path):
    run_dir, _ = run
    suffix, args = WRITERS[path]
    existing = tmp_path / f"mine{suffix}"
    existing.write_bytes(b"the user's own file")
    result = invoke(path, args(run_dir, existing), tmp_path)
    assert_one_line_error(result, str(existing), "exists", "--overwrite", status=2)
    assert existing.read_bytes() == b"the user's own file"


def test_export_onto_the_runs_own_checkpoint_keeps_the_run(tmp_path, run):
    """The case found: ``ksae-data export RUN --out RUN/checkpoint.h5`` replaced the run with the export."""
    run_dir, _ = run
    before = (run_dir / "checkpoint.h5").read_bytes()
    result = invoke(("ksae-data", "export"), ["export", run_dir, "--out", run_dir / "checkpoint.h5",
                                              "--format", "npz", "--overwrite"], tmp_path)
    assert_one_line_error(result, "checkpoint of run folder", status=2)
    assert (run_dir / "checkpoint.h5").read_bytes() == before


def test_export_with_overwrite_replaces_an_unrelated_file(tmp_path, run):
    run_dir, _ = run
    existing = tmp_path / "model.npz"
    existing.write_bytes(b"old")
    result = invoke(("ksae-data", "export"), ["export", run_dir, "--out", existing, "--overwrite"], tmp_path)
    assert result.exit_code == 0, result.output
    assert np.load(existing)["encoder.weight"].shape == (8, 16)


def test_a_file_where_the_folder_should_be_is_named(tmp_path, run):
    run_dir, data = run
    result = invoke(("ksae-data", "export"), ["export", run_dir, "--out", data / "x.npz"], tmp_path)
    assert_one_line_error(result, f"{data} is a file, not a folder", status=2)
    assert "create it" not in result.stderr

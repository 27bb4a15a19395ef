"""ksae-sweep --pack: the grid trained in one process as one pack of runs, each in its run folder; its rows
equal the rows of each grid point trained alone (ksae_cupy.parallel.sweep.run_one), and the same command
again resumes instead of training anew."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from clicheck import assert_one_line_error
from ksae_cupy.cli.sweep import sweep_command
from ksae_cupy.parallel.sweep import grid, run_one

GRID = ["--k", "3,5", "--alpha", "1,2", "--hidden", "24", "--seeds", "0,1", "--epochs", "2", "--batch-size", "50"]


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.random.default_rng(0).random((300, 12)).astype(np.float32))
    return str(path)


def sweep(args):
    result = CliRunner().invoke(sweep_command, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_a_packed_sweep_gives_the_rows_of_each_run_alone_and_resumes(data_file, tmp_path):
    out = tmp_path / "out"
    output = sweep([data_file, *GRID, "--pack", "--out", out])
    assert "pack of 4 run(s), one after another" in output
    rows = json.loads((out / "results.json").read_text())
    specs = grid([3, 5], [1, 2], [24], [0, 1], [2], base={"batch_size": 50, "k_start": "auto", "threads": 1,
                                                           "lr": 0.01})
    alone = [row for spec in specs for row in run_one(spec, data_file)]
    assert [(r["k"], r["seed"], r["alpha"]) for r in rows] == [(r["k"], r["seed"], r["alpha"]) for r in alone]
    for got, want in zip(rows, alone):
        for key in ("final_train_loss", "final_valid_loss", "valid_loss_alpha_k", "dead_fraction", "kept", "lr"):
            assert got[key] == want[key], key  # bit for bit: the same steps on the same thread count
    run_dirs = sorted(p.name for p in (out / "runs").iterdir())
    assert run_dirs == ["h24-k3-seed0-e2", "h24-k3-seed1-e2", "h24-k5-seed0-e2", "h24-k5-seed1-e2"]
    # Again: every run is finished, nothing trains, the rows are the same.
    again = sweep([data_file, *GRID, "--pack", "--out", out])
    assert "epoch 1/2" not in again
    newer = json.loads((out / "results.json").read_text())
    assert [without_time(row) for row in newer] == [without_time(row) for row in rows]
    # A run killed before its first checkpoint (config.json and metrics, nothing to resume) starts again.
    (out / "runs" / "h24-k5-seed1-e2" / "checkpoint.h5").unlink()
    again = sweep([data_file, *GRID, "--pack", "--out", out])
    assert "removed" in again and "h24-k5-seed1-e2: epoch 1/2" in again and "h24-k3-seed0-e2: epoch" not in again
    newer = json.loads((out / "results.json").read_text())
    assert [without_time(row) for row in newer] == [without_time(row) for row in rows]


def test_a_packed_sweep_of_one_epoch_given_again_finds_its_runs_done(data_file, tmp_path):
    """In one epoch the k schedule (k-start auto: 24) never reaches k, so each run is made without it; the same
    sweep again finds those runs finished (not "another run" for the k-start it asks)."""
    out, one_epoch = tmp_path / "out", [*GRID[:-4], "--epochs", "1", "--batch-size", "50"]
    output = sweep([data_file, *one_epoch, "--pack", "--out", out])
    assert output.count("never reach k") == 4
    rows = json.loads((out / "results.json").read_text())
    assert {row["k_start"] for row in rows} == {None}
    again = sweep([data_file, *one_epoch, "--pack", "--out", out])
    assert "epoch 1/1" not in again
    newer = json.loads((out / "results.json").read_text())
    assert [without_time(row) for row in newer] == [without_time(row) for row in rows]


def without_time(row: dict) -> dict:
    return {key: value for key, value in row.items() if key != "train_seconds"}


@pytest.mark.parametrize("args, fragment", [
    (["--device", "gpu", "--no-pack"], "--no-pack with --device gpu is not allowed"),
    (["--pack", "--scheduler", "tcp://head:8786"], "--scheduler tcp://head:8786 contradicts --pack")])
def test_contradicting_pack_options_are_one_line(data_file, tmp_path, args, fragment):
    result = CliRunner().invoke(sweep_command, [data_file, "--out", str(tmp_path / "o"), *args])
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "o").exists()

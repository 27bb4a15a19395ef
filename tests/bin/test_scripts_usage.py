"""The scripts in bin/: a usage line for --help and without arguments (the whole run takes a flag), one
``error:`` line for a folder they cannot read, and bin/dead-units-table's row for every kind of run folder."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.synthetic import make_sparse_signals

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(path.name for path in (REPO / "bin").iterdir() if path.is_file())
ENV = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
# Without arguments every script gives its usage line and status 2: the dead-units table printed an empty
# table and exited 0, and these started their whole (hours-long) run or wrote a file. Their whole run is now an
# explicit flag, and bin/paper-tables writes its tables where --out says.
WHOLE_RUN_FLAG = {"reproduce-mnist": "--all", "reproduce-finetune": "--all", "fashion-mnist-table": "--all",
                  "bench-auxk": "--all", "measure-lr": "--all", "paper-tables": "--out"}


def script(name: str, *args, cwd: Path):
    return subprocess.run([sys.executable, str(REPO / "bin" / name), *map(str, args)], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=600)  # a hang guard only


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_gives_a_usage_line_for_help(name, tmp_path):
    result = script(name, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {name} "), result.stdout[:200]
    assert list(tmp_path.iterdir()) == []  # nothing run, nothing written


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_gives_its_usage_line_without_arguments(name, tmp_path):
    result = script(name, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert result.stderr.startswith(f"usage: {name} ") and "error: " in result.stderr.splitlines()[-1]
    if name in WHOLE_RUN_FLAG:  # the one line says what to give
        assert f"give {WHOLE_RUN_FLAG[name]} " in result.stderr.splitlines()[-1], result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing run, nothing written


@pytest.mark.parametrize("name", sorted(WHOLE_RUN_FLAG))
def test_the_whole_run_flag_is_an_option_of_the_script(name, tmp_path):
    """The flag is known to the parser: beside an unknown option, only the unknown one is refused (before any
    work, so nothing runs)."""
    flag = ["--all"] if WHOLE_RUN_FLAG[name] == "--all" else ["--out", tmp_path / "t.md"]
    assert WHOLE_RUN_FLAG[name] in script(name, "--help", cwd=tmp_path).stdout
    result = script(name, *flag, "--no-such-option", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert result.stderr.splitlines()[-1].endswith("unrecognized arguments: --no-such-option"), result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_explicit_forms_run(tmp_path):
    """A run of each explicit form that takes seconds: reproduce-finetune's table of an empty folder with --all
    (nothing trained: --collect-only), paper-tables' of an empty run root with --out, reproduce-mnist's --ks
    checked after --all."""
    finetune = script("reproduce-finetune", "--all", "--collect-only", "--out", tmp_path / "fn", cwd=tmp_path)
    assert finetune.returncode == 0, finetune.stderr
    assert "| k-Sparse AE + F.T. (k=25) | 1.08% | not started |" in (tmp_path / "fn" / "table_fn_mnist.md").read_text()
    (tmp_path / "runs").mkdir()
    tables = script("paper-tables", "--runs-root", tmp_path / "runs", "--out", tmp_path / "t.md", cwd=tmp_path)
    assert tables.returncode == 0 and tables.stdout.startswith(f"tables: {tmp_path / 't.md'}\n"), tables.stderr
    assert "Table err_mnist" in (tmp_path / "t.md").read_text()
    mnist = script("reproduce-mnist", "--all", "--ks", "x", "--out", tmp_path / "mnist", cwd=tmp_path)
    assert (mnist.returncode, mnist.stdout) == (2, "")
    assert mnist.stderr.splitlines()[-1] == ("reproduce-mnist: error: --ks 'x' is not allowed; use a comma-separated "
                                             "list of integers such as 40,25,10")
    assert not (tmp_path / "mnist").exists()


def test_a_folder_a_script_cannot_read_is_one_error_line(tmp_path):
    result = script("dead-units-table", tmp_path / "nowhere", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"error: RUN_DIR {tmp_path / 'nowhere'} does not exist\n"
    scored = script("baseline-grid", "--out", tmp_path / "grid", "--score", tmp_path / "nowhere", cwd=tmp_path)
    assert scored.returncode == 2 and "Traceback" not in scored.stderr, scored.stderr
    assert scored.stderr.splitlines() == [f"error: run folder {tmp_path / 'nowhere'} does not exist"]


def trained_run(tmp_path, name: str) -> tuple[Path, Path]:
    """``(data file, run folder)``: one epoch of ksae-train on a small .npy."""
    data = tmp_path / "x.npy"
    np.save(data, make_sparse_signals(200, D=8, H=16, k=2, seed=0)[0])
    run = tmp_path / name
    result = CliRunner().invoke(train_command, [str(data), "--hidden", "16", "--k", "2", "--no-k-schedule",
                                                "--batch-size", "60", "--lr", "0.01", "--epochs", "1", "--device",
                                                "cpu", "--threads", "1", "--run-dir", str(run), "--quiet"])
    assert result.exit_code == 0, result.output
    return data, run


def test_the_dead_units_table_has_a_row_for_every_kind_of_run_folder(tmp_path):
    data, trained = trained_run(tmp_path, "trained")
    cut = tmp_path / "cut"
    cut.mkdir()
    for name in ("config.json", "metrics.jsonl"):
        (cut / name).write_bytes((trained / name).read_bytes())
    whole = (trained / "checkpoint.h5").read_bytes()
    (cut / "checkpoint.h5").write_bytes(whole[:len(whole) // 2])
    for kind in ("ksae-baseline", "ksae-finetune"):
        (tmp_path / kind).mkdir()
        (tmp_path / kind / "config.json").write_text(json.dumps({"kind": kind, "dataset": str(data)}))
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "config.json").write_text('{"kind": "ksae-tr')
    result = script("dead-units-table", trained, cut, tmp_path / "ksae-baseline", tmp_path / "ksae-finetune", damaged,
                    cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    rows = {line.split("|")[-2].strip(): line.split("|")[1].strip() for line in result.stdout.splitlines()[2:]}
    assert rows["`trained`"] == "the paper's"
    assert rows["`cut`"].startswith(f"broken: {cut / 'checkpoint.h5'} is corrupt or truncated")
    assert rows["`ksae-baseline`"] == "a ksae-baseline run: no k-sparse units to count (give ksae-train runs)"
    assert rows["`ksae-finetune`"] == "a ksae-finetune run: no k-sparse units to count (give ksae-train runs)"
    assert rows["`damaged`"] == "broken: config.json is not JSON (cut short or overwritten)"


@pytest.mark.parametrize("name, args", [("fashion-mnist-table", ["--ks", "x"]), ("fashion-mnist-table", ["--ks", "10,0"]),
                                        ("bench-auxk", ["--rounds", "0"])])
def test_a_bad_count_is_a_usage_error_not_a_traceback(name, args, tmp_path):
    """These ended in a ValueError / StatisticsError traceback after loading data."""
    result = script(name, *args, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1].endswith("is not allowed; give a whole number >= 1"), result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_dead_units_table_counts_only_on_the_data_the_run_recorded(tmp_path):
    """A data file replaced since training is the row's refusal (both hashes), not a count on other data."""
    data, run = trained_run(tmp_path, "run")
    np.save(data, make_sparse_signals(200, D=8, H=16, k=2, seed=1)[0])  # replaced since
    result = script("dead-units-table", run, cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    row = result.stdout.splitlines()[2].split("|")[1].strip()
    assert row.startswith("broken: ") and "changed since the run was trained on it" in row, row

"""bin/paper-tables' options and run through the package (:mod:`ksae_cupy.recipes.paper_tables_script`); the
tables themselves: tests/bin/test_paper_tables.py."""
from __future__ import annotations

import pytest

from ksae_cupy.recipes import paper_tables_script as script


def test_the_default_runs_root_and_out_are_under_the_clone_given(tmp_path):
    (tmp_path / "results" / "runs").mkdir(parents=True)
    args = script.parse(["--seeds", "0,2", "--rows", "k25"], repo=tmp_path)
    assert args.runs_root == tmp_path / "results" / "runs"
    assert args.out == tmp_path / "results" / "paper-tables.md"
    assert args.rows == [("err_mnist", "k25")] and args.settings.seeds == (0, 2)


@pytest.mark.parametrize("argv, message", [
    ([], "error: no arguments; give --out FILE "),
    (["--out", "t.md", "--threads", "0"], "error: --threads 0 is not allowed; use a positive number"),
    (["--out", "t.md", "--seeds", "-1"], "error: --seeds '-1' is not allowed; use comma-separated whole numbers"),
])
def test_a_bad_option_is_one_error_line_and_status_2(argv, message, tmp_path, capsys):
    (tmp_path / "results" / "runs").mkdir(parents=True)
    with pytest.raises(SystemExit) as stopped:
        script.parse(argv, repo=tmp_path)
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(message)


def test_a_command_inside_this_folder_is_shown_relative_to_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    deep = tmp_path / "bin" / "reproduce-finetune"
    assert script.command_text(str(deep), ["--out", tmp_path / "fn"], deep) == "bin/reproduce-finetune --out fn"
    assert script.command_text("ksae-eval", [tmp_path / "k25", "--threads", 1], deep) == "ksae-eval k25 --threads 1"


def test_main_writes_the_tables_and_prints_what_is_left(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    status = script.main(["--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "t.md"), "--rows", "k25"],
                         repo=tmp_path)
    lines = capsys.readouterr().out.splitlines()
    assert status == 0 and lines[0] == f"tables: {tmp_path / 't.md'}"
    assert "Table err_mnist" in (tmp_path / "t.md").read_text()
    assert [line.split()[1] for line in lines[1:]] == ["ksae-train", "ksae-eval"]  # the k25 row: train, evaluate
    assert "--run-dir runs/mnist-k25-5000" in lines[1]

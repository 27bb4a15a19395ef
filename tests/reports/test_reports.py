"""ksae_cupy.reports (run-folder state, Markdown) and the two small modules under it: ksae_cupy.atomic
(files written whole or not at all) and ksae_cupy.paper (the paper's figures, typed once)."""
from __future__ import annotations

import json
import os
import time

import pytest

from ksae_cupy import paper
from ksae_cupy.atomic import write_json_atomic, write_text_atomic
from ksae_cupy.errors import KsaeError
from ksae_cupy.reports.folders import evaluation_is_current, find_runs, progress, read_metrics, run_state
from ksae_cupy.reports.markdown import duration, mean_spread, percent, percent_spread, table


def _metrics(folder, epochs, cut=False):
    lines = "".join(json.dumps({"epoch": e, "step": 10 * e, "seconds": 1.5}) + "\n" for e in epochs)
    (folder / "metrics.jsonl").write_text(lines + ('{"epoch": 9, "sec' if cut else ""))


# -- folders -----------------------------------------------------------------------------------------------

def test_progress_counts_the_logged_epochs_and_their_seconds_and_leaves_out_a_line_cut_short(tmp_path):
    assert progress(tmp_path) == (0, 0.0)  # nothing logged yet
    _metrics(tmp_path, [1, 2, 3], cut=True)
    assert progress(tmp_path) == (3, 4.5)
    assert [r["epoch"] for r in read_metrics(tmp_path)] == [1, 2, 3]


def test_a_damaged_metrics_line_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1}\nnot json\n{"epoch": 2}\n')
    with pytest.raises(KsaeError, match="metrics.jsonl: line 2"):
        read_metrics(tmp_path)


@pytest.mark.parametrize("config, logged, results, asked, state", [
    ({"kind": "ksae-train", "train": {"epochs": 10}}, [1, 2], None, 10, "stopped at epoch 2 of 10"),
    ({"kind": "ksae-train", "train": {"epochs": 10}}, [1, 2], "no checkpoint", 10,
     "not started (stopped at epoch 2, before its first checkpoint)"),
    ({"train": {"epochs": 2}}, [1, 2], None, 2, "trained (2 epochs), not evaluated"),  # before kinds were written
    ({"kind": "ksae-train", "train": {"epochs": 2}}, [1, 2], {"epoch": 1}, 2, "trained (2 epochs), not evaluated"),
    ({"kind": "ksae-baseline", "baseline": {"epochs": 2}}, [1, 2], {"epoch": 2}, 2, "done"),
    ({"kind": "ksae-finetune", "finetune": {"epochs": 2, "phases": ["softmax", "top", "all"]}}, [1, 2, 1, 2], None,
     6, "stopped at epoch 4 of 6"),  # a fine-tuning run logs each phase's epochs from 1
    ({"finetune": {"epochs": 1, "phases": ["all"]}}, [1], {"test_error": 0.01}, 1, "done"),
])
def test_run_state_reads_what_each_command_wrote(tmp_path, config, logged, results, asked, state):
    (tmp_path / "config.json").write_text(json.dumps(config))
    _metrics(tmp_path, logged)
    if results != "no checkpoint":
        (tmp_path / "checkpoint.h5").write_bytes(b"not read")
    if isinstance(results, dict):
        name = "finetune.json" if "finetune" in config else "eval.json"
        (tmp_path / name).write_text(json.dumps(results))
    run = run_state(tmp_path)
    assert (run.epochs_asked, run.describe()) == (asked, state)
    assert run.seconds == 1.5 * len(logged)


def test_find_runs_finds_every_folder_with_a_config_at_any_depth(tmp_path):
    for name in ("a", "b/c", "b/d/e"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "config.json").write_text("{}")
    (tmp_path / "f").mkdir()  # no config.json: not a run folder
    assert [run.path.relative_to(tmp_path).as_posix() for run in find_runs(tmp_path)] == ["a", "b/c", "b/d/e"]
    assert find_runs(tmp_path / "nowhere") == []


def test_an_evaluation_is_current_when_newer_than_the_checkpoint_and_made_with_the_grids_asked(tmp_path):
    (tmp_path / "checkpoint.h5").write_bytes(b"x")
    assert not evaluation_is_current(tmp_path)
    (tmp_path / "eval.json").write_text(json.dumps({"alphas": [1.0, 2.0], "l2_grid": [1e-3, 1e-4]}))
    assert evaluation_is_current(tmp_path)
    assert evaluation_is_current(tmp_path, alphas=["1", "2"], l2_grid=["1e-4", "1e-3"])
    assert not evaluation_is_current(tmp_path, alphas=["1", "3"])
    assert not evaluation_is_current(tmp_path, raw_baseline=True)  # no raw_baseline in it
    later = time.time() + 10
    os.utime(tmp_path / "checkpoint.h5", (later, later))  # trained on after the evaluation
    assert not evaluation_is_current(tmp_path)


# -- markdown ----------------------------------------------------------------------------------------------

def test_table_percent_and_duration():
    assert table(["a", "b"], [[1, None], ["x", 2.5]], "lr") == "| a | b |\n|---|---:|\n| 1 |  |\n| x | 2.5 |"
    assert (percent(0.0135), percent(None), percent(0.5, 0)) == ("1.35%", "-", "50%")
    assert [duration(s) for s in (4.25, 42, 252, 15120)] == ["4.2 s", "42 s", "4.2 min", "4.2 h"]


def test_seeds_are_shown_as_mean_and_sample_standard_deviation():
    assert mean_spread([0.02]) == (0.02, None)
    mean, spread = mean_spread([0.018, 0.019, 0.020])
    assert mean == pytest.approx(0.019) and spread == pytest.approx(0.001)
    assert percent_spread([0.018, 0.019, 0.020]) == "1.90% ± 0.10"
    assert percent_spread([0.0135]) == "1.35%"


# -- atomic writes -------------------------------------------------------------------------------------------

def test_a_write_whose_check_fails_leaves_the_old_file_as_it_was(tmp_path):
    path = tmp_path / "r.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(ValueError):
        write_text_atomic(path, '{"a": ', check=json.loads)  # half a document never replaces a whole one
    assert json.loads(path.read_text()) == {"a": 1}
    write_json_atomic(path, {"b": [1, 2]})
    assert json.loads(path.read_text()) == {"b": [1, 2]} and not (tmp_path / "r.json.tmp").exists()


# -- the paper's figures ---------------------------------------------------------------------------------------

def test_the_paper_figures_are_read_where_they_are_quoted():
    from ksae_cupy.evaluation.eval_report import markdown_report
    from ksae_cupy.supervised.baselines import PAPER_ERR_MNIST

    assert PAPER_ERR_MNIST == {"rbm": 0.0181, "dropout-ae": 0.0180, "denoising-ae": 0.0195,
                               "dropout-denoising-ae": 0.0160}
    assert paper.errors(paper.FN_MNIST)["deep-dropout-ae"] == 0.0085
    assert paper.err_mnist_error("k25", "mnist", 1000) == 0.0135
    assert paper.err_mnist_error("k25", "mnist", 500) is None and paper.err_mnist_error("k25", "norb", 1000) is None
    assert paper.err_mnist_error("k70", "mnist", 1000) is None
    selected = {"alpha": 3.0, "l2": 1e-4, "valid_error": 0.02}
    report = markdown_report({"run_dir": "r", "k": 25, "hidden": 1000, "epoch": 1, "dataset": "mnist", "device": "cpu",
                              "paper_test_error": 0.0135,
                              "features": {"selected": selected, "test_error": 0.02, "refit": "train+valid"},
                              "raw_baseline": {"selected": {**selected, "alpha": None}, "test_error": 0.07}})
    assert "| 7.20% |" in report and "| 1.35% |" in report  # the raw row's figure comes from ksae_cupy.paper


def test_a_folder_another_process_holds_is_running_and_given_no_command(tmp_path):
    from ksae_cupy.reports import paper_tables
    from ksae_cupy.session.runlock import RunLock

    folder = tmp_path / "k25"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"kind": "ksae-train", "dataset": "mnist", "train": {
        "hidden": 1000, "k": 25, "epochs": 10, "seed": 0}}))
    _metrics(folder, [1, 2])
    (folder / "checkpoint.h5").write_bytes(b"not read")
    lock = RunLock(folder)
    lock.acquire()
    try:
        assert run_state(folder).describe() == "running: epoch 2 of 10"
        [target] = paper_tables.plan(tmp_path, [("err_mnist", "k25")], paper_tables.Settings(ksparse_epochs=10))
        assert target.folder == folder and target.steps == []  # left to the process running it
    finally:
        lock.release()
    [target] = paper_tables.plan(tmp_path, [("err_mnist", "k25")], paper_tables.Settings(ksparse_epochs=10))
    assert [command for command, _ in target.steps] == ["ksae-train", "ksae-eval"]
    assert target.steps[0][1][:2] == ["--resume", folder]


# -- the project's commands as children -------------------------------------------------------------------------

def test_python_argv_runs_a_console_script_or_a_script_file_with_this_python():
    import sys

    from ksae_cupy.reports.children import python_argv, shown

    argv = python_argv("ksae-eval", "run", 3)
    assert argv[:2] == [sys.executable, "-c"] and "eval_command()" in argv[2] and argv[3:] == ["run", "3"]
    assert python_argv("bin/reproduce-finetune", "--rows", "ksparse") == [sys.executable, "bin/reproduce-finetune",
                                                                        "--rows", "ksparse"]
    assert shown("ksae-eval", "a b", 3) == "ksae-eval 'a b' 3"


def test_run_or_exit_ends_the_script_with_one_line_naming_the_failed_command(tmp_path, capfd):
    from ksae_cupy.reports.children import run_or_exit

    with pytest.raises(SystemExit) as ended:
        run_or_exit("ksae-eval", [tmp_path / "no-run"], who="a-script")
    assert str(ended.value) == f"a-script: ksae-eval {tmp_path / 'no-run'} failed with exit status 2"
    out, err = capfd.readouterr()
    assert out.startswith(f"+ ksae-eval {tmp_path / 'no-run'}") and "error:" in err  # the command's own line

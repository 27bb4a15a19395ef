"""The user's own data with labels and splits: .npz (X, y, X_test, y_test), file.h5:X with
--labels, .npy labels, seeded validation and test fractions; one-line errors for labels that
do not fit; and the two commands a user runs, ksae-train then ksae-eval, end to end."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from clicheck import assert_one_line_error
from ksae_cupy import load_dataset
from ksae_cupy.errors import KsaeError


def labelled(n=300, D=12, classes=3, seed=0):
    """Classes that differ in which third of the features is bright, values in [0, 1]."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    X = 0.3 * rng.random((n, D)) + 0.6 * (np.arange(D)[None, :] % classes == y[:, None])
    return X.astype(np.float32), y


@pytest.fixture
def npz(tmp_path):
    X, y = labelled(400)
    path = tmp_path / "data.npz"
    np.savez(path, X=X[:300], y=y[:300], X_test=X[300:], y_test=y[300:])
    return path, X, y


def test_npz_brings_labels_and_its_test_set(npz):
    path, X, y = npz
    data = load_dataset(str(path))
    assert (len(data.X_train), len(data.X_valid), len(data.X_test)) == (270, 30, 100)
    np.testing.assert_array_equal(data.X_test, X[300:])
    np.testing.assert_array_equal(data.y_test, y[300:])
    assert data.n_classes == 3 and data.y_train.dtype == np.int64
    # every training row is a row of X with its own label, and train / valid share none
    rows = {tuple(r): label for r, label in zip(X[:300], y[:300])}
    assert all(rows[tuple(r)] == label for r, label in zip(data.X_train, data.y_train))
    assert not {tuple(r) for r in data.X_train} & {tuple(r) for r in data.X_valid}


def test_fractions_and_seed_choose_the_rows(tmp_path):
    X, y = labelled(200)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    a = load_dataset(str(tmp_path / "X.npy"), labels=str(tmp_path / "y.npy"), valid_fraction=0.2, test_fraction=0.25)
    b = load_dataset(str(tmp_path / "X.npy"), labels=str(tmp_path / "y.npy"), valid_fraction=0.2, test_fraction=0.25)
    c = load_dataset(str(tmp_path / "X.npy"), labels=str(tmp_path / "y.npy"), valid_fraction=0.2, test_fraction=0.25,
                     split_seed=1)
    assert (len(a.X_train), len(a.X_valid), len(a.X_test)) == (110, 40, 50)
    np.testing.assert_array_equal(a.X_test, b.X_test)  # the same seed, the same rows
    assert not np.array_equal(a.X_test, c.X_test)
    together = np.concatenate([a.X_train, a.X_valid, a.X_test])
    assert sorted(map(tuple, together)) == sorted(map(tuple, X))  # a partition of the rows


def test_h5_member_with_labels_from_the_same_file(tmp_path):
    X, y = labelled(100)
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f["X"], f["y"] = X, y.reshape(-1, 1)  # a column of labels is taken as a vector
    data = load_dataset(f"{tmp_path / 'f.h5'}:X", labels=f"{tmp_path / 'f.h5'}:y")
    assert data.n_classes == 3 and len(data.y_train) + len(data.y_valid) == 100


def test_test_set_from_another_file(tmp_path, npz):
    path, X, y = npz
    np.savez(tmp_path / "other.npz", X=X[:50], y=y[:50])
    data = load_dataset(str(path), test=str(tmp_path / "other.npz"))
    np.testing.assert_array_equal(data.y_test, y[:50])


@pytest.mark.parametrize("labels, fragments", [
    (np.arange(99) % 3, ["hold 99 values for 100 rows", "one label per row"]),
    (np.full(100, 0.5), ["are not integers (row 0: 0.5)", "class numbers"]),
    (np.full(100, 2), ["hold one class (2)", "at least two"]),
    (np.where(np.arange(100) == 7, -1, 1), ["hold -1 (row 7)", "class numbers 0 to"]),
    (np.array(["a"] * 100), ["dtype <U1", "integer class numbers"]),
])
def test_labels_that_do_not_fit_are_one_line_errors(tmp_path, labels, fragments):
    X, _ = labelled(100)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", labels)
    with pytest.raises(KsaeError) as info:
        load_dataset(str(tmp_path / "X.npy"), labels=str(tmp_path / "y.npy"))
    assert "\n" not in str(info.value) and str(tmp_path / "y.npy") in str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"valid_fraction": 1.5}, "valid_fraction 1.5 is not allowed; use 0 < fraction < 1"),
    ({"valid_fraction": 0.5, "test_fraction": 0.5}, "test_fraction 0.5 is not allowed"),
    ({"test_labels": "y.npy"}, "test_labels y.npy is not allowed without test;"),
    ({"test": "T.npy", "test_fraction": 0.2}, "test_fraction 0.2 is not allowed with test;"),
    ({"valid_fraction": 0.6, "test_fraction": 0.5}, "use 0 <= fraction < 1 - valid_fraction \\(0.6\\)"),
])
def test_bad_split_arguments_name_the_python_argument(npz, kwargs, fragment):
    with pytest.raises(KsaeError, match=fragment):
        load_dataset(str(npz[0]), **kwargs)


@pytest.mark.parametrize("args, line", [
    (["--test-labels", "y.npy"], "--test-labels y.npy is not allowed without --test; name the test examples' file too"),
    (["--test", "T.npy", "--test-fraction", "0.2"], "--test-fraction 0.2 is not allowed with --test"),
    (["--valid-fraction", "0.6", "--test-fraction", "0.5"],
     "--test-fraction 0.5 is not allowed; use 0 <= fraction < 1 - --valid-fraction (0.6)"),
])
def test_a_command_names_every_option_of_a_split_mistake_by_its_flag(npz, args, line):
    # The same mistakes as above, in Python terms there; each parameter the message names is a flag here.
    from ksae_cupy.cli.train import train_command

    result = CliRunner().invoke(train_command, [str(npz[0]), *args, *SMALL])
    assert_one_line_error(result, line, status=2)


def test_options_of_own_files_are_refused_for_a_builtin_dataset():
    with pytest.raises(KsaeError, match="labels is not allowed with the built-in dataset 'synthetic'"):
        load_dataset("synthetic", labels="y.npy")


def test_test_set_without_labels_beside_labelled_data_is_refused(tmp_path, npz):
    path, X, _ = npz
    np.save(tmp_path / "T.npy", X[:20])
    with pytest.raises(KsaeError, match="the data has labels but the test set has none"):
        load_dataset(str(path), test=str(tmp_path / "T.npy"))


# -- the two commands ----------------------------------------------------------------------------

SMALL = ["--hidden", "24", "--k", "4", "--epochs", "4", "--batch-size", "32", "--device", "cpu", "--quiet"]


def test_train_then_eval_on_a_labelled_npz(tmp_path, npz):
    from ksae_cupy.cli.evaluate import eval_command
    from ksae_cupy.cli.train import train_command

    run = tmp_path / "run"
    result = CliRunner().invoke(train_command, [str(npz[0]), *SMALL, "--run-dir", str(run)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    config = json.loads((run / "config.json").read_text())
    assert config["data"]["valid_fraction"] == 0.1 and config["train"]["lr_auto"] is True
    result = CliRunner().invoke(eval_command, [str(run), "--alphas", "1,2", "--l2", "1e-3", "--quiet"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads((run / "eval.json").read_text())
    assert report["features"]["test_error"] < 0.2  # three well-separated classes


def test_eval_takes_labels_for_a_run_trained_without_them(tmp_path):
    from ksae_cupy.cli.evaluate import eval_command
    from ksae_cupy.cli.train import train_command

    X, y = labelled(300)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    run = tmp_path / "run"
    args = [str(tmp_path / "X.npy"), *SMALL, "--run-dir", str(run), "--test-fraction", "0.2", "--split-seed", "3"]
    assert CliRunner().invoke(train_command, args, catch_exceptions=False).exit_code == 0
    no_labels = CliRunner().invoke(eval_command, [str(run), "--alphas", "1", "--l2", "1e-3"])
    assert_one_line_error(no_labels, "has no labels", "--labels", status=2)
    # The run's splits are the only ones: ksae-eval does not offer the options that would change them.
    other_split = CliRunner().invoke(eval_command, [str(run), "--labels", str(tmp_path / "y.npy"), "--split-seed", "4"])
    assert other_split.exit_code == 2 and "No such option '--split-seed'" in other_split.output
    ok = CliRunner().invoke(eval_command, [str(run), "--labels", str(tmp_path / "y.npy"), "--alphas", "1",
                                           "--l2", "1e-3", "--quiet"], catch_exceptions=False)
    assert ok.exit_code == 0, ok.output
    assert json.loads((run / "eval.json").read_text())["features"]["test_error"] < 0.2


def test_eval_of_a_run_without_a_test_set_names_the_options_that_give_one(tmp_path):
    from ksae_cupy.cli.evaluate import eval_command
    from ksae_cupy.cli.train import train_command

    X, y = labelled(200)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    run = tmp_path / "run"
    args = [str(tmp_path / "X.npy"), "--labels", str(tmp_path / "y.npy"), *SMALL, "--run-dir", str(run)]
    assert CliRunner().invoke(train_command, args, catch_exceptions=False).exit_code == 0
    result = CliRunner().invoke(eval_command, [str(run), "--alphas", "1", "--l2", "1e-3"])
    assert_one_line_error(result, "has no labelled test set; give --test (with --test-labels unless it is an .npz "
                                  "holding y), or train with --test-fraction", status=2)


def test_train_refuses_mismatched_labels_before_creating_the_run(tmp_path):
    from ksae_cupy.cli.train import train_command

    X, y = labelled(100)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y[:90])
    result = CliRunner().invoke(train_command, [str(tmp_path / "X.npy"), "--labels", str(tmp_path / "y.npy"), *SMALL,
                                                "--run-dir", str(tmp_path / "run")])
    assert_one_line_error(result, "hold 90 values for 100 rows", status=2)
    assert not (tmp_path / "run").exists()
    bad = CliRunner().invoke(train_command, ["mnist", "--labels", "y.npy", *SMALL])
    assert_one_line_error(bad, "--labels is not allowed with the built-in dataset 'mnist'", status=2)


def test_finetune_and_analyze_take_the_runs_labelled_npz(tmp_path, npz):
    from ksae_cupy.cli.analyze import analyze_command
    from ksae_cupy.cli.finetune import finetune_command
    from ksae_cupy.cli.train import train_command

    run = tmp_path / "run"
    assert CliRunner().invoke(train_command, [str(npz[0]), *SMALL, "--run-dir", str(run)],
                              catch_exceptions=False).exit_code == 0
    tuned = CliRunner().invoke(finetune_command, [str(run), "--epochs", "2", "--batch-size", "32", "--device", "cpu",
                                                  "--run-dir", str(tmp_path / "tuned"), "--quiet"],
                               catch_exceptions=False)
    assert tuned.exit_code == 0, tuned.output
    results = json.loads((tmp_path / "tuned" / "finetune.json").read_text())
    assert results["dataset"] == str(npz[0].resolve()) and results["test_error"] is not None
    iti = CliRunner().invoke(analyze_command, ["iti", str(run), "--n-samples", "20", "--split", "test", "--quiet"],
                             catch_exceptions=False)
    assert iti.exit_code == 0, iti.output
    assert json.loads((run / "iti.json").read_text())["n"] == 20


def test_resume_keeps_the_runs_splits_and_its_auto_rate(tmp_path, npz):
    from ksae_cupy.cli.train import train_command

    run = tmp_path / "run"
    first = [str(npz[0]), *SMALL, "--epochs", "2", "--valid-fraction", "0.2", "--run-dir", str(run)]
    assert CliRunner().invoke(train_command, first, catch_exceptions=False).exit_code == 0
    other = CliRunner().invoke(train_command, ["--resume", str(run), "--epochs", "3", "--valid-fraction", "0.3"])
    assert_one_line_error(other, "--valid-fraction 0.3 (the run has 0.2)", status=2)
    same = CliRunner().invoke(train_command, ["--resume", str(run), "--epochs", "3", "--valid-fraction", "0.2",
                                              "--lr", "auto", "--quiet"], catch_exceptions=False)
    assert same.exit_code == 0, same.output
    assert [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    fixed = CliRunner().invoke(train_command, ["--resume", str(run), "--epochs", "4", "--lr", "0.5"])
    assert_one_line_error(fixed, "--lr 0.5 (the run has", status=2)

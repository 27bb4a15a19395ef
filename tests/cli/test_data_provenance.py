"""Provenance end to end (ksae_cupy/session/trained_on.py), through the real commands: a run's data file
replaced since training is refused by every command that reads it; codes carry their origin, layer 2
records it and deep fine-tuning checks the chain; the evaluation's kept fits are keyed on every value of
the data."""
import json

import numpy as np
import pytest

from ksae_cupy.cli.analyze import analyze_command
from ksae_cupy.cli.baseline import baseline_command
from ksae_cupy.cli.data import data_command
from ksae_cupy.cli.evaluate import eval_command
from ksae_cupy.cli.finetune import finetune_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.evaluation import classifier, grid
from ksae_cupy.evaluation import run_evaluation, selection
from ksae_cupy.session.runs import RunFolder
from clicheck import FINETUNE, SESSION, assert_one_line_error, invoke
from runfolder import make_run, sparse_signal_dataset



def write_rows(path, seed=0, n=300):
    """Labelled rows in [0, 1], 16 wide (the RBM and the autoencoders take them as they are)."""
    rng = np.random.default_rng(seed)
    X = rng.random((n, 16)).astype(np.float32)
    np.savez(path, X=X, y=(X[:, 0] > 0.5).astype(np.int64))
    return path


def change_one_value(path):
    """The same file, one value of one row changed: the same shape, other bytes."""
    arrays = dict(np.load(path))
    arrays["X"][5, 3] += 0.25
    np.savez(path, **arrays)


def train(data, run_dir, hidden=12, k=3, epochs=1, seed=0):
    invoke(train_command, [data, "--hidden", hidden, "--k", k, "--epochs", epochs, "--batch-size", 50,
                           "--seed", seed, "--run-dir", run_dir, *SESSION])
    return run_dir


def codes(run_dir, out):
    invoke(data_command, ["codes", run_dir, out])
    return out


@pytest.fixture
def stack(tmp_path):
    """Layer 1 on a user file, its codes, layer 2 trained on them."""
    rows = write_rows(tmp_path / "rows.npz")
    layer1 = train(rows, tmp_path / "layer1")
    written = codes(layer1, tmp_path / "codes.npy")
    layer2 = train(written, tmp_path / "layer2", hidden=8, k=2)
    return rows, layer1, written, layer2


# -- the data file ---------------------------------------------------------------------------------

def test_a_data_file_replaced_since_training_is_refused_by_every_command_that_reads_it(stack, tmp_path):
    rows, layer1, _, _ = stack
    recorded = RunFolder(layer1).read_config()["dataset_sha256"]
    change_one_value(rows)
    for command, args in ((eval_command, [layer1, "--threads", "1"]),
                          (data_command, ["codes", layer1, tmp_path / "again.npy"]),
                          (finetune_command, [layer1, "--run-dir", tmp_path / "ft", *FINETUNE]),
                          (finetune_command, [rows, layer1, "--run-dir", tmp_path / "ft", *FINETUNE]),
                          (analyze_command, ["iti", layer1])):
        result = invoke(command, args, expect=2)
        assert_one_line_error(result, f"{layer1}: its data file {rows.resolve()} changed since the run was trained",
                              f"the run recorded {recorded[:12]}", "put the run's data back", status=2)
    assert not (tmp_path / "again.npy").exists() and not (tmp_path / "again.json").exists()
    assert not (tmp_path / "ft").exists() and not (layer1 / "eval.json").exists()


def test_a_baseline_folder_on_a_replaced_file_is_refused_by_eval_and_codes(tmp_path):
    rows = write_rows(tmp_path / "rows.npz")
    run = tmp_path / "rbm"
    invoke(baseline_command, [rows, "--model", "rbm", "--hidden", 8, "--epochs", 1, "--batch-size", 50,
                              "--run-dir", run, *SESSION])
    change_one_value(rows)
    for command, args in ((eval_command, [run, "--threads", "1"]), (data_command, ["codes", run, tmp_path / "f.npy"])):
        assert_one_line_error(invoke(command, args, expect=2), f"{run}: its data file", "changed since", status=2)


def test_a_fine_tuning_run_records_its_data_and_resume_refuses_it_replaced(tmp_path):
    rows = write_rows(tmp_path / "rows.npz")
    layer1 = train(rows, tmp_path / "layer1")
    out = tmp_path / "ft"
    invoke(finetune_command, [layer1, "--run-dir", out, *FINETUNE])
    config = RunFolder(out).read_config()
    assert config["dataset_sha256"] == RunFolder(layer1).read_config()["dataset_sha256"]
    assert config["pretrained"][0]["dataset_sha256"] == config["dataset_sha256"]
    change_one_value(rows)
    result = invoke(finetune_command, ["--resume", out, "--threads", "1"], expect=2)
    assert_one_line_error(result, f"the run's data file {rows.resolve()} changed since the run started", status=2)


def labelled_separately(tmp_path):
    """Rows, their labels and a test set in separate files (ksae-train DATA --labels --test --test-labels)."""
    rng = np.random.default_rng(0)
    files = {name: tmp_path / f"{name}.npy" for name in ("X", "y", "X_test", "y_test")}
    for name, n in (("X", 300), ("X_test", 60)):
        np.save(files[name], rng.random((n, 16)).astype(np.float32))
        np.save(files["y" + name[1:]], (np.load(files[name])[:, 0] > 0.5).astype(np.int64))
    return files


def test_a_labels_file_replaced_since_training_is_refused_in_one_line_naming_both_hashes(tmp_path):
    from ksae_cupy.paths import file_sha256
    files = labelled_separately(tmp_path)
    run = tmp_path / "run"
    invoke(train_command, [files["X"], "--labels", files["y"], "--test", files["X_test"], "--test-labels",
                           files["y_test"], "--hidden", 12, "--k", 3, "--epochs", 1, "--batch-size", 50,
                           "--run-dir", run, *SESSION])
    data = RunFolder(run).read_config()["data"]
    assert data["labels_sha256"] == file_sha256(files["y"]) and data["test_sha256"] == file_sha256(files["X_test"])
    assert data["test_labels_sha256"] == file_sha256(files["y_test"])
    recorded = data["labels_sha256"]
    np.save(files["y"], 1 - np.load(files["y"]))  # the same shape and classes, every label flipped
    result = invoke(eval_command, [run, "--threads", "1", "--alphas", "1", "--l2", "1e-3"], expect=2)
    assert_one_line_error(result, f"{run}: its --labels file {files['y'].resolve()} changed since the run was "
                          f"trained (SHA-256 now {file_sha256(files['y'])[:12]}, the run recorded {recorded[:12]})",
                          "put the run's file back", status=2)
    assert not (run / "eval.json").exists()
    result = invoke(train_command, ["--resume", run, "--epochs", 2, "--threads", "1", "--quiet"], expect=2)
    assert_one_line_error(result, "its --labels file", "changed since the run was trained", status=2)
    # given again, the file is read as it is now: the command's choice, not the run's
    invoke(eval_command, [run, "--labels", files["y"], "--threads", "1", "--alphas", "1", "--l2", "1e-3", "--quiet"])
    assert (run / "eval.json").is_file()
    # a test file replaced: refused the same way, unless a new --test is given (with its labels)
    np.save(files["X_test"], np.load(files["X_test"])[::-1].copy())
    result = invoke(eval_command, [run, "--labels", files["y"], "--threads", "1", "--alphas", "1", "--l2", "1e-3"],
                    expect=2)
    assert_one_line_error(result, f"its --test file {files['X_test'].resolve()} changed", status=2)
    invoke(eval_command, [run, "--labels", files["y"], "--test", files["X_test"], "--test-labels", files["y_test"],
                          "--threads", "1", "--alphas", "1", "--l2", "1e-3", "--quiet"])


# -- codes, layer 2 and the chain --------------------------------------------------------------------

def test_codes_carry_their_origin_and_layer_2_records_it(stack):
    _, layer1, written, layer2 = stack
    origin = json.loads(written.with_suffix(".json").read_text())
    from ksae_cupy.paths import file_sha256
    assert origin["codes_sha256"] == file_sha256(written)
    assert origin["layer"]["checkpoint_sha256"] == file_sha256(layer1 / "checkpoint.h5")
    assert origin["layer"]["epoch"] == 1 and origin["layer"]["run_dir"] == str(layer1.resolve())
    assert origin["layer"]["run_id"] == RunFolder(layer1).read_config()["run_id"]
    config2 = RunFolder(layer2).read_config()
    assert config2["dataset_sha256"] == origin["codes_sha256"]
    assert config2["codes_origin"] == {"codes_sha256": origin["codes_sha256"], "alpha": 3.0,
                                       "layer": origin["layer"]}
    # a resumed layer 2 keeps the record
    invoke(train_command, ["--resume", layer2, "--epochs", 2, "--threads", "1", "--quiet"])
    assert RunFolder(layer2).read_config()["codes_origin"] == config2["codes_origin"]


def test_deep_fine_tuning_takes_a_layer_2_trained_on_this_layer_1s_codes(stack, tmp_path):
    _, layer1, _, layer2 = stack
    result = invoke(finetune_command, [layer1, layer2, "--run-dir", tmp_path / "ft", *FINETUNE])
    assert "cannot be verified" not in result.stderr
    assert (tmp_path / "ft" / "finetune.json").is_file()


def test_deep_fine_tuning_refuses_a_layer_2_trained_on_another_runs_codes(stack, tmp_path):
    rows, layer1, _, _ = stack
    other = train(rows, tmp_path / "other", seed=1)
    other2 = train(codes(other, tmp_path / "other-codes.npy"), tmp_path / "other2", hidden=8, k=2)
    other_id = RunFolder(other).read_config()["run_id"]
    result = invoke(finetune_command, [layer1, other2, "--run-dir", tmp_path / "ft", *FINETUNE], expect=2)
    assert_one_line_error(result, f"layer 2 {other2} was trained on the codes of another run", other_id,
                          f"not of layer 1 {layer1}", "write", "train layer 2 on them", status=2)
    assert not (tmp_path / "ft").exists()


def test_deep_fine_tuning_refuses_a_layer_1_resumed_after_its_codes_were_written(stack, tmp_path):
    _, layer1, _, layer2 = stack
    invoke(train_command, ["--resume", layer1, "--epochs", 2, "--threads", "1", "--quiet"])
    result = invoke(finetune_command, [layer1, layer2, "--run-dir", tmp_path / "ft", *FINETUNE], expect=2)
    assert_one_line_error(result, f"layer 1 {layer1} is now at epoch 2", "its codes of epoch 1",
                          "resumed after its codes were written", "ksae-data codes", status=2)
    assert not (tmp_path / "ft").exists()


def test_a_codes_file_replaced_later_is_refused(stack, tmp_path):
    rows, layer1, written, layer2 = stack
    other = train(rows, tmp_path / "other", seed=1)
    origin = written.with_suffix(".json").read_bytes()
    codes(other, tmp_path / "other-codes.npy")
    written.write_bytes((tmp_path / "other-codes.npy").read_bytes())  # the file replaced, its origin record kept
    # layer 2 read on it again: its data changed
    for command, args in ((eval_command, [layer2, "--threads", "1"]),
                          (data_command, ["codes", layer2, tmp_path / "layer3.npy"])):
        assert_one_line_error(invoke(command, args, expect=2), f"{layer2}: its data file {written.resolve()} changed",
                              status=2)
    # a new layer on it: the file is not the codes its origin record names
    assert written.with_suffix(".json").read_bytes() == origin
    result = invoke(train_command, [written, "--hidden", 8, "--k", 2, "--epochs", 1, "--batch-size", 50,
                                    "--run-dir", tmp_path / "new2", *SESSION], expect=2)
    assert_one_line_error(result, f"{written.resolve()} changed since ksae-data codes wrote it",
                          "write the codes again", status=2)
    assert not (tmp_path / "new2").exists()


def test_a_layer_2_without_an_origin_record_is_named_and_used(tmp_path):
    """Folders written before the records (results/runs): one note line, and the run goes on."""
    rows = write_rows(tmp_path / "rows.npz")
    layer1 = train(rows, tmp_path / "layer1")
    written = codes(layer1, tmp_path / "codes.npy")
    written.with_suffix(".json").unlink()  # as bin/reproduce-finetune's codes were before origins were recorded
    layer2 = train(written, tmp_path / "layer2", hidden=8, k=2)
    assert "codes_origin" not in RunFolder(layer2).read_config()
    result = invoke(finetune_command, [layer1, layer2, "--run-dir", tmp_path / "ft", *FINETUNE])
    notes = [line for line in result.stderr.splitlines() if "cannot be verified" in line]
    assert len(notes) == 1 and notes[0].startswith("note: ") and str(layer2) in notes[0], result.stderr
    assert (tmp_path / "ft" / "finetune.json").is_file()


# -- the evaluation's kept fits -----------------------------------------------------------------------

def test_kept_fits_are_not_reused_when_a_row_outside_the_old_sample_changed(tmp_path, monkeypatch):
    """The key once hashed every (N // 1000)-th row: with 2400 rows, row 1 was outside it."""
    data, W_dh = sparse_signal_dataset(n_train=2400, n_valid=200, n_test=200)
    run = make_run(tmp_path / "run", W_dh, k=5)
    calls, real_fit = [], classifier.fit

    def fit(*args, **kwargs):
        if len(calls) == 1 and stop[0]:
            raise KeyboardInterrupt
        calls.append(1)
        return real_fit(*args, **kwargs)

    stop = [True]
    monkeypatch.setattr(classifier, "fit", fit)
    grid_args = dict(alphas=[1], l2_grid=[1e-2, 1e-3], log=lambda *_: None, l2_extend=0)
    with pytest.raises(grid.EvaluationInterrupted):
        run_evaluation.evaluate_run(run, dataset=data, **grid_args)
    kept = grid.FitStore(run / grid.FITS_FILE, grid.fingerprint(run / "checkpoint.h5", data, max_iter=500,
                                                                 topk="sort", activation="linear",
                                                                 protocol=selection.PROTOCOL))
    assert len(kept) == 1  # the fit made before the stop, under the data's key
    data.X_train = data.X_train.copy()
    data.X_train[1, 0] += 1.0
    calls.clear()
    stop[0] = False
    run_evaluation.evaluate_run(run, dataset=data, **grid_args)
    assert len(calls) == 3  # both fits made again, and the refit: none from the old data reused

"""A run folder knows its run: a run_id drawn at creation is in config.json and in every checkpoint,
and every command that reads a folder's checkpoint (resume, eval, fine-tuning) refuses one that is
another run's, or a folder of another command's kind, in one line naming both. Folders written
before identities existed (no run_id) still load. Every case goes through the real command."""
import json
import shutil

import h5py
import pytest
from click.testing import CliRunner

from clicheck import assert_one_line_error
from ksae_cupy.cli.evaluate import eval_command
from ksae_cupy.cli.finetune import finetune_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.training.checkpoint import load_checkpoint
from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint
from runfolder import make_run

QUICK = ["synthetic", "--hidden", "16", "--k", "2", "--no-k-schedule", "--batch-size", "500", "--device", "cpu",
         "--epochs", "1"]
FINETUNE_QUICK = ["--epochs", "1", "--batch-size", "500", "--device", "cpu", "--lr-start", "0.1", "--lr-end", "0.01"]


def invoke(command, *args):
    return CliRunner().invoke(command, [str(a) for a in args])


def config(run):
    return json.loads((run / "config.json").read_text())


def train(run, *extra):
    result = invoke(train_command, *QUICK, "--run-dir", run, *extra)
    assert result.exit_code == 0, result.output
    return run


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return train(root / "a"), train(root / "b", "--seed", "1")


def test_a_new_run_writes_its_id_into_config_json_and_every_checkpoint(two_runs):
    a, b = two_runs
    assert config(a)["kind"] == "ksae-train" and len(config(a)["run_id"]) == 32
    assert load_checkpoint(a / "checkpoint.h5").run_id == config(a)["run_id"]
    assert config(a)["run_id"] != config(b)["run_id"]


def test_another_runs_checkpoint_copied_in_is_refused_by_resume_eval_and_finetune(two_runs, tmp_path):
    a, b = two_runs
    run = tmp_path / "a"
    shutil.copytree(a, run)
    shutil.copy(b / "checkpoint.h5", run / "checkpoint.h5")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    own, other = config(a)["run_id"], config(b)["run_id"]
    assert_one_line_error(invoke(train_command, "--resume", run, "--epochs", "2"),
                          f"belongs to run {other}, not to this folder's run {own}", status=2)
    assert_one_line_error(invoke(eval_command, run, "--device", "cpu"),
                          f"belongs to run {other}, not to this folder's run {own}", status=2)
    assert_one_line_error(invoke(finetune_command, run, *FINETUNE_QUICK, "--run-dir", tmp_path / "ft"),
                          f"belongs to run {other}, not to this folder's run {own}", status=2)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != ".lock"} == \
           {name: data for name, data in before.items() if name != ".lock"}
    assert not (tmp_path / "ft").exists()


def legacy_copy(run, tmp_path):
    """``(copy, its config)``: a copy of ``run`` whose config.json is as written before run ids (no
    run_id, no kind)."""
    copy = tmp_path / "legacy"
    shutil.copytree(run, copy)
    legacy = {key: value for key, value in config(run).items() if key not in ("run_id", "kind")}
    (copy / "config.json").write_text(json.dumps(legacy))
    return copy, legacy


def test_a_legacy_folder_without_ids_still_loads_and_gets_an_id_when_resumed(two_runs, tmp_path):
    a, _ = two_runs
    run, _ = legacy_copy(a, tmp_path)
    with h5py.File(run / "checkpoint.h5", "a") as f:  # as written before identities: no run_id
        del f.attrs["run_id"]
        from ksae_cupy.training import checksums
        checksums.seal(f)
    assert load_checkpoint(run / "checkpoint.h5").run_id is None
    assert invoke(eval_command, run, "--device", "cpu").exit_code == 0
    result = invoke(train_command, "--resume", run, "--epochs", "2")
    assert result.exit_code == 0, result.output
    assert load_checkpoint(run / "checkpoint.h5").run_id == config(run)["run_id"] is not None


def test_a_legacy_checkpoint_of_another_shape_is_refused_by_its_options(two_runs, tmp_path):
    """Without ids the options that shape the model tell runs apart: config.json is not rewritten."""
    a, b = two_runs
    run, legacy = legacy_copy(a, tmp_path)
    shutil.copy(b / "checkpoint.h5", run / "checkpoint.h5")  # seed 1, the folder's run has seed 0
    assert_one_line_error(invoke(train_command, "--resume", run, "--epochs", "2"),
                          "is not the run config.json describes: seed 1 (config.json: 0)", status=2)
    assert config(run) == legacy


def test_the_repositorys_run_folders_written_before_ids_still_open(tmp_path):
    from pathlib import Path

    import numpy as np

    from ksae_cupy.evaluation.trained_run import open_run
    from ksae_cupy.reports.kept_checkpoints import read_manifest

    # Their checkpoints are kept in git history, not in the tree (results/checkpoints.json; a shallow clone lacks
    # them): each config.json, as written then, is opened beside a checkpoint of its run's shape without an id.
    root = Path(__file__).resolve().parents[2]
    folders = sorted(root / Path(entry.path).parent for entry in read_manifest(root))
    # The paper-length MNIST runs were written before ids; runs carried since (baselines) have theirs.
    legacy = [folder for folder in folders if "run_id" not in config(folder) and "train" in config(folder)]
    assert {folder.name for folder in legacy} >= {"mnist-k10-5000", "mnist-k25-5000", "mnist-k40-5000"}
    for folder in legacy:
        train = config(folder)["train"]
        shaping = {key: value for key, value in train.items() if key not in ("k", "hidden")}
        copy = make_run(tmp_path / folder.name, np.zeros((784, train["hidden"])), train["k"], **shaping)
        (copy / "config.json").write_text((folder / "config.json").read_text())
        assert open_run(copy).k == train["k"]


def test_the_documented_legacy_runs_still_evaluate_from_their_folder(tmp_path):
    run = make_run(tmp_path / "old", [[1.0, 0.0], [0.0, 1.0]], k=1)  # the helper writes no ids
    assert "run_id" not in config(run)
    from ksae_cupy.evaluation.trained_run import open_run

    assert open_run(run).k == 1


def test_finetune_into_a_train_run_folder_names_the_kind_and_never_suggests_overwrite(two_runs):
    a, _ = two_runs
    result = invoke(finetune_command, a, *FINETUNE_QUICK, "--run-dir", a)
    assert_one_line_error(result, f"run folder {a} holds a ksae-train run", "choose another --run-dir", status=2)
    assert "--overwrite" not in result.stderr and "--resume" not in result.stderr


def test_a_finetune_folder_is_refused_by_train_resume_and_eval_naming_its_command(two_runs, tmp_path):
    a, _ = two_runs
    ft = tmp_path / "ft"
    result = invoke(finetune_command, a, *FINETUNE_QUICK, "--run-dir", ft)
    assert result.exit_code == 0, result.output
    assert config(ft)["kind"] == "ksae-finetune"
    assert load_finetune_checkpoint(ft / "checkpoint.h5")["run_id"] == config(ft)["run_id"]
    assert_one_line_error(invoke(train_command, "--resume", ft),
                          f"a ksae-finetune run folder, not a ksae-train one; continue it with ksae-finetune "
                          f"--resume {ft}", status=2)
    assert_one_line_error(invoke(eval_command, ft, "--device", "cpu"), "a ksae-finetune run folder", status=2)
    assert_one_line_error(invoke(finetune_command, ft, *FINETUNE_QUICK, "--run-dir", tmp_path / "ft2"),
                          "a ksae-finetune run folder, not a ksae-train one", status=2)


def test_a_finetune_checkpoint_of_another_run_is_refused_on_resume(two_runs, tmp_path):
    a, b = two_runs
    one, two = tmp_path / "one", tmp_path / "two"
    for pretrained, folder in ((a, one), (b, two)):
        assert invoke(finetune_command, pretrained, *FINETUNE_QUICK, "--run-dir", folder).exit_code == 0
    shutil.copy(two / "checkpoint.h5", one / "checkpoint.h5")
    assert_one_line_error(invoke(finetune_command, "--resume", one),
                          f"belongs to run {config(two)['run_id']}, not to this folder's run {config(one)['run_id']}",
                          status=2)

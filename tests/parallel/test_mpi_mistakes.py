"""Mistakes through the real ``mpiexec -n 2 python -m mpi4py -m ksae_cupy.cli.mpi_train train``:
one ``error:`` line (not one per rank, no MPICH "Abort(...)" line, no traceback) and exit status 2,
before any work; the run folder's lock and files, the checkpoint's checksums, divergence and
resume behave as in ``ksae-train``. (Issue 24's MPI cases; docs/reliability-audit-2026-11-25.md.)
"""
import hashlib
import re
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.training.checkpoint import load_checkpoint

from heldmpi import held_mpi_train, release, wait_until_held
from test_distributed import _missing, dist_train

pytestmark = pytest.mark.skipif(_missing is not None, reason=str(_missing))
SMALL = ["--hidden", "16", "--k", "2", "--batch-size", "20"]


@pytest.fixture
def folder(tmp_path):
    X = make_sparse_signals(400, D=8, H=16, k=2, seed=0)[0].astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "xi8.npy", (X * 10).astype(np.int8))
    (tmp_path / "text.txt").write_text("hello")
    return tmp_path


def one_error_line(proc, status=2) -> str:
    """The job's one line on stderr, after checking it is the only one and the exit status."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == status and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


def two_epoch_run(folder, *extra):
    dist_train(2, ["x.npy", *SMALL, "--epochs", "2", "--run-dir", "run1", "--quiet", *extra], cwd=folder)
    return folder / "run1"


@pytest.mark.parametrize("args, expected", [
    (["nothere.npy", *SMALL], "nothere.npy does not exist"),  # by its absolute path, as ksae-train names it
    (["text.txt", *SMALL], "unknown dataset 'text.txt'"),
    (["xi8.npy", *SMALL], "holds integers (dtype int8"),
    (["x.npy", "--hidden", "16", "--k", "30"], "--k 30 is not allowed; use 1 <= k <= hidden (16)"),
    (["x.npy", *SMALL, "--batch-size", "0"], "--batch-size 0 is not allowed"),
    (["x.npy", *SMALL, "--k-start", "1"], "--k-start 1 is not allowed"),
    ([*SMALL], "missing DATASET"),
    (["x.npy", *SMALL, "--run-dir", "text.txt/r"], "text.txt is a file, not a folder"),
    (["x.npy", *SMALL, "--comm", "nccl"], "--comm nccl needs --device gpu"),
    (["x.npy", *SMALL, "--topk-dist", "gather"], "--topk-dist gather is not allowed without --shard-hidden"),
    (["x.npy", *SMALL, "--checkpoint-every", "0"], "--checkpoint-every 0 is not allowed"),
    # issue 37: values legal to the parser but meaningless, refused before any work as ksae-train does
    (["x.npy", *SMALL, "--run-dir", ""], "--run-dir '' is not allowed: an empty path"),
    (["x.npy", *SMALL, "--lr", "1e-20"], "--lr 1e-20 is not allowed for this data: in float32 a step at that rate"),
    (["x.npy", *SMALL, "--sigma", "1e-50"], "--sigma 1e-50 is not allowed in float32"),
    (["mnist", *SMALL, "--data-dir", "text.txt"], "text.txt is a file, not a folder"),
    (["--resume", "nothere"], "--resume nothere: no such run folder"),
])
def test_a_mistake_is_one_line_before_any_work(folder, args, expected):
    proc = dist_train(2, [*args, "--epochs", "1", *([] if "--run-dir" in args else ["--run-dir", "r"])],
                      cwd=folder, check=False)
    assert expected in one_error_line(proc)
    assert proc.stdout == "" and not (folder / "r").exists()


def test_a_shard_hidden_layer_narrower_than_the_ranks_is_one_line(folder):
    proc = dist_train(3, ["x.npy", "--hidden", "2", "--k", "1", "--epochs", "1", "--shard-hidden", "--run-dir", "r"],
                      cwd=folder, check=False)
    assert "2 hidden units cannot be split over 3 ranks" in one_error_line(proc)


def test_a_mistyped_command_line_is_shown_once(folder):
    proc = dist_train(2, ["x.npy", "--epochs", "abc"], cwd=folder, check=False)
    assert proc.returncode == 2 and proc.stderr.count("Usage:") == 1 and proc.stderr.count("Error:") == 1


def test_a_new_run_refuses_a_folder_holding_a_run_unless_overwrite(folder):
    run = two_epoch_run(folder)
    line = one_error_line(dist_train(2, ["x.npy", *SMALL, "--epochs", "2", "--run-dir", "run1"], cwd=folder,
                                     check=False))
    assert "already holds a run" in line and "mpi_train train --resume run1" in line
    dist_train(2, ["x.npy", *SMALL, "--epochs", "1", "--run-dir", "run1", "--overwrite", "--quiet"], cwd=folder)
    assert load_checkpoint(run / "checkpoint.h5").epoch == 1
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1


def test_resume_applies_or_refuses_every_option_and_keeps_those_not_given(folder):
    run = two_epoch_run(folder, "--checkpoint-every", "1", "--topk", "threshold")
    refused = dist_train(2, ["--resume", "run1", "--epochs", "4", "--hidden", "30"], cwd=folder, check=False)
    assert "--hidden 30 (the run has 16)" in one_error_line(refused)
    extended = dist_train(2, ["--resume", "run1", "--epochs", "3"], cwd=folder)
    assert "applied: epochs 2 -> 3" in extended.stdout and "done: 3 epochs" in extended.stdout
    config = json.loads((run / "config.json").read_text())
    assert config["checkpoint_every"] == 1 and config["train"]["topk"] == "threshold"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3
    finished = dist_train(2, ["--resume", "run1", "--checkpoint-every", "2"], cwd=folder)
    assert "nothing to train: the run had already trained all its 3 epochs" in finished.stdout
    assert "applied: checkpoint-every 1 -> 2" in finished.stdout  # a setting of the session, said as ksae-dist did
    assert json.loads((run / "config.json").read_text())["checkpoint_every"] == 2
    wrong_ranks = dist_train(3, ["--resume", "run1", "--epochs", "4"], cwd=folder, check=False)
    assert "trained on 2 ranks; resume it with mpiexec -n 2" in one_error_line(wrong_ranks)
    # From another folder: the run names its data by absolute path.
    (folder / "sub").mkdir()
    dist_train(2, ["--resume", "../run1", "--epochs", "4", "--quiet"], cwd=folder / "sub")
    np.save(folder / "x.npy", np.load(folder / "x.npy")[::-1].copy())
    changed = dist_train(2, ["--resume", "run1", "--epochs", "5"], cwd=folder, check=False)
    assert "changed since the run started" in one_error_line(changed)


def test_resume_checks_the_runs_labels_and_test_files_as_ksae_train_does(folder):
    """--labels, --test and --test-labels are recorded with their SHA-256; a resume reads them only while their bytes
    are the run's, and refuses, by name, a data option given again that is not the run's."""
    X = np.load(folder / "x.npy")
    np.save(folder / "y.npy", np.arange(len(X)) % 3)
    np.save(folder / "xt.npy", X[:50])
    np.save(folder / "yt.npy", np.arange(50) % 3)
    dist_train(2, ["x.npy", *SMALL, "--epochs", "1", "--run-dir", "run1", "--labels", "y.npy", "--test", "xt.npy",
                   "--test-labels", "yt.npy", "--quiet"], cwd=folder)
    data = json.loads((folder / "run1" / "config.json").read_text())["data"]
    assert data["labels"] == str(folder / "y.npy") and data["test_labels"] == str(folder / "yt.npy")
    assert {data[f"{key}_sha256"] for key in ("labels", "test", "test_labels")} == {
        hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in ("y.npy", "xt.npy", "yt.npy")}
    dist_train(2, ["--resume", "run1", "--epochs", "2", "--quiet"], cwd=folder)  # the run's bytes: it goes on
    other = dist_train(2, ["--resume", "run1", "--epochs", "3", "--labels", "yt.npy"], cwd=folder, check=False)
    assert "--labels yt.npy (the run has" in one_error_line(other)
    np.save(folder / "yt.npy", np.arange(50) % 2)
    changed = dist_train(2, ["--resume", "run1", "--epochs", "3"], cwd=folder, check=False)
    line = one_error_line(changed)
    assert f"its --test-labels file {folder / 'yt.npy'} changed since the run was trained" in line
    assert json.loads((folder / "run1" / "config.json").read_text())["train"]["epochs"] == 2  # refused before any work


def test_resume_refuses_a_ksae_train_run_and_a_damaged_checkpoint(folder):
    single = subprocess.run([str(Path(sys.executable).parent / "ksae-train"), "x.npy", *SMALL, "--epochs", "1", "--device", "cpu", "--run-dir", "rs",
                             "--quiet"], cwd=folder, capture_output=True, text=True)
    assert single.returncode == 0, single.stderr
    line = one_error_line(dist_train(2, ["--resume", "rs"], cwd=folder, check=False))
    assert "continue it with ksae-train --resume rs" in line
    import h5py

    run = two_epoch_run(folder)

    with h5py.File(run / "checkpoint.h5", "r") as f:
        dataset = f["params/W_dh"]
        at = dataset.id.get_offset() + dataset.id.get_storage_size() // 2
    with open(run / "checkpoint.h5", "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x10]))
    line = one_error_line(dist_train(2, ["--resume", "run1", "--epochs", "4"], cwd=folder, check=False))
    assert "params/W_dh does not match its SHA-256 checksum" in line


def test_a_diverging_run_is_one_line_and_status_1(folder):
    proc = dist_train(2, ["x.npy", *SMALL, "--lr", "1e6", "--epochs", "3", "--run-dir", "r"], cwd=folder, check=False)
    line = one_error_line(proc, status=1)
    # Which non-finite value comes first (nan or inf) is float arithmetic's business, not the message's.
    assert re.search(r"the loss became (nan|inf|-inf) at epoch 1", line), line
    assert "nothing was saved" in line and "use a smaller --lr" in line
    assert not (folder / "r" / "checkpoint.h5").exists()


def test_a_second_job_into_a_held_run_folder_is_refused(folder):
    proc = held_mpi_train(2, ["x.npy", *SMALL, "--epochs", "3000", "--checkpoint-every", "1", "--run-dir", "r"],
                          folder, epoch=1, checkpoint=True)
    try:
        wait_until_held(proc)
        for args in (["--resume", "r", "--epochs", "5"], ["x.npy", *SMALL, "--epochs", "2", "--run-dir", "r",
                                                          "--overwrite"]):
            assert "run folder r is in use by another process" in one_error_line(
                dist_train(2, args, cwd=folder, check=False))
    finally:
        proc.terminate()  # SIGTERM to mpiexec: the held job stops after its next step
        release(proc)
    assert proc.returncode == 143

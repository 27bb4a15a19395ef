"""Every "what to do next" is true of the state it advises on, a library's failure keeps its real cause,
and a logged epoch's loss covers the whole epoch across a mid-epoch resume. Through the real commands
(in-process, with the fault injected where a real one cannot be made on demand) or the Python API."""
import errno
import json
import os
import sys
from pathlib import Path

import numpy as np
from click.testing import CliRunner

import ksae_cupy.training.checkpoint as checkpoint
from clicheck import assert_one_line_error
from resumecheck import stop_at
from ksae_cupy.cli.evaluate import eval_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.training.estimator import KSparseAutoencoder

QUICK = ["--hidden", "16", "--k", "2", "--k-start", "4", "--batch-size", "10", "--device", "cpu"]


def data(tmp_path, n=200):
    path = tmp_path / "x.npy"
    np.save(path, make_sparse_signals(n, D=8, H=16, k=2, seed=0)[0])
    return path


def invoke(command, *args):
    return CliRunner().invoke(command, [str(a) for a in args])


def epochs_logged(run):
    return [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()]


# -- metrics lines dropped on resume ---------------------------------------------------------------

def test_dropped_metrics_lines_say_which_epochs_run_again_and_which_do_not(tmp_path):
    run = tmp_path / "run"
    assert invoke(train_command, data(tmp_path), *QUICK, "--epochs", "2", "--run-dir", run).exit_code == 0
    with open(run / "metrics.jsonl", "a") as f:  # as after a crash: two epochs logged past the checkpoint
        for epoch, step in ((3, 1000), (4, 1001)):
            f.write(json.dumps({"epoch": epoch, "step": step}) + "\n")
    result = invoke(train_command, "--resume", run, "--epochs", "3")
    assert result.exit_code == 0, result.output
    assert ("metrics.jsonl: dropped 2 line(s): epochs 3-4, logged after the checkpoint (epoch 2); epoch 3 runs again, "
            "epoch 4 does not (the run now ends at epoch 3)") in result.output
    assert epochs_logged(run) == [1, 2, 3]


def test_a_cut_line_is_not_called_an_epoch_that_runs_again(tmp_path):
    run = tmp_path / "run"
    assert invoke(train_command, data(tmp_path), *QUICK, "--epochs", "2", "--run-dir", run).exit_code == 0
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 3, "step": 60, "lo')
    result = invoke(train_command, "--resume", run, "--epochs", "3")
    assert "metrics.jsonl: dropped 1 line(s): a last line cut short by a kill" in result.output
    assert "run again" not in result.output


# -- a failed checkpoint write: resume only where a checkpoint is ------------------------------------

def fill_the_disk(monkeypatch):
    """From now on every checkpoint write fails as on a full disk (ENOSPC), before its first byte; the
    real writer, to put back."""
    real_writer = checkpoint.write_hdf5_atomically

    def disk_full(path, write_fn, verify_fn):
        def enospc(f):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path) + ".tmp")
        return real_writer(path, enospc, verify_fn)

    monkeypatch.setattr(checkpoint, "write_hdf5_atomically", disk_full)
    return real_writer


def test_a_first_checkpoint_that_cannot_be_written_does_not_advise_resume(tmp_path, monkeypatch):
    real_writer = fill_the_disk(monkeypatch)
    run, x = tmp_path / "run", data(tmp_path)
    args = [x, *QUICK, "--epochs", "2", "--checkpoint-every", "1", "--run-dir", run]
    result = invoke(train_command, *args)
    assert_one_line_error(result, "No space left on device", "no checkpoint.h5 was written",
                          "start the run again with --overwrite (no checkpoint was written to resume from)", status=2)
    assert "--resume" not in result.stderr
    monkeypatch.setattr(checkpoint, "write_hdf5_atomically", real_writer)
    assert invoke(train_command, *args, "--overwrite").exit_code == 0  # the advice works


def test_the_api_save_does_not_advise_a_command_line_option(tmp_path, monkeypatch):
    model = KSparseAutoencoder(n_hidden=16, k=2, k_start=None, epochs=1, device="cpu").fit(
        make_sparse_signals(100, D=8, H=16, k=2, seed=0)[0])
    fill_the_disk(monkeypatch)
    try:
        model.save(tmp_path / "model.h5")
        raise AssertionError("no error")
    except checkpoint.CheckpointWriteError as exc:
        assert str(exc).endswith("no model.h5 was written; free space or fix the folder, then try again"), exc
        assert "--" not in str(exc)


# -- a library's failure keeps its real cause ------------------------------------------------------

def test_a_checkpoint_that_cannot_be_read_says_why_and_not_corrupt(tmp_path, monkeypatch):
    """Root reads any file, so the refusal h5py reports for a file without read permission is injected
    as h5py raises it (errno 13 on the exception, or only inside its message)."""
    import h5py

    run = tmp_path / "run"
    assert invoke(train_command, data(tmp_path), *QUICK, "--epochs", "1", "--run-dir", run).exit_code == 0
    real_file = h5py.File
    text = (f"Unable to synchronously open file (unable to open file: name = '{run / 'checkpoint.h5'}', errno = 13, "
            f"error message = 'Permission denied', flags = 0, o_flags = 0)")
    for raised in (PermissionError(errno.EACCES, text), OSError(text)):
        def refusing(name, mode="r", *args, **kwargs):
            if str(name).endswith("checkpoint.h5") and mode == "r":
                raise raised
            return real_file(name, mode, *args, **kwargs)

        monkeypatch.setattr(h5py, "File", refusing)
        result = invoke(eval_command, run, "--device", "cpu")
        assert_one_line_error(result, f"cannot read checkpoint {run / 'checkpoint.h5'}: Permission denied (errno 13)",
                              status=2)
        assert "corrupt" not in result.stderr


# -- the MPI trainer's resume hint names what is installed -------------------------------------------

def test_the_mpi_resume_hint_names_this_interpreter():
    from ksae_cupy.parallel.distributed_run import LAUNCH

    words = LAUNCH.format(size=2).split()
    assert words[3] == sys.executable and Path(words[3]).exists()
    assert words[0] == "mpiexec" or Path(words[0]).exists()


# -- an epoch's loss across a mid-epoch resume -------------------------------------------------------

def test_an_epoch_resumed_midway_logs_the_loss_of_all_its_batches(tmp_path):
    X = make_sparse_signals(400, D=8, H=16, k=2, seed=0)[0]
    settings = dict(n_hidden=16, k=2, k_start=None, epochs=3, batch_size=40, lr=0.05, device="cpu")
    whole = []
    KSparseAutoencoder(**settings).fit(X, on_epoch=whole.append)

    stopped, before = KSparseAutoencoder(**settings), []
    stopped.fit(X, on_epoch=before.append, on_batch=stop_at(stopped, epoch=1, batch=4))
    assert [r.epoch for r in before] == [1] and stopped.trainer_.batch_in_epoch == 4
    stopped.save(tmp_path / "mid.h5")
    after = []
    KSparseAutoencoder.load(tmp_path / "mid.h5", device="cpu").fit(X, on_epoch=after.append)
    assert [r.epoch for r in after] == [2, 3]
    assert [r.train_loss for r in before + after] == [r.train_loss for r in whole]  # epoch 2: all 10 batches

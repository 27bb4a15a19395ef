"""Work stays bounded whatever the numbers: the time-left estimate takes no memory or time per epoch
(``--epochs`` of 10^8), a stop signal is honoured after the next step, and thread counts are capped at
the cores this process may use (``--threads 100000``, ``n_threads=10**6``)."""
import os
import signal
import subprocess
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from heldrun import held_train, wait_until_held
from ksae_cupy import KSparseAutoencoder
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.errors import KsaeNote
from ksae_cupy import threads as threads_module
from ksae_cupy.training.checkpoint import load_checkpoint
from ksae_cupy.session.progress import RunProgress, done_around

ENV = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), PYTHONUNBUFFERED="1")


def progress_of(epochs, k, k_start, n_batches, step_cost=lambda k: 1.0 + 0.1 * k):
    config = types.SimpleNamespace(epochs=epochs, k=k, k_start=k_start, k_schedule_epochs=None, batch_size=10)
    trainer = types.SimpleNamespace(config=config, step=0, epoch=0, batch_in_epoch=0, finished=False)
    return RunProgress(trainer, n_batches * 10, enabled=False, tty=False, step_cost=step_cost)


@pytest.mark.parametrize("epochs, k, k_start, n_batches", [(1, 5, 9, 3), (7, 25, 100, 2), (40, 30, 4, 3),
                                                          (13, 6, 6, 1), (25, 3, None, 4)])
def test_the_closed_form_weighs_every_step_as_a_sum_over_the_epochs_does(epochs, k, k_start, n_batches):
    progress = progress_of(epochs, k, k_start, n_batches)
    weighed = [0.0]
    for epoch in range(epochs):
        for _ in range(n_batches):
            weighed.append(weighed[-1] + progress._relative_cost(progress._epoch_k(epoch)))
    for step, expected in enumerate(weighed):
        assert progress._work_before(step) == pytest.approx(expected, rel=1e-12, abs=1e-9)


def test_the_estimate_of_a_run_of_10_to_the_12_epochs_reads_the_schedule_a_few_hundred_times():
    progress = progress_of(10**12, 25, 100, 469)
    calls = []
    schedule_k = progress._epoch_k
    progress._epoch_k = lambda epoch: calls.append(epoch) or schedule_k(epoch)
    progress.trainer.epoch, progress.trainer.step = 1, 469
    assert progress.seconds_left() is not None
    assert len(calls) < 76 * 45  # one bisection per k of 100 -> 25, never one read per epoch
    assert done_around(1e13) == "done after the year 9999"  # past what a date holds: no OverflowError


def test_ksae_train_of_10_to_the_8_epochs_stops_after_the_next_step_on_ctrl_c(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, make_sparse_signals(200, D=8, H=16, k=2, seed=0)[0])  # 180 train rows: 9 steps an epoch
    run = tmp_path / "run"
    proc = subprocess.Popen(held_train(1) + [str(path), "--hidden", "16", "--k", "2", "--k-start", "8", "--batch-size",
                                             "20", "--lr", "0.01", "--device", "cpu", "--threads", "1", "--epochs",
                                             str(10**8), "--run-dir", str(run)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    wait_until_held(proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=600)  # a hang guard only
    assert proc.returncode == 130, err
    assert "estimate: 100000000 epochs" in out + err
    saved = load_checkpoint(run / "checkpoint.h5")
    assert saved.step <= 9 + 1, saved.step  # the step under way when the signal came, and no more


def test_ksae_baseline_of_10_to_the_8_epochs_stops_after_the_next_step_on_sigterm(tmp_path):
    from ksae_cupy.supervised.baseline_trainer import load_baseline_checkpoint

    path = tmp_path / "x.npy"
    np.save(path, np.random.default_rng(0).random((200, 8)).astype(np.float32))  # 180 train rows: 9 steps an epoch
    run = tmp_path / "run"
    proc = subprocess.Popen(held_train(1, command="baseline") + [
        str(path), "--model", "dropout-ae", "--hidden", "8", "--batch-size", "20", "--lr", "0.01", "--device", "cpu",
        "--threads", "1", "--epochs", str(10**8), "--run-dir", str(run)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    wait_until_held(proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=600)  # a hang guard only
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "estimate: 100000000 epochs" in out + err
    assert load_baseline_checkpoint(run / "checkpoint.h5").step <= 9 + 1


def test_a_thread_count_above_the_cores_is_capped_with_a_note(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, make_sparse_signals(60, D=8, H=16, k=2, seed=0)[0])
    cores = threads_module.usable_cores()
    result = CliRunner().invoke(train_command, [str(path), "--hidden", "16", "--k", "2", "--batch-size", "10",
                                               "--lr", "0.01", "--epochs", "1", "--device", "cpu",
                                               "--threads", "100000", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert (f"note: --threads 100000 is more than the {cores} cores this process may use; using {cores}"
            in result.stderr.splitlines())
    assert f"--threads 100000 capped at the {cores} usable cores" in result.output


def test_the_estimators_n_threads_is_capped_with_a_warning(monkeypatch):
    monkeypatch.setattr(threads_module, "_process_threads", None)
    cores = threads_module.usable_cores()
    X = np.random.default_rng(0).random((60, 8)).astype(np.float32)
    from ksae_cupy.cpu import lanes
    before = set(lanes._lanes)  # pools other tests started on purpose (3 or 5 lanes) stay cached
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        KSparseAutoencoder(n_hidden=16, k=2, k_start=None, epochs=1, batch_size=20, lr=0.01, n_threads=10**6,
                           device="cpu").fit(X)
    notes = [str(w.message) for w in caught if issubclass(w.category, KsaeNote)]
    assert f"n_threads 1000000 is more than the {cores} cores this process may use; using {cores}" in notes
    assert max(set(lanes._lanes) - before, default=1) <= cores  # this fit started no lanes beyond the cores

"""Nothing silently wrong in a run folder: one writer at a time, no mixing with another run's
files, SIGTERM and SIGHUP stop as Ctrl-C does, a diverged run or integer data never trains on.

Every case goes through the real command (in-process with CliRunner, or a subprocess where a
second process or a signal is the point); waits are on events (a line, a file), never a clock.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from clicheck import assert_one_line_error
from heldrun import held_train, wait_until_held
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.training.checkpoint import load_checkpoint
from ksae_cupy.session.runlock import RunLock

QUICK = ["--hidden", "16", "--k", "2", "--k-start", "4", "--batch-size", "20", "--device", "cpu"]
TRAIN = [sys.executable, "-c", "from ksae_cupy.cli.train import train_command; train_command()"]
ENV = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), PYTHONUNBUFFERED="1")


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, make_sparse_signals(400, D=8, H=16, k=2, seed=0)[0])
    return path


def invoke(*args):
    return CliRunner().invoke(train_command, [str(a) for a in args])


# -- one writer per run folder --------------------------------------------------------------------

def test_a_second_writer_is_refused_with_the_holders_pid_and_nothing_is_touched(data_file, tmp_path):
    run = tmp_path / "run"
    assert invoke(data_file, *QUICK, "--epochs", "1", "--run-dir", run).exit_code == 0
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom ksae_cupy.session.runlock import "
                               "RunLock\nRunLock(sys.argv[1]).acquire()\nprint('locked', flush=True)\nsys.stdin.read()",
                               str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert holder.stdout.readline() == "locked\n"  # the event: the other process holds the lock now
        for args in (["--resume", run, "--epochs", "2"], [data_file, *QUICK, "--epochs", "1", "--run-dir", run,
                                                          "--overwrite"]):
            result = invoke(*args)
            assert_one_line_error(result, f"run folder {run} is in use by another process (PID {holder.pid} holds",
                                  status=2)
        assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != ".lock"} == \
               {name: data for name, data in before.items() if name != ".lock"}
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    result = invoke("--resume", run, "--epochs", "2")  # the holder is gone: the folder is free again
    assert result.exit_code == 0, result.output


def test_a_lock_left_by_a_killed_run_is_taken_over(data_file, tmp_path):
    run = tmp_path / "run"
    assert invoke(data_file, *QUICK, "--epochs", "1", "--run-dir", run).exit_code == 0
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom ksae_cupy.session.runlock import RunLock\n"
                               "RunLock(sys.argv[1]).acquire()\nprint('locked', flush=True)\nsys.stdin.read()",
                               str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    assert holder.stdout.readline() == "locked\n"
    holder.kill()  # kill -9: no release ran, its PID stays in the file
    holder.wait(timeout=60)
    assert (run / ".lock").read_text().strip() == str(holder.pid)
    result = invoke("--resume", run, "--epochs", "2")
    assert result.exit_code == 0, result.output
    assert f"took over {run / '.lock'} from PID {holder.pid}" in result.stderr
    assert (run / ".lock").read_text() == ""  # released cleanly at the end


def test_the_lock_is_exclusive_between_two_holders(tmp_path):
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    assert first.acquire() is None
    with pytest.raises(Exception, match=f"PID {os.getpid()} holds"):
        second.acquire()
    first.release()
    assert second.acquire() is None and second.held
    second.release()


# -- a new run never mixes with another run's files -----------------------------------------------

@pytest.mark.parametrize("left", [["metrics.jsonl"], ["config.json", "metrics.jsonl"], ["checkpoint.h5.tmp"]])
def test_a_new_run_into_a_dead_runs_folder_is_refused_unless_overwrite(data_file, tmp_path, left):
    run = tmp_path / "run"
    run.mkdir()
    for name in left:  # what a run killed before its first checkpoint leaves
        (run / name).write_text(json.dumps({"epoch": 1, "step": 20}) + "\n")
    result = invoke(data_file, *QUICK, "--epochs", "1", "--run-dir", run)
    assert_one_line_error(result, f"run folder {run} already holds a run ({', '.join(sorted(left))})", "--overwrite",
                          status=2)
    assert sorted(p.name for p in run.iterdir()) == sorted(left)

    (run / "eval.json").write_text("{}")  # a result of the old run goes too
    result = invoke(data_file, *QUICK, "--epochs", "1", "--run-dir", run, "--overwrite")
    assert result.exit_code == 0, result.output
    assert f"--overwrite: removed {run / left[0]}" in result.stderr and not (run / "eval.json").exists()
    assert [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]


def test_overwrite_contradicts_resume(data_file, tmp_path):
    run = tmp_path / "run"
    assert invoke(data_file, *QUICK, "--epochs", "1", "--run-dir", run).exit_code == 0
    assert_one_line_error(invoke("--resume", run, "--overwrite"), "--overwrite contradicts --resume", status=2)


# -- SIGTERM and SIGHUP stop like Ctrl-C ------------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_save_print_the_resume_line_and_exit_128_plus_the_signal(data_file, tmp_path, signum):
    run = tmp_path / "run"
    proc = subprocess.Popen(held_train(2) + [str(data_file), *QUICK, "--epochs", "500", "--checkpoint-every", "1000",
                                             "--run-dir", str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    wait_until_held(proc)  # the run holds after epoch 2 (an event): the signal cannot come after its end
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)  # closes stdin: the run goes on and stops after its next step
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err
    assert f"{name}: stopping after this step and saving a checkpoint" in err
    assert f"continue with: ksae-train --resume {run}" in err.splitlines()[-1]
    saved = load_checkpoint(run / "checkpoint.h5")
    assert 2 <= saved.epoch < 500 and saved.step > 0


# -- training health ------------------------------------------------------------------------------

def test_integer_data_is_refused_with_a_hint_to_scale_it(tmp_path):
    path = tmp_path / "pixels.npy"
    np.save(path, np.random.default_rng(0).integers(0, 256, (200, 8), dtype=np.uint8))
    result = invoke(path, *QUICK, "--epochs", "1", "--run-dir", tmp_path / "run")
    assert_one_line_error(result, str(path), "holds integers (dtype uint8, values 0 to 255)", "X / 255", status=2)
    assert not (tmp_path / "run").exists()


def test_a_validation_loss_that_overflows_stops_the_epoch_before_it_counts():
    """Every batch's loss finite, the validation split's not (as unscaled data gives): diverged,
    and the epoch is neither counted nor reported, so nothing of it is logged or saved."""
    from ksae_cupy.backend import CPU
    from ksae_cupy.errors import TrainingDiverged
    from ksae_cupy.training.trainer import TrainConfig, Trainer

    X_nd = make_sparse_signals(200, D=8, H=16, k=2, seed=0)[0]
    trainer = Trainer(TrainConfig(hidden=16, k=2, k_start=None, epochs=2, batch_size=20), CPU, D=8)
    assert trainer.run_epoch(X_nd, X_nd[:20]).valid_loss < 1e3
    with pytest.raises(TrainingDiverged, match="the validation loss became inf at epoch 2"):
        trainer.run_epoch(X_nd, np.full((20, 8), 3e19, np.float32))
    assert trainer.epoch == 1


def test_a_diverging_run_exits_1_in_one_line_and_saves_nothing_of_it(data_file, tmp_path):
    run = tmp_path / "run"
    # 3: above --lr auto's 0.4 for this data, below the 3.47 at which it is refused up front
    result = invoke(data_file, *QUICK, "--epochs", "3", "--lr", "3", "--checkpoint-every", "1", "--run-dir", run)
    assert_one_line_error(result, "became", "with --lr 3.0", "nothing was saved", "or a smaller rate", status=1)
    assert not (run / "checkpoint.h5").exists() and not (run / "metrics.jsonl").exists()


def test_a_diverging_run_prints_its_line_without_numpys_overflow_warnings(data_file, tmp_path):
    """A real process (warnings print there as they would for a user): NumPy's RuntimeWarnings from
    the dense step's products, two lines each, once came before the error line; the health checks
    catch every overflow they report."""
    proc = subprocess.run(TRAIN + [str(data_file), *QUICK, "--epochs", "3", "--lr", "3", "--step", "dense",
                                   "--run-dir", str(tmp_path / "run"), "--quiet"], capture_output=True, text=True,
                          env=ENV, timeout=300)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the loss became "), proc.stderr


# -- a log line cut by a kill ---------------------------------------------------------------------

def test_resume_drops_a_metrics_line_a_kill_cut_short(data_file, tmp_path):
    """kill -9 in the middle of an append leaves a last line without its newline: --resume was a
    JSONDecodeError traceback; it now drops that line with the epochs after the checkpoint."""
    run = tmp_path / "run"
    assert invoke(data_file, *QUICK, "--epochs", "2", "--checkpoint-every", "1", "--run-dir", run).exit_code == 0
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 3, "step": 60, "lo')
    result = invoke("--resume", run, "--epochs", "3")
    assert result.exit_code == 0, result.output
    assert "metrics.jsonl: dropped 1 line(s)" in result.output
    assert [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_resume_names_a_damaged_metrics_line_and_trains_nothing(data_file, tmp_path):
    run = tmp_path / "run"
    assert invoke(data_file, *QUICK, "--epochs", "2", "--run-dir", run).exit_code == 0
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(lines[0][:15] + "\n" + lines[1] + "\n")
    checkpoint = (run / "checkpoint.h5").read_bytes()
    result = invoke("--resume", run, "--epochs", "3")
    assert_one_line_error(result, f"{run / 'metrics.jsonl'}: line 1 is not a JSON record", status=2)
    assert (run / "checkpoint.h5").read_bytes() == checkpoint

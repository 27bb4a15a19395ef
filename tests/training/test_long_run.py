"""A long ksae-train run a user can live with: progress and ETA, checkpoints by time, a resume
that applies or refuses every option, metrics without duplicates, BLAS threads, the k schedule.

Runs go through the real command (a subprocess) on small synthetic data.
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
from ksae_cupy.session import fields
from ksae_cupy.session.train_run import IN_CHECKPOINT
from ksae_cupy.session.progress import RunProgress
from ksae_cupy.training.wording import format_duration
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.training.checkpoint import load_checkpoint
from ksae_cupy.session.checkpoint_policy import CheckpointPolicy
from ksae_cupy.training.trainer import TrainConfig

TRAIN = [sys.executable, "-c", "from ksae_cupy.cli.train import train_command; train_command()"]
ENV = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), PYTHONUNBUFFERED="1")
SMALL = ["--hidden", "24", "--k", "3", "--batch-size", "20", "--device", "cpu"]


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, make_sparse_signals(1000, D=16, H=32, k=3, seed=2)[0])
    return path


def train(*args, cwd=None, timeout=300):
    return subprocess.run(TRAIN + [str(a) for a in args], capture_output=True, text=True, env=ENV, cwd=cwd,
                          timeout=timeout)


def epochs_logged(run_dir):
    return [json.loads(line)["epoch"] for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


# -- progress ---------------------------------------------------------------------------------

def test_output_to_a_file_gets_progress_lines_an_estimate_and_epoch_lines_with_lr(data_file, tmp_path):
    result = train(data_file, *SMALL, "--epochs", "3", "--run-dir", tmp_path / "run", "--progress-seconds", "0",
                   "--lr", "0.01")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("device: cpu") and lines[1].startswith("BLAS threads: ")
    assert any(line == f"checkpoints: {tmp_path / 'run' / 'checkpoint.h5'}, every 10 epochs and every 5 minutes, "
               "and at the end" for line in lines)
    epoch_lines = [line for line in lines if line.startswith("epoch ")]
    assert [line.split()[1] for line in epoch_lines] == ["1/3", "2/3", "3/3"]
    assert all("  lr 0.01  " in line for line in epoch_lines)
    assert "ETA " in epoch_lines[0] and "ETA" not in epoch_lines[-1]  # nothing left to estimate at the end
    estimates = [line for line in lines if line.startswith("estimate: 3 epochs at ")]
    assert len(estimates) == 1 and lines.index(estimates[0]) == lines.index(epoch_lines[0]) + 1
    # stderr is a pipe here, so progress comes as lines (every batch with --progress-seconds 0).
    progress = [line for line in result.stderr.splitlines() if line.startswith("  epoch ")]
    assert progress and all(" batch " in line and "samples/s" in line and "ETA " in line for line in progress)
    assert any(line.startswith("  epoch 2/3  batch ") for line in progress)


def test_eta_counts_the_steps_left_in_the_whole_run():
    class FakeTrainer:
        config = TrainConfig(epochs=10, batch_size=100)
        epoch, step, batch_in_epoch, finished = 0, 0, 0, False

    now = [0.0]
    trainer = FakeTrainer()
    progress = RunProgress(trainer, n_train=1000, enabled=True, tty=False, clock=lambda: now[0], echo=None)
    assert progress.eta() == "?"
    trainer.epoch, trainer.step, trainer.batch_in_epoch = 2, 25, 5  # 25 steps in 50 s: 2 s a step
    now[0] = 50.0
    assert progress.steps_left() == 8 * 10 - 5
    assert progress.eta() == format_duration(2.0 * 75) == "2m 30s"
    assert "epoch 3/10  batch 5/10  50 samples/s  ETA 2m 30s" == progress.status()


@pytest.mark.parametrize("seconds,text", [(0, "0s"), (59.4, "59s"), (185, "3m 05s"), (7 * 3600 + 12 * 60, "7h 12m"),
                                          (2 * 86400 + 4 * 3600 + 59, "2d 04h")])
def test_durations_read_as_a_person_would_say_them(seconds, text):
    assert format_duration(seconds) == text


# -- checkpoints by time ------------------------------------------------------------------------

def test_checkpoint_policy_saves_by_epochs_and_by_time():
    now = [0.0]
    policy = CheckpointPolicy(every_epochs=3, minutes=1, clock=lambda: now[0])
    assert [policy.after_epoch(e) for e in (1, 2, 3)] == [False, False, True]
    now[0] = 59.0
    assert not policy.after_batch(5, 10)
    now[0] = 61.0
    assert not policy.after_batch(10, 10)  # the epoch's end is after_epoch's to save
    assert policy.after_batch(3, 10) and not policy.after_batch(4, 10)  # the clock restarts
    now[0] = 122.0
    assert policy.after_epoch(4)
    assert not CheckpointPolicy(every_epochs=3, minutes=0, clock=lambda: 1e9).after_batch(1, 10)


def test_kill_9_loses_only_minutes_and_resume_logs_each_epoch_once(data_file, tmp_path):
    """--checkpoint-every far away, --checkpoint-minutes tiny: SIGKILL still finds a recent checkpoint;
    the resumed run ends bit-identical to an uninterrupted one and metrics.jsonl has every epoch once.

    The run holds after logging epoch 3 (or the first epoch after it with a checkpoint on disk) until
    it is killed: an event, where a kill sent on its epoch line raced the 27 epochs left."""
    common = [data_file, *SMALL, "--epochs", "30", "--checkpoint-every", "1000"]
    proc = subprocess.Popen(held_train(3, checkpoint=True) + [str(a) for a in common] + [
        "--run-dir", str(tmp_path / "a"), "--checkpoint-minutes", "0.001"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)
    held_at = wait_until_held(proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    saved = load_checkpoint(tmp_path / "a" / "checkpoint.h5")
    assert len(epochs_logged(tmp_path / "a")) == held_at
    assert saved.epoch < 30 and saved.step > 0  # by time only: every-1000 epochs never came
    assert len(epochs_logged(tmp_path / "a")) >= saved.epoch

    resumed = train("--resume", tmp_path / "a", "--device", "cpu")
    assert resumed.returncode == 0, resumed.stderr
    first = resumed.stdout.splitlines()[0]
    assert first.startswith(f"resuming {tmp_path / 'a'} after epoch {saved.epoch}") and f"(step {saved.step})" in first
    assert epochs_logged(tmp_path / "a") == list(range(1, 31))

    straight = train(*common, "--run-dir", tmp_path / "b")
    assert straight.returncode == 0, straight.stderr
    a, b = load_checkpoint(tmp_path / "a" / "checkpoint.h5"), load_checkpoint(tmp_path / "b" / "checkpoint.h5")
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])


def test_resume_drops_metric_lines_written_after_the_checkpoint(data_file, tmp_path):
    run = tmp_path / "run"
    assert train(data_file, *SMALL, "--epochs", "2", "--run-dir", run).returncode == 0
    # As after a crash: two more epochs were logged, but the checkpoint still says epoch 2.
    with open(run / "metrics.jsonl", "a") as f:
        for epoch, step in ((3, 150), (4, 200)):
            f.write(json.dumps({"epoch": epoch, "step": step}) + "\n")
    result = train("--resume", run, "--epochs", "4")
    assert result.returncode == 0, result.stderr
    assert "metrics.jsonl: dropped 2 line(s)" in result.stdout
    assert epochs_logged(run) == [1, 2, 3, 4]


# -- resume: every option applied or refused ------------------------------------------------------

# ksae-train's options by what --resume does with them (session/fields.py declares each one's policy).
SESSION = fields.named(fields.TRAIN, fields.SESSION)
APPLIED = fields.named(fields.TRAIN, fields.APPLIED) + SESSION
REFUSED = fields.named(fields.TRAIN, fields.REFUSED)
DATA, RUN_LEVEL = fields.DATA[1:], fields.RUN_LEVEL


def test_every_option_of_ksae_train_is_applied_or_refused_on_resume():
    names = {param.name for param in train_command.params if param.expose_value}  # not --version: no value
    classified = (set(APPLIED) | set(REFUSED) | set(DATA)
                  | {"dataset", "run_dir", "resume", "overwrite"})
    assert names == classified
    assert not set(APPLIED) & (set(REFUSED) | set(DATA))
    # ... and every applied option not given keeps the run's value: from config.json, from the
    # checkpoint's training configuration, or (only --quiet) it belongs to one session.
    kept = set(RUN_LEVEL) | set(IN_CHECKPOINT) | set(SESSION)
    assert set(APPLIED) == kept and set(IN_CHECKPOINT) <= set(TrainConfig().to_dict())


def test_resume_keeps_the_value_of_every_option_not_given(data_file, tmp_path):
    """Non-default values of every applied option, then a bare --resume: config.json and the
    checkpoint still hold them (before, --threads fell back to the default)."""
    pytest.importorskip("threadpoolctl", reason="--threads needs threadpoolctl")
    run, data_dir = tmp_path / "run", tmp_path / "data"
    data_dir.mkdir()
    values = {"epochs": 2, "topk": "threshold", "step": "sparse", "device": "cpu", "checkpoint_every": 3,
              "checkpoint_minutes": 2.5, "threads": 1, "data_dir": str(data_dir), "progress_seconds": 7.0}
    assert set(values) == set(APPLIED) - set(SESSION)
    args = [f"--{name.replace('_', '-')}={value}" for name, value in values.items()]
    first = train(data_file, *SMALL[:-2], *args, "--run-dir", run)
    assert first.returncode == 0, first.stderr
    resumed = train("--resume", run, "--epochs", "3")  # only --epochs given: the rest must stay
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[2].startswith("BLAS threads: 1 (")
    config, ckpt = json.loads((run / "config.json").read_text()), load_checkpoint(run / "checkpoint.h5")
    for name, value in values.items():
        found = ckpt.config[name] if name in IN_CHECKPOINT else config[name]
        assert found == (3 if name == "epochs" else value), name


def test_resume_applies_epochs_topk_and_checkpoint_options_and_keeps_the_k_schedule(data_file, tmp_path):
    run = tmp_path / "run"
    first = train(data_file, *SMALL, "--epochs", "4", "--k-start", "11", "--run-dir", run, "--checkpoint-every", "2",
                  "--checkpoint-minutes", "7")
    assert first.returncode == 0, first.stderr
    result = train("--resume", run, "--epochs", "8", "--topk", "threshold")
    assert result.returncode == 0, result.stderr
    assert "applied: epochs 4 -> 8, topk sort -> threshold" in result.stdout.splitlines()[0]
    config = json.loads((run / "config.json").read_text())
    assert (config["checkpoint_every"], config["checkpoint_minutes"]) == (2, 7)  # kept, not reset
    assert (config["train"]["epochs"], config["train"]["topk"], config["train"]["k_schedule_epochs"]) == (8, "threshold", 4)
    ckpt = load_checkpoint(run / "checkpoint.h5")
    assert ckpt.epoch == 8 and ckpt.config["topk"] == "threshold"
    ks = [json.loads(line)["k"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert ks[:2] == [11, 7] and ks[2:] == [3] * 6  # k stays reached; it does not climb back up

    again = train("--resume", run, "--checkpoint-every", "5")
    assert again.returncode == 0, again.stderr
    assert json.loads((run / "config.json").read_text())["checkpoint_every"] == 5


def test_shortened_epochs_shrink_the_k_schedule_so_k_is_still_reached():
    from ksae_cupy.backend import CPU
    from ksae_cupy.session.fields import TrainOptions
    from ksae_cupy.session.resuming import apply
    from ksae_cupy.training.trainer import Trainer

    trainer = Trainer(TrainConfig(hidden=24, k=3, k_start=21, epochs=100, batch_size=10), CPU, D=8)
    trainer.epoch = 10

    def given(epochs):  # ksae-train --resume RUN --epochs N, as its options object
        return TrainOptions(epochs=epochs, given=frozenset({"epochs"}))

    changes = apply(IN_CHECKPOINT, given(40), trainer)
    assert changes == ["epochs 100 -> 40 (the k schedule now spans 40 epochs)"]
    assert (trainer.config.epochs, trainer.config.k_schedule_epochs) == (40, 40)
    trainer.epoch = 20
    assert trainer.current_k() == 3  # half of the 40 epochs: k reached
    assert apply(IN_CHECKPOINT, given(90), trainer) == ["epochs 40 -> 90"]
    assert trainer.config.k_schedule_epochs == 40 and trainer.current_k() == 3


@pytest.mark.parametrize("args,fragments", [
    (["--lr", "0.5", "--k", "2"], ["--k 2 (the run has 3)", "--lr 0.5 (the run has 0.01)"]),
    (["--batch-size", "30"], ["--batch-size 30 (the run has 20)"]),
    (["--run-dir", "{tmp}/elsewhere"], ["--run-dir", "not allowed with --resume"]),
    (["--epochs", "1"], ["--epochs 1", "already trained 2 epochs"]),
    (["--checkpoint-minutes", "-1"], ["--checkpoint-minutes -1.0"]),
    (["{tmp}/other.npy"], ["DATASET", "contradicts"]),
])
def test_resume_refuses_what_it_cannot_honour_by_name(data_file, tmp_path, args, fragments):
    run = tmp_path / "run"
    assert train(data_file, *SMALL, "--epochs", "2", "--run-dir", run, "--lr", "0.01").returncode == 0
    before = (run / "checkpoint.h5").read_bytes(), (run / "config.json").read_text()
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = CliRunner().invoke(train_command, ["--resume", str(run), *args], catch_exceptions=False)
    assert_one_line_error(result, *fragments, status=2)
    assert ((run / "checkpoint.h5").read_bytes(), (run / "config.json").read_text()) == before


def test_user_data_is_recorded_absolute_with_its_hash_and_a_change_is_noticed(data_file, tmp_path):
    run = tmp_path / "run"
    assert train("x.npy", *SMALL, "--epochs", "2", "--run-dir", run, cwd=tmp_path).returncode == 0
    config = json.loads((run / "config.json").read_text())
    assert config["dataset"] == str(data_file.resolve()) and len(config["dataset_sha256"]) == 64
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = train("--resume", run, "--epochs", "3", cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    np.save(data_file, make_sparse_signals(1000, D=16, H=32, k=3, seed=3)[0])
    result = CliRunner().invoke(train_command, ["--resume", str(run), "--epochs", "4"], catch_exceptions=False)
    assert_one_line_error(result, str(data_file.resolve()), "changed since the run started", status=2)



def test_a_moved_data_file_is_taken_when_its_bytes_are_the_runs(data_file, tmp_path):
    """Run folders and their data travel between machines (a lent GPU, results/runs): the data file at a
    new path, given as DATASET, is the run's when its SHA-256 is; the run records the new path."""
    run = tmp_path / "run"
    assert train(data_file, *SMALL, "--epochs", "2", "--run-dir", run).returncode == 0
    sha = json.loads((run / "config.json").read_text())["dataset_sha256"]
    moved = tmp_path / "moved" / "x.npy"
    moved.parent.mkdir()
    data_file.rename(moved)
    result = CliRunner().invoke(train_command, ["--resume", str(run), "--epochs", "3"], catch_exceptions=False)
    assert_one_line_error(result, "does not exist any more", "give its new path as DATASET", status=2)
    other = tmp_path / "other.npy"  # the same shape, other bytes
    np.save(other, make_sparse_signals(1000, D=16, H=32, k=3, seed=3)[0])
    result = CliRunner().invoke(train_command, [str(other), "--resume", str(run), "--epochs", "3"],
                                catch_exceptions=False)
    assert_one_line_error(result, "contradicts the run's dataset", "these are not", status=2)
    assert epochs_logged(run) == [1, 2]
    result = train(moved, "--resume", run, "--epochs", "3")
    assert result.returncode == 0, result.stderr
    config = json.loads((run / "config.json").read_text())
    assert config["dataset"] == str(moved.resolve()) and config["dataset_sha256"] == sha
    result = train("--resume", run, "--epochs", "4")  # from now on without DATASET
    assert result.returncode == 0, result.stderr
    assert epochs_logged(run) == [1, 2, 3, 4]

# -- BLAS threads, the k schedule -----------------------------------------------------------------

def test_threads_option_sets_and_reports_the_blas_threads(data_file, tmp_path):
    pytest.importorskip("threadpoolctl", reason="--threads needs threadpoolctl")
    result = train(data_file, *SMALL, "--epochs", "1", "--run-dir", tmp_path / "run", "--threads", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].startswith("BLAS threads: 1 (")
    bad = train(data_file, *SMALL, "--epochs", "1", "--run-dir", tmp_path / "run2", "--threads", "0")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --threads 0 is not allowed")
    assert not (tmp_path / "run2").exists()


@pytest.mark.parametrize("variable", ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"])
def test_a_thread_count_from_the_environment_is_kept_and_named(data_file, tmp_path, variable):
    from ksae_cupy.threads import THREAD_VARIABLES

    env = {key: value for key, value in ENV.items() if key not in THREAD_VARIABLES}
    result = subprocess.run(TRAIN + [str(data_file), *SMALL, "--epochs", "1", "--run-dir", str(tmp_path / "run")],
                            capture_output=True, text=True, env={**env, variable: "1"}, timeout=300)
    assert result.returncode == 0, result.stderr
    blas = result.stdout.splitlines()[1]
    assert blas.startswith("BLAS threads: 1 (") and f"set by {variable}=1" in blas, blas


@pytest.mark.parametrize("load, expected", [(0.2, 4), (1.2, 3), (2.6, 1), (9.0, 1)])
def test_the_default_thread_count_leaves_the_cores_other_jobs_use(monkeypatch, load, expected):
    pytest.importorskip("threadpoolctl", reason="the count is set through threadpoolctl")
    from ksae_cupy import threads as threads_module
    from ksae_cupy.cpu import numba_kernels as cpu_kernels
    from ksae_cupy.threads import THREAD_VARIABLES

    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads_module, "usable_cores", lambda: 4)
    monkeypatch.setattr(threads_module.os, "getloadavg", lambda: (load, load, load))
    try:
        line, used = threads_module.set_blas_threads(None)
        assert used == expected
        assert ("one per free core" in line) == (expected < 4), line
        if cpu_kernels.available():
            assert cpu_kernels._threads == expected
    finally:
        cpu_kernels.set_threads(None)


def test_the_thread_count_a_run_used_is_kept_on_resume(data_file, tmp_path):
    """Without --threads the count chosen (from the environment here) is recorded, so a resume in
    another environment uses it: BLAS products differ in their last bits on another count."""
    pytest.importorskip("threadpoolctl", reason="the count is set through threadpoolctl")
    from ksae_cupy.threads import THREAD_VARIABLES

    env = {key: value for key, value in ENV.items() if key not in THREAD_VARIABLES}
    run = tmp_path / "run"
    first = subprocess.run(TRAIN + [str(data_file), *SMALL, "--epochs", "1", "--run-dir", str(run)],
                           capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert first.returncode == 0, first.stderr
    assert json.loads((run / "config.json").read_text())["threads"] == 1
    resumed = subprocess.run(TRAIN + ["--resume", str(run), "--epochs", "2"], capture_output=True, text=True,
                             env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[2].startswith("BLAS threads: 1 ("), resumed.stdout


def test_one_epoch_with_a_k_schedule_says_it_trains_at_k(data_file, tmp_path):
    result = train(data_file, *SMALL, "--epochs", "1", "--run-dir", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "never reach k 3; training with k 3 from the start" in result.stdout
    assert epochs_logged(tmp_path / "run") == [1]
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text())["k"] == 3


def test_eta_weighs_each_epochs_steps_by_the_cost_of_its_k():
    """Under the k schedule a step at k 100 costs more than one at k 25: after an epoch at k 100 the
    estimate counts the later epochs at their own cost, measured by step_cost and linear in k."""
    class FakeTrainer:
        config = TrainConfig(epochs=4, batch_size=100, k=25, k_start=100)  # k: 100, 62, 25, 25
        epoch, step, batch_in_epoch, finished = 1, 10, 0, False

    measured = []

    def step_cost(k):  # 1 s a step at k 100, 0.5 s at k 25
        measured.append(k)
        return 0.5 + 0.5 * (k - 25) / 75

    now = [10.0]  # epoch 1 (k 100): 10 steps in 10 s
    progress = RunProgress(FakeTrainer(), n_train=1000, enabled=True, tty=False, clock=lambda: now[0], echo=None,
                           step_cost=step_cost)
    progress.started, progress.step_at_start = 0.0, 0
    assert progress._epoch_k(1) == 62
    cost_62 = 0.5 + 0.5 * (62 - 25) / 75
    assert progress.seconds_left() == pytest.approx(10 * cost_62 + 10 * 0.5 + 10 * 0.5)
    assert measured == [100, 25] * 3  # the two k in turn, whatever the number of epochs


def test_eta_does_not_count_the_time_spent_measuring_step_costs():
    """Measuring the cost line takes seconds of its own (six timed steps, a compile the first
    time); they are not the run's pace, so the estimate is the same as if they took none."""
    class FakeTrainer:
        config = TrainConfig(epochs=4, batch_size=100, k=25, k_start=100)
        epoch, step, batch_in_epoch, finished = 1, 10, 0, False

    estimates = []
    for seconds_per_measurement in (0.0, 7.0):
        now = [10.0]  # epoch 1 (k 100): 10 steps in 10 s

        def step_cost(k):
            now[0] += seconds_per_measurement
            return 0.5 + 0.5 * (k - 25) / 75

        progress = RunProgress(FakeTrainer(), n_train=1000, enabled=True, tty=False, clock=lambda: now[0],
                               echo=None, step_cost=step_cost)
        progress.started, progress.step_at_start = 0.0, 0
        estimates.append(progress.seconds_left())
    assert estimates[1] == pytest.approx(estimates[0])
    assert estimates[0] == pytest.approx(10 * (0.5 + 0.5 * 37 / 75) + 10 * 0.5 + 10 * 0.5)


def test_eta_cost_line_keeps_the_least_time_and_never_makes_fewer_units_dearer():
    """Under load a measurement only ever gains time: the least of three taken in turn is kept, and a
    step at k 25 measured dearer than one at k 100 (load that came and went) is capped at k 100's."""
    class FakeTrainer:
        config = TrainConfig(epochs=4, batch_size=100, k=25, k_start=100)
        epoch, step, batch_in_epoch, finished = 1, 10, 0, False

    times = iter([3.0, 9.0, 1.0, 7.0, 2.0, 5.0])  # k 100, k 25, k 100, ...: another job during the k 25 ones
    progress = RunProgress(FakeTrainer(), n_train=1000, enabled=True, tty=False, echo=None,
                           step_cost=lambda k: next(times))
    assert progress._measure_cost_line(100, 25) == (100, 1.0, 25, 1.0)
    quiet = iter([2.0, 1.0, 2.5, 1.2, 3.0, 0.9])
    progress.step_cost = lambda k: next(quiet)
    assert progress._measure_cost_line(100, 25) == (100, 2.0, 25, 0.9)


def test_the_epoch_report_times_its_parts_and_validates_through_the_kept_units(monkeypatch):
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.training.trainer import Trainer

    X_nd = np.random.default_rng(3).random((200, 30), dtype=np.float32)
    trainer = Trainer(TrainConfig(hidden=60, k=5, k_start=None, epochs=1, batch_size=50), resolve_device("cpu"), D=30)
    report = trainer.run_epoch(X_nd, X_nd[:70])
    assert set(report.parts) == {"shuffle", "batches", "steps", "updates", "validation"}
    assert all(seconds >= 0 for seconds in report.parts.values())
    assert report.parts["steps"] + report.parts["updates"] <= report.seconds
    # The validation loss through the kept rows of W equals the dense decoder's, to float32 rounding.
    sparse = trainer.evaluate_loss(X_nd, 5)
    monkeypatch.setenv("KSAE_CPU_KERNELS", "0")
    assert trainer.evaluate_loss(X_nd, 5) == pytest.approx(sparse, rel=1e-5)


@pytest.mark.parametrize("given, expected", [(None, "4"), ("20", "20")])
def test_commands_cut_openblas_spin_before_numpy_loads_and_keep_a_users_value(given, expected):
    # OpenBLAS reads OPENBLAS_THREAD_TIMEOUT once, when NumPy loads it: the command package must set
    # it before anything imports NumPy, or the setting does nothing.
    env = {key: value for key, value in os.environ.items() if key != "OPENBLAS_THREAD_TIMEOUT"}
    if given is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = given
    probe = ("import os, sys, ksae_cupy.cli; "
             "print('numpy' in sys.modules, os.environ['OPENBLAS_THREAD_TIMEOUT'])")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", expected]


def test_the_thread_limit_reaches_scipys_own_blas():
    """SciPy bundles a BLAS of its own (L-BFGS-B's, scipy.linalg's). A limit reaches only the libraries loaded,
    so set_blas_threads loads SciPy's first: in a fresh process that has imported only NumPy, every BLAS
    library found afterwards runs on the one thread asked (ksae-eval --threads 1 once spun on both cores)."""
    script = ("import sys, numpy; assert 'scipy' not in sys.modules\n"
              "from ksae_cupy.threads import set_blas_threads\n"
              "set_blas_threads(1)\n"
              "import scipy.optimize\n"
              "from threadpoolctl import threadpool_info\n"
              "blas = [(i['filepath'], i['num_threads']) for i in threadpool_info() if i['user_api'] == 'blas']\n"
              "print(blas)\n"
              "assert blas and all(n == 1 for _, n in blas), blas\n")
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                                          "MKL_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout

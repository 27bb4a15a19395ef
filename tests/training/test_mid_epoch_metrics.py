"""A run stopped inside an epoch by a real Ctrl-C and resumed logs, for that epoch, the very metrics line an
uninterrupted run logs: every statistic (loss, validation loss, dead units, AuxK loss, FVE, L0, ...) but the
clocks'. For every kind of run, through its command: ksae-train (plain, --aux-k, relu units), ksae-baseline
(dropout AE, RBM) and ksae-finetune (with input dropout). The epoch engine (ksae_cupy/training/epochs.py)
keeps the epoch's statistics in the mid-epoch checkpoint.

The stop is an event, not a clock: the stopped run holds inside its nth batch (in the checkpoint policy's
after-batch call, which every command makes) until the test has sent SIGINT and closed its stdin; the run
then stops after that batch, inside the epoch."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from click.testing import CliRunner

ENV = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), PYTHONUNBUFFERED="1")
CLOCKS = {"seconds", "samples_per_s", "parts", "time"}

# COMMAND's run, holding inside its nth batch (counted over the whole session) until its stdin is closed.
HOLD_IN_BATCH = """\
import sys
from ksae_cupy.session import checkpoint_policy

nth, after_batch, calls = int(sys.argv.pop(1)), checkpoint_policy.CheckpointPolicy.after_batch, []


def hold(self, done, total):
    calls.append(done)
    if len(calls) == nth:
        print(f"held in batch {done} of {total}", flush=True)
        sys.stdin.read()  # until the test closes this process's stdin
    return after_batch(self, done, total)


checkpoint_policy.CheckpointPolicy.after_batch = hold
from ksae_cupy.cli.COMMAND import COMMAND_command

COMMAND_command()
"""


COMMON = ["--batch-size", "20", "--test-fraction", "0.2", "--device", "cpu", "--threads", "1",
          "--checkpoint-every", "1000", "--checkpoint-minutes", "0"]
RUNS = {
    "train": ("train", ["--hidden", "24", "--k", "3", "--k-start", "8", "--epochs", "3", "--lr", "0.05"]),
    "train-auxk": ("train", ["--hidden", "24", "--k", "3", "--k-start", "8", "--epochs", "3", "--lr", "0.05",
                             "--aux-k", "4", "--dead-window", "200"]),
    "train-relu": ("train", ["--hidden", "24", "--k", "4", "--no-k-schedule", "--epochs", "3", "--lr", "0.05",
                             "--activation", "relu"]),
    "baseline-dropout-ae": ("baseline", ["--model", "dropout-ae", "--hidden", "12", "--epochs", "3", "--lr", "0.05"]),
    "baseline-rbm": ("baseline", ["--model", "rbm", "--hidden", "12", "--epochs", "3", "--lr", "0.05"]),
    "finetune-dropout": ("finetune", ["--no-pretraining", "--hidden", "16", "--k", "3", "--epochs", "3",
                                      "--input-dropout", "0.2"]),
}


def command_of(name: str):
    module = __import__(f"ksae_cupy.cli.{name}", fromlist=[f"{name}_command"])
    return getattr(module, f"{name}_command")


def invoke(command: str, args) -> str:
    result = CliRunner().invoke(command_of(command), [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def statistics(run: Path) -> list[dict]:
    """metrics.jsonl without the clocks."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{key: value for key, value in json.loads(line).items() if key not in CLOCKS} for line in lines]


def stop_inside_epoch_two(command: str, args: list, run: Path, batches_per_epoch: int) -> None:
    """Run ``command`` and stop it with SIGINT inside its second epoch (after its fourth batch there)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_IN_BATCH.replace("COMMAND", command),
                             str(batches_per_epoch + 4), *args, "--run-dir", str(run)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    for line in proc.stdout:
        if line.startswith("held in batch"):
            assert line.split()[3:6] == ["4", "of", str(batches_per_epoch)], line
            break
    else:
        raise AssertionError(f"the run ended without holding: {proc.communicate()[1]}")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)  # closes stdin: the run stops after the batch it holds in
    assert proc.returncode == 130, err
    with h5py.File(run / "checkpoint.h5") as f:
        assert (int(f.attrs["epoch"]), int(f.attrs["batch_in_epoch"])) == (1, 4)  # inside epoch 2
        assert "epoch_tally" in f


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_the_resumed_epoch_logs_the_uninterrupted_runs_line(labelled_rows_file, tmp_path, kind):
    command, own = RUNS[kind]
    args = [labelled_rows_file, *own, *COMMON]
    invoke(command, [*args, "--run-dir", tmp_path / "straight", "--quiet"])
    straight = statistics(tmp_path / "straight")
    stop_inside_epoch_two(command, args, tmp_path / "stopped", straight[0]["step"])
    output = invoke(command, ["--resume", tmp_path / "stopped", "--device", "cpu"])
    assert "covers only its batches after the resume" not in output
    assert statistics(tmp_path / "stopped") == straight
    if command == "train":  # every statistic an autoencoder epoch logs is there to compare
        assert {"train_loss", "valid_loss", "dead_fraction", "fve", "valid_fve", "l0", "valid_l0"} <= set(straight[1])
        assert (straight[1]["aux_loss"] is not None) == (kind == "train-auxk")


def test_a_checkpoint_without_the_tally_resumes_and_says_what_the_epoch_covers(labelled_rows_file, tmp_path):
    """A mid-epoch checkpoint written before tallies (as by an older version) still resumes; the resumed
    epoch's figures then cover its batches after the resume only, and one line says so."""
    from ksae_cupy.training.checkpoint import load_checkpoint, save_checkpoint

    command, own = RUNS["train"]
    args = [labelled_rows_file, *own, *COMMON]
    invoke(command, [*args, "--run-dir", tmp_path / "straight", "--quiet"])
    stop_inside_epoch_two(command, args, tmp_path / "old", statistics(tmp_path / "straight")[0]["step"])
    ckpt = load_checkpoint(tmp_path / "old" / "checkpoint.h5")
    ckpt.epoch_tally = None
    save_checkpoint(tmp_path / "old" / "checkpoint.h5", ckpt)
    output = invoke(command, ["--resume", tmp_path / "old", "--device", "cpu"])
    assert (f"note: {tmp_path / 'old' / 'checkpoint.h5'} was written before checkpoints kept an epoch's statistics: "
            f"epoch 2's line covers only its batches after the resume (from batch 5)") in output
    assert [r["epoch"] for r in statistics(tmp_path / "old")] == [1, 2, 3]
